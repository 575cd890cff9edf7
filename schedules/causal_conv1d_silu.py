"""PLACEHOLDER: causal_conv1d_silu schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("causal_conv1d_silu")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("causal_conv1d_silu")
