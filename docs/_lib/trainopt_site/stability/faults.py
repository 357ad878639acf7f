"""Fault injection on a real training run: does the stability stack survive what breaks runs?

:func:`run_fault_injection` trains the digits MLP (:mod:`trainopt.models`) twice with the same
data order and seed: once clean, once with faults injected at chosen steps, both through a
:class:`~trainopt.stability.stabilizer.TrainingStabilizer` with a
:class:`~trainopt.stability.recovery.rollback.TrainingRecovery`
and a :class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager`. The faults:

=====================  =====================================================================
``nan_gradients``      one parameter's gradient becomes NaN (the loss stays finite)
``inf_loss``           the loss is multiplied by inf (so are all gradients)
``gradient_spike``     every gradient is 1000 times too large (the loss stays normal)
``loss_spike``         a corrupt batch: every label is wrong, the loss jumps
``diverged_weights``   the weights are knocked far off (a bad update that got through):
                       the loss stays high until something restores them
=====================  =====================================================================

The first four are single bad steps: the stabilizer skips them on the device and they never
reach the weights. The last one needs a rollback: the loss stays high, so the window that holds
it is not saved, and at a ``check_every`` boundary the median of the recent losses lies above
every loss of the last stable window: the recovery reloads the last good checkpoint and halves
the learning rate. Both runs finish; the result says what happened to each fault,
whether any weight or optimizer state became non-finite, and how far the final validation loss
of the faulty run is from the clean one.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainopt.config.cli import ArgumentParser, output_file, positive_int, run_command
from trainopt.models import digits_data, digits_mlp
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.recovery.rollback import TrainingRecovery
from trainopt.stability.stabilizer import TrainingStabilizer

DEFAULT_FAULTS: dict[str, int] = {
    "nan_gradients": 40,
    "inf_loss": 60,
    "gradient_spike": 80,
    "loss_spike": 100,
    "diverged_weights": 123,
}
EXPECTED = {
    "nan_gradients": "step skipped",
    "inf_loss": "step skipped",
    "gradient_spike": "step skipped",
    "loss_spike": "step skipped",
    "diverged_weights": "rolled back",
}


def _batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x) - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield x[idx], y[idx]


def _all_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    tensors = [p.detach() for p in model.parameters()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _train(
    faults: Mapping[str, int],
    steps: int,
    check_every: int,
    lr: float,
    batch_size: int,
    seed: int,
    save_dir: str,
) -> dict[str, Any]:
    from trainopt.stability.checkpointing.checkpoint import CheckpointManager

    x_train, y_train, x_val, y_val = digits_data(seed=seed)
    model = digits_mlp(seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)
    scheduler = cosine_annealing_schedule(
        optimizer, total_steps=steps, warmup_steps=steps // 10, min_lr=lr / 10
    )
    manager = CheckpointManager(save_dir, save_every=check_every, keep_last=3)
    recovery = TrainingRecovery(
        model, optimizer, manager, scheduler=scheduler, lr_factor=0.5, max_rollbacks=3
    )
    stabilizer = TrainingStabilizer(
        model, optimizer, scheduler, max_grad_norm=1.0, check_every=check_every, recovery=recovery
    )
    by_call = {call: name for name, call in faults.items()}
    observed: dict[str, dict[str, Any]] = {}
    batches = _batches(x_train, y_train, batch_size, seed)
    curve: list[torch.Tensor] = []
    call = 0
    while stabilizer.steps < steps:
        xb, yb = next(batches)
        fault = by_call.get(call)
        handles = []
        loss_factor = 1.0
        if fault == "nan_gradients":
            handles.append(model[0].weight.register_hook(lambda g: g * math.nan))
        elif fault == "gradient_spike":
            handles += [p.register_hook(lambda g: g * 1000.0) for p in model.parameters()]
        elif fault == "inf_loss":
            loss_factor = math.inf
        elif fault == "loss_spike":
            yb = (yb + 1) % 10
        skipped_before = int(stabilizer.skipped) + stabilizer.skip_events
        recoveries_before = recovery.recovery_attempts
        loss = stabilizer.step(lambda: F.cross_entropy(model(xb), yb) * loss_factor)
        curve.append(loss.float())
        for handle in handles:
            handle.remove()
        if fault == "diverged_weights":
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.5)
        if fault is not None:
            observed[fault] = {
                "step": stabilizer.steps - 1,
                "call": call,
                "skipped": int(stabilizer.skipped) + stabilizer.skip_events > skipped_before,
                "finite_after": _all_finite(model, optimizer),
                "recoveries_before": recoveries_before,
            }
        call += 1
    with torch.no_grad():
        logits = model(x_val)
        val_loss = F.cross_entropy(logits, y_val).item()
        val_acc = (logits.argmax(-1) == y_val).float().mean().item()
    return {
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "calls": call,
        "skipped_steps": stabilizer.skip_events + int(stabilizer.skipped),
        "recoveries": list(recovery.history),
        "observed": observed,
        "finite": _all_finite(model, optimizer),
        "lr_scale": recovery.lr_scale,
        "loss_curve": [x if math.isfinite(x) else None for x in torch.stack(curve).tolist()],
    }


def run_fault_injection(
    faults: Mapping[str, int] | None = None,
    steps: int = 200,
    check_every: int = 10,
    lr: float = 3e-3,
    batch_size: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Train the digits MLP clean and with injected faults; report what each fault did.

    Args:
        faults: ``{fault name: call index}`` (see the module notes); defaults to one of each.
        steps: Applied optimizer steps each run trains for.
        check_every: The stabilizer's boundary interval (and the checkpoint interval).
        lr: Peak learning rate of the cosine schedule (AdamW).
        batch_size: Batch size.
        seed: Seed of the model, the data split and the batch order (shared by both runs).

    Returns:
        ``{"clean": ..., "faulty": ..., "rows": [...], "final_loss_gap": ...}``; each row has
        ``fault``, ``step``, ``expected``, ``observed`` and ``survived``.

    Example:
        >>> from trainopt_site.stability.faults import run_fault_injection
        >>> result = run_fault_injection({"nan_gradients": 3, "diverged_weights": 23},
        ...                              steps=40, check_every=10)
        >>> for row in result["rows"]:
        ...     print(row["fault"], "|", row["observed"], "|", row["survived"])
        nan_gradients | step skipped | True
        diverged_weights | rolled back to step 20, learning rate × 0.5 | True
        >>> result["faulty"]["finite"], len(result["clean"]["loss_curve"])
        (True, 40)
    """
    faults = dict(DEFAULT_FAULTS if faults is None else faults)
    unknown = sorted(set(faults) - set(EXPECTED))
    if unknown:
        raise ValueError(f"faults must be among {sorted(EXPECTED)}, got {unknown}")
    with tempfile.TemporaryDirectory() as clean_dir, tempfile.TemporaryDirectory() as faulty_dir:
        clean = _train({}, steps, check_every, lr, batch_size, seed, clean_dir)
        faulty = _train(faults, steps, check_every, lr, batch_size, seed, faulty_dir)
    rows = []
    for name, call in sorted(faults.items(), key=lambda item: item[1]):
        seen = faulty["observed"].get(name, {})
        if name == "diverged_weights":
            after = faulty["recoveries"][seen.get("recoveries_before", 0) :]
            observed = (
                f"rolled back to step {after[0]['restored_step']}, "
                f"learning rate × {after[0]['lr_scale']:g}"
                if after
                else "not rolled back"
            )
            survived = bool(after)
        else:
            observed = "step skipped" if seen.get("skipped") else "step applied"
            survived = bool(seen.get("skipped")) and bool(seen.get("finite_after"))
        rows.append(
            {
                "fault": name,
                "step": seen.get("step", call),
                "expected": EXPECTED[name],
                "observed": observed,
                "survived": survived and faulty["finite"],
            }
        )
    gap = faulty["val_loss"] / clean["val_loss"] - 1.0
    return {
        "clean": clean,
        "faulty": faulty,
        "rows": rows,
        "final_loss_gap": gap,
        "config": {
            "steps": steps,
            "check_every": check_every,
            "lr": lr,
            "batch_size": batch_size,
            "seed": seed,
            "model": "digits_mlp(hidden=128, depth=2)",
            "optimizer": "AdamW(fused=True)",
        },
    }


def fault_injection_table(path: str | Path) -> str:
    """The table of faults injected vs survived, as MyST Markdown, from a result JSON file.

    The file is what ``python -m trainopt_site.stability.faults --out <path>`` writes (the page's
    table is built from it at build time; a test reruns the experiment and compares).

    Example:
        >>> import json
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.stability.faults import fault_injection_table
        >>> result = {"rows": [{"fault": "nan_gradients", "step": 40, "expected": "step skipped",
        ...                     "observed": "step skipped", "survived": True}],
        ...           "clean": {"val_loss": 0.1, "val_accuracy": 0.97},
        ...           "faulty": {"val_loss": 0.102, "val_accuracy": 0.97, "finite": True,
        ...                      "skipped_steps": 1, "recoveries": []}, "final_loss_gap": 0.02}
        >>> path = Path(tempfile.mkdtemp()) / "fault_injection.json"
        >>> _ = path.write_text(json.dumps(result))
        >>> print(fault_injection_table(path).splitlines()[2])
        | `nan_gradients` | 40 | step skipped | step skipped | yes |
    """
    if not Path(path).exists():
        return (
            "*Not recorded yet.* Run `python -m trainopt_site.stability.faults --out "
            "docs/_data/stability_fault_injection.json` to write the table.\n"
        )
    result = json.loads(Path(path).read_text())
    lines = [
        "| fault | step | expected | observed | survived |",
        "| --- | ---: | --- | --- | :---: |",
    ]
    for row in result["rows"]:
        lines.append(
            f"| `{row['fault']}` | {row['step']} | {row['expected']} | {row['observed']} | "
            f"{'yes' if row['survived'] else '**no**'} |"
        )
    clean, faulty = result["clean"], result["faulty"]
    lines += [
        "",
        f"Final validation loss: clean run {clean['val_loss']:.4f} "
        f"(accuracy {clean['val_accuracy']:.1%}), "
        f"faulty run {faulty['val_loss']:.4f} (accuracy {faulty['val_accuracy']:.1%}): a gap of "
        f"{result['final_loss_gap']:+.1%}. Weights and optimizer state finite at the end: "
        f"{'yes' if faulty['finite'] else '**no**'}. Steps skipped: {faulty['skipped_steps']}; "
        f"rollbacks: {len(faulty['recoveries'])}.",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> ArgumentParser:
    """The command line of ``python -m trainopt_site.stability.faults``.

    Example:
        >>> from trainopt_site.stability.faults import build_parser
        >>> args = build_parser().parse_args(["--out", "faults.json", "--steps", "50"])
        >>> args.out, args.steps
        (PosixPath('faults.json'), 50)
        >>> build_parser().parse_args(["--out", "faults.json"]).steps
        200
    """
    parser = ArgumentParser(
        prog="python -m trainopt_site.stability.faults",
        description="Train the digits MLP clean and with injected faults; write JSON.",
    )
    parser.add_argument("--out", type=output_file, required=True, help="JSON file to write")
    parser.add_argument(
        "--steps", type=positive_int, default=200, help="training steps of each run (default 200)"
    )
    return parser


def fault_injection_figure(path: str | Path) -> Any:
    """Training loss per batch of the clean and the faulty run, with the faults marked.

    Example:
        >>> import json
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.stability.faults import fault_injection_figure
        >>> result = {"clean": {"loss_curve": [2.0, 1.0, 0.5]},
        ...           "faulty": {"loss_curve": [2.0, None, 0.6], "recoveries": [],
        ...                      "observed": {"inf_loss": {"call": 1}}}}
        >>> path = Path(tempfile.mkdtemp()) / "fault_injection.json"
        >>> _ = path.write_text(json.dumps(result))
        >>> len(fault_injection_figure(path).axes[0].lines) >= 2
        True
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    if not Path(path).exists():
        ax.text(0.5, 0.5, "not recorded yet", ha="center", va="center", transform=ax.transAxes)
        return fig
    result = json.loads(Path(path).read_text())
    for name, style in (
        ("clean", dict(color="0.55", lw=1.0)),
        ("faulty", dict(color="C0", lw=1.0)),
    ):
        curve = [math.nan if v is None else v for v in result[name]["loss_curve"]]
        ax.plot(range(len(curve)), curve, label=f"{name} run", **style)
    for i, (fault, seen) in enumerate(
        sorted(result["faulty"]["observed"].items(), key=lambda kv: kv[1]["call"])
    ):
        ax.axvline(seen["call"], color=f"C{i + 1}", ls="--", lw=0.9, label=fault.replace("_", " "))
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("training loss (log)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return fig


def main(argv: list[str] | None = None) -> int:
    """Run the experiment, write the JSON, print the table; exit 1 if a fault was not survived.

    Example:
        >>> import json
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.stability.faults import main
        >>> import contextlib, io
        >>> out = Path(tempfile.mkdtemp()) / "faults.json"
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     # ends before the first fault (call 40)
        ...     code = main(["--out", str(out), "--steps", "20"])
        >>> code, [row["survived"] for row in json.loads(out.read_text())["rows"]]
        (1, [False, False, False, False, False])
        >>> print(printed.getvalue().splitlines()[2])
        | `nan_gradients` | 40 | step skipped | step applied | **no** |
    """
    args = build_parser().parse_args(argv)
    result = run_fault_injection(steps=args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(fault_injection_table(args.out), end="")
    return 0 if all(row["survived"] for row in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(run_command(main))
