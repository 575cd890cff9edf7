"""PLACEHOLDER: split_interleaved reference (being written)."""


def split_interleaved(**kwargs):
    raise NotImplementedError("split_interleaved")

