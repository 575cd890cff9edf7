"""PLACEHOLDER: decode_attention (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("decode_attention")


def make_decode_attention(cfg, **flags):
    raise NotImplementedError("decode_attention")
