"""PLACEHOLDER: causal_conv1d_silu (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("causal_conv1d_silu")


def make_causal_conv1d_silu(cfg, **flags):
    raise NotImplementedError("causal_conv1d_silu")
