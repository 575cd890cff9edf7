"""The whole-model baseline: Qwen3.5's decode step in PyTorch the way serving engines run it (bf16 activations and
cuBLAS bf16 GEMMs with the stacked projections engines use, fla's fused recurrent gated delta rule updating the
V-first state in place, `scaled_dot_product_attention` over the KV cache, the whole step captured in one torch CUDA
graph), on the same weights (`plan.model` names) as `runtime.model.Model`.

Every lane is live on slot b = lane b and at one position, fixed when the step is made (engines pass lengths on the
device to their attention kernels; a fixed slice of the cache is SDPA's best case). `recurrence="torch"` swaps fla
for the recurrence in PyTorch, so the CPU tests can check this file's math against the model's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from benchmarks import fla_ops
from gdn_tvm.config import DecodeConfig


class TorchModel:
    """`step(ids [B] int64, position) -> logits [B, V] float32` with states of its own (zeroed at construction):
    conv states and recurrent states (V-first, float32) of the GDN layers, KV caches of the attention layers."""

    def __init__(self, cfg: DecodeConfig, weights: Mapping[str, torch.Tensor], dtype=torch.bfloat16, recurrence="fla"):
        self.cfg, self.m, self.dtype, self.recurrence = cfg, cfg.model, dtype, recurrence
        m, B, dev = cfg.model, cfg.batch, weights["embed_tokens"].device
        w = {name: t.to(dtype) if t.dim() == 2 and name.rsplit(".", 1)[-1] != "conv1d" else t.float()
             for name, t in weights.items()}  # fmt: skip
        self.embed, self.final_norm = w["embed_tokens"], w["norm"]
        self.lm_head = self.embed if m.tie_word_embeddings else w["lm_head"]
        self.layers = []
        for i, kind in enumerate(m.layer_types):
            p = f"layers.{i}."
            layer = {k.removeprefix(p): v for k, v in w.items() if k.startswith(p)}
            stacked = (
                ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
                if kind == "gdn"
                else ("q_proj", "k_proj", "v_proj")
            )
            layer["in"] = torch.cat([layer.pop(n) for n in stacked])  # fmt: skip
            layer["gate_up"] = torch.cat([layer.pop("gate_proj"), layer.pop("up_proj")])
            if kind == "gdn":
                layer["A_log"] = torch.log(-layer["A"])
                layer["conv_state"] = torch.zeros(B, m.conv_dim, m.conv_kernel - 1, device=dev)
                layer["rec_state"] = torch.zeros(B, m.n_v_heads, m.head_v_dim, m.head_k_dim, device=dev)
            else:
                kv = (B, cfg.max_len, m.n_kv_heads, m.head_dim)
                layer["k_cache"], layer["v_cache"] = (
                    torch.zeros(kv, device=dev, dtype=dtype),
                    torch.zeros(kv, device=dev, dtype=dtype),
                )
            self.layers.append((kind, layer))

    def _norm(self, x: torch.Tensor, w: torch.Tensor, zero_centred: bool = True) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.m.rms_norm_eps)
        return (x * ((1.0 + w.float()) if zero_centred else w.float())).to(self.dtype)

    def step(self, ids: torch.Tensor, position: int) -> torch.Tensor:
        residual = F.embedding(ids, self.embed).float()
        for kind, layer in self.layers:
            h = self._norm(residual, layer["input_layernorm"])
            h = self._gdn(layer, h) if kind == "gdn" else self._attention(layer, h, position)
            residual = residual + h.float()
            h = self._norm(residual, layer["post_attention_layernorm"])
            gate, up = (h @ layer["gate_up"].t()).chunk(2, dim=-1)
            residual = residual + (F.silu(gate) * up @ layer["down_proj"].t()).float()
        return (self._norm(residual, self.final_norm) @ self.lm_head.t()).float()

    def _gdn(self, layer: dict, h: torch.Tensor) -> torch.Tensor:
        m, B = self.m, h.shape[0]
        hk, hv, dk, dv, C = m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim, m.conv_dim
        proj = h @ layer["in"].t()
        mixed, z, b, a = proj.split([C, hv * dv, hv, hv], dim=-1)
        window = torch.cat([layer["conv_state"], mixed.float()[:, :, None]], dim=-1)
        layer["conv_state"].copy_(window[:, :, 1:])
        qkv = F.silu((window * layer["conv1d"]).sum(-1))
        q, k = qkv[:, : hk * dk].reshape(B, 1, hk, dk), qkv[:, hk * dk : 2 * hk * dk].reshape(B, 1, hk, dk)
        v = qkv[:, 2 * hk * dk :].reshape(B, 1, hv, dv)
        gates = {"a": a.float().reshape(B, 1, hv).contiguous(), "b": b.float().reshape(B, 1, hv).contiguous()}
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # fla's kernel takes [B, T, H, D] packed
        if self.recurrence == "fla":
            o = fla_ops.launch_in_place(
                q=q, k=k, v=v, g=gates["a"], beta=gates["b"], state=layer["rec_state"], scale=dk**-0.5,
                A_log=layer["A_log"], dt_bias=layer["dt_bias"], use_qk_l2norm_in_kernel=True,
                use_beta_sigmoid_in_kernel=True,
            )  # fmt: skip
        else:
            o = _torch_recurrence(m, q, k, v, **gates, A=layer["A"], dt_bias=layer["dt_bias"], state=layer["rec_state"])
        o = o.float().view(B, hv, dv)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + m.rms_norm_eps) * layer["norm"].float()
        o = o * F.silu(z.float().view(B, hv, dv))
        return o.view(B, hv * dv).to(self.dtype) @ layer["out_proj"].t()

    def _attention(self, layer: dict, h: torch.Tensor, position: int) -> torch.Tensor:
        m, B = self.m, h.shape[0]
        hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
        proj = h @ layer["in"].t()
        qg, k, v = proj.split([hq * 2 * d, hkv * d, hkv * d], dim=-1)
        q, gate = qg.view(B, hq, 2 * d).chunk(2, dim=-1)
        q, k = self._norm(q, layer["q_norm"]), self._norm(k.view(B, hkv, d), layer["k_norm"])
        q, k = _rope(m, q, position), _rope(m, k, position)
        layer["k_cache"][:, position] = k
        layer["v_cache"][:, position] = v.view(B, hkv, d)
        keys = layer["k_cache"][:, : position + 1].transpose(1, 2)  # [B, Hkv, T, D]
        values = layer["v_cache"][:, : position + 1].transpose(1, 2)
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, enable_gqa=True).squeeze(2)
        out = out * torch.sigmoid(gate)
        return out.reshape(B, hq * d) @ layer["o_proj"].t()


def _rope(m, x: torch.Tensor, position: int) -> torch.Tensor:
    """NeoX RoPE on the first `n_rot` dims of each head at one position (float32 angles)."""
    half = m.n_rot // 2
    inv = m.rope_theta ** (-2.0 * torch.arange(half, device=x.device, dtype=torch.float64) / m.n_rot)
    cos, sin = torch.cos(position * inv).float(), torch.sin(position * inv).float()
    x1, x2, rest = x[..., :half].float(), x[..., half : m.n_rot].float(), x[..., m.n_rot :]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)
    return torch.cat([rotated, rest], dim=-1)


def _torch_recurrence(m, q, k, v, a, b, A, dt_bias, state) -> torch.Tensor:
    """The same step in PyTorch (float32): L2-normed q, k; g = softplus(a + dt_bias) * A; beta = sigmoid(b)."""
    hv = m.n_v_heads
    heads = torch.tensor([m.key_head(h) for h in range(hv)], device=q.device)
    q, k = q[:, 0, heads].float(), k[:, 0, heads].float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + m.l2_norm_eps) / math.sqrt(m.head_k_dim)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + m.l2_norm_eps)
    g = F.softplus(a[:, 0] + dt_bias, threshold=20.0) * A
    beta = torch.sigmoid(b[:, 0])
    s = state * torch.exp(g)[..., None, None]
    d = beta[..., None] * (v[:, 0].float() - torch.einsum("bhij,bhj->bhi", s, k))
    s = s + d[..., :, None] * k[..., None, :]
    state.copy_(s)
    return torch.einsum("bhij,bhj->bhi", s, q)[:, None]
