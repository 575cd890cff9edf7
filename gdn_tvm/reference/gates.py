"""PLACEHOLDER: gates reference (being written)."""


def gates(**kwargs):
    raise NotImplementedError("gates")

