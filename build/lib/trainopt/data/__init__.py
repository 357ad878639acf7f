"""Files the pages load, shipped inside the package: example configs and recorded runs.

A copied example finds them wherever it runs, through :func:`path`:

- ``scheduler_cosine.yaml``, ``scheduler_custom.yaml``: training configs of the learning-rate page;
- ``hpo_digits.yaml``: the tuning config of the hyperparameter page;
- ``hpo_trainer.yaml``: the config that tunes a Hugging Face ``Trainer`` run (the trainer page);
- ``runs/<fault>.jsonl``: the recorded runs of the troubleshooting page;
- ``digits.npz``: the 1,797 8×8 hand-written digits (UCI ML hand-written digits, Alpaydin and
  Kaynak 1998, CC BY 4.0; the copy scikit-learn bundles as ``load_digits``), as ``images``
  (uint8, 0 to 16, one row of 64 pixels per sample) and ``target`` (uint8): the pages' data set,
  with nothing to install.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["path", "names"]


def names() -> list[str]:
    """Every file shipped in ``trainopt.data``, as the names :func:`path` takes, sorted.

    Example:
        >>> from trainopt.data import names
        >>> "hpo_digits.yaml" in names(), "runs/healthy.jsonl" in names()
        (True, True)
    """
    root = resources.files(__name__)
    found: list[str] = []
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir():
                stack.append((entry, f"{prefix}{entry.name}/"))
            else:
                found.append(prefix + entry.name)
    return sorted(found)


def path(name: str) -> Path:
    """The path of a shipped file, e.g. ``path("scheduler_cosine.yaml")`` or ``path("runs")``.

    Raises:
        FileNotFoundError: ``name`` is not shipped; the message lists what is.

    Example:
        >>> from trainopt.data import path
        >>> path("scheduler_cosine.yaml").name
        'scheduler_cosine.yaml'
        >>> path("runs").is_dir()
        True
    """
    target = resources.files(__name__).joinpath(name)
    if not (target.is_file() or target.is_dir()):
        raise FileNotFoundError(
            f"name: {name!r} is not shipped with trainopt; available: {names()}"
        )
    return Path(str(target))
