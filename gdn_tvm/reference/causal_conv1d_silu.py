"""PLACEHOLDER: causal_conv1d_silu reference (being written)."""


def causal_conv1d_silu(**kwargs):
    raise NotImplementedError("causal_conv1d_silu")

