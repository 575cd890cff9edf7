// The kernels of benchmarks/weight_stream.py (it says what they measure and how the table is laid out).
//
// One pass is a table of stages, each a bf16 GEMV (y = W x, W [rows, 256 * lines]; normed: y = W x / rms(x), the
// RMSNorm a layer's projections start with, as a scale of their sums) or a recurrent-state update (a row of 128
// floats a line: s = 0.9 s + 0.1 v k, y = s . q / sqrt(128), s written back in place). Every array lives in one arena
// at the byte offsets the table gives. Warp `gw` of the `tw` in the grid runs rows gw, gw + tw, ... of each stage it
// is given, one 512-byte line of a row at a time, 16 bytes a lane. Its lines are a stream that `cp.async` copies into
// a ring of D lines of shared memory, D lines ahead of the one the warp computes: each lane copies its own 16 bytes
// and reads only those, so no lane waits for another's copy.
//
// `first` to `last` are the stages of one launch. With more than one, the grid is persistent (all of it resident: the
// caller checks the occupancy) and waits at a grid barrier before each later stage. `cross` says whether the stream
// runs on past the end of the stage being computed: with it, a warp done with a stage has the next stage's first D
// lines in flight while it waits at the barrier (the weights and states do not depend on the activations the barrier
// waits for); without, the ring drains at every barrier and fills again after it, as separate kernels do. A launch
// first lets the next kernel start (programmatic dependent launch, where the host asked for it), copies its first D
// lines, and only then waits for the kernel before it. `x_first` has a launch read its input (the norm) before it
// copies any line, as a kernel whose prologue comes first does; otherwise the copies are in flight meanwhile.

#define LINE 512

enum { GEMV, STATE, NORMED };  // stage kinds

struct Stage {  // the table's 8 int64s a stage (weight_stream.Stage)
  long long kind, rows, lines, w, x, y, dv, group;
};

struct Cursor {  // a line of the warp's stream: stage, row, line of the row; the stage's lines, rows and weights
  int s, row, line, lines, rows;
  long long w;
};

// `c` moved on to the first stage from its own at which the warp has a row (or to `last`), that stage's fields read.
__device__ __forceinline__ void settle(Cursor& c, const Stage* t, int last, int gw) {
  for (; c.s < last; ++c.s, c.row = gw, c.line = 0) {
    c.lines = (int)t[c.s].lines;
    c.rows = (int)t[c.s].rows;
    c.w = t[c.s].w;
    if (c.row < c.rows) return;
  }
}

__device__ __forceinline__ void step(Cursor& c, const Stage* t, int last, int gw, int tw) {
  if (++c.line == c.lines) {
    c.line = 0;
    c.row += tw;
    if (c.row >= c.rows) {
      ++c.s;
      c.row = gw;
      settle(c, t, last, gw);
    }
  }
}

// The line at `c`, if the stream may run to it, copied into the ring's next slot; one commit group either way, so
// that `wait_group D - 1` always lands the oldest line in flight.
template <int D>
__device__ __forceinline__ void fetch(Cursor& c, int& slot, unsigned char* ring, const Stage* t, const char* arena,
                                      int last, int allowed, int gw, int tw) {
  if (c.s < allowed) {
    const char* src = arena + c.w + ((long long)c.row * c.lines + c.line) * LINE + (threadIdx.x & 31) * 16;
    unsigned dst = (unsigned)__cvta_generic_to_shared(ring + slot * LINE);
    asm volatile("cp.async.cg.shared.global [%0], [%1], %2;" : : "r"(dst), "l"(src), "n"(16) : "memory");
    slot = slot == D - 1 ? 0 : slot + 1;
    step(c, t, last, gw, tw);
  }
  asm volatile("cp.async.commit_group;");
}

__device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// A GEMV line: the lane's 8 weights (bf16) times its 8 elements of x.
__device__ __forceinline__ float gemv_line(uint4 w, const float* x) {
  float4 a = *(const float4*)x, b = *(const float4*)(x + 4);
  return lo(w.x) * a.x + hi(w.x) * a.y + lo(w.y) * a.z + hi(w.y) * a.w + lo(w.z) * b.x + hi(w.z) * b.y +
         lo(w.w) * b.z + hi(w.w) * b.w;
}

// A state row's line (its 4 floats a lane, `s`): updated and stored back to `out`; the lane's part of s . q.
__device__ __forceinline__ float state_line(uint4 bits, const float* q, const float* k, float v, float* out) {
  float4 s = make_float4(__uint_as_float(bits.x), __uint_as_float(bits.y), __uint_as_float(bits.z),
                         __uint_as_float(bits.w));
  float4 kk = *(const float4*)k, qq = *(const float4*)q;
  s = make_float4(0.9f * s.x + 0.1f * (v * kk.x), 0.9f * s.y + 0.1f * (v * kk.y), 0.9f * s.z + 0.1f * (v * kk.z),
                  0.9f * s.w + 0.1f * (v * kk.w));
  *(float4*)out = s;
  return s.x * qq.x + s.y * qq.y + s.z * qq.z + s.w * qq.w;
}

// 1 / rms of a normed stage's input (`cols` floats), each warp summing it alone.
__device__ __forceinline__ float inv_rms(const float* x, int cols) {
  float sum = 0.f;
  for (int c = (threadIdx.x & 31) * 4; c < cols; c += 128) {
    float4 v = *(const float4*)(x + c);
    sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return rsqrtf(sum / cols + 1e-6f);
}

// The grid barrier before stage `s - first` of a persistent launch, and the exit count whose last CTA zeroes both
// counters for the next launch.
__device__ __forceinline__ void grid_sync(int* sync, int target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(sync, 1);
    while (*(volatile int*)sync < target) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ void grid_exit(int* sync) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(sync + 1, 1) == (int)gridDim.x - 1) {
    sync[0] = 0;
    sync[1] = 0;
  }
}

template <int D>
__device__ __forceinline__ void run(const Stage* t, char* arena, int first, int last, int cross, int* sync,
                                    int x_first, unsigned char* ring) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int gw = blockIdx.x * warps + (threadIdx.x >> 5), tw = gridDim.x * warps;
  ring += (threadIdx.x >> 5) * (D * LINE) + lane * 16;
  Cursor c = {first, gw, 0, 0, 0, 0};
  settle(c, t, last, gw);
  int in = 0, out = 0;  // the ring's slots of the next line copied and of the next computed
  float scale = 1.f;  // a normed stage's 1 / rms(x)
  asm volatile("griddepcontrol.launch_dependents;");
  // Launched with programmatic stream serialization, the kernel gets here while the one before it still runs: what
  // that kernel wrote is visible after the wait (otherwise a no-op).
  if (x_first) {
    asm volatile("griddepcontrol.wait;" : : : "memory");
    if (t[first].kind == NORMED && gw < t[first].rows)
      scale = inv_rms((const float*)(arena + t[first].x), (int)t[first].lines * 256);
  }
  for (int i = 0; i < D; ++i) fetch<D>(c, in, ring, t, arena, last, cross ? last : first + 1, gw, tw);
  asm volatile("griddepcontrol.wait;" : : : "memory");
  for (int s = first; s < last; ++s) {
    const int allowed = cross ? last : s + 1;
    if (s > first) {
      grid_sync(sync, (s - first) * gridDim.x);
      if (!cross)
        for (int i = 0; i < D; ++i) fetch<D>(c, in, ring, t, arena, last, allowed, gw, tw);
    }
    const Stage st = t[s];
    const int rows = (int)st.rows, lines = (int)st.lines, dv = (int)st.dv, group = (int)st.group;
    const float* x = (const float*)(arena + st.x);
    if (st.kind == NORMED && gw < rows && !(x_first && s == first)) scale = inv_rms(x, lines * 256);
    for (int row = gw; row < rows; row += tw) {
      float acc = 0.f;
      for (int line = 0; line < lines; ++line) {
        asm volatile("cp.async.wait_group %0;" : : "n"(D - 1) : "memory");
        uint4 w = *(const uint4*)(ring + out * LINE);
        if (st.kind != STATE) {
          acc += gemv_line(w, x + line * 256 + lane * 8);
        } else {
          int kh = row / dv / group, keys = rows / dv / group;
          acc += state_line(w, x + kh * 128 + lane * 4, x + (keys + kh) * 128 + lane * 4, x[2 * keys * 128 + row],
                            (float*)(arena + st.w + (long long)row * LINE + lane * 16));
        }
        out = out == D - 1 ? 0 : out + 1;
        fetch<D>(c, in, ring, t, arena, last, allowed, gw, tw);
      }
      for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      if (lane == 0)
        ((float*)(arena + st.y))[row] = acc * (st.kind == STATE ? 0.08838834764831845f : st.kind == NORMED ? scale : 1.f);
    }
  }
  if (last - first > 1) grid_exit(sync);
}

extern "C" __global__ void weight_stream_d4(const Stage* table, char* arena, int first, int last, int cross, int* sync, int x_first) {
  extern __shared__ __align__(16) unsigned char ring[];
  run<4>(table, arena, first, last, cross, sync, x_first, ring);
}

extern "C" __global__ void weight_stream_d8(const Stage* table, char* arena, int first, int last, int cross, int* sync, int x_first) {
  extern __shared__ __align__(16) unsigned char ring[];
  run<8>(table, arena, first, last, cross, sync, x_first, ring);
}

extern "C" __global__ void weight_stream_d16(const Stage* table, char* arena, int first, int last, int cross, int* sync, int x_first) {
  extern __shared__ __align__(16) unsigned char ring[];
  run<16>(table, arena, first, last, cross, sync, x_first, ring);
}

extern "C" __global__ void weight_stream_d24(const Stage* table, char* arena, int first, int last, int cross, int* sync, int x_first) {
  extern __shared__ __align__(16) unsigned char ring[];
  run<24>(table, arena, first, last, cross, sync, x_first, ring);
}
