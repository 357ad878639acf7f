"""Reference implementations of the update rules on the concepts page, written to be read.

Each optimizer is a pure function ``*_update(param, grad, state, ...) -> (new_param, new_state)``
over plain tensors: nothing is changed in place, and the state is a small frozen dataclass. The
tests check every rule against ``torch.optim`` over 100 steps. These are for reading and for
experiments on the concepts page; train with ``torch.optim``, which fuses the same maths.

- :func:`sgd_update` — SGD with momentum, dampening, Nesterov and L2 weight decay (torch's form).
- :func:`rmsprop_update` — RMSProp with smoothing ``alpha``, ``eps``, momentum and ``centered``.
- :func:`adam_update` — Adam with bias correction (switchable, to show what it does), L2 decay.
- :func:`adamw_update` — AdamW: Adam with decoupled weight decay.
- :func:`adam_step_size_factor` — how much uncorrected Adam mis-sizes step ``t``.
- :func:`clip_by_global_norm` — gradient clipping by the norm of all gradients together.
- :func:`scale_loss`, :func:`unscale_gradients`, :func:`next_loss_scale` — dynamic loss scaling.
- :func:`warmup_cosine_lr` — linear warm-up, then cosine decay to ``min_lr``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from trainopt.validation import check_int

# ---------------------------------------------------------------------------------------------
# Gradient descent and momentum
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SGDState:
    """Momentum buffer of one parameter (``None`` until the first step).

    Example:
        >>> from trainopt.concepts import SGDState
        >>> SGDState().momentum_buffer is None
        True
    """

    momentum_buffer: Tensor | None = None


def sgd_update(
    param: Tensor,
    grad: Tensor,
    state: SGDState,
    *,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> tuple[Tensor, SGDState]:
    """One step of SGD as ``torch.optim.SGD`` defines it.

    .. math::
        g_t = \\nabla L(\\theta_t) + \\lambda\\theta_t, \\quad
        b_t = \\mu b_{t-1} + (1-\\tau) g_t \\ (b_1 = g_1), \\quad
        \\theta_{t+1} = \\theta_t - \\eta\\,(g_t + \\mu b_t \\text{ if Nesterov else } b_t)

    Example:
        >>> import torch
        >>> from trainopt.concepts import SGDState
        >>> from trainopt.concepts import sgd_update
        >>> p, s = sgd_update(
        ...     torch.tensor([1.0]), torch.tensor([2.0]), SGDState(), lr=0.1, momentum=0.9
        ... )
        >>> p, s.momentum_buffer  # the first step has no history: b_1 = g_1
        (tensor([0.8000]), tensor([2.]))
    """
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError(
            f"nesterov needs momentum > 0 and dampening == 0, got {momentum=}, {dampening=}"
        )
    if weight_decay:
        grad = grad + weight_decay * param
    buffer = state.momentum_buffer
    if momentum:
        buffer = grad.clone() if buffer is None else momentum * buffer + (1 - dampening) * grad
        grad = grad + momentum * buffer if nesterov else buffer
    return param - lr * grad, SGDState(buffer)


# ---------------------------------------------------------------------------------------------
# RMSProp
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RMSPropState:
    """Running mean of squared gradients (and of gradients when centered), momentum buffer.

    Example:
        >>> import torch
        >>> from trainopt.concepts import RMSPropState
        >>> state = RMSPropState.zeros_like(torch.ones(3), centered=True)
        >>> state.square_avg, state.grad_avg is not None, state.momentum_buffer
        (tensor([0., 0., 0.]), True, None)
    """

    square_avg: Tensor
    grad_avg: Tensor | None = None
    momentum_buffer: Tensor | None = None

    @classmethod
    def zeros_like(
        cls, param: Tensor, centered: bool = False, momentum: float = 0.0
    ) -> RMSPropState:
        """A fresh state: zeros, as torch starts."""
        zeros = torch.zeros_like(param)
        return cls(
            zeros, zeros.clone() if centered else None, zeros.clone() if momentum > 0 else None
        )


def rmsprop_update(
    param: Tensor,
    grad: Tensor,
    state: RMSPropState,
    *,
    lr: float = 1e-2,
    alpha: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    centered: bool = False,
) -> tuple[Tensor, RMSPropState]:
    """One step of RMSProp as ``torch.optim.RMSprop`` defines it.

    .. math::
        v_t = \\alpha v_{t-1} + (1-\\alpha) g_t^2, \\quad
        \\theta_{t+1} = \\theta_t - \\eta\\, \\frac{g_t}{\\sqrt{v_t - \\bar g_t^2} + \\epsilon}

    where the ``centered`` variant subtracts the squared running mean ``ḡ_t`` (a variance, not a
    second moment), and with momentum the fraction accumulates in a buffer first.

    Example:
        >>> import torch
        >>> from trainopt.concepts import RMSPropState
        >>> from trainopt.concepts import rmsprop_update
        >>> p, s = rmsprop_update(torch.tensor([1.0]), torch.tensor([2.0]),
        ...                       RMSPropState.zeros_like(torch.tensor([1.0])), lr=0.01, alpha=0.99)
        >>> round(p.item(), 4)  # first step: g / sqrt(0.01 g^2) = 10, times lr
        0.9
    """
    if weight_decay:
        grad = grad + weight_decay * param
    square_avg = alpha * state.square_avg + (1 - alpha) * grad * grad
    grad_avg = None
    if centered:
        grad_avg = alpha * state.grad_avg + (1 - alpha) * grad
        denom = (square_avg - grad_avg * grad_avg).sqrt() + eps
    else:
        denom = square_avg.sqrt() + eps
    buffer = None
    if momentum > 0:
        buffer = momentum * state.momentum_buffer + grad / denom
        param = param - lr * buffer
    else:
        param = param - lr * grad / denom
    return param, RMSPropState(square_avg, grad_avg, buffer)


# ---------------------------------------------------------------------------------------------
# Adam and AdamW
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdamState:
    """Step count and the two moment estimates of one parameter.

    Example:
        >>> import torch
        >>> from trainopt.concepts import AdamState
        >>> state = AdamState.zeros_like(torch.ones(2))
        >>> state.step, state.exp_avg, state.exp_avg_sq
        (0, tensor([0., 0.]), tensor([0., 0.]))
    """

    step: int
    exp_avg: Tensor
    exp_avg_sq: Tensor

    @classmethod
    def zeros_like(cls, param: Tensor) -> AdamState:
        """A fresh state: step 0 and zero moments, as torch starts."""
        return cls(0, torch.zeros_like(param), torch.zeros_like(param))


def adam_update(
    param: Tensor,
    grad: Tensor,
    state: AdamState,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    bias_correction: bool = True,
) -> tuple[Tensor, AdamState]:
    """One step of Adam as ``torch.optim.Adam`` defines it (L2 weight decay added to the gradient).

    .. math::
        m_t = \\beta_1 m_{t-1} + (1-\\beta_1) g_t,
        \\quad v_t = \\beta_2 v_{t-1} + (1-\\beta_2) g_t^2,
        \\quad \\hat m_t = \\frac{m_t}{1-\\beta_1^t}, \\quad \\hat v_t = \\frac{v_t}{1-\\beta_2^t},
        \\quad \\theta_{t+1} = \\theta_t - \\eta \\frac{\\hat m_t}{\\sqrt{\\hat v_t} + \\epsilon}

    ``bias_correction=False`` uses ``m_t`` and ``v_t`` directly, so the concepts page can show
    what goes wrong without the correction.

    Example:
        >>> import torch
        >>> from trainopt.concepts import AdamState
        >>> from trainopt.concepts import adam_update
        >>> p, s = adam_update(torch.tensor([1.0]), torch.tensor([0.5]),
        ...                    AdamState.zeros_like(torch.tensor([1.0])), lr=0.1)
        >>> round(p.item(), 6), s.step  # the first corrected step moves lr * sign(g)
        (0.9, 1)
    """
    beta1, beta2 = betas
    if weight_decay:
        grad = grad + weight_decay * param
    step = state.step + 1
    exp_avg = beta1 * state.exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * state.exp_avg_sq + (1 - beta2) * grad * grad
    m_hat, v_hat = exp_avg, exp_avg_sq
    if bias_correction:
        m_hat = exp_avg / (1 - beta1**step)
        v_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * m_hat / (v_hat.sqrt() + eps)
    return param, AdamState(step, exp_avg, exp_avg_sq)


def adamw_update(
    param: Tensor,
    grad: Tensor,
    state: AdamState,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> tuple[Tensor, AdamState]:
    """One step of AdamW as ``torch.optim.AdamW`` defines it: decay the weights, then Adam.

    .. math::
        \\theta_{t+1} = (1 - \\eta\\lambda)\\,\\theta_t
        - \\eta \\frac{\\hat m_t}{\\sqrt{\\hat v_t} + \\epsilon}

    The decay never enters ``m`` or ``v``, so Adam's per-coordinate normalisation does not
    rescale it: every weight shrinks by the same factor ``1 - lr * weight_decay``.

    Example:
        >>> import torch
        >>> from trainopt.concepts import AdamState
        >>> from trainopt.concepts import adamw_update
        >>> p, _ = adamw_update(torch.tensor([2.0]), torch.tensor([0.0]),
        ...                     AdamState.zeros_like(torch.tensor([2.0])), lr=0.1, weight_decay=0.5)
        >>> p  # no gradient: pure decay, 2 * (1 - 0.1 * 0.5)
        tensor([1.9000])
    """
    decayed = param * (1 - lr * weight_decay)
    return adam_update(decayed, grad, state, lr=lr, betas=betas, eps=eps, weight_decay=0.0)


def adam_step_size_factor(
    step: int | Tensor, betas: tuple[float, float] = (0.9, 0.999)
) -> float | Tensor:
    """How many times larger uncorrected Adam's step ``t`` is than corrected Adam's, for a constant
    gradient.

    With a constant gradient ``g``, ``m_t = (1-β1^t) g`` and ``v_t = (1-β2^t) g²``, so the
    uncorrected step is ``(1-β1^t) / sqrt(1-β2^t)`` times the corrected one (which is ``lr``).

    Example:
        >>> from trainopt.concepts import adam_step_size_factor
        >>> round(adam_step_size_factor(1), 3), round(adam_step_size_factor(10_000), 3)
        (3.162, 1.0)
    """
    beta1, beta2 = betas
    if torch.is_tensor(step):
        return (1 - beta1**step) / torch.sqrt(1 - beta2**step)
    return (1 - beta1**step) / math.sqrt(1 - beta2**step)


# ---------------------------------------------------------------------------------------------
# Gradient clipping
# ---------------------------------------------------------------------------------------------


def clip_by_global_norm(
    grads: list[Tensor], max_norm: float, eps: float = 1e-6
) -> tuple[list[Tensor], Tensor]:
    """Scale all gradients by one factor so that their joint L2 norm is at most ``max_norm``.

    .. math::
        g \\leftarrow g \\cdot
        \\min\\left(1, \\frac{\\tau}{\\lVert g \\rVert_2 + \\varepsilon}\\right)

    Returns the clipped gradients and the norm *before* clipping, as
    ``torch.nn.utils.clip_grad_norm_`` does (its ``eps`` is also ``1e-6``). Clipping only ever
    shrinks: a small gradient comes back unchanged.

    Example:
        >>> import torch
        >>> from trainopt.concepts import clip_by_global_norm
        >>> grads = [torch.tensor([3.0]), torch.tensor([4.0])]
        >>> clipped, norm = clip_by_global_norm(grads, max_norm=1.0)
        >>> norm.item(), [round(g.item(), 3) for g in clipped]
        (5.0, [0.6, 0.8])
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm must be positive, got {max_norm=}")
    total_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (total_norm + eps), max=1.0)
    return [g * factor for g in grads], total_norm


# ---------------------------------------------------------------------------------------------
# Loss scaling
# ---------------------------------------------------------------------------------------------


def scale_loss(loss: Tensor, scale: float | Tensor) -> Tensor:
    """Multiply the loss by ``scale`` so that small fp16 gradients don't underflow to zero.

    Example:
        >>> import torch
        >>> from trainopt.concepts.rules import scale_loss
        >>> scale_loss(torch.tensor(0.5), 1024.0)
        tensor(512.)
    """
    return loss * scale


def unscale_gradients(grads: list[Tensor], scale: float | Tensor) -> tuple[list[Tensor], Tensor]:
    """Divide gradients by ``scale`` in float32 and report whether any is inf or NaN.

    Returns ``(unscaled, found_inf)``, ``found_inf`` a 0-d bool tensor (no host sync): the
    caller skips the optimizer step when it is true, as ``GradScaler.step`` does.

    Example:
        >>> import torch
        >>> from trainopt.concepts import unscale_gradients
        >>> scaled = [torch.tensor([2048.0], dtype=torch.float16)]
        >>> grads, found_inf = unscale_gradients(scaled, 1024.0)
        >>> grads[0], bool(found_inf)
        (tensor([2.]), False)
    """
    unscaled = [g.float() / scale for g in grads]
    finite = torch.stack([torch.isfinite(g).all() for g in unscaled]).all()
    return unscaled, ~finite


def next_loss_scale(
    scale: float,
    growth_tracker: int,
    found_inf: bool,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """The dynamic loss-scale rule of ``torch.amp.GradScaler.update``.

    On an overflow, multiply the scale by ``backoff_factor`` at once and restart the count of
    clean steps; after ``growth_interval`` clean steps in a row, multiply it by
    ``growth_factor``. Returns ``(scale, growth_tracker)``.

    Example:
        >>> from trainopt.concepts import next_loss_scale
        >>> next_loss_scale(1024.0, 5, found_inf=True)
        (512.0, 0)
        >>> next_loss_scale(1024.0, 1999, found_inf=False)
        (2048.0, 0)
    """
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker + 1 == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker + 1


# ---------------------------------------------------------------------------------------------
# Warm-up and decay
# ---------------------------------------------------------------------------------------------


def warmup_cosine_lr(
    step: int, *, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0
) -> float:
    """Learning rate at ``step``: linear warm-up to ``max_lr``, cosine decay to ``min_lr``, then
    hold.

    .. math::
        \\eta_t = \\begin{cases}
            \\eta_{\\max}\\, t / T_w & t < T_w \\\\
            \\eta_{\\min} + \\tfrac12(\\eta_{\\max}-\\eta_{\\min})
            \\left(1 + \\cos\\pi\\frac{t-T_w}{T-T_w}\\right) & T_w \\le t \\le T \\\\
            \\eta_{\\min} & t > T
        \\end{cases}

    Example:
        >>> from trainopt.concepts import warmup_cosine_lr
        >>> [round(warmup_cosine_lr(t, max_lr=1.0, warmup_steps=10, total_steps=110), 3)
        ...  for t in (0, 5, 10, 60, 110, 500)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """
    check_int("warmup_steps", warmup_steps, 0)
    if not isinstance(total_steps, int) or total_steps <= warmup_steps:
        raise ValueError(
            f"total_steps must be an int > warmup_steps, got {total_steps=}, {warmup_steps=}"
        )
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
