"""PLACEHOLDER: decode_attention reference (being written)."""


def decode_attention(**kwargs):
    raise NotImplementedError("decode_attention")


def decode_attention_split(**kwargs):
    raise NotImplementedError("decode_attention_split")


def decode_attention_reduce(**kwargs):
    raise NotImplementedError("decode_attention_reduce")

