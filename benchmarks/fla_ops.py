"""fla's delta rule (flash-linear-attention's Triton `fused_recurrent_gated_delta_rule`), the delta rule's same-run
baseline, called the way its users run it at its best: every argument by keyword, one kernel per step (for the
fused op, the q/k L2 norm, the gates and beta's sigmoid inside that kernel), inputs already in its [B, T, H, D]
layout (made before the timed call), and the recurrent state in either of its layouts. fla 0.6.0's wrapper writes
the final state to a buffer it allocates each call; engines (vLLM, SGLang) update a state pool in place, so the
benchmark also times fla's kernel launched as the wrapper launches it with one V-first state as its initial and
its final state (`launch_in_place`), the comparison with our in-place kernel.

fla 0.6.0 takes `(q, k, v, g, gk, gv, beta, scale, ...)`: a positional call `f(q, k, v, g, beta)` hands beta in as
the per-key gate `gk` and leaves beta at its default, a different recurrence that reads out of bounds. Hence keywords
only, and the benchmark checks the result against the float64 reference before it times anything.
"""

from __future__ import annotations

import torch

from gdn_tvm.config import DecodeConfig

# Column label -> (fla's `state_v_first`, in place): [Hv, Dv, Dk] is our layout, read as it is; the K-first
# [Hv, Dk, Dv] state is fla's default, transposed from ours before timing. In place: `launch_in_place`.
LAYOUTS = {"fla": (True, False), "fla_kfirst": (False, False), "fla_inplace": (True, True)}


def launch_in_place(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
) -> torch.Tensor:
    """One step of fla's fused recurrent gated delta rule kernel on q, k [B, 1, H, K], v [B, 1, HV, V], g, beta
    [B, 1, HV] (raw `a` and `b` with `A_log` and the flags: the gates in the kernel) with the V-first state
    [B, HV, V, K] as both its initial and its final state, updated in place; returns o [B, 1, HV, V]. fla 0.6.0's
    wrapper launches this kernel with the same arguments and a final state of its own."""
    import triton
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kernel

    if not state.is_contiguous():
        raise ValueError("state: fla's kernel updates a contiguous state in place")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[-1]
    BV = min(8, triton.next_power_of_2(V))
    o = torch.empty_like(v)
    kernel[(triton.cdiv(V, BV) * B * HV,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=A_log, dt_bias=dt_bias, o=o, h0=state, ht=state,
        cu_seqlens=None, scale=scale, T=T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
        IS_BETA_HEADWISE=beta.ndim != v.ndim, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        APPLY_BETA_SIGMOID=use_beta_sigmoid_in_kernel, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=True, num_warps=1,
        num_stages=3,
    )  # fmt: skip
    return o


# The wrapper's arguments that `launch_in_place` does without (its state is both; A_log turns the gate on).
_WRAPPER_ONLY = ("initial_state", "output_final_state", "state_v_first", "use_gate_in_kernel")


class FlaStep:
    """One step of fla on inputs made from the kernel's (`values`: the op's arguments by name, every lane active on
    slots 0..B-1). Fused: raw q and k (normalised by fla, `use_qk_l2norm_in_kernel`), raw `a` with `A_log = log(-A)`
    and `dt_bias` (`use_gate_in_kernel`), raw `b` (`use_beta_sigmoid_in_kernel`). Calling it runs one step;
    `outputs()` gives the last call's o [B, Hv, Dv] and state [S, Hv, Dv, Dk] in the kernel's layout and its storage
    dtype (fla returns a float32 final state; a bf16 pool stores it rounded). `in_place` (V-first only): the kernel
    updates `values["state"]` itself (`launch_in_place`)."""

    tolerance = None  # checked within the op's own tolerance

    def __init__(self, cfg: DecodeConfig, values: dict, fused: bool, v_first: bool, in_place: bool = False) -> None:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        self.run = fused_recurrent_gated_delta_rule
        m, B = cfg.model, cfg.batch
        hk, hv, dk, dv = m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim
        slots = values["slots"].long()
        if not torch.equal(slots, torch.arange(B, device=slots.device)) or values["state"].shape[0] != B:
            raise ValueError("the fla baseline needs every lane active on slots 0..B-1 (fla indexes states by lane)")
        qk = values["qkv"][:, : 2 * hk * dk].reshape(B, 2 * hk, dk) if fused else values["qk"]
        q, k = qk[:, None, :hk], qk[:, None, hk:]
        if m.head_mapping != "grouped":  # fla groups value heads by key head (h // (Hv/Hk)): give it Hv q/k heads
            heads = torch.tensor([m.key_head(h) for h in range(hv)], device=qk.device)
            q, k = q[:, :, heads], k[:, :, heads]
        if in_place and not v_first:
            raise ValueError("fla's kernel updates our state in place in the V-first layout only")
        state = values["state"] if v_first else values["state"].transpose(-1, -2)
        self.v_first, self.in_place, self.state_dtype = v_first, in_place, values["state"].dtype
        self.args = {
            "q": q.contiguous(),
            "k": k.contiguous(),
            "v": values["qkv"][:, 2 * hk * dk :].reshape(B, 1, hv, dv).contiguous(),
            "scale": dk**-0.5,
            "initial_state": state.contiguous(),
            "output_final_state": True,
            "state_v_first": v_first,
        }
        if fused:
            self.args |= {
                "g": values["a"][:, None].contiguous(),
                "beta": values["b"][:, None].contiguous(),
                "A_log": torch.log(-values["A"]),
                "dt_bias": values["dt_bias"].contiguous(),
                "use_gate_in_kernel": True,
                "use_beta_sigmoid_in_kernel": True,
                "use_qk_l2norm_in_kernel": True,
            }
        else:
            self.args |= {"g": values["g"][:, None].contiguous(), "beta": values["beta"][:, None].contiguous()}
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self) -> None:
        if self.in_place:
            state, args = self.args["initial_state"], {n: a for n, a in self.args.items() if n not in _WRAPPER_ONLY}
            self.last = launch_in_place(state=state, **args), state
        else:
            self.last = self.run(**self.args)

    def outputs(self) -> dict[str, torch.Tensor]:
        if self.last is None:
            raise RuntimeError("fla has not run yet")
        o, final = self.last
        state = final if self.v_first else final.transpose(-1, -2)
        return {"o": o[:, 0], "state": state.to(self.state_dtype)}
