"""An average of the weights (EMA, SWA) that leaves out skipped steps, decided on the device.

An EMA kept with an optimizer step hook sees every step, skipped ones included
(:func:`~trainopt.stability.skipping.optimizers.check_no_step_hooks` refuses such hooks). Update it
after the step instead, with the same skip flag: :func:`masked_update_parameters` is
``torch.optim.swa_utils.AveragedModel.update_parameters`` with the flag, which leaves the
average and its count bit for bit unchanged where the step was skipped. It also reads nothing
on the host: torch's own method does (``bool(self.n_averaged == 0)``), a sync per call on a GPU.
"""

from __future__ import annotations

import itertools

import torch
from torch.optim.swa_utils import AveragedModel, get_swa_avg_fn, get_swa_multi_avg_fn
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

__all__ = ["masked_update_parameters"]

# The devices on which torch's default average (SWA) runs a foreach kernel.
_FOREACH_DEVICES = ("cuda", "xpu", "mtia", "privateuseone")


class _Flag:
    """A 0-d bool tensor, copied once to each device that asks for it."""

    def __init__(self, flag: torch.Tensor) -> None:
        self.by_device = {flag.device: flag}

    def __call__(self, device: torch.device) -> torch.Tensor:
        if device not in self.by_device:
            self.by_device[device] = next(iter(self.by_device.values())).to(device)
        return self.by_device[device]


def _pairs(
    averaged: AveragedModel, model: torch.nn.Module
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(averaged tensor, model tensor on its device), in ``update_parameters``' order."""
    if averaged.use_buffers:
        mine = itertools.chain(averaged.module.parameters(), averaged.module.buffers())
        theirs = itertools.chain(model.parameters(), model.buffers())
    else:
        mine, theirs = averaged.parameters(), model.parameters()
    return [(a.detach(), m.detach().to(a.device)) for a, m in zip(mine, theirs)]


def _averages(
    averaged: AveragedModel,
    olds: list[torch.Tensor],
    models: list[torch.Tensor],
    count: torch.Tensor,
) -> list[torch.Tensor]:
    """What ``update_parameters`` makes of each averaged tensor once ``n_averaged > 0``, out of
    place."""
    if averaged.multi_avg_fn is None and averaged.avg_fn is not None:
        return [averaged.avg_fn(a, m, count.to(a.device)) for a, m in zip(olds, models)]
    news = [a.clone() for a in olds]
    groups = _group_tensors_by_device_and_dtype([news, models])  # aliases of news: updated in place
    for (device, dtype), ((mine, theirs), _) in groups.items():
        n = count.to(device)
        if averaged.multi_avg_fn is not None:
            averaged.multi_avg_fn(mine, theirs, n)
        elif device.type in _FOREACH_DEVICES and (dtype.is_floating_point or dtype.is_complex):
            # torch: _foreach_lerp_ with the weight 1 / (n + 1) as a Python number (a sync)
            weight = (1 / (n + 1)).to(dtype)
            for a, m in zip(mine, theirs):
                a.lerp_(m, weight)
        elif device.type in _FOREACH_DEVICES:
            get_swa_multi_avg_fn()(mine, theirs, n)
        else:
            average = get_swa_avg_fn()
            for a, m in zip(mine, theirs):
                a.copy_(average(a, m, n))
    return news


@torch.no_grad()
def masked_update_parameters(
    averaged: AveragedModel, model: torch.nn.Module, skip: torch.Tensor
) -> None:
    """``averaged.update_parameters(model)``, except where ``skip`` is true: then nothing changes.

    The update is torch's: the first one copies the model, the later ones apply the averaged
    model's ``multi_avg_fn`` or ``avg_fn`` (``get_ema_multi_avg_fn``, ``get_ema_avg_fn``, your
    own), or the running mean by default; with ``use_buffers=True`` the buffers are averaged too,
    else copied from the model. Where ``skip`` is true the averaged parameters, buffers and
    ``n_averaged`` keep their values bit for bit. The model's own buffers are another matter:
    a skipped step's forward pass moved them (BatchNorm's running statistics), and the next
    applied update would take them in; :class:`~trainopt.stability.skipping.buffers.BufferSnapshot`
    puts them back first (the stabilizer does, before it calls this). Everything is chosen on the
    device with ``torch.where`` (the first copy by ``n_averaged == 0``), so nothing is read on the
    host, as long as the averaging function reads nothing either (torch's do not). The price: the
    update is computed each call, into a copy of the averaged tensors, and ``avg_fn`` or
    ``multi_avg_fn`` also runs on the first call (its result is not used).

    ``n_averaged`` is moved to ``skip``'s device the first time (``AveragedModel`` makes it on
    the CPU unless given ``device=``), where counting needs no copy of the flag to the host. On a
    GPU the default running mean (no ``avg_fn``) is computed with a tensor weight rather than
    torch's Python number: bit for bit the same in float32 and float64.

    Args:
        averaged: The ``torch.optim.swa_utils.AveragedModel`` to update.
        model: The model being trained (the same architecture).
        skip: 0-d tensor, true (or non-zero) where this step was skipped: the flag given to
            :func:`~trainopt.stability.skipping.step.masked_step` or
            :func:`~trainopt.stability.skipping.step.fused_step`.

    Example:
        >>> import torch
        >>> from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        >>> from trainopt.stability.skipping.averaging import masked_update_parameters
        >>> model = torch.nn.Linear(2, 1)
        >>> ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        >>> masked_update_parameters(ema, model, torch.tensor(False))  # the first: a copy
        >>> with torch.no_grad():
        ...     _ = model.weight.add_(1.0)
        >>> before = ema.module.weight.clone()
        >>> masked_update_parameters(ema, model, torch.tensor(True))   # skipped: nothing changes
        >>> torch.equal(ema.module.weight, before), int(ema.n_averaged)
        (True, 1)
        >>> masked_update_parameters(ema, model, torch.tensor(False))  # applied: 0.9 old + 0.1 new
        >>> torch.allclose(ema.module.weight, before + 0.1), int(ema.n_averaged)
        (True, 2)
    """
    if not torch.is_tensor(skip) or skip.dim() != 0:
        raise ValueError(f"skip must be a 0-d tensor (the step's skip flag), got {skip!r}")
    keep = _Flag(skip if skip.dtype == torch.bool else skip != 0)
    if averaged.n_averaged.device != skip.device:
        averaged.n_averaged = averaged.n_averaged.to(skip.device)
    count = averaged.n_averaged
    first = _Flag(count == 0)
    pairs = _pairs(averaged, model)
    olds, models = [a for a, _ in pairs], [m for _, m in pairs]
    news = _averages(averaged, olds, models, count)
    for old, new_model, new in zip(olds, models, news):
        chosen = torch.where(first(old.device), new_model, new)
        old.copy_(torch.where(keep(old.device), old, chosen))
    if not averaged.use_buffers:
        for mine, theirs in zip(averaged.module.buffers(), model.buffers()):
            mine.copy_(torch.where(keep(mine.device), mine, theirs.detach().to(mine.device)))
    count.copy_(torch.where(keep(count.device), count, count + 1))
