"""Which optimizers a step can be skipped for exactly, on the device, and which are refused.

:class:`~trainopt.stability.stabilizer.TrainingStabilizer` calls :func:`check_skippable` when it
is built. It refuses, with an error that names the optimizer and what to use instead, every
configuration whose skipped step would either corrupt the optimizer state or need the skip flag
on the host (a sync every step):

- ``LBFGS`` evaluates the loss several times per step through a closure;
- ``SparseAdam`` needs sparse gradients, while the stabilizer measures and clips dense ones;
- ``SGD`` with momentum and ``dampening != 0`` starts its momentum buffer at the first gradient,
  undamped: after a skipped first step no buffer value reproduces that, short of reading the flag;
- a non-fused optimizer with state on another device than its parameters, where torch offers no
  ``capturable`` form to keep it there (``Adagrad`` without ``fused=True`` on a GPU keeps its
  step counters on the CPU): masking them copies the flag to the host. Where torch offers one
  (``Adam``, ``AdamW``, ``NAdam``, ``RAdam``, ``Adamax``, ``ASGD``, ``Rprop``, ``Adadelta``,
  ``RMSprop``), :func:`keep_state_on_device` turns ``capturable=True`` on first: a bare
  ``torch.optim.AdamW(params)`` on CUDA (``foreach`` with CPU step counters, whose every step
  reads each counter on the host) is then stepped with its counters on the GPU, which torch's
  capturable path updates without a host read;
- on a GPU, an optimizer whose own step synchronises (``Adafactor`` reads norms with
  ``.item()``; ``ASGD`` and ``Rprop`` without ``capturable=True``): found by running one step of
  a twin optimizer on a two-element parameter under ``torch.cuda.set_sync_debug_mode("error")``.

:func:`check_no_step_hooks` refuses an optimizer with step hooks (``register_step_pre_hook``,
``register_step_post_hook``, or torch's global ones): a skipped step still calls ``step()``, so
a hook would see an update that is then undone.

Everything else in ``torch.optim`` is skipped exactly: fused optimizers inside their kernel
(:func:`~trainopt.stability.skipping.step.fused_step`), the others by
:func:`~trainopt.stability.skipping.step.masked_step`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

__all__ = [
    "UnsupportedOptimizerError",
    "check_no_step_hooks",
    "check_skippable",
    "keep_state_on_device",
    "skips_in_kernel",
]


class UnsupportedOptimizerError(ValueError):
    """An optimizer whose step cannot be skipped exactly without a host sync.

    Example:
        >>> import torch
        >>> from trainopt.stability import UnsupportedOptimizerError
        >>> from trainopt.stability.skipping.optimizers import check_skippable
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> try:
        ...     check_skippable(torch.optim.LBFGS([w]))
        ... except UnsupportedOptimizerError as error:
        ...     print(str(error).split(":")[0])
        LBFGS cannot be stabilized
    """


def skips_in_kernel(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer takes ``found_inf`` and skips inside its kernel (``fused=True``).

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.optimizers import skips_in_kernel
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> fused, plain = torch.optim.AdamW([w], fused=True), torch.optim.AdamW([w])
        >>> skips_in_kernel(fused), skips_in_kernel(plain)
        (True, False)
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def keep_state_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Turn ``capturable=True`` on where torch offers it and the parameters are not on the CPU.

    Without it the step counters of ``Adam``-style optimizers live on the CPU while the
    parameters are on a GPU (what a bare constructor gives): a skipped step could only be undone
    by reading the skip flag on the host. With it torch keeps them on the parameters' device and
    computes the bias corrections there. Counters already made move to the device. Returns
    whether a group changed (never on a CPU, never for a ``fused=True`` group).

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.optimizers import keep_state_on_device
        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
        >>> keep_state_on_device(opt), opt.param_groups[0]["capturable"]  # a CPU: nothing to do
        (False, False)
    """
    changed = False
    for group in optimizer.param_groups:
        if "capturable" not in group or group["capturable"] or group.get("fused"):
            continue
        if all(p.device.type == "cpu" for p in group["params"]):
            continue
        group["capturable"] = changed = True
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if torch.is_tensor(state.get("step")) and state["step"].device != p.device:
                state["step"] = state["step"].to(p.device)
    if changed and "capturable" in optimizer.defaults:
        optimizer.defaults["capturable"] = True
    return changed


def _refuse(optimizer: torch.optim.Optimizer, why: str, instead: str) -> UnsupportedOptimizerError:
    return UnsupportedOptimizerError(
        f"{type(optimizer).__name__} cannot be stabilized: {why}; {instead}"
    )


@contextlib.contextmanager
def _sync_errors(device: torch.device) -> Iterator[None]:
    """Raise on any host sync inside the block, on a CUDA device (a CPU has nothing to sync)."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _twin(
    optimizer: torch.optim.Optimizer, group: dict
) -> tuple[torch.optim.Optimizer, torch.Tensor] | None:
    """The same optimizer class and settings over a small parameter like the group's first."""
    first = group["params"][0]
    names = inspect.signature(type(optimizer).__init__).parameters
    settings = {k: v for k, v in group.items() if k in names and k not in ("params", "self")}
    probe = torch.nn.Parameter(
        torch.zeros((2,) * first.ndim, dtype=first.dtype, device=first.device)
    )
    try:
        return type(optimizer)([probe], **settings), probe
    except Exception:  # a custom optimizer that needs more than its groups hold: nothing to learn
        return None


def _check_group_on_its_device(optimizer: torch.optim.Optimizer, group: dict, fused: bool) -> None:
    twin = _twin(optimizer, group)
    if twin is None:
        return
    opt, probe = twin
    probe.grad = torch.full_like(probe, 1e-3)
    try:
        with _sync_errors(probe.device):
            opt.step()
    except RuntimeError as exc:
        if "synchroniz" not in str(exc):
            raise
        raise _refuse(
            optimizer,
            f"its own step synchronises the host with the device on {probe.device}",
            "pass capturable=True or fused=True where it offers them, or use "
            "torch.optim.AdamW(..., fused=True)",
        ) from exc
    for key, value in opt.state[probe].items():
        if not torch.is_tensor(value):
            raise _refuse(
                optimizer,
                f"its state {key!r} is a Python {type(value).__name__}, which no "
                "device flag can restore",
                "use an optimizer whose state is tensors",
            )
        if not fused and value.device != probe.device:
            raise _refuse(
                optimizer,
                f"its state {key!r} lives on {value.device} while the parameters "
                f"are on {probe.device}, so undoing a skipped step reads the flag on the host",
                f"pass fused=True or capturable=True to {type(optimizer).__name__}",
            )


def check_skippable(optimizer: torch.optim.Optimizer) -> None:
    """Raise :class:`UnsupportedOptimizerError` unless a step can be skipped exactly without a sync.

    See the module notes for what is refused and why. The error names the optimizer and a
    supported alternative.

    Example:
        >>> import torch
        >>> from trainopt.stability import UnsupportedOptimizerError
        >>> from trainopt.stability.skipping.optimizers import check_skippable
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> check_skippable(torch.optim.NAdam([w]))  # fine: nothing raised
        >>> try:
        ...     check_skippable(torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.1))
        ... except UnsupportedOptimizerError as error:
        ...     print(str(error).split("; ")[-1])
        use dampening=0 (torch's default), or another optimizer
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise _refuse(
            optimizer,
            "it evaluates the loss several times per step through a closure",
            "use it without the stabilizer, or use torch.optim.AdamW(..., fused=True)",
        )
    if isinstance(optimizer, torch.optim.SparseAdam):
        raise _refuse(
            optimizer,
            "it needs sparse gradients, and the stabilizer measures and clips dense ones",
            "use torch.optim.Adam with dense gradients",
        )
    fused = skips_in_kernel(optimizer)
    for index, group in enumerate(optimizer.param_groups):
        if (
            isinstance(optimizer, torch.optim.SGD)
            and group.get("momentum", 0)
            and group.get("dampening", 0)
        ):
            raise _refuse(
                optimizer,
                f"param_groups[{index}] has momentum and dampening={group['dampening']}: torch "
                "starts the momentum buffer at the first gradient, undamped, and after a skipped "
                "first step no buffer value gives that without reading the skip flag on the host",
                "use dampening=0 (torch's default), or another optimizer",
            )
        if group["params"]:
            _check_group_on_its_device(optimizer, group, fused)


def _step_hooks(optimizer: torch.optim.Optimizer) -> list[tuple[str, object]]:
    from torch.optim import optimizer as torch_optimizer

    tables = (
        ("pre hook of this optimizer", getattr(optimizer, "_optimizer_step_pre_hooks", {})),
        ("post hook of this optimizer", getattr(optimizer, "_optimizer_step_post_hooks", {})),
        ("global pre hook", torch_optimizer._global_optimizer_pre_hooks),
        ("global post hook", torch_optimizer._global_optimizer_post_hooks),
    )
    return [(kind, hook) for kind, hooks in tables for hook in hooks.values()]


def check_no_step_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Raise :class:`UnsupportedOptimizerError` if a step hook would see a skipped step.

    A skipped step runs ``optimizer.step()`` and undoes it
    (:func:`~trainopt.stability.skipping.step.masked_step`), or runs a fused kernel that does
    nothing (:func:`~trainopt.stability.skipping.step.fused_step`): either way the hooks run as for
    an applied step. An EMA kept by a post hook would average an update that was undone, or count a
    step that never happened. The error names each hook (its
    ``__qualname__``), and says whether it is a pre or post hook, of this optimizer
    (``register_step_pre_hook``/``register_step_post_hook``) or global
    (``torch.optim.optimizer.register_optimizer_step_pre_hook``/``..._post_hook``). The check reads
    four dict lengths when there are no hooks: it is cheap enough for every step.

    Example:
        >>> import torch
        >>> from trainopt.stability import UnsupportedOptimizerError
        >>> from trainopt.stability.skipping.optimizers import check_no_step_hooks
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt = torch.optim.AdamW([w])
        >>> check_no_step_hooks(opt)  # fine: no hooks
        >>> def update_ema(optimizer, args, kwargs):
        ...     pass
        >>> handle = opt.register_step_post_hook(update_ema)
        >>> try:
        ...     check_no_step_hooks(opt)
        ... except UnsupportedOptimizerError as error:
        ...     handle.remove()
        ...     print(str(error).split(": ")[2].split(";")[0])
        post hook of this optimizer update_ema
    """
    from torch.optim import optimizer as torch_optimizer

    if not (
        getattr(optimizer, "_optimizer_step_pre_hooks", None)
        or torch_optimizer._global_optimizer_pre_hooks
        or getattr(optimizer, "_optimizer_step_post_hooks", None)
        or torch_optimizer._global_optimizer_post_hooks
    ):
        return
    named = ", ".join(
        f"{kind} {getattr(hook, '__qualname__', None) or repr(hook)}"
        for kind, hook in _step_hooks(optimizer)
    )
    raise _refuse(
        optimizer,
        f"it has optimizer step hooks, which would run on skipped steps too: {named}",
        "remove them (handle.remove()); for an EMA or SWA of the weights, pass a "
        "torch.optim.swa_utils.AveragedModel to the stabilizer's averaged= (or call "
        "trainopt.stability.skipping.averaging.masked_update_parameters), which leaves it "
        "unchanged on skipped steps",
    )
