"""Unit-wise adaptive gradient clipping (AGC, Brock et al. 2021): each unit against its own
weights."""

from __future__ import annotations

import torch

from trainopt.stability.clipping.norms import Parameters, _params, _positive_float

__all__ = ["adaptive_clip_grad_"]


def _unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm per output unit (dim 0) for matrices and kernels; whole norm for vectors."""
    if x.ndim <= 1:
        return torch.linalg.vector_norm(x, 2)
    return torch.linalg.vector_norm(x, 2, dim=tuple(range(1, x.ndim)), keepdim=True)


@torch.no_grad()
def adaptive_clip_grad_(
    parameters: Parameters, clip_factor: float = 0.01, eps: float = 1e-3
) -> None:
    """Unit-wise adaptive gradient clipping (AGC, Brock et al. 2021), in place.

    For each output unit :math:`i` of a weight :math:`W` (a row of a linear layer, a filter of
    a convolution; a bias or gain counts as one unit) with gradient :math:`G_i`:

    .. math::  G_i \\leftarrow G_i \\cdot \\frac{\\lambda \\max(\\lVert W_i \\rVert, \\epsilon)}
               {\\lVert G_i \\rVert} \\quad\\text{if}\\quad
               \\lVert G_i \\rVert > \\lambda \\max(\\lVert W_i \\rVert, \\epsilon).

    It bounds the ratio :math:`\\lVert G_i \\rVert / \\lVert W_i \\rVert` of each unit's
    *gradient* to its weights, not the update: the optimizer turns the clipped gradient into an
    update (Adam rescales it, momentum adds history), so the update's ratio can be larger. The
    paper applies it to every layer except the final classifier; pass the parameters to clip
    accordingly. No host sync: the choice is a ``torch.where``.

    Args:
        parameters: A module, a tensor, or an iterable of tensors.
        clip_factor: :math:`\\lambda`, the largest gradient-to-weight norm ratio per unit.
        eps: :math:`\\epsilon`, keeps zero-initialised weights (biases) trainable.

    Example:
        >>> import torch
        >>> from trainopt.stability import adaptive_clip_grad_
        >>> w = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
        >>> w.grad = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> adaptive_clip_grad_([w], clip_factor=0.01)
        >>> w.grad   # row 0: 0.01 * 5 allowed; row 1: 0.01 * 1e-3 allowed
        tensor([[5.0000e-02, 0.0000e+00],
                [0.0000e+00, 1.0000e-05]])
    """
    clip_factor = _positive_float("clip_factor", clip_factor)
    eps = _positive_float("eps", eps)
    for p in _params(parameters):
        if p.grad is None:
            continue
        max_norm = _unitwise_norm(p.detach()).clamp_min(eps) * clip_factor
        grad_norm = _unitwise_norm(p.grad)
        scaled = p.grad * (max_norm / grad_norm.clamp_min(1e-6))
        p.grad.copy_(torch.where(grad_norm > max_norm, scaled, p.grad))
