"""Save and restore every random number generator a training run draws from."""

from __future__ import annotations

import random
import warnings
from typing import Any

import torch


def get_rng_state() -> dict[str, Any]:
    """The Python, NumPy, torch and CUDA generator states as tensors and plain values.

    ``random.getstate()`` holds a tuple of 625 ints: it is stored as an int64 tensor, so the
    result loads with ``weights_only=True``.

    Example:
        >>> import random
        >>> import torch
        >>> from trainopt.stability.checkpointing.rng import get_rng_state
        >>> from trainopt.stability.checkpointing.rng import set_rng_state
        >>> state = get_rng_state(); a = torch.rand(2), random.random()
        >>> set_rng_state(state); b = torch.rand(2), random.random()
        >>> torch.equal(a[0], b[0]) and a[1] == b[1]
        True
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": None,
    }
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = {
        "kind": str(kind),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned (CUDA states only where CUDA is present).

    Example:
        >>> import torch
        >>> from trainopt.stability.checkpointing.rng import get_rng_state
        >>> from trainopt.stability.checkpointing.rng import set_rng_state
        >>> import numpy as np
        >>> state = get_rng_state(); first = np.random.rand(), torch.randint(100, (3,)).tolist()
        >>> set_rng_state(state)
        >>> (np.random.rand(), torch.randint(100, (3,)).tolist()) == first
        True
    """
    py = state["python"]
    random.setstate(
        (int(py["version"]), tuple(int(v) for v in py["state"].cpu().tolist()), py["gauss"])
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint has {len(cuda)} CUDA RNG states, this machine "
                f"{torch.cuda.device_count()} devices: restoring the common ones",
                stacklevel=2,
            )
        for index, rng in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(rng.cpu(), index)
    if state.get("numpy") is not None:
        import numpy as np

        npy = state["numpy"]
        np.random.set_state(
            (
                npy["kind"],
                npy["keys"].cpu().numpy().astype("uint32"),
                npy["pos"],
                npy["has_gauss"],
                npy["cached_gaussian"],
            )
        )
