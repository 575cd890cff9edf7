"""The emulator's tensor-core and async-copy instructions (`cuda_emu`: the inline PTX TVM emits rewritten into calls of
the shim) against their PTX ISA definitions in numpy: ldmatrix's fragments of 8x8 b16 matrices whose rows the lanes
point at, mma's D = A B + C on bf16 fragments, the two together as TVM's tensor-core GEMVs use them, cp.async's
copies landing by commit group; and what the emulator does not model refused or stopped with the reason."""

from __future__ import annotations

import re
import shutil

import ml_dtypes
import numpy as np
import pytest
from cuda_emu import Launch, NotEmulated, launcher

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH (it builds the emulated kernels)")

LANE = np.arange(32)
G, Q = LANE // 4, LANE % 4  # a lane's group (row of A, C; column of B) and its place in the group


def _pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """32-bit registers of two b16 (uint16 bits) each, `lo` in the low half."""
    return lo.astype(np.uint32) | hi.astype(np.uint32) << 16


def _ldmatrix_fragment(m: np.ndarray) -> np.ndarray:
    """The register of each lane that ldmatrix loads an 8x8 matrix `m` into: lane t holds row t/4, columns 2 (t%4)
    and 2 (t%4) + 1."""
    return _pack(m[G, 2 * Q], m[G, 2 * Q + 1])


def _a_fragment(a: np.ndarray) -> np.ndarray:
    """(32, 4) registers of m16n8k16's A (16 x 16 b16 bits, rows M, columns K): rows g, g + 8, g, g + 8 and k 2q,
    2q + 1 (+ 8 in the last two)."""
    return np.stack(
        [_pack(a[r, k], a[r, k + 1]) for r, k in [(G, 2 * Q), (G + 8, 2 * Q), (G, 2 * Q + 8), (G + 8, 2 * Q + 8)]], 1
    )


def _b_fragment(b: np.ndarray) -> np.ndarray:
    """(32, 2) registers of m16n8k16's B (16 x 8 b16 bits, rows K, columns N): column g at k 2q, 2q + 1 (+ 8)."""
    return np.stack([_pack(b[k, G], b[k + 1, G]) for k in (2 * Q, 2 * Q + 8)], 1)


def _c_fragment(c: np.ndarray) -> np.ndarray:
    """(32, 4) registers of m16n8k16's C or D (16 x 8): rows g, g, g + 8, g + 8 at columns 2q, 2q + 1."""
    return np.stack([c[G, 2 * Q], c[G, 2 * Q + 1], c[G + 8, 2 * Q], c[G + 8, 2 * Q + 1]], 1)


def _bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16)


def _product(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A B + C rounded once to float32: the products of bf16 are exact in float64 and the sums of these random
    values too (they span far fewer than 53 bits), so the shim's sum in k order rounds to the same float."""
    return (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)


def _ldmatrix(n: int, trans: bool, registers: str, address: str) -> str:
    """An ldmatrix statement as TVM's CUDA codegen prints it: `n` registers at `registers` (a b16 pointer) from
    `address` (an expression of the lane's row address, a shared offset)."""
    outputs = ", ".join(f'"=r"(((unsigned *)({registers}))[{r}])' for r in range(n))
    operands = ", ".join(f"%{r}" for r in range(n))
    return f"""
  {{
    unsigned int addr = {address};
    __asm__ __volatile__(
      "ldmatrix.sync.aligned.m8n8.x{n}{".trans" if trans else ""}.shared.b16"
      "{{{operands}}}, [%{n}];\\n"
      : {outputs}
      : "r"(addr)
    );
  }}
"""


def _mma(acc: str, a: str, b: str) -> str:
    """An m16n8k16 bf16 mma statement as TVM's CUDA codegen prints it: C and D the 4 floats at `acc`, A's and B's
    registers at `a` and `b`."""
    d = [f'"=f"(((float *)({acc}))[{i}])' for i in range(4)]
    ab = [f'"r"(((unsigned *)({x}))[{i}])' for x, n in [(a, 4), (b, 2)] for i in range(n)]
    c = [f'"f"(((float *)({acc}))[{i}])' for i in range(4)]
    return f"""
  {{
    __asm__ __volatile__(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
      "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%10, %11, %12, %13}};\\n"
      :  {", ".join(d)}
      : {", ".join(ab + c)});
  }}
"""


# Each lane of two warps points at a row of a table of 64 in shared memory (a lane whose address ldmatrix does not use
# at none: an offset past shared storage) and stores what ldmatrix loads.
LDMATRIX = """#include <cuda.h>
extern "C" __global__ void __launch_bounds__(64) ldmatrix_kernel(nv_bfloat16* __restrict__ table_ptr,
    int* __restrict__ rows_ptr, unsigned* __restrict__ out_ptr) {
  __shared__ alignas(64) nv_bfloat16 table_shared_ptr[512];
  alignas(16) unsigned out_warp_ptr[4];
  int t = (((int)threadIdx.y) * 32) + ((int)threadIdx.x);
  for (int i = 0; i < 8; ++i) {
    table_shared_ptr[(t * 8) + i] = table_ptr[(t * 8) + i];
  }
  __syncthreads();
@LDMATRIX
  for (int r = 0; r < @N; ++r) {
    out_ptr[(t * @N) + r] = out_warp_ptr[r];
  }
}
"""
ROW_ADDRESS = "__cvta_generic_to_shared((&(table_shared_ptr[0])) + (rows_ptr[t] * 8))"


def _ldmatrix_source(n: int, trans: bool, address: str = f"rows_ptr[t] < 0 ? 0xfffffff0u : {ROW_ADDRESS}") -> str:
    return LDMATRIX.replace("@LDMATRIX", _ldmatrix(n, trans, "out_warp_ptr + 0", address)).replace("@N", str(n))


@pytest.mark.parametrize("trans", [False, True], ids=["rows", "trans"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_ldmatrix_loads_the_fragments_of_the_rows_lanes_point_at(n, trans, rng):
    """Matrix r of a warp is the 8 rows lanes 8r to 8r + 7 point at (anywhere, in any order); register r of lane t
    gets row t/4 of it (of its transpose with .trans) at columns 2 (t%4), 2 (t%4) + 1; the other lanes' addresses are
    not read (they point past shared memory)."""
    table = _bits(_bf16(rng, 64, 8))
    rows = np.full((2, 32), -1, np.int32)
    rows[:, : 8 * n] = rng.integers(0, 64, (2, 8 * n))
    out = np.full((2, 32, n), 0xFFFFFFFF, np.uint32)
    run = launcher(_ldmatrix_source(n, trans), [Launch("ldmatrix_kernel", (0, 1, 2), (1, 1, 1), (32, 2, 1))])
    run(table, rows, out)
    for w in range(2):
        for r in range(n):
            m = table[rows[w, 8 * r : 8 * r + 8]]
            np.testing.assert_array_equal(out[w, :, r], _ldmatrix_fragment(m.T if trans else m), f"warp {w}, {r}")


# Two warps, each an m16n8k16 of the registers it reads; C and D are the same registers, as TVM emits them.
MMA = """#include <cuda.h>
#include <mma.h>
extern "C" __global__ void __launch_bounds__(64) mma_kernel(unsigned* __restrict__ a_ptr,
    unsigned* __restrict__ b_ptr, float* __restrict__ c_ptr, float* __restrict__ d_ptr) {
  alignas(16) unsigned a_warp_ptr[4];
  alignas(16) unsigned b_warp_ptr[2];
  alignas(16) float acc_warp_ptr[4];
  int t = (((int)threadIdx.y) * 32) + ((int)threadIdx.x);
  for (int i = 0; i < 4; ++i) {
    a_warp_ptr[i] = a_ptr[(t * 4) + i];
    acc_warp_ptr[i] = c_ptr[(t * 4) + i];
  }
  for (int i = 0; i < 2; ++i) {
    b_warp_ptr[i] = b_ptr[(t * 2) + i];
  }
@MMA
  for (int i = 0; i < 4; ++i) {
    d_ptr[(t * 4) + i] = acc_warp_ptr[i];
  }
}
""".replace("@MMA", _mma("acc_warp_ptr + 0", "a_warp_ptr + 0", "b_warp_ptr + 0"))


def test_mma_bf16_gives_the_fragments_of_a_b_plus_c(rng):
    """Each warp's D fragments are those of A B + C (A, B bf16, C float32) of its A, B and C fragments, exactly."""
    a, b = _bf16(rng, 2, 16, 16), _bf16(rng, 2, 16, 8)
    c = rng.standard_normal((2, 16, 8)).astype(np.float32)
    d = np.full((2, 32, 4), np.nan, np.float32)
    registers = [np.stack([f(x) for x in xs]) for f, xs in [(_a_fragment, _bits(a)), (_b_fragment, _bits(b))]]
    run = launcher(MMA, [Launch("mma_kernel", (0, 1, 2, 3), (1, 1, 1), (32, 2, 1))])
    run(*registers, np.stack([_c_fragment(x) for x in c]), d)
    for w in range(2):
        np.testing.assert_array_equal(d[w], _c_fragment(_product(a[w], b[w], c[w])), f"warp {w}")


# One warp: D (16 x 16) = A (16 x 16, rows M) B (16 x 16) + C through ldmatrix and two m16n8k16, from shared memory
# of padded rows (24 b16). B is stored N x K (`w`, as TVM's GEMVs read their weights: ldmatrix as is) or K x N
# (ldmatrix .trans); lanes point at the rows of matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), ... of A
# and (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), ... of B, whose registers 0, 1 and 2, 3 are the n halves.
TILE = """#include <cuda.h>
extern "C" __global__ void __launch_bounds__(32) tile_kernel(nv_bfloat16* __restrict__ a_ptr,
    nv_bfloat16* __restrict__ b_ptr, float* __restrict__ c_ptr, float* __restrict__ d_ptr) {
  __shared__ alignas(64) nv_bfloat16 a_shared_ptr[384];
  __shared__ alignas(64) nv_bfloat16 b_shared_ptr[384];
  alignas(16) nv_bfloat16 a_shared_warp_ptr[8];
  alignas(16) nv_bfloat16 b_shared_warp_ptr[8];
  alignas(16) float acc_warp_ptr[8];
  int l = ((int)threadIdx.x);
  for (int i = 0; i < 8; ++i) {
    a_shared_ptr[((l >> 1) * 24) + (((l & 1) * 8) + i)] = a_ptr[(l * 8) + i];
    b_shared_ptr[((l >> 1) * 24) + (((l & 1) * 8) + i)] = b_ptr[(l * 8) + i];
    acc_warp_ptr[i] = c_ptr[(l * 8) + i];
  }
  __syncthreads();
@LDMATRIX_A
@LDMATRIX_B
  for (int j = 0; j < 2; ++j) {
@MMA
  }
  for (int i = 0; i < 8; ++i) {
    d_ptr[(l * 8) + i] = acc_warp_ptr[i];
  }
}
""".replace(
    "@LDMATRIX_A",
    _ldmatrix(
        4,
        False,
        "a_shared_warp_ptr + 0",
        "__cvta_generic_to_shared((&(a_shared_ptr[0])) + ((((l & 7) + (((l >> 3) & 1) * 8)) * 24) + ((l >> 4) * 8)))",
    ),
).replace("@MMA", _mma("acc_warp_ptr + (j * 4)", "a_shared_warp_ptr + 0", "b_shared_warp_ptr + (j * 4)"))
B_ADDRESS = {  # lane l points at row l % 8 of matrix l / 8: (n, k) of w[n, k], (k, n) of b[k, n]
    "nk": "((((l >> 4) * 8) + (l & 7)) * 24) + (((l >> 3) & 1) * 8)",
    "kn": "(((((l >> 3) & 1) * 8) + (l & 7)) * 24) + ((l >> 4) * 8)",
}


@pytest.mark.parametrize("layout", B_ADDRESS)
def test_ldmatrix_feeds_mma_as_tvm_emits_them(layout, rng):
    """A warp's 16 x 16 tile of A B + C from A and B in shared memory: A's fragments by ldmatrix, B's by ldmatrix of
    N x K storage or ldmatrix .trans of K x N, two mma (n 0-7, 8-15) accumulating in place."""
    a, b = _bf16(rng, 16, 16), _bf16(rng, 16, 16)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    d = np.full((32, 8), np.nan, np.float32)

    def registers(x):  # C's or D's of both n halves, as the warp holds them
        return np.concatenate([_c_fragment(x[:, :8]), _c_fragment(x[:, 8:])], 1)

    address = f"__cvta_generic_to_shared((&(b_shared_ptr[0])) + ({B_ADDRESS[layout]}))"
    source = TILE.replace("@LDMATRIX_B", _ldmatrix(4, layout == "kn", "b_shared_warp_ptr + 0", address))
    run = launcher(source, [Launch("tile_kernel", (0, 1, 2, 3), (1, 1, 1), (32, 1, 1))])
    run(_bits(a), _bits(np.ascontiguousarray(b.T) if layout == "nk" else b), registers(c), d)
    np.testing.assert_array_equal(d, registers(_product(a, b, c)))


# Each thread copies two floats of `in` into shared memory in two commit groups (16 and 4 bytes) and reads both back
# after waiting for all but the newest group, then after waiting for all; shared memory starts at -1.
CP_ASYNC = """#include <cuda.h>
extern "C" __global__ void __launch_bounds__(32) copies(float* __restrict__ in_ptr, float* __restrict__ out_ptr) {
  __shared__ alignas(64) float s_ptr[160];
  int t = ((int)threadIdx.x);
  s_ptr[t * 4] = -1.000000e+00f;
  s_ptr[128 + t] = -1.000000e+00f;
  __syncthreads();
  unsigned int first = __cvta_generic_to_shared((&(s_ptr[0])) + (t * 4));
  unsigned int second = __cvta_generic_to_shared((&(s_ptr[128])) + t);
  asm volatile("cp.async.cg.shared.global [%0], [%1], %2;" :: "r"(first), "l"(in_ptr + (t * 4)), "n"(16));
  asm volatile("cp.async.commit_group;" :  : );
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(second), "l"(in_ptr + (128 + t)), "n"(4));
  asm volatile("cp.async.commit_group;" :  : );
  asm volatile("cp.async.wait_group 1;" :  :  : "memory");
  out_ptr[t] = s_ptr[t * 4];
  out_ptr[32 + t] = s_ptr[128 + t];
  asm volatile("cp.async.wait_group 0;" :  :  : "memory");
  out_ptr[64 + t] = s_ptr[128 + t];
}
"""


def test_cp_async_copies_land_by_commit_group(rng):
    """`wait_group 1` lands every group but the newest; a copy of the newest is not in shared memory until
    `wait_group 0` (the emulator lands copies as late as PTX allows, so a read no wait orders sees stale data)."""
    values = rng.standard_normal(160).astype(np.float32)
    out = np.full(96, np.nan, np.float32)
    launcher(CP_ASYNC, [Launch("copies", (0, 1), (1, 1, 1), (32, 1, 1))])(values, out)
    np.testing.assert_array_equal(out[:32], values[:128:4])
    np.testing.assert_array_equal(out[32:64], -1)
    np.testing.assert_array_equal(out[64:], values[128:])


ASM = """#include <cuda.h>
extern "C" __global__ void __launch_bounds__(32) asm_kernel(float* __restrict__ x_ptr) {
  __shared__ alignas(64) float x_shared_ptr[128];
  float x[4];
  unsigned int addr = __cvta_generic_to_shared((&(x_shared_ptr[0])) + (((int)threadIdx.x) * 4));
  {
    __asm__ __volatile__(
      @ASM
    );
  }
}
"""
F16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
REFUSED = {  # an asm statement's operands and what the refusal names
    "cp.async-literal-size": (
        '"cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(addr), "l"(x_ptr)',
        "cp.async.cg.shared.global with operands",
    ),
    "cp.async-src-size": (
        '"cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"(addr), "l"(x_ptr), "n"(4), "r"(addr)',
        "cp.async.ca.shared.global with operands",
    ),
    "mma-f16": (
        f'"{F16} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%10, %11, %12, %13}};"\n'
        ': "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]) : "r"(addr), "r"(addr), "r"(addr), "r"(addr), "r"(addr),\n'
        '"r"(addr), "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3])',
        F16,
    ),
    "ldmatrix-operands": (
        '"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1}, [%2];" : "=r"(x[0]), "=r"(x[1]) : "r"(addr)',
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 with operands",
    ),
    "ldmatrix-clobbers": (
        '"ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(x[0]) : "r"(addr) : "cc"',
        "ldmatrix.sync.aligned.m8n8.x1.shared.b16 with clobbers",
    ),
    "several-instructions": ('"{ .reg .pred p; setp.ne.b32 p, %0, 0; }" :: "r"(addr)', "{ .reg .pred p;"),
}


@pytest.mark.parametrize("what", REFUSED)
def test_unmodelled_inline_ptx_is_refused_by_name(what):
    """Inline PTX the shim does not model (an instruction, another form of a modelled one) is refused, named,
    before g++ sees it."""
    operands, name = REFUSED[what]
    with pytest.raises(NotEmulated, match=re.escape(name)):
        launcher(ASM.replace("@ASM", operands), [Launch("asm_kernel", (0,), (1, 1, 1), (32, 1, 1))])


STOPPED = {  # an address of the ldmatrix kernel (x4), the block's threads (x, y) and why the launch stops
    "local-address": ("__cvta_generic_to_shared(&(out_warp_ptr[0]))", (32, 2), "no __shared__ storage"),
    "misaligned-row": (ROW_ADDRESS.replace("* 8)", "* 8) + 4"), (32, 2), "no 16 aligned bytes"),
    "partial-warp": (ROW_ADDRESS, (48, 1), "ldmatrix in warp 1 of 16 threads: it takes a whole warp"),
}


@pytest.mark.parametrize("what", STOPPED)
def test_undefined_ldmatrix_stops_with_the_reason(what, rng):
    """What CUDA leaves undefined stops the launch: an address that is no shared memory, a row not 16-byte aligned,
    a warp short of 32 threads."""
    address, (x, y), why = STOPPED[what]
    rows = rng.integers(0, 63, (2, 32), dtype=np.int32)
    run = launcher(_ldmatrix_source(4, False, address), [Launch("ldmatrix_kernel", (0, 1, 2), (1, 1, 1), (x, y, 1))])
    with pytest.raises(RuntimeError, match=why):
        run(_bits(_bf16(rng, 64, 8)), rows, np.zeros(64 * 4, np.uint32))
