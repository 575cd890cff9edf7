// A CPU stand-in for the CUDA C++ that TVM generates; tests/cuda_emu.py builds a kernel with it and launches it.
//
// The generated preamble includes <cuda.h> outside NVRTC: the build directory's cuda.h is this file, so it is all the
// CUDA a kernel sees. Blocks run one after another, so `__shared__` storage can be function-static. A block's threads
// are fibers (ucontext) on the calling thread taking turns; a fiber gives up its turn only where CUDA threads wait
// for each other: `__syncthreads()` (the block's barrier) and the shuffles (its warp's barrier). So every barrier is
// exact and a warp's lanes exchange values in lockstep; between barriers one thread runs at a time, first to last in
// even blocks and last to first in odd ones, so a read that a missing barrier leaves unordered sees a stale value in
// one order or the other. What the generated code never does stops the launch with the reason rather than hanging
// or guessing: threads of a block at different barriers (a divergent `__syncthreads`, a shuffle some lanes skip, an
// early return before a barrier) and shuffles whose mask leaves lanes out.
//
// Not modelled: concurrent blocks (no inter-block races), uninitialised shared memory (it holds the last block's
// values), CUDA's rounding (`-ffp-contract=off`: no FMA contraction; libm `expf`; an exact `rsqrtf`).
//
// bf16 (`cuda_bf16.h`, included after this file, is this file again): `nv_bfloat16` holds the bits, converts from
// float rounding to the nearest even (NaN to 0x7fff, as `cvt.rn.bf16.f32` does) and to float exactly; the vector
// types TVM's codegen moves 8 and 16 bytes of them in (`uint2`, `uint4`) and 32 bytes of floats in (`ulonglong4`).
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __shared__ static
// `__shared__ alignas(64) float x[n]` becomes `static alignas(64) ...`, where C++ allows no standard attribute;
// GNU's aligned attribute may stand there.
#define alignas(n) __attribute__((aligned(n)))

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) int4 {  // a vector of indices, where TVM gathers float4s it cannot prove contiguous
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
struct alignas(16) ulonglong4 {  // 16-byte aligned in CUDA too (`ulonglong4_32a` is the 32-byte one)
  unsigned long long x, y, z, w;
};

struct nv_bfloat16 {
  unsigned short bits;
  nv_bfloat16() = default;
  nv_bfloat16(float f) {  // NOLINT: implicit, as CUDA's
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? 0x7fff : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  }
  operator float() const {  // NOLINT: implicit, as CUDA's
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};
struct alignas(4) nv_bfloat162 {
  nv_bfloat16 x, y;
  nv_bfloat162() = default;
  nv_bfloat162(nv_bfloat16 x, nv_bfloat16 y) : x(x), y(y) {}
};
using __nv_bfloat16 = nv_bfloat16;
using __nv_bfloat162 = nv_bfloat162;
inline nv_bfloat16 __float2bfloat16(float f) { return nv_bfloat16(f); }
inline nv_bfloat16 __float2bfloat16_rn(float f) { return nv_bfloat16(f); }
inline float __bfloat162float(nv_bfloat16 h) { return float(h); }
inline bool __hgt(nv_bfloat16 a, nv_bfloat16 b) { return float(a) > float(b); }
inline bool __hlt(nv_bfloat16 a, nv_bfloat16 b) { return float(a) < float(b); }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }

inline uint3 blockIdx;
inline dim3 blockDim, gridDim;
#define threadIdx (emu::self->index)

namespace emu {

constexpr unsigned kMaxThreads = 1024;  // a block's limit in CUDA
constexpr size_t kStack = 256 << 10;    // bytes per fiber (the largest local arrays are a few KiB)

struct Thread {
  ucontext_t context;
  uint3 index;
  unsigned lane, warp, parity;
  bool done;
};

struct Barrier {
  unsigned count, arrived, line;  // `line`: where the first of this round arrived
  unsigned long round;
};

struct Warp {
  Barrier barrier;
  unsigned mask;         // its lanes (the last warp of a block may be partial)
  uint64_t slot[2][32];  // a value per lane; shuffles alternate rows, so one barrier per shuffle suffices
};

inline Thread threads[kMaxThreads];
inline Warp warps[kMaxThreads / 32];
inline Barrier block_barrier;
inline Thread* self;
inline bool reverse;  // this block's threads take turns last to first
inline unsigned n_threads, alive, idle;  // idle: switches since a thread last arrived at a barrier or finished
inline ucontext_t scheduler;
inline void (*body)(void**);
inline void** body_args;
inline char error[256];

// Stop the launch: say why and return to the scheduler for good (the fibers hold no resources).
template <class... A>
[[noreturn]] void fail(const char* format, A... args) {
  snprintf(error, sizeof error, format, args...);
  setcontext(&scheduler);
  __builtin_unreachable();
}

// Switch to the block's next unfinished thread; a full round of them without progress is a deadlock.
inline void yield() {
  if (++idle > alive)
    fail("deadlock: threads wait at barriers that cannot complete (a __syncthreads not every thread reaches, or a "
         "shuffle some lanes of a warp skip)");
  Thread *me = self, *last = &threads[n_threads - 1];
  do self = reverse ? (self == threads ? last : self - 1) : (self == last ? threads : self + 1);
  while (self->done);
  if (self != me) swapcontext(&me->context, &self->context);
}

inline void wait(Barrier& b, unsigned line) {
  if (b.arrived == 0)
    b.line = line;
  else if (b.line != line)
    fail("threads meet at lines %u and %u (%s)", b.line, line,
         &b == &block_barrier ? "a __syncthreads in divergent code" : "a warp's lanes at different shuffles");
  idle = 0;
  unsigned long round = b.round;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.round;
    return;
  }
  while (b.round == round) yield();
}

// `v` of lane `src` of the caller's warp, all its lanes in lockstep.
template <class T>
T exchange(unsigned mask, T v, unsigned src, unsigned line) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  Warp& w = warps[self->warp];
  if (mask != w.mask) fail("shuffle mask %#x leaves lanes of warp %u (%#x) out", mask, self->warp, w.mask);
  unsigned row = self->parity ^= 1;
  std::memcpy(&w.slot[row][self->lane], &v, sizeof v);
  wait(w.barrier, line);
  T out;
  std::memcpy(&out, &w.slot[row][src], sizeof out);
  return out;
}

inline void entry() {
  body(body_args);
  self->done = true;
  idle = 0;
  if (--alive == 0) setcontext(&scheduler);
  yield();
}

// Run `kernel(args)` over a grid of `dims[0..2]` blocks of `dims[3..5]` threads; nullptr, or why it stopped.
// One launch at a time (`__shared__` storage and this state are static).
inline const char* run(void (*kernel)(void**), void** args, const unsigned* dims) {
  gridDim = {dims[0], dims[1], dims[2]};
  blockDim = {dims[3], dims[4], dims[5]};
  n_threads = blockDim.x * blockDim.y * blockDim.z;
  if (n_threads > kMaxThreads) return "more than 1024 threads a block";
  for (unsigned i = 0; i < n_threads; ++i) {
    threads[i].index = {i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
    threads[i].lane = i % 32;
    threads[i].warp = i / 32;
  }
  for (unsigned w = 0; w * 32 < n_threads; ++w) {
    unsigned lanes = n_threads - 32 * w < 32 ? n_threads - 32 * w : 32;
    warps[w].barrier = {lanes, 0, 0, 0};
    warps[w].mask = lanes == 32 ? ~0u : (1u << lanes) - 1;
    std::memset(warps[w].slot, 0xff, sizeof warps[w].slot);  // a lane past the block's last reads NaN (or -1)
  }
  block_barrier = {n_threads, 0, 0, 0};
  body = kernel;
  body_args = args;
  error[0] = 0;
  char* stacks = new char[n_threads * kStack];
  for (unsigned b = 0; b < gridDim.x * gridDim.y * gridDim.z && !error[0]; ++b) {
    blockIdx = {b % gridDim.x, b / gridDim.x % gridDim.y, b / (gridDim.x * gridDim.y)};
    for (unsigned i = 0; i < n_threads; ++i) {
      Thread& t = threads[i];
      getcontext(&t.context);
      t.context.uc_stack = {stacks + i * kStack, 0, kStack};
      t.context.uc_link = nullptr;
      makecontext(&t.context, entry, 0);
      t.parity = 0;
      t.done = false;
    }
    alive = n_threads;
    idle = 0;
    reverse = b % 2;
    self = reverse ? &threads[n_threads - 1] : threads;
    swapcontext(&scheduler, &self->context);
  }
  delete[] stacks;
  if (error[0]) {
    size_t n = strlen(error);
    snprintf(error + n, sizeof error - n, " in block (%u, %u, %u)", blockIdx.x, blockIdx.y, blockIdx.z);
  }
  return error[0] ? error : nullptr;
}

}  // namespace emu

// tests/cuda_emu.py appends one per kernel, `...` being its arguments read from `a` (`*(float**)a[0], *(int*)a[1]`):
// `emu_launch_<kernel>(a, dims)` runs it as `emu::run` does, the library's one export (it builds with hidden symbols).
#define EMU_EXPORT extern "C" __attribute__((visibility("default")))
#define EMU_LAUNCHER(kernel, ...)                                                 \
  static void emu_body_##kernel(void** a) { kernel(__VA_ARGS__); }                \
  EMU_EXPORT const char* emu_launch_##kernel(void** a, const unsigned* dims) {    \
    return emu::run(emu_body_##kernel, a, dims);                                  \
  }

inline void __syncthreads(unsigned line = __builtin_LINE()) { emu::wait(emu::block_barrier, line); }
inline unsigned __activemask() { return emu::warps[emu::self->warp].mask; }

// CUDA's lane arithmetic for `width` (a power of two): a lane reads within its own `width`-wide segment and gets
// its own value where the source falls outside it.
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, unsigned line = __builtin_LINE()) {
  unsigned lane = emu::self->lane;
  return emu::exchange(mask, v, (lane & ~(width - 1)) + (src & (width - 1)), line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, unsigned line = __builtin_LINE()) {
  unsigned lane = emu::self->lane;
  return emu::exchange(mask, v, (lane & (width - 1)) + delta < (unsigned)width ? lane + delta : lane, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, unsigned line = __builtin_LINE()) {
  unsigned lane = emu::self->lane;
  return emu::exchange(mask, v, (lane & (width - 1)) >= delta ? lane - delta : lane, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, unsigned line = __builtin_LINE()) {
  unsigned lane = emu::self->lane, src = lane ^ lane_mask;
  return emu::exchange(mask, v, src < (lane & ~(width - 1)) + width ? src : lane, line);
}
