"""Tests of trainopt.perf.cross_entropy: the chunked head-plus-loss equals the plain one, in
loss and gradients, over shapes, ignored targets and chunk sizes, at a lower measured peak."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.perf.cross_entropy import chunked_linear_cross_entropy
from trainopt.perf.peak import LiveStorageTracker


def _loss_and_grads(loss_fn, hidden, weight, targets):
    hidden = hidden.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, targets)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def _plain(reduction="mean"):
    return lambda h, w, t: F.cross_entropy((h @ w.T).float(), t, reduction=reduction)


def _chunked(chunk_size, reduction="mean"):
    return lambda h, w, t: chunked_linear_cross_entropy(
        h, w, t, chunk_size=chunk_size, reduction=reduction
    )


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 40),
    width=st.integers(1, 12),
    vocab=st.integers(2, 50),
    chunk_size=st.integers(1, 17),
    ignored=st.floats(0.0, 0.9),
    reduction=st.sampled_from(["mean", "sum"]),
    data=st.data(),
)
def test_chunked_equals_plain_cross_entropy_in_loss_and_gradients(
    tokens, width, vocab, chunk_size, ignored, reduction, data
):
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    hidden = torch.randn(tokens, width, generator=generator)
    weight = torch.randn(vocab, width, generator=generator)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    drop = torch.rand(tokens, generator=generator) < ignored
    drop[0] = False  # at least one counted token: the mean over none is 0/0 in both
    targets[drop] = -100
    expected = _loss_and_grads(_plain(reduction), hidden, weight, targets)
    actual = _loss_and_grads(_chunked(chunk_size, reduction), hidden, weight, targets)
    for got, want in zip(actual, expected):
        # fp32 rounding: a summed loss's gradients add up to 40 terms of order 1
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 5, 7, 64])
def test_chunked_equals_plain_with_bf16_inputs_and_leading_dims(chunk_size):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=generator).bfloat16()
    weight = torch.randn(40, 16, generator=generator).bfloat16()
    targets = torch.randint(0, 40, (3, 7), generator=generator)
    targets[1, 2:5] = 3  # a custom ignore_index below

    def plain(h, w, t):
        return F.cross_entropy((h @ w.T).float().flatten(0, 1), t.flatten(), ignore_index=3)

    def chunked(h, w, t):
        return chunked_linear_cross_entropy(h, w, t, chunk_size, ignore_index=3)

    expected = _loss_and_grads(plain, hidden, weight, targets)
    actual = _loss_and_grads(chunked, hidden, weight, targets)
    torch.testing.assert_close(
        actual[0], expected[0], rtol=1e-6, atol=1e-6
    )  # the loss is fp32 in both
    for got, want in zip(actual[1:], expected[1:]):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-3)  # bf16: 8 significant bits


def test_gradients_scale_with_the_incoming_gradient_and_only_where_required():
    hidden = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(9, 4)  # frozen head
    targets = torch.randint(0, 9, (6,))
    (3.0 * chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=4)).backward()
    scaled = hidden.grad.clone()
    hidden.grad = None
    chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=4).backward()
    torch.testing.assert_close(scaled, 3.0 * hidden.grad)
    assert weight.grad is None


def test_chunked_holds_a_lower_peak_than_plain():
    generator = torch.Generator().manual_seed(0)
    tokens, width, vocab, chunk = 512, 32, 4096, 64
    hidden = torch.randn(tokens, width, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, width, generator=generator, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    peaks = {}
    for name, loss_fn in (("plain", _plain()), ("chunked", _chunked(chunk))):
        hidden.grad = weight.grad = None
        tracker = LiveStorageTracker("cpu")
        tracker.count([hidden, weight, targets])
        with tracker:
            loss_fn(hidden, weight, targets).backward()
        peaks[name] = tracker.peak
    logits_bytes = tokens * vocab * 4
    assert peaks["plain"] > 3 * logits_bytes  # logits, log-softmax, and their gradients in backward
    assert peaks["chunked"] < logits_bytes  # never the full logits
    assert peaks["chunked"] < 0.25 * peaks["plain"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reduction": "none"}, "reduction must be"),
        ({"chunk_size": 0}, "chunk_size must be"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        chunked_linear_cross_entropy(
            torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long), **kwargs
        )


def test_rejects_targets_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"targets must have shape \(4,\)"):
        chunked_linear_cross_entropy(
            torch.randn(4, 3), torch.randn(5, 3), torch.zeros(2, 2, dtype=torch.long)
        )


def test_chunked_under_bf16_autocast_matches_the_gpt_head():
    torch.manual_seed(0)
    hidden = torch.randn(2, 16, 32, requires_grad=True)  # fp32, as the last LayerNorm gives it
    head = torch.nn.Linear(32, 100, bias=False)
    targets = torch.randint(0, 100, (2, 16))
    results = []
    for chunked in (False, True):
        hidden.grad = head.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if chunked:
                loss = chunked_linear_cross_entropy(hidden, head.weight, targets, chunk_size=5)
            else:
                loss = F.cross_entropy(head(hidden).flatten(0, 1), targets.flatten())
        loss.backward()
        results.append((loss.detach(), hidden.grad.clone(), head.weight.grad.clone()))
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
