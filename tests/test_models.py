"""Tests of trainopt.models.synthetic_batch: inputs and targets are separate, contiguous tensors."""

from __future__ import annotations

import pytest
import torch

from trainopt.models import gpt_config, synthetic_batch


@pytest.mark.parametrize("batch_size", [1, 3])
def test_synthetic_batch_inputs_and_targets_share_no_storage(batch_size):
    x, y = synthetic_batch(
        gpt_config("tiny"),
        batch_size=batch_size,
        seq_len=8,
        generator=torch.Generator().manual_seed(0),
    )
    assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    before = y.clone()
    x.zero_()  # writing to the inputs leaves the targets alone
    assert torch.equal(y, before)


def test_the_shipped_digits_are_scikit_learns() -> None:
    """``digits.npz`` holds the samples, in order, that ``sklearn.datasets.load_digits`` gives."""
    from extras import require

    sklearn = require("sklearn.datasets", "test")
    from trainopt.models import digits_pixels

    reference = sklearn.load_digits()
    pixels, labels = digits_pixels()
    assert torch.equal(pixels.double(), torch.as_tensor(reference.data))
    assert torch.equal(labels.long(), torch.as_tensor(reference.target))
