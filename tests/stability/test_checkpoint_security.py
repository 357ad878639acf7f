"""Checkpoints never run code: a crafted pickle is refused by every load, and the same file is
live under an unsafe load (the control)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch

from trainopt.stability.checkpointing.checkpoint import CheckpointError, CheckpointManager


def make(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


class WritesMarker:
    """Unpickling this would write a marker file: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, writer):
    marker = tmp_path / "marker.txt"
    evil = tmp_path / "checkpoint_step_99.pt"
    payload = {"format": "trainopt.stability.checkpoint/1", "model": WritesMarker(marker)}
    with open(evil, "wb") as f:
        torch.save(payload, f) if writer == "torch.save" else pickle.dump(payload, f, protocol=2)
    model, opt = make()
    with pytest.raises(CheckpointError, match=r"checkpoint_step_99\.pt.*refused"):
        CheckpointManager(tmp_path).load_checkpoint(model, opt, evil)
    with pytest.warns(UserWarning, match="checkpoint_step_99.pt"):
        assert CheckpointManager(tmp_path).load_latest(model, opt) is None
    assert not marker.exists()


def test_the_malicious_payload_is_live_under_an_unsafe_load(tmp_path):
    """Control: the same file does run code under torch.load(weights_only=False)."""
    marker = tmp_path / "marker.txt"
    torch.save({"model": WritesMarker(marker)}, tmp_path / "evil.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.read_text() == "code ran"
