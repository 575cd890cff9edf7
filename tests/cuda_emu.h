// A CPU stand-in for the CUDA C++ that TVM generates; tests/cuda_emu.py builds a kernel with it and launches it.
//
// The generated preamble includes <cuda.h> outside NVRTC: the build directory's cuda.h is this file, so it is all the
// CUDA a kernel sees. Blocks run one after another (last to first), so `__shared__` storage can be function-static. A block's threads
// are fibers (ucontext) on the calling thread taking turns; a fiber gives up its turn only where CUDA threads wait
// for each other: `__syncthreads()` (the block's barrier) and the shuffles (its warp's barrier). So every barrier is
// exact and a warp's lanes exchange values in lockstep; between barriers one thread runs at a time, first to last in
// even blocks and last to first in odd ones, so a read that a missing barrier leaves unordered sees a stale value in
// one order or the other. What the generated code never does stops the launch with the reason rather than hanging
// or guessing: threads of a block at different barriers (a divergent `__syncthreads`, a shuffle some lanes skip, an
// early return before a barrier), shuffles whose mask leaves lanes out and tensor-core instructions in a partial warp.
//
// Tensor cores: tests/cuda_emu.py rewrites the inline PTX of `ldmatrix` (m8n8 .x1/.x2/.x4, .trans or not, b16) and
// of `mma` (m16n8k16 row.col, bf16 inputs, f32 accumulators) into calls of `emu::ldmatrix` and
// `emu::mma_m16n8k16_bf16` below: warp collectives like the shuffles, whose lanes post their part (a matrix row, their
// A and B registers) and read the others' behind one warp barrier. `__shared__` storage is a section of the library
// (`emu_shared`), so `__cvta_generic_to_shared` gives an offset into it as CUDA gives one into the shared window.
// `cp.async` (the copies of a software pipeline's async stages) becomes `emu::cp_async` and its group calls: a copy
// lands in shared memory at the `wait_group` that must have landed it, so a read it does not order sees stale data.
//
// Grid-wide waits: a block whose threads all wait, one of them spinning on memory (`__nanosleep` in its loop), gives
// its turn to the blocks not started yet, then to the other waiting ones in turn (its state, `__shared__` storage
// included, saved meanwhile), so a grid barrier completes; a round of waits with no atomic write and no block
// finishing is reported as a deadlock (a wait on a plain store's flag would be too).
//
// Not modelled: concurrent blocks (no inter-block races), uninitialised shared memory (it holds the last block's
// values), CUDA's rounding (`-ffp-contract=off`: no FMA contraction; libm `expf`; an exact `rsqrtf`; `mma` sums its
// exact products in double, rounding once to float, where tensor cores keep fewer bits).
//
// bf16 (`cuda_bf16.h`, included after this file, is this file again): `nv_bfloat16` holds the bits, converts from
// float rounding to the nearest even (NaN to 0x7fff, as `cvt.rn.bf16.f32` does) and to float exactly; the vector
// types TVM's codegen moves 8 and 16 bytes of them in (`uint2`, `uint4`) and 32 bytes of floats in (`ulonglong4`).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ static inline  // internal linkage: a helper's `__shared__` statics share the kernels' section
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
// Function-static, in a section of its own: the linker brackets it with `__start_emu_shared` and `__stop_emu_shared`.
#define __shared__ static __attribute__((section("emu_shared")))
// `__shared__ alignas(64) float x[n]` becomes `static __attribute__((...)) alignas(64) ...`, where C++ allows no
// standard attribute; GNU's aligned attribute may stand there.
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
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
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
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
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

// The most a lane posts to a warp collective: a shuffle's value, its row of an ldmatrix, its A and B registers of an
// mma.
constexpr size_t kPost = 24;

struct Warp {
  Barrier barrier;
  unsigned mask;  // its lanes (the last warp of a block may be partial)
  alignas(8) unsigned char slot[2][32][kPost];  // a post a lane; collectives alternate rows: one barrier each suffices
};

inline Thread threads[kMaxThreads];
inline Warp warps[kMaxThreads / 32];
inline Barrier block_barrier;
inline Thread* self;
inline bool reverse;  // this block's threads take turns last to first
inline unsigned n_threads, alive, idle;  // idle: switches since a thread last arrived at a barrier or finished
inline unsigned polling;                 // threads of the block that waited on memory since the last progress
inline bool suspended;                   // the block gave the grid its turn (every thread waits, one on memory)
inline unsigned long grid_progress;      // atomic writes and finished blocks: what a waiting block may wait for
inline ucontext_t scheduler;
inline void (*body)(void**);
inline void** body_args;
inline char error[256];

// A thread's `cp.async` copies not landed yet (see `cp_async` below).
struct AsyncCopy {
  uint32_t dst;
  const void* src;
  unsigned bytes, group;
};
constexpr unsigned kMaxCopies = 256;  // pending in a thread
struct AsyncCopies {
  AsyncCopy copy[kMaxCopies];
  unsigned n, committed;
};
inline AsyncCopies async_copies[kMaxThreads];

// Stop the launch: say why and return to the scheduler for good (the fibers hold no resources).
template <class... A>
[[noreturn]] void fail(const char* format, A... args) {
  snprintf(error, sizeof error, format, args...);
  setcontext(&scheduler);
  __builtin_unreachable();
}

// Switch to the block's next unfinished thread; a full round of them without progress is a deadlock, unless one of
// them waits on memory (`poll`): then the block gives the grid scheduler its turn, and resumes where it stopped.
inline void yield() {
  if (++idle > alive) {
    if (!polling)
      fail("deadlock: threads wait at barriers that cannot complete (a __syncthreads not every thread reaches, or a "
           "shuffle or tensor-core instruction some lanes of a warp skip)");
    suspended = true;
    swapcontext(&self->context, &scheduler);
    idle = polling = 0;
    return;
  }
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
         &b == &block_barrier ? "a __syncthreads in divergent code"
                               : "a warp's lanes at different shuffles or tensor-core instructions");
  idle = polling = 0;
  unsigned long round = b.round;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.round;
    return;
  }
  while (b.round == round) yield();
}

// What the lanes of a warp posted to one collective, by lane.
template <class T>
struct Posted {
  const unsigned char (*row)[kPost];
  T operator[](unsigned lane) const {
    T v;
    std::memcpy(&v, row[lane], sizeof v);
    return v;
  }
};

// Post `v` for the caller's warp, all its lanes in lockstep, and see every lane's post: readable until the caller's
// next collective (which posts to the other row; the one after waits until every lane has left this one).
template <class T>
Posted<T> gather(unsigned mask, const T& v, unsigned line) {
  static_assert(sizeof(T) <= kPost && std::is_trivially_copyable_v<T>);
  Warp& w = warps[self->warp];
  if (mask != w.mask) fail("shuffle mask %#x leaves lanes of warp %u (%#x) out", mask, self->warp, w.mask);
  unsigned row = self->parity ^= 1;
  std::memcpy(w.slot[row][self->lane], &v, sizeof v);
  wait(w.barrier, line);
  return {w.slot[row]};
}

// `v` of lane `src` of the caller's warp, all its lanes in lockstep.
template <class T>
T exchange(unsigned mask, T v, unsigned src, unsigned line) {
  return gather(mask, v, line)[src];
}

inline void land_pending_copies();

inline void entry() {
  body(body_args);
  land_pending_copies();
  self->done = true;
  idle = polling = 0;
  if (--alive == 0) setcontext(&scheduler);
  yield();
}

extern "C" char __start_emu_shared[] __attribute__((visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((visibility("hidden")));

// A block that gave the grid its turn: the running block's state (the globals above), saved while others run.
struct Waiting {
  uint3 index;
  unsigned self, alive;
  bool reverse;
  Barrier block_barrier;
  char* stacks;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::vector<AsyncCopies> copies;
  std::vector<char> shared;
};

inline unsigned n_warps() { return (n_threads + 31) / 32; }

// Start block `b` on `stacks`, its threads at the kernel's entry, until it finishes or waits on memory.
inline void start(unsigned b, char* stacks) {
  blockIdx = {b % gridDim.x, b / gridDim.x % gridDim.y, b / (gridDim.x * gridDim.y)};
  for (unsigned i = 0; i < n_threads; ++i) {
    Thread& t = threads[i];
    t.index = {i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
    t.lane = i % 32;
    t.warp = i / 32;
    getcontext(&t.context);
    t.context.uc_stack = {stacks + i * kStack, 0, kStack};
    t.context.uc_link = nullptr;
    makecontext(&t.context, entry, 0);
    t.parity = 0;
    t.done = false;
    async_copies[i].n = async_copies[i].committed = 0;
  }
  for (unsigned w = 0; w < n_warps(); ++w) {
    unsigned lanes = n_threads - 32 * w < 32 ? n_threads - 32 * w : 32;
    warps[w].barrier = {lanes, 0, 0, 0};
    warps[w].mask = lanes == 32 ? ~0u : (1u << lanes) - 1;
    std::memset(warps[w].slot, 0xff, sizeof warps[w].slot);  // a lane past the block's last reads NaN (or -1)
  }
  block_barrier = {n_threads, 0, 0, 0};
  alive = n_threads;
  idle = polling = 0;
  reverse = b % 2;
  self = reverse ? &threads[n_threads - 1] : threads;
  swapcontext(&scheduler, &self->context);
}

inline Waiting save(char* stacks) {
  Waiting w{blockIdx, unsigned(self - threads), alive, reverse, block_barrier, stacks,
            {threads, threads + n_threads}, {warps, warps + n_warps()}, {async_copies, async_copies + n_threads},
            {__start_emu_shared, __stop_emu_shared}};
  return w;
}

// Resume a waiting block where its thread gave the turn (its contexts back at the addresses they were saved from).
inline void resume(const Waiting& w) {
  blockIdx = w.index;
  alive = w.alive;
  reverse = w.reverse;
  block_barrier = w.block_barrier;
  std::copy(w.threads.begin(), w.threads.end(), threads);
  std::copy(w.warps.begin(), w.warps.end(), warps);
  std::copy(w.copies.begin(), w.copies.end(), async_copies);
  std::copy(w.shared.begin(), w.shared.end(), __start_emu_shared);
  self = &threads[w.self];
  swapcontext(&scheduler, &self->context);
}

// Run `kernel(args)` over a grid of `dims[0..2]` blocks of `dims[3..5]` threads; nullptr, or why it stopped.
// One launch at a time (`__shared__` storage and this state are static). Blocks start last to first, each running
// until it finishes or waits on memory; waiting blocks resume in turn once every block has started, and a round of
// them in which no atomic wrote and no block finished is a deadlock.
inline const char* run(void (*kernel)(void**), void** args, const unsigned* dims) {
  gridDim = {dims[0], dims[1], dims[2]};
  blockDim = {dims[3], dims[4], dims[5]};
  n_threads = blockDim.x * blockDim.y * blockDim.z;
  if (n_threads > kMaxThreads) return "more than 1024 threads a block";
  body = kernel;
  body_args = args;
  error[0] = 0;
  unsigned blocks = gridDim.x * gridDim.y * gridDim.z, started = 0, stale = 0;
  unsigned long progress = grid_progress;
  std::vector<char*> spare;
  std::deque<Waiting> waiting;
  while (!error[0] && (started < blocks || !waiting.empty())) {
    char* stacks;
    if (started < blocks) {  // last to first: no order CUDA promises, and the reverse of the CPU builds' loops
      stacks = spare.empty() ? new char[n_threads * kStack] : spare.back();
      if (!spare.empty()) spare.pop_back();
      start(blocks - 1 - started++, stacks);
    } else {
      stale = grid_progress == progress ? stale + 1 : 0;
      progress = grid_progress;
      if (stale > waiting.size()) {
        snprintf(error, sizeof error, "deadlock: every block waits on memory that no block writes");
        break;
      }
      stacks = waiting.front().stacks;
      resume(waiting.front());
      waiting.pop_front();
    }
    if (error[0]) {
      spare.push_back(stacks);
    } else if (suspended) {
      suspended = false;
      waiting.push_back(save(stacks));
    } else {
      ++grid_progress;
      spare.push_back(stacks);
    }
  }
  for (char* stacks : spare) delete[] stacks;
  for (Waiting& w : waiting) delete[] w.stacks;
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

// One thread runs at a time, so an atomic is a plain read-modify-write and a fence has nothing to order. Blocks run last
// to first (`run`), so a kernel taking the last arrival for the last block fails; a block whose threads all wait,
// one of them spinning on memory (`__nanosleep` in the loop), lets the others run (a grid-wide barrier).
template <class T>
T atomicAdd(T* address, T value) {
  T old = *address;
  *address = old + value;
  emu::grid_progress += value != T(0);
  return old;
}
inline void __threadfence() {}
// A thread spinning on memory backs off here: the emulator lets the block's other threads, then other blocks, run.
inline void __nanosleep(unsigned) {
  ++emu::polling;
  emu::yield();
}

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

// Tensor cores. `__shared__` storage lies between the linker's bounds of its section, which the placeholder keeps in
// every library (with shared arrays or none) and aligns to 16 bytes, so offsets are aligned where addresses are.
extern "C" char __start_emu_shared[] __attribute__((visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((visibility("hidden")));

namespace emu {

static char shared_placeholder[1] __attribute__((section("emu_shared"), used, aligned(16)));

// An asm output operand ("=r", "=f"): a C++ lvalue of 32 bits, of whatever type, that the instruction writes.
struct Reg {
  void* p;
  template <class T>
  Reg(T& v) : p(&v) {  // NOLINT: implicit, so that a braced list of the operands makes their array
    static_assert(sizeof(T) == 4 && !std::is_const_v<T>, "an asm output operand of 32 bits");
  }
  void set(uint32_t bits) const { std::memcpy(p, &bits, sizeof bits); }
};

// An asm input operand ("r", "f"): its 32 bits.
template <class T>
uint32_t bits(const T& v) {
  static_assert(sizeof(T) == 4, "an asm input operand of 32 bits");
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

inline float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The bf16 in the low or high half of a register, as float (exactly).
inline float bf16_in(uint32_t reg, bool high) { return as_float(high ? reg & 0xffff0000u : reg << 16); }

// Tensor-core instructions (`.sync.aligned`) take a whole warp.
inline void whole_warp(const char* instruction) {
  unsigned mask = warps[self->warp].mask;
  if (mask != ~0u)
    fail("%s in warp %u of %d threads: it takes a whole warp", instruction, self->warp, __builtin_popcount(mask));
}

// `bytes` of `__shared__` storage at offset `addr` (as `__cvta_generic_to_shared` gives it), aligned to `bytes`.
inline const char* shared_at(uint32_t addr, size_t bytes, const char* what) {
  size_t size = __stop_emu_shared - __start_emu_shared;
  if (addr % bytes || addr + bytes > size)  // (in size_t: no wrap-around)
    fail("%s at shared offset %#x: no %zu aligned bytes of the %zu of __shared__ storage", what, addr, bytes, size);
  char* at = __start_emu_shared + addr;
  asm("" : "+r"(at));  // hide where `at` came from: g++ must assume it may point into any `__shared__` array
  return at;
}

// prefetch.global.L2 [p]: a hint to the cache, with no effect on any value; the addresses asked for are kept for
// `emu_prefetched` (tests/cuda_emu.py maps them onto the launch's arrays).
inline std::vector<uintptr_t> prefetched;
inline void prefetch_l2(const void* p) { prefetched.push_back(reinterpret_cast<uintptr_t>(p)); }
// How many addresses were prefetched since the record was last taken; with `out`, they are copied there (up to `n`)
// and the record cleared (C linkage: tests/cuda_emu.py calls it).
EMU_EXPORT size_t emu_prefetched(uintptr_t* out, size_t n) {
  size_t total = prefetched.size();
  if (out) {
    std::copy_n(prefetched.begin(), std::min(n, total), out);
    prefetched.clear();
  }
  return total;
}

// cp.async.{ca,cg}.shared.global [dst], [src], bytes: a copy the thread starts now and that lands later. Its copies
// since its last commit_group are its next group; wait_group n lands its groups but the newest n (in CUDA they may
// land earlier; landing them as late as allowed makes a read that no wait orders after its copy see stale data). A
// thread's pending copies land when it ends.
inline void cp_async(uint32_t dst, const void* src, unsigned bytes) {
  AsyncCopies& mine = async_copies[self - threads];
  if (mine.n == kMaxCopies) fail("more than %u cp.async copies pending in a thread", kMaxCopies);
  if (bytes != 4 && bytes != 8 && bytes != 16) fail("cp.async of %u bytes (4, 8 or 16)", bytes);
  shared_at(dst, bytes, "a cp.async destination");
  mine.copy[mine.n++] = {dst, src, bytes, mine.committed};
}

inline void cp_async_commit_group() { ++async_copies[self - threads].committed; }

// Land the caller's copies of committed groups but the newest `newest`.
inline void cp_async_wait_group(unsigned newest) {
  AsyncCopies& mine = async_copies[self - threads];
  unsigned kept = 0;
  for (unsigned i = 0; i < mine.n; ++i) {
    const AsyncCopy& c = mine.copy[i];
    if (c.group + newest < mine.committed)
      std::memcpy(const_cast<char*>(shared_at(c.dst, c.bytes, "a cp.async destination")), c.src, c.bytes);
    else
      mine.copy[kept++] = c;
  }
  mine.n = kept;
}

inline void land_pending_copies() {
  cp_async_commit_group();
  cp_async_wait_group(0);
}

// ldmatrix.sync.aligned.m8n8.x<n>[.trans].shared.b16 {out}, [addr]: lanes 8r to 8r + 7 give the addresses of the 8
// rows (8 b16, 16 bytes aligned) of matrix r < n, the other lanes' addresses are unused; register r of lane t gets row
// t / 4 of matrix r at columns 2 (t % 4) and 2 (t % 4) + 1 (the first in its low half), of the transposed matrix with
// `trans`. A lane reads its row when it reaches the instruction, as it posts its value to a shuffle.
template <unsigned n>
void ldmatrix(bool trans, uint32_t addr, const Reg (&out)[n], unsigned line = __builtin_LINE()) {
  static_assert(n == 1 || n == 2 || n == 4);
  whole_warp("ldmatrix");
  struct Row {
    uint16_t b16[8];
  } mine = {};
  unsigned t = self->lane;
  if (t < 8 * n) std::memcpy(&mine, shared_at(addr, sizeof mine, "an ldmatrix row"), sizeof mine);
  Posted<Row> rows = gather(~0u, mine, line);
  for (unsigned r = 0; r < n; ++r) {
    uint32_t lo, hi;
    if (trans) {
      lo = rows[8 * r + 2 * (t % 4)].b16[t / 4];
      hi = rows[8 * r + 2 * (t % 4) + 1].b16[t / 4];
    } else {
      Row row = rows[8 * r + t / 4];
      lo = row.b16[2 * (t % 4)];
      hi = row.b16[2 * (t % 4) + 1];
    }
    out[r].set(lo | hi << 16);
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d}, {a}, {b}, {c}: D = A B + C for the warp's A (16 x 16,
// bf16), B (16 x 8, bf16), C and D (16 x 8, f32) in the PTX ISA's fragments. With g = lane / 4 and q = lane % 4, a
// lane holds A's rows g (a0, a2) and g + 8 (a1, a3) at k = 2q, 2q + 1 (a0, a1; in the low and high half) and
// 2q + 8, 2q + 9 (a2, a3); B's column g at the same k (b0, b1); C's and D's rows g (c0, c1) and g + 8 (c2, c3) at
// columns 2q, 2q + 1. An element of D is C's, then the 16 products in k order, summed in double (the products of
// bf16 are exact there) and rounded once to float. C is read before D is written (TVM passes the same registers).
inline void mma_m16n8k16_bf16(const Reg (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                              const uint32_t (&c)[4], unsigned line = __builtin_LINE()) {
  whole_warp("mma");
  struct Fragments {
    uint32_t a[4], b[2];
  };
  Posted<Fragments> all = gather(~0u, Fragments{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, line);
  unsigned g = self->lane / 4, q = self->lane % 4;
  float A[2][16], B[2][16];  // this lane's rows of A (g, g + 8) and columns of B (2q, 2q + 1)
  for (unsigned k = 0; k < 16; ++k) {
    unsigned holder = k % 8 / 2;  // the lane holding k among the 4 of a row of A or a column of B
    for (unsigned i = 0; i < 2; ++i) {
      A[i][k] = bf16_in(all[4 * g + holder].a[i + 2 * (k / 8)], k % 2);
      B[i][k] = bf16_in(all[4 * (2 * q + i) + holder].b[k / 8], k % 2);
    }
  }
  for (unsigned e = 0; e < 4; ++e) {  // D's row g + 8 (e / 2), column 2q + e % 2
    double sum = as_float(c[e]);
    for (unsigned k = 0; k < 16; ++k) sum += double(A[e / 2][k]) * B[e % 2][k];
    d[e].set(bits(float(sum)));
  }
}

}  // namespace emu

// The offset of `p` in `__shared__` storage, as CUDA's is in the shared window; of anything else (undefined in
// CUDA) it stops the launch.
inline size_t __cvta_generic_to_shared(const void* p) {
  uintptr_t at = uintptr_t(p), start = uintptr_t(__start_emu_shared);
  if (at < start || at >= uintptr_t(__stop_emu_shared))
    emu::fail("__cvta_generic_to_shared(%p): no __shared__ storage", p);
  asm volatile("" : : "r"(p) : "memory");  // the array escapes: `emu::shared_at`'s pointers may write it
  return at - start;
}
