"""PyTorch implementations of the registry ops, the same-run baseline of the benchmark (graph-replayed there: a call
copies nothing from the host once it has run once).

Each takes the kernel's argument names as torch CUDA tensors (every lane active; `seq_len` is the host-side
attention length) and writes its outputs and states in place, like the kernel. Weights, caches and states come in
their storage dtypes; bf16 ones are widened by type promotion and stored states rounded to their dtype, except in
the matmuls engines run in bf16, which take their activations in bf16 (`activation_dtype`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


def causal_conv1d_silu(model, x, weight, state, slots, y, **_):
    idx = slots.long()
    window = torch.cat([state[idx], x[:, :, None]], dim=-1)
    y.copy_(F.silu((window * weight).sum(-1)))
    state[idx] = window[:, :, 1:]


def per_head_l2_norm(model, qkv, qk, **_):
    x = qkv[:, : qk.shape[1] * qk.shape[2]].reshape(qk.shape)
    qk.copy_(x * torch.rsqrt((x * x).sum(-1, keepdim=True) + model.l2_norm_eps))


def gates(model, a, b, A, dt_bias, g, beta, **_):
    g.copy_(F.softplus(a + dt_bias, threshold=20.0) * A)
    beta.copy_(torch.sigmoid(b))


def delta_rule(model, qk, qkv, g, beta, state, slots, o, **_):
    hk, hv, dk, dv = model.n_k_heads, model.n_v_heads, model.head_k_dim, model.head_v_dim
    idx = slots.long()
    heads = _key_heads(model, qk.device)
    q, k = qk[:, :hk][:, heads], qk[:, hk:][:, heads]  # [B, Hv, Dk]
    v = qkv[:, 2 * hk * dk :].reshape(-1, hv, dv)
    s = state[idx] * torch.exp(g)[..., None, None]
    d = beta[..., None] * (v - torch.einsum("bhij,bhj->bhi", s, k))
    s = s + d[..., :, None] * k[..., None, :]
    o.copy_(torch.einsum("bhij,bhj->bhi", s, q) / math.sqrt(dk))
    state[idx] = s.to(state.dtype)


@functools.cache
def _key_heads(model, device: torch.device) -> torch.Tensor:
    """[Hv] the key head of each value head, on `device`; made by the first (eager) call, reused inside a capture."""
    return torch.tensor([model.key_head(h) for h in range(model.n_v_heads)], device=device)


def delta_rule_fused(model, qkv, a, b, A, dt_bias, state, slots, o, **_):
    hk, dk = model.n_k_heads, model.head_k_dim
    qk = torch.empty(qkv.shape[0], 2 * hk, dk, device=qkv.device)
    g, beta = torch.empty_like(a), torch.empty_like(b)
    per_head_l2_norm(model, qkv, qk)
    gates(model, a, b, A, dt_bias, g, beta)
    delta_rule(model, qk, qkv, g, beta, state, slots, o)


def gated_rmsnorm(model, o, z, w, y, **_):
    """In float32 (bf16 activations of `gemv_norm` widened), as engines' gated-norm kernels compute it."""
    o, z = o.float(), z.float()
    y.copy_(o * torch.rsqrt((o * o).mean(-1, keepdim=True) + model.rms_norm_eps) * w * F.silu(z))


def split_interleaved(model, src, q, gate, **_):
    d = q.shape[-1]
    q.copy_(src[..., :d])
    gate.copy_(src[..., d:])


def per_head_rmsnorm(model, q, k, q_norm, k_norm, q_out, k_out, **_):
    """Zero-centred weights, as Hugging Face's Qwen3.5 RMSNorm: `x * rsqrt(mean(x^2) + eps) * (1 + w.float())`."""
    for x, w, out in ((q, q_norm, q_out), (k, k_norm, k_out)):
        out.copy_(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + model.rms_norm_eps) * (1.0 + w.float()))


def partial_neox_rope(model, q, k, q_out, k_out, positions, **_):
    half = model.n_rot // 2
    p = positions.double()
    inv = model.rope_theta ** (-2.0 * torch.arange(half, device=q.device, dtype=torch.float64) / model.n_rot)
    ang = p[:, None, None] * inv
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    for x, out in ((q, q_out), (k, k_out)):
        x1, x2 = x[..., :half], x[..., half : model.n_rot]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half : model.n_rot] = x1 * sin + x2 * cos
        out[..., model.n_rot :] = x[..., model.n_rot :]


def kv_row_scatter(model, k, v, k_cache, v_cache, slots, positions, **_):
    idx, p = slots.long(), positions.long()
    k_cache[idx, p] = k.to(k_cache.dtype)
    v_cache[idx, p] = v.to(v_cache.dtype)


def decode_attention(model, q, k_cache, v_cache, slots, seq_len, out=None, **_):
    """Whole decode attention (SDPA); the split-KV stages are compared with it as a whole (out=None allocates)."""
    out = torch.empty_like(q) if out is None else out
    idx = slots.long()
    group = model.n_q_heads // model.n_kv_heads
    keys = k_cache[idx, :seq_len].transpose(1, 2).repeat_interleave(group, dim=1)  # [B, Hq, T, D]
    vals = v_cache[idx, :seq_len].transpose(1, 2).repeat_interleave(group, dim=1)
    out.copy_(F.scaled_dot_product_attention(q[:, :, None], keys, vals).squeeze(2))
    return out


def sigmoid_gate(model, x, gate, y, **_):
    y.copy_(x * torch.sigmoid(gate))


def gemv(model, w, x, y, **_):
    """cuBLAS in w's dtype: at bf16 weights x and y are bf16 too (`activation_dtype`)."""
    torch.matmul(x, w.t(), out=y)


def gemv_conv(model, w, x, conv_weight, state, slots, y, **_):
    c = conv_weight.shape[0]
    proj = x @ w.t()
    y[:, c:] = proj[:, c:]
    causal_conv1d_silu(model, proj[:, :c], conv_weight, state, slots, y[:, :c])


def gemv_swiglu(model, w, x, y, **_):
    gate, up = (x @ w.t()).chunk(2, dim=-1)
    y.copy_(F.silu(gate) * up)


def gemv_norm(model, w, x, z, norm_weight, y, **_):
    heads = (x.shape[0], -1, norm_weight.shape[0])
    normed = torch.empty_like(x)
    gated_rmsnorm(model, x.view(heads), z.view(heads), norm_weight, normed.view(heads))
    gemv(model, w, normed, y)


def _rms_normed(model, x, w):
    """The decoder layer's RMSNorm of x in float32 (bf16 activations widened), zero-centred weight w."""
    x = x.float()
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + model.rms_norm_eps) * (1.0 + w.float())


def gemv_rmsnorm(model, w, x, norm_weight, y, **_):
    gemv(model, w, _rms_normed(model, x, norm_weight).to(x.dtype), y)


def gemv_rmsnorm_conv(model, w, x, norm_weight, conv_weight, state, slots, y, **_):
    gemv_conv(model, w, _rms_normed(model, x, norm_weight).to(x.dtype), conv_weight, state, slots, y)


def gemv_rmsnorm_swiglu(model, w, x, norm_weight, y, **_):
    gemv_swiglu(model, w, _rms_normed(model, x, norm_weight).to(x.dtype), y)


def gemv_residual(model, w, x, residual, **_):
    residual.add_(x @ w.t())


def gemv_norm_residual(model, w, x, z, norm_weight, residual, **_):
    y = torch.empty(residual.shape, dtype=x.dtype, device=x.device)
    gemv_norm(model, w, x, z, norm_weight, y)
    residual.add_(y)


def attention_prologue(model, q_gate, k, v, q_norm, k_norm, k_cache, v_cache, slots, positions, q_out, gate, **_):
    """The four ops it fuses, one after another."""
    d = q_out.shape[-1]
    gate.copy_(q_gate[..., d:])
    q_normed, k_normed, k_rotated = torch.empty_like(q_out), torch.empty_like(k), torch.empty_like(k)
    per_head_rmsnorm(model, q_gate[..., :d], k, q_norm, k_norm, q_normed, k_normed)
    partial_neox_rope(model, q_normed, k_normed, q_out, k_rotated, positions)
    kv_row_scatter(model, k_rotated, v, k_cache, v_cache, slots, positions)


def activation_dtype(op, cfg) -> torch.dtype:
    """The dtype of `op`'s baseline's activations (its float32 `in` and `out` arguments) at `cfg`: bf16 for the
    matmuls engines run in bf16, the GEMVs on bf16 weights (cuBLAS bf16, bf16 output) and attention on a bf16 cache
    (bf16 SDPA); float32 otherwise."""
    stored = {"gemv": cfg.weight_dtype, "decode_attention": cfg.kv_dtype}.get(op.family, "float32")
    return getattr(torch, stored)


def activations(op, cfg, values: dict) -> dict:
    """`values` with the float32 `in` and `out` arguments of `op`'s signature in `activation_dtype` (converted once,
    before timing, as an engine's activations already are); every other tensor the same object."""
    dtype = activation_dtype(op, cfg)
    converted = {a.name for a in op.signature(cfg) if a.role in ("in", "out") and a.dtype == "float32"}
    return {n: v.to(dtype) if n in converted else v for n, v in values.items()}


# A baseline on bf16 activations rounds each input activation to bf16 (up to 2^-9 relative), and its outputs (and
# the conv state, which holds bf16 projections) too: no longer float32 arithmetic, which the per-op tolerances bound.
# The input roundings add up over a dot product to about 2^-9 of its size at every output; measured against the
# float64 reference (relative L-inf, 0.8b and 4b shapes at B = 1 to 32, CPU torch): 2.2-5.4e-3 for the GEMVs and
# attention, 0.9-3.0e-3 beyond the output's own bf16 ulp. Such a baseline is checked within 1e-2 (about 5 * 2^-9);
# our kernels, whose activations stay float32, keep `verify.TOLERANCES`.
BF16_ACTIVATIONS_TOL = 1e-2


def tolerance(op, cfg) -> float | None:
    """The relative L-inf tolerance of `op`'s baseline at `cfg` where it is not the op's own: `BF16_ACTIVATIONS_TOL`
    on bf16 activations, else None."""
    return BF16_ACTIVATIONS_TOL if activation_dtype(op, cfg) == torch.bfloat16 else None


def baseline(op):
    """The implementation of registry op `op` (by name, else by family); None for the split-KV stages, whose
    PyTorch counterpart is the whole `decode_attention`."""
    if op.name in ("decode_attention_split", "decode_attention_reduce"):
        return None
    return BASELINES.get(op.name, BASELINES.get(op.family))


BASELINES = {
    "causal_conv1d_silu": causal_conv1d_silu,
    "per_head_l2_norm": per_head_l2_norm,
    "gates": gates,
    "delta_rule": delta_rule,
    "delta_rule_fused": delta_rule_fused,
    "gated_rmsnorm": gated_rmsnorm,
    "split_interleaved": split_interleaved,
    "per_head_rmsnorm": per_head_rmsnorm,
    "partial_neox_rope": partial_neox_rope,
    "kv_row_scatter": kv_row_scatter,
    "decode_attention": decode_attention,
    "sigmoid_gate": sigmoid_gate,
    "gemv": gemv,
    "gemv_in_proj_qkv_conv": gemv_conv,
    "gemv_in_proj_conv": gemv_conv,
    "gemv_out_proj_norm": gemv_norm,
    "gemv_gate_up_proj_swiglu": gemv_swiglu,
    "gemv_in_proj_rmsnorm_conv": gemv_rmsnorm_conv,
    "gemv_qkv_proj_rmsnorm": gemv_rmsnorm,
    "gemv_gate_up_proj_rmsnorm_swiglu": gemv_rmsnorm_swiglu,
    "gemv_out_proj_norm_residual": gemv_norm_residual,
    "gemv_o_proj_residual": gemv_residual,
    "gemv_down_proj_residual": gemv_residual,
    "attention_prologue": attention_prologue,
}
