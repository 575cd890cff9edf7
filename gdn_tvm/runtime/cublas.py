"""cuBLAS through ctypes: the library GEMMs of a CUDA build (`gemm_<proj>`, ops/gemm.py), no framework needed.

`gemm_kernel(signature, device)` is the function of one such op: `y = xs[0] @ w.T + xs[1] @ w.T` as one
`cublasGemmEx` over the 2B rows of xs (bf16 in, float32 accumulation and out) into a scratch `[2, B, N]` of its own,
then `cublasSgeam` adding the halves into y (into each part's output, for a stacked projection); all on the stream TVM
launches on (`tvm_ffi.get_raw_stream`), so a CUDA graph captures them like the TensorIR kernels around them. cuBLAS is
found where `GDN_TVM_CUBLAS` says (a file), else as `libcublas.so.13` / `.12` on the loader's path, under
`$CUDA_PATH/lib64` or in an nvidia-cublas wheel's folder; `CublasError` names where it looked.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

import tvm
import tvm_ffi

from gdn_tvm.signature import Arg

NAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")
WORKSPACE_BYTES = 32 << 20  # cuBLAS's workspace, set explicitly: graph capture must not allocate
OP_N, OP_T = 0, 1  # cublasOperation_t
R_32F, R_16BF = 0, 14  # cudaDataType
COMPUTE_32F = 68  # cublasComputeType_t
GEMM_DEFAULT = -1  # cublasGemmAlgo_t


class CublasError(RuntimeError):
    """cuBLAS is missing or a call failed; the message says which."""


def _candidates() -> list[str]:
    found = [os.environ["GDN_TVM_CUBLAS"]] if os.environ.get("GDN_TVM_CUBLAS") else []
    found += list(NAMES)
    roots = [os.environ.get("CUDA_PATH", "/usr/local/cuda")]
    roots += [os.path.join(p, "nvidia", sub) for p in sys.path for sub in ("cublas", "cu13", "cu12")]
    for root in roots:
        found += sorted(glob.glob(os.path.join(root, "lib*", "libcublas.so.1*")))
    return found


_LIBRARY: list[ctypes.CDLL] = []  # the loaded library, once found


def library() -> ctypes.CDLL:
    """The cuBLAS library (loaded on first use); `CublasError` lists where it looked."""
    if _LIBRARY:
        return _LIBRARY[0]
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as err:
            tried.append(f"{path} ({err})")
            continue
        if hasattr(lib, "cublasGemmEx"):
            _LIBRARY.append(lib)
            return lib
        tried.append(f"{path} (no cublasGemmEx)")
    raise CublasError(
        "a CUDA build with library GEMMs needs cuBLAS (libcublas.so.13): install it or set GDN_TVM_CUBLAS to the "
        "file; tried " + "; ".join(tried)
    )


class _Handle:
    """One cuBLAS handle of a device, with its workspace; `lock` held from setting the stream to the last call, since
    threads may share the handle (two models on one device)."""

    _by_device: dict[int, _Handle] = {}

    def __init__(self, device_id: int):
        self.lib = library()
        self.ffi_device = tvm_ffi.device(f"cuda:{device_id}")
        self.handle = ctypes.c_void_p()
        _check("cublasCreate_v2", self.lib.cublasCreate_v2(ctypes.byref(self.handle)))
        self.workspace = tvm.runtime.empty((WORKSPACE_BYTES,), "uint8", tvm.cuda(device_id))
        self.lock = threading.Lock()

    @classmethod
    def of(cls, device_id: int) -> _Handle:
        if device_id not in cls._by_device:
            cls._by_device[device_id] = cls(device_id)
        return cls._by_device[device_id]

    def on_current_stream(self) -> None:
        """Issue the next calls on the stream TVM launches on now (a capturing one inside a CUDA graph capture)."""
        use_stream(self.lib, self.handle, tvm_ffi.get_raw_stream(self.ffi_device), int(self.workspace.data_ptr()))


def _check(name: str, status: int) -> None:
    if status != 0:
        raise CublasError(f"{name} failed with cublasStatus_t {status}")


def use_stream(lib: ctypes.CDLL, handle: ctypes.c_void_p, stream: int, workspace: int) -> None:
    """Set `handle`'s stream and then its `WORKSPACE_BYTES` workspace at device address `workspace` (setting a stream
    resets cuBLAS to its own workspace pool, which a graph capture must not allocate from)."""
    _check("cublasSetStream_v2", lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream)))
    size = ctypes.c_size_t(WORKSPACE_BYTES)
    _check("cublasSetWorkspace_v2", lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace), size))


def gemm_ex(lib: ctypes.CDLL, handle: ctypes.c_void_p, w: int, x: int, y: int, n: int, rows: int, k: int) -> None:
    """`y [rows, n]` float32 = `x [rows, k]` bf16 @ `w [n, k]` bf16 .T, row-major at device addresses w, x, y, by
    `cublasGemmEx` (float32 accumulation)."""
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    # column-major: y^T [n, rows] = w [k, n]^T . x^T [k, rows]
    a, b, c = (ctypes.c_void_p(p) for p in (w, x, y))
    status = lib.cublasGemmEx(
        handle, OP_T, OP_N, n, rows, k, ctypes.byref(one), a, R_16BF, k, b, R_16BF, k, ctypes.byref(zero), c, R_32F, n,
        COMPUTE_32F, GEMM_DEFAULT,
    )  # fmt: skip
    _check("cublasGemmEx", status)


def _ptr(tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(tensor.data_ptr()))


class Sgeam(NamedTuple):
    """One `cublasSgeam` of a library GEMM: `C = A + B` over column-major `[rows, cols]` matrices, A and B at element
    offsets `hi` and `lo` of the `[2, B, N]` scratch with leading dimension `ld`, C an output's own `[cols, rows]`
    row-major buffer (leading dimension `rows`)."""

    hi: int
    lo: int
    rows: int
    cols: int
    ld: int


def sgeams(batch: int, n: int, widths: Sequence[int]) -> list[Sgeam]:
    """The halves' sums of a GEMM of `n` output columns over `batch` lanes into outputs of `widths` columns, in row
    order of the weight: each output's columns of the high half (`[0, b, :]`) and the low half (`[1, b, :]`)."""
    if sum(widths) != n or min(widths, default=0) < 1:
        raise ValueError(f"library GEMM outputs of {list(widths)} columns do not cover the weight's {n} rows")
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return [Sgeam(start, batch * n + start, width, batch, n) for start, width in zip(starts, widths, strict=True)]


def gemm_kernel(signature: Sequence[Arg], device: tuple[int, int]) -> Callable[..., None]:
    """The function `(w, xs, *outputs)` of a library GEMM with `signature` (w: [N, K] bf16, xs: [2, B, K] bf16, then
    its outputs: y [B, N] float32, or a stacked projection's parts [B, N_part] in row order) on CUDA device `device`
    (DLPack type, index): one `cublasGemmEx` into a `[2, B, N]` scratch, then per output one `cublasSgeam` adding its
    columns of the two halves (`sgeams`). The scratch is its own, like a kernel's registers would be, but it is
    memory: models stepping at once on different streams need functions of their own."""
    shapes = {a.name: a.shape for a in signature}
    (N, K), (_, B, _) = shapes["w"], shapes["xs"]
    sums = sgeams(B, N, [a.shape[1] for a in signature if a.role == "out"])
    handle = _Handle.of(device[1])
    parts = tvm.runtime.empty((2, B, N), "float32", tvm.cuda(device[1]))
    one = ctypes.c_float(1.0)

    def gemm(w, xs, *outs) -> None:
        base = int(parts.data_ptr())  # the closure must hold `parts`: an address alone lets it be freed
        with handle.lock:
            handle.on_current_stream()
            gemm_ex(handle.lib, handle.handle, int(w.data_ptr()), int(xs.data_ptr()), base, N, 2 * B, K)
            for y, op in zip(outs, sums, strict=True):
                hi, lo = (ctypes.c_void_p(base + 4 * offset) for offset in (op.hi, op.lo))
                args = (handle.handle, OP_N, OP_N, op.rows, op.cols, ctypes.byref(one), hi, op.ld, ctypes.byref(one))
                _check("cublasSgeam", handle.lib.cublasSgeam(*args, lo, op.ld, _ptr(y), op.rows))

    return gemm
