"""PLACEHOLDER: decode_attention schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("decode_attention")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("decode_attention")
