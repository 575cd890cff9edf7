"""gemv reference."""

import numpy as np

from gdn_tvm.reference.activations import silu
from gdn_tvm.reference.add_rmsnorm import rmsnorm
from gdn_tvm.reference.causal_conv1d_silu import causal_conv1d_silu
from gdn_tvm.reference.gated_rmsnorm import gated_rmsnorm


def gemv(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """w: [N, K], x: [B, K] -> y[:] = x @ w.T, [B, N]."""
    y[...] = x @ w.T


def gemv_swiglu(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """w: [2I, K] (gate rows, then up rows), x: [B, K] -> y[:] = silu(x @ w[:I].T) * (x @ w[I:].T), [B, I]."""
    gate, up = np.split(x @ w.T, 2, axis=1)
    y[...] = silu(gate) * up


def gemv_conv(
    w: np.ndarray, x: np.ndarray, conv_weight: np.ndarray, state: np.ndarray, slots: np.ndarray, y: np.ndarray
) -> None:
    """w: [N, K], x: [B, K]; conv_weight: [C, Kc]; state: [S, C, Kc-1], shifted in place; slots: [B] -> y: [B, N].

    gemv, then causal_conv1d_silu on its first C rows (lanes with slot -1 leave those rows and their state untouched).
    """
    proj = x @ w.T
    c = conv_weight.shape[0]
    y[:, c:] = proj[:, c:]
    causal_conv1d_silu(proj[:, :c], conv_weight, state, slots, y[:, :c])


def gemv_norm(
    w: np.ndarray, x: np.ndarray, z: np.ndarray, norm_weight: np.ndarray, y: np.ndarray, *, rms_norm_eps: float
) -> None:
    """w: [N, K]; x, z: [B, K] (K = Hv*Dv); norm_weight: [Dv] -> y[:] = gated_rmsnorm(x, z, norm_weight) @ w.T."""
    heads = (x.shape[0], -1, norm_weight.shape[0])
    normed = np.empty(x.shape).reshape(heads)
    gated_rmsnorm(x.reshape(heads), z.reshape(heads), norm_weight, normed, rms_norm_eps=rms_norm_eps)
    y[...] = normed.reshape(x.shape) @ w.T


def gemv_rmsnorm(w: np.ndarray, x: np.ndarray, norm_weight: np.ndarray, y: np.ndarray, *, rms_norm_eps: float) -> None:
    """w: [N, K]; x: [B, K] (the residual stream); norm_weight: [K] (zero-centred) -> y[:] = rmsnorm(x) @ w.T."""
    y[...] = _normed(x, norm_weight, rms_norm_eps) @ w.T


def gemv_rmsnorm_conv(
    w: np.ndarray,
    x: np.ndarray,
    norm_weight: np.ndarray,
    conv_weight: np.ndarray,
    state: np.ndarray,
    slots: np.ndarray,
    y: np.ndarray,
    *,
    rms_norm_eps: float,
) -> None:
    """`gemv_conv` of rmsnorm(x) (norm_weight: [K], zero-centred)."""
    gemv_conv(w, _normed(x, norm_weight, rms_norm_eps), conv_weight, state, slots, y)


def gemv_rmsnorm_swiglu(
    w: np.ndarray, x: np.ndarray, norm_weight: np.ndarray, y: np.ndarray, *, rms_norm_eps: float
) -> None:
    """`gemv_swiglu` of rmsnorm(x) (norm_weight: [K], zero-centred)."""
    gemv_swiglu(w, _normed(x, norm_weight, rms_norm_eps), y)


def gemv_residual(w: np.ndarray, x: np.ndarray, residual: np.ndarray) -> None:
    """w: [N, K], x: [B, K]; residual: [B, N], in place: residual += x @ w.T."""
    residual += x @ w.T


def gemv_norm_residual(
    w: np.ndarray, x: np.ndarray, z: np.ndarray, norm_weight: np.ndarray, residual: np.ndarray, *, rms_norm_eps: float
) -> None:
    """`gemv_norm` added into residual: [B, N] in place."""
    y = np.empty(residual.shape)
    gemv_norm(w, x, z, norm_weight, y, rms_norm_eps=rms_norm_eps)
    residual += y


def _normed(x: np.ndarray, norm_weight: np.ndarray, eps: float) -> np.ndarray:
    normed = np.empty(x.shape)
    rmsnorm(x, norm_weight, normed, rms_norm_eps=eps)
    return normed
