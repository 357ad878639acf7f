"""The sync guard catches what syncs on a GPU: HostSyncCounter flags, on a CPU, by operator name,
every operator that makes the host wait for a CUDA device, and none of their sync-free forms.
On a GPU, each flagged case is checked against ``torch.cuda.set_sync_debug_mode("error")``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainopt.stability.syncs import SYNCING_OPERATORS, HostSyncCounter


def _data(device: str = "cpu") -> dict[str, torch.Tensor]:
    x = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0, -2.0], device=device)
    return {
        "x": x,
        "mask": x > 0,
        "repeats": torch.tensor([1, 2, 0, 1, 1, 1], device=device),
        "ints": torch.tensor([1, 2, 2], device=device),
        "eye": torch.eye(2, device=device),
    }


SYNCING: dict[str, tuple[Callable[[dict], object], str]] = {
    ".item()": (lambda d: d["x"].sum().item(), "aten._local_scalar_dense"),
    "if tensor:": (lambda d: bool(d["x"].sum() > 0), "aten._local_scalar_dense"),
    "nonzero": (lambda d: d["x"].nonzero(), "aten.nonzero"),
    "argwhere": (lambda d: torch.argwhere(d["x"]), "aten.nonzero"),
    "one-argument where": (lambda d: torch.where(d["mask"]), "aten.nonzero"),
    "boolean-mask indexing": (lambda d: d["x"][d["mask"]], "aten.index"),
    "boolean-mask assignment": (
        lambda d: d["x"].clone().__setitem__(d["mask"], 0.0),
        "aten.index_put_",
    ),
    "masked_select": (lambda d: d["x"].masked_select(d["mask"]), "aten.masked_select"),
    "unique": (lambda d: torch.unique(d["x"]), "aten._unique2"),
    "unique(dim=0)": (lambda d: torch.unique(d["eye"], dim=0), "aten.unique_dim"),
    "unique_consecutive": (lambda d: torch.unique_consecutive(d["x"]), "aten.unique_consecutive"),
    "repeat_interleave without output_size": (
        lambda d: torch.repeat_interleave(d["x"], d["repeats"]),
        "aten.repeat_interleave",
    ),
    "bincount": (lambda d: torch.bincount(d["ints"]), "aten.bincount"),
    "torch.equal": (lambda d: torch.equal(d["x"], d["x"]), "aten.equal"),
    "torch.allclose": (lambda d: torch.allclose(d["x"], d["x"]), "aten.allclose"),
    "linalg.inv": (lambda d: torch.linalg.inv(d["eye"]), "aten._linalg_check_errors"),
    "linalg.cholesky": (lambda d: torch.linalg.cholesky(d["eye"]), "aten._linalg_check_errors"),
}

SYNC_FREE: dict[str, Callable[[dict], object]] = {
    "three-argument where": lambda d: torch.where(d["mask"], d["x"], 0.0),
    "masked_fill": lambda d: d["x"].masked_fill(d["mask"], 0.0),
    "integer-index indexing": lambda d: d["x"][torch.tensor([0, 2], device=d["x"].device)],
    "repeat_interleave with output_size": lambda d: torch.repeat_interleave(
        d["x"], d["repeats"], output_size=6
    ),
    "repeat_interleave with an int": lambda d: torch.repeat_interleave(d["x"], 2),
    "nonzero_static": lambda d: torch.nonzero_static(d["x"], size=3),
    "linalg.inv_ex": lambda d: torch.linalg.inv_ex(d["eye"]),
    "sum, sort, topk, cumsum": lambda d: (
        d["x"].sum(),
        d["x"].sort(),
        d["x"].topk(2),
        d["x"].cumsum(0),
    ),
}


@pytest.mark.parametrize("run, name", SYNCING.values(), ids=SYNCING.keys())
def test_an_operator_that_syncs_on_cuda_is_flagged_by_name_on_the_cpu(run, name: str) -> None:
    data = _data()
    with HostSyncCounter() as counter:
        run(data)
    assert counter.count >= 1 and name in counter.operators, counter.operators


@pytest.mark.parametrize("run", SYNC_FREE.values(), ids=SYNC_FREE.keys())
def test_the_sync_free_forms_are_not_flagged(run) -> None:
    with HostSyncCounter() as counter:
        run(_data())
    assert counter.count == 0, counter.operators


def test_every_listed_operator_has_a_case() -> None:
    flagged = {name for _, name in SYNCING.values()}
    listed = {f"aten.{op.__name__}" for op in SYNCING_OPERATORS}
    assert listed - flagged <= {
        "aten._unique",
        "aten.unique_dim_consecutive",
        "aten.is_nonzero",
        "aten.index_put",
    }  # other spellings of the cases above


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: checks the list against the device"
)
@pytest.mark.parametrize("run, name", SYNCING.values(), ids=SYNCING.keys())
def test_each_flagged_case_really_syncs_on_cuda(run, name: str) -> None:
    data = _data("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            run(data)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: checks the list against the device"
)
@pytest.mark.parametrize("run", SYNC_FREE.values(), ids=SYNC_FREE.keys())
def test_the_sync_free_forms_do_not_sync_on_cuda(run) -> None:
    data = _data("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(data)
    finally:
        torch.cuda.set_sync_debug_mode("default")
