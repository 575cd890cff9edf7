"""Weight streaming across grid barriers at B = 1, measured on hand-written CUDA before it is built in TensorIR.

A persistent kernel made of the scheduled kernels (`codegen.persistent.fuse`) lost to graph-replayed launches, with
or without an L2 prefetch before its barriers (design.md "Persistent kernels"): a barrier drains the memory pipeline
as a launch boundary does. What a megakernel does instead is keep loading the next weights into the SM while it
waits, since weights do not depend on the activations waited for. This benchmark says whether that pays, on a
kernel small enough to write by hand (`weight_stream.cu`): a stage's rows a warp each, their 512-byte lines copied
into a ring of D lines of shared memory by `cp.async` D lines ahead of the one computed.

The pass is L GDN decoder layers' bytes at B = 1 (qwen3.5-0.8b and -4b), each layer its own weights and state
(L2-cold, as in a step): in_proj [2 Hk Dk + 2 Hv Dv + 2 Hv, hidden] (bf16), the recurrent state [Hv Dv, Dk]
(float32, read and written in place), out_proj [hidden, Hv Dv], gate|up [2 I, hidden], down [hidden, I], each stage
reading the one before's output (down its first I values, as many as SwiGLU's), the projections but down scaling
their sums by 1 / rms of their input (RMSNorm, out_proj's standing in for its gated norm; the conv and residual adds
move no weights and are left out). The ways:

  launches-r<R>        5 L launches, graph-replayed; each warp about R lines of its stage (fewer where that would
                       leave under 2 CTAs an SM), all in flight at once, then reading its input (the norm)
  launches-r<R>-xfirst the same reading the input first, as a kernel whose norm is a prologue does
  pdl-r<R>             the same launched with programmatic dependent launch: a kernel's CTAs start while the one
                       before still runs, copy their first lines, then wait for it (the separate-kernel way to it)
  drain-<C>x<W>-d<D>   one persistent kernel, C CTAs an SM of W warps, a ring of D lines a warp, a grid barrier
                       between stages; the ring drains at every barrier and fills after it (what fusion does)
  stream-<C>x<W>-d<D>  the same, the ring running on past each stage: a warp waiting at a barrier has the next
                       stage's first D lines in flight

The first way (`launches-r4`) is checked against a float64 reference (each stage from its input as the pass left
it, every output NaN-poisoned first; relative L-inf 1e-4), every other way against it bit for bit (the same rows,
each summed by one warp in one order) with the barrier's counters back at zero. A persistent way the GPU cannot
hold at once is recorded, not run; a pass that does not finish in `WATCHDOG_S` ends the run with the rows so far
written. Times are medians of graph replays, rated against the H200's 4.3 TB/s (`peak_pct`) and against this GPU's
own device-to-device copy (`copy_gbps`, timed first; `copy_pct`).

python -m benchmarks.weight_stream --out FILE.json [--presets P ...] [--layers L]   (a CUDA GPU; no TVM compiler)
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from benchmarks.persistent import relative_error
from gdn_tvm.config import ModelConfig, preset
from gdn_tvm.target import DEFAULT_GPU

SOURCE = Path(__file__).with_name("weight_stream.cu")
PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b")
LAYERS = 8
LINE = 512  # bytes a warp's lanes move in one 16-byte copy each
COLUMNS = LINE // 2  # bf16 weights a line
DK = LINE // 4  # float32 state columns a line: the kernel's state rows are one line
ALIGN = 256
GEMV, STATE, NORMED = 0, 1, 2  # stage kinds (a NORMED GEMV scales its sums by 1 / rms(x): an RMSNorm)
EPS = 1e-6
DEPTHS = (4, 8, 16, 24)  # the kernels' ring depths (`weight_stream_d<D>`)
LAUNCH_LINES = (4, 8, 16)  # launches-r<R>
LAUNCH_WARPS = 8
PERSISTENT = [(c, w, d) for c in (1, 2) for w in (8, 16) for d in (8, 16, 24)]  # CTAs an SM, warps a CTA, depth
PEAK_BYTES_PER_US = DEFAULT_GPU.peak_gbps * 1e3  # the H200's measured copy bandwidth
COPY_BYTES = 1 << 29  # a device-to-device copy timed beside the ways: this GPU's copy bandwidth
WATCHDOG_S = 30.0
TOLERANCE = 1e-4  # verify.TOL_OP, which a runtime-only process cannot import (verify imports the registry)


@dataclass(frozen=True)
class Stage:
    """One stage of a pass, as the kernels' table holds it (8 int64s): a bf16 GEMV of `rows` rows of `lines` lines
    (`NORMED`: of its input's RMSNorm), or a state update of `rows` rows (heads of `dv` rows, `group` of them sharing
    a key head); `w`, `x`, `y` the byte offsets in the arena of its weights (or state), input and output."""

    kind: int
    rows: int
    lines: int
    w: int
    x: int
    y: int
    dv: int = 0
    group: int = 0

    @property
    def streamed(self) -> int:
        """Bytes of weights or state the stage reads (a state's are written back as well)."""
        return self.rows * self.lines * LINE


class Layout:
    """A pass's stages and the arena they live in, built stage by stage: each stage reads the previous one's output
    unless told otherwise (`x`: an offset of floats in the arena, `cols` of them)."""

    def __init__(self, inputs: int):
        self.size, self.inputs = 0, inputs
        self.stages: list[Stage] = []
        self.x0 = self._take(4 * inputs)
        self.x, self.width = self.x0, inputs

    def gemv(self, rows: int, cols: int | None = None, x: int | None = None, normed: bool = False) -> Layout:
        cols = self.width if cols is None else cols
        if cols % COLUMNS or (x is None and cols > self.width):
            raise ValueError(f"a GEMV reads whole lines of {COLUMNS} of its input: {cols} columns")
        w, y = self._take(2 * rows * cols), self._take(4 * rows)
        kind = NORMED if normed else GEMV
        self.stages.append(Stage(kind, rows, cols // COLUMNS, w, self.x if x is None else x, y))
        self.x, self.width = y, rows
        return self

    def state(self, heads: int, dv: int, keys: int) -> Layout:
        """A state update of `heads` value heads of `dv` rows, `keys` key heads; its input holds q [keys, DK],
        k [keys, DK], then v [heads * dv]."""
        rows = heads * dv
        if heads % keys or self.width < 2 * keys * DK + rows:
            raise ValueError(
                f"a state update of {heads} heads x {dv} rows over {keys} key heads reads "
                f"{2 * keys * DK + rows} inputs, not {self.width}"
            )
        w, y = self._take(rows * LINE), self._take(4 * rows)
        self.stages.append(Stage(STATE, rows, 1, w, self.x, y, dv, heads // keys))
        self.x, self.width = y, rows
        return self

    def table(self) -> np.ndarray:
        return np.array([astuple(s) for s in self.stages], dtype=np.int64)

    def written(self) -> list[tuple[int, int]]:
        """(offset, bytes) of what a pass writes: every output, then every state."""
        outputs = [(s.y, 4 * s.rows) for s in self.stages]
        return outputs + [(s.w, s.streamed) for s in self.stages if s.kind == STATE]

    def _take(self, nbytes: int) -> int:
        at = self.size
        self.size += -(-nbytes // ALIGN) * ALIGN
        return at


def decoder_layers(cfg: ModelConfig, layers: int) -> Layout:
    """`layers` GDN decoder layers' stages at B = 1 (see the module's docstring)."""
    if cfg.head_k_dim != DK or cfg.intermediate_size is None:
        raise ValueError(f"{cfg.name}: the kernel's state rows are {DK} wide and the MLP dense")
    hk, hv, dv = cfg.n_k_heads, cfg.n_v_heads, cfg.head_v_dim
    layout = Layout(cfg.hidden)
    for _ in range(layers):  # out_proj normed too: its gated norm reads its input first as well
        layout.gemv(2 * hk * DK + 2 * hv * dv + 2 * hv, normed=True).state(hv, dv, hk).gemv(cfg.hidden, normed=True)
        layout.gemv(2 * cfg.intermediate_size, normed=True).gemv(cfg.hidden, cols=cfg.intermediate_size)
    return layout


def filled(layout: Layout, rng: np.random.Generator) -> np.ndarray:
    """The arena with random weights (bf16 +-1/sqrt(cols)), states and input; outputs NaN."""
    arena = np.full(layout.size, 0xFF, dtype=np.uint8)
    _floats(arena, layout.x0, layout.inputs)[:] = _uniform(rng, layout.inputs)
    for s in layout.stages:
        if s.kind != STATE:
            arena[s.w : s.w + s.streamed] = _bf16_bits(rng, s.rows, s.lines * COLUMNS).view(np.uint8)
        else:
            state = _floats(arena, s.w, s.rows * DK)
            state[:] = _uniform(rng, state.size)
    return arena


def check(layout: Layout, before: np.ndarray, after: np.ndarray) -> float:
    """Relative L-inf error of the pass `after` holds (run from `before`) against float64: each stage's output and
    state from its input as `after` holds it (NaN where an output was left unwritten)."""
    errors = []
    for s in layout.stages:
        cols = s.lines * COLUMNS if s.kind != STATE else 0
        x = _floats(after, s.x, max(cols, _state_inputs(s))).astype(np.float64)
        if s.kind != STATE:
            w = before[s.w : s.w + s.streamed].view(ml_dtypes.bfloat16).astype(np.float64).reshape(s.rows, cols)
            scale = 1 / math.sqrt((x**2).mean() + EPS) if s.kind == NORMED else 1.0
            pairs = [(_floats(after, s.y, s.rows), w @ x * scale)]
        else:
            old = _floats(before, s.w, s.rows * DK).astype(np.float64).reshape(s.rows, DK)
            heads, keys = s.rows // s.dv, s.rows // s.dv // s.group
            kh = np.arange(s.rows) // s.dv // s.group
            q, k = x[: keys * DK].reshape(keys, DK)[kh], x[keys * DK : 2 * keys * DK].reshape(keys, DK)[kh]
            v = x[2 * keys * DK : 2 * keys * DK + heads * s.dv]
            new = 0.9 * old + 0.1 * (v[:, None] * k)
            pairs = [
                (_floats(after, s.y, s.rows), (new * q).sum(1) / math.sqrt(DK)),
                (_floats(after, s.w, s.rows * DK).reshape(s.rows, DK), new),
            ]
        errors += [relative_error(got, want) for got, want in pairs]
    return float(np.max(errors))  # NaN where any is


def _state_inputs(s: Stage) -> int:
    return 0 if s.kind != STATE else 2 * (s.rows // s.dv // s.group) * DK + s.rows


def _floats(arena: np.ndarray, at: int, n: int) -> np.ndarray:
    return arena[at : at + 4 * n].view(np.float32)


def _uniform(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, n).astype(np.float32)


def _bf16_bits(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """`rows x cols` bf16 bit patterns of +-1/sqrt(cols) (random signs, from random bytes, which numpy makes fast): a
    GEMV keeps the mean square of its input, so the values stay finite through the pass."""
    magnitude = np.float32(cols**-0.5).view(np.uint32)
    magnitude = np.uint16((magnitude + 0x7FFF + ((magnitude >> 16) & 1)) >> 16)  # to the nearest even bf16
    return (np.frombuffer(rng.bytes(2 * rows * cols), dtype=np.uint16) & 0x8000) | magnitude


@dataclass(frozen=True)
class Way:
    """How a pass runs: `ctas` (an SM) of `warps` warps and ring `depth` for a persistent way (`cross`: the stream
    runs on past each stage), or launches of about `lines` lines a warp (`pdl`: programmatic dependent launches;
    `x_first`: a launch reads its input for the norm before it copies any line)."""

    name: str
    depth: int
    warps: int
    ctas: int = 0
    cross: int = 0
    lines: int = 0
    pdl: bool = False
    x_first: int = 0

    @property
    def shared(self) -> int:
        return self.warps * self.depth * LINE


def ways() -> list[Way]:
    separate = [Way(f"launches-r{r}", r, LAUNCH_WARPS, lines=r) for r in LAUNCH_LINES]
    separate += [Way(f"launches-r{r}-xfirst", r, LAUNCH_WARPS, lines=r, x_first=1) for r in LAUNCH_LINES]
    separate += [Way(f"pdl-r{r}", r, LAUNCH_WARPS, lines=r, pdl=True) for r in LAUNCH_LINES]
    persistent = [
        Way(f"{kind}-{c}x{w}-d{d}", d, w, ctas=c, cross=int(kind == "stream"))
        for kind in ("drain", "stream")
        for c, w, d in PERSISTENT
    ]
    return separate + persistent


def launches(layout: Layout, way: Way, sms: int) -> list[tuple[int, int, int, int]]:
    """(grid, first stage, last stage, threads) of each launch of a pass run `way`."""
    if way.ctas:
        return [(way.ctas * sms, 0, len(layout.stages), 32 * way.warps)]
    out = []
    for i, s in enumerate(layout.stages):  # about `lines` lines a warp, as long as that leaves 2 CTAs an SM
        rows_a_warp = max(1, min(way.lines // s.lines, s.rows // (2 * sms * way.warps)))
        out.append((-(-s.rows // (rows_a_warp * way.warps)), i, i + 1, 32 * way.warps))
    return out


def compile_cubin(arch: str) -> bytes:
    """`weight_stream.cu` compiled for `arch` (e.g. "sm_90") by the pinned NVRTC."""
    from cuda.bindings import nvrtc

    def ok(result):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {err}")
        return rest[0] if rest else None

    prog = ok(nvrtc.nvrtcCreateProgram(SOURCE.read_bytes(), b"weight_stream.cu", 0, [], []))
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = b" " * ok(nvrtc.nvrtcGetProgramLogSize(prog))
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC: {log.decode(errors='replace')}")
        cubin = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
        ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class Gpu:
    """The kernels on device 0 (cuda-bindings), an arena and table on it, and one stream."""

    def __init__(self) -> None:
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart

        from gdn_tvm.runtime.graph import cuda_check

        self.driver, self.cudart, self.ok = driver, cudart, cuda_check
        cuda_check(cudart.cudaSetDevice(0))
        cuda_check(cudart.cudaFree(0))  # the primary context, current for the driver API too
        props = cuda_check(cudart.cudaGetDeviceProperties(0))
        self.sms = props.multiProcessorCount
        self.arch = f"sm_{props.major}{props.minor}"
        self._image = np.frombuffer(compile_cubin(self.arch), dtype=np.uint8)
        self.module = cuda_check(driver.cuModuleLoadData(self._image.ctypes.data))
        self.kernels = {
            d: cuda_check(driver.cuModuleGetFunction(self.module, f"weight_stream_d{d}".encode())) for d in DEPTHS
        }
        self.stream = cuda_check(cudart.cudaStreamCreate())
        self.sync = self.alloc(8)
        self.upload(self.sync, np.zeros(2, np.int32))
        self.table = self.arena = 0

    def alloc(self, nbytes: int) -> int:
        return int(self.ok(self.cudart.cudaMalloc(nbytes)))

    def free(self, ptr: int) -> None:
        self.ok(self.cudart.cudaFree(ptr))

    def upload(self, ptr: int, host: np.ndarray) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.ok(self.cudart.cudaMemcpy(ptr, host.ctypes.data, host.nbytes, kind))

    def download(self, ptr: int, host: np.ndarray) -> np.ndarray:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.ok(self.cudart.cudaMemcpy(host.ctypes.data, ptr, host.nbytes, kind))
        return host

    def copy_gbps(self, nbytes: int) -> float:
        """GB/s of a graph-replayed device-to-device copy of `nbytes` (read and written: 2 `nbytes` moved)."""
        from benchmarks.timing import replayed_us
        from gdn_tvm.runtime.graph import CudaGraph

        src, dst = self.alloc(nbytes), self.alloc(nbytes)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        try:
            graph = CudaGraph(
                lambda: self.ok(self.cudart.cudaMemcpyAsync(dst, src, nbytes, kind, self.stream)), 1, stream=self.stream
            )
            return round(2 * nbytes / replayed_us(graph) / 1e3, 1)
        finally:
            self.free(src)
            self.free(dst)

    def registers(self, depth: int) -> int:
        attr = self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
        return int(self.ok(self.driver.cuFuncGetAttribute(attr, self.kernels[depth])))

    def resident(self, way: Way) -> int:
        """CTAs of `way` an SM can hold (its shared memory allowed first)."""
        f = self.kernels[way.depth]
        attr = self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self.ok(self.driver.cuFuncSetAttribute(f, attr, way.shared))
        return int(self.ok(self.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(f, 32 * way.warps, way.shared)))

    def run(self, layout: Layout, way: Way, cooperative: bool = False) -> None:
        """Queue one pass `way` on the stream (`cooperative`: the driver refuses a grid that cannot be resident)."""
        d = self.driver
        types = (ctypes.c_void_p,) * 2 + (ctypes.c_int,) * 3 + (ctypes.c_void_p, ctypes.c_int)  # the kernels'
        attrs = []
        if way.pdl:
            attrs.append(d.CUlaunchAttribute())
            attrs[-1].id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attrs[-1].value.programmaticStreamSerializationAllowed = 1
        if cooperative:
            attrs.append(d.CUlaunchAttribute())
            attrs[-1].id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attrs[-1].value.cooperative = 1
        for grid, first, last, threads in launches(layout, way, self.sms):
            config = d.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
            config.sharedMemBytes, config.hStream = way.shared, d.CUstream(int(self.stream))
            config.attrs, config.numAttrs = attrs, len(attrs)
            args = ((self.table, self.arena, first, last, way.cross, self.sync, way.x_first), types)
            self.ok(d.cuLaunchKernelEx(config, self.kernels[way.depth], args, 0))

    def finish(self, seconds: float) -> bool:
        """Whether the stream's work finished within `seconds` (polled)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            err = self.cudart.cudaStreamQuery(self.stream)[0]
            if err == self.cudart.cudaError_t.cudaSuccess:
                return True
            if err != self.cudart.cudaError_t.cudaErrorNotReady:
                raise RuntimeError(f"CUDA error {err}")
            time.sleep(0.01)
        return False


class Hung(Exception):
    """A pass did not end: the GPU still runs it."""


def run(out: Path, presets: list[str], layers: int) -> int:
    from benchmarks.record import Results

    gpu = Gpu()
    seed, copy = int.from_bytes(os.urandom(4), "little"), gpu.copy_gbps(COPY_BYTES)
    header = {"sms": gpu.sms, "layers": layers, "seed": seed, "peak_bytes_per_us": PEAK_BYTES_PER_US, "copy_gbps": copy}
    results = Results(str(out), "benchmarks.weight_stream", None, **header)
    rng = np.random.default_rng(seed)
    for name in presets:
        layout = decoder_layers(preset(name), layers)
        moved = sum(s.streamed * (2 if s.kind == STATE else 1) for s in layout.stages)
        row: dict = {
            "preset": name,
            "stages": len(layout.stages),
            "bytes_per_layer": moved // layers,
            "floor_us_per_layer": round(moved / layers / PEAK_BYTES_PER_US, 2),
            "ways": [],
        }
        results.add(row)  # rewritten as its ways come
        start = filled(layout, rng)
        gpu.arena, gpu.table = gpu.alloc(layout.size), gpu.alloc(8 * 8 * len(layout.stages))
        gpu.upload(gpu.arena, start)
        gpu.upload(gpu.table, layout.table())
        want = None  # what the reference way wrote
        for way in ways():
            entry: dict = {"way": way.name, "registers": gpu.registers(way.depth), "shared": way.shared}
            row["ways"].append(entry)
            try:
                want = _measure(gpu, layout, way, start, want, entry)
            except Hung:
                results.save()
                os._exit(3)  # a kernel that never ends cannot be stopped from here
            except RuntimeError as why:  # recorded; a sticky CUDA error fails the ways after it as quickly
                entry["error"] = f"{why}"[:400]
            if "us" in entry:
                us = entry["us"]
                gbps = moved / us / 1e3
                entry.update(
                    us_per_layer=round(us / layers, 2),
                    gbps=round(gbps, 1),
                    peak_pct=round(100 * moved / us / PEAK_BYTES_PER_US, 1),
                    copy_pct=round(100 * gbps / copy, 1),
                )
            results.save()
            print(name, entry, flush=True)
        gpu.free(gpu.arena)
        gpu.free(gpu.table)
    results.finish()
    return 0


def _measure(gpu: Gpu, layout: Layout, way: Way, start: np.ndarray, want, entry: dict):
    """Check one pass `way` (against float64 for the first way, else against `want`), then time it (`us`), into
    `entry`; returns what the first way wrote."""
    from benchmarks.timing import replayed_us
    from gdn_tvm.runtime.graph import CudaGraph

    resident = gpu.resident(way)
    if way.ctas:
        entry["resident"] = resident
        if resident < way.ctas:
            entry["error"] = f"{way.ctas} CTAs an SM asked, {resident} fit"
            return want
    regions = layout.written()
    for at, n in regions:  # states as they started, outputs NaN
        gpu.upload(gpu.arena + at, start[at : at + n])
    gpu.upload(gpu.sync, np.zeros(2, np.int32))
    gpu.run(layout, way, cooperative=bool(way.ctas))  # a grid that cannot be resident is refused, not hung
    if not gpu.finish(WATCHDOG_S):
        entry["error"] = f"no end in {WATCHDOG_S} s"
        raise Hung
    got = np.concatenate([gpu.download(gpu.arena + at, np.empty(n, np.uint8)) for at, n in regions])
    if want is None:
        after = start.copy()
        for (at, n), chunk in zip(regions, np.split(got, np.cumsum([n for _, n in regions])[:-1]), strict=True):
            after[at : at + n] = chunk
        entry["error_vs_float64"] = check(layout, start, after)
        if not entry["error_vs_float64"] <= TOLERANCE:  # NaN fails too
            entry["error"] = f"relative error {entry['error_vs_float64']} against float64"
        want = got
    else:
        sync = gpu.download(gpu.sync, np.empty(2, np.int32)).tolist()
        entry["bit_equal"], entry["sync_left"] = bool(np.array_equal(got, want)), sync
        if not entry["bit_equal"] or any(sync):
            entry["error"] = f"differs from the first way or left counters {sync}"
    graph = CudaGraph(lambda: gpu.run(layout, way), len(launches(layout, way, gpu.sms)), stream=gpu.stream)
    entry["us"] = replayed_us(graph)
    return want


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("weight_stream.json"))
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--layers", type=int, default=LAYERS)
    args = p.parse_args(argv)
    return run(args.out, args.presets, args.layers)


if __name__ == "__main__":
    sys.exit(main())
