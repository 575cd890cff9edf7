"""cuBLAS through ctypes: the library GEMMs of a CUDA build (`gemm_<proj>`, ops/gemm.py), no framework needed.

`gemm_kernel(signature, device)` is the function of one such op: `y = xs[0] @ w.T + xs[1] @ w.T` as one
`cublasGemmEx` over the 2B rows of xs (bf16 in, float32 accumulation and out) into a scratch `[2, B, N]` of its own,
then `cublasSgeam` adding the halves into y; both on the stream TVM launches on (`tvm_ffi.get_raw_stream`), so a
CUDA graph captures them like the TensorIR kernels around them. cuBLAS is found where `GDN_TVM_CUBLAS` says (a
file), else as `libcublas.so.13` / `.12` on the loader's path, under `$CUDA_PATH/lib64` or in an nvidia-cublas
wheel's folder; `CublasError` names where it looked.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections.abc import Callable, Sequence

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
        self.check("cublasCreate_v2", ctypes.byref(self.handle))
        self.workspace = tvm.runtime.empty((WORKSPACE_BYTES,), "uint8", tvm.cuda(device_id))
        self.lock = threading.Lock()

    @classmethod
    def of(cls, device_id: int) -> _Handle:
        if device_id not in cls._by_device:
            cls._by_device[device_id] = cls(device_id)
        return cls._by_device[device_id]

    def check(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise CublasError(f"{name} failed with cublasStatus_t {status}")

    def on_current_stream(self) -> None:
        """Issue the next calls on the stream TVM launches on now (a capturing one inside a CUDA graph capture), with
        the handle's own workspace (setting a stream resets cuBLAS to its default workspace pool)."""
        self.check("cublasSetStream_v2", self.handle, ctypes.c_void_p(tvm_ffi.get_raw_stream(self.ffi_device)))
        self.check("cublasSetWorkspace_v2", self.handle, _ptr(self.workspace), ctypes.c_size_t(WORKSPACE_BYTES))


def _ptr(tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(tensor.data_ptr()))


def gemm_kernel(signature: Sequence[Arg], device: tuple[int, int]) -> Callable[..., None]:
    """The function `(w, xs, y)` of a library GEMM with `signature` (w: [N, K] bf16, xs: [2, B, K] bf16, y: [B, N]
    float32) on CUDA device `device` (DLPack type, index). Its `[2, B, N]` scratch is its own, like a kernel's
    registers would be, but it is memory: models stepping at once on different streams need functions of their own."""
    shapes = {a.name: a.shape for a in signature}
    (N, K), (_, B, _) = shapes["w"], shapes["xs"]
    handle = _Handle.of(device[1])
    parts = tvm.runtime.empty((2, B, N), "float32", tvm.cuda(device[1]))
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    lo_half = ctypes.c_void_p(int(parts.data_ptr()) + B * N * 4)

    def gemm(w, xs, y) -> None:
        with handle.lock:
            _calls(w, xs, y)

    def _calls(w, xs, y) -> None:
        handle.on_current_stream()
        # column-major: parts^T [N, 2B] = w [K, N]^T . xs^T [K, 2B]
        handle.check(
            "cublasGemmEx",
            handle.handle,
            OP_T,
            OP_N,
            N,
            2 * B,
            K,
            ctypes.byref(one),
            _ptr(w),
            R_16BF,
            K,
            _ptr(xs),
            R_16BF,
            K,
            ctypes.byref(zero),
            _ptr(parts),
            R_32F,
            N,
            COMPUTE_32F,
            GEMM_DEFAULT,
        )
        handle.check(
            "cublasSgeam",
            handle.handle,
            OP_N,
            OP_N,
            N,
            B,
            ctypes.byref(one),
            _ptr(parts),
            N,
            ctypes.byref(one),
            lo_half,
            N,
            _ptr(y),
            N,
        )

    return gemm
