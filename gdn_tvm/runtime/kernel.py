"""A compiled kernel bound to its signature: the checked entry point every caller goes through."""

from __future__ import annotations

from collections.abc import Sequence

from gdn_tvm.signature import Arg, bind, check_args


class Kernel:
    """Calls a compiled PrimFunc by argument name, after checking every argument.

    `kernel(x=..., state=..., ...)` validates shapes, dtypes, device, slots and positions and raises
    `ArgumentError` before anything runs, so a rejected call leaves every buffer untouched.
    `kernel.launch(values)` skips the checks (the executor's hot path, after it checked once).
    """

    def __init__(self, name: str, func, signature: Sequence[Arg], device: tuple[int, int]):
        self.name = name
        self.func = func
        self.signature = list(signature)
        self.device = device

    def __call__(self, *, check_weights: bool = True, **values) -> None:
        check_args(self.signature, values, self.device, check_weights=check_weights)
        self.launch(values)

    def launch(self, values) -> None:
        """Run without checks; `values` maps every visible argument name to its value."""
        self.func(*bind(self.signature, values))

    def __repr__(self) -> str:
        args = ", ".join(a.name for a in self.signature if a.alias is None)
        return f"Kernel {self.name}({args})"
