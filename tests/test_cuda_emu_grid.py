"""The CUDA emulator's grid-wide waits: blocks that spin on memory a later block writes (a grid barrier) complete,
each block's shared memory kept across the wait; a wait nothing can end is reported, not hung."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from cuda_emu import launcher, lower
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

BLOCKS, THREADS = 6, 64
# A grid barrier: every thread of a block calls it; the first thread arrives and spins (backing off) until all have.
BARRIER = """
__forceinline__ __device__ int grid_barrier(int* arrived, int blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrived, 1);
    while (atomicAdd(arrived, 0) < blocks) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();
  return 0;
}
"""


def _kernel(blocks_waited_for: int):
    """Block g stages its part of x times 2 in shared memory, writes it to y, waits for `blocks_waited_for` arrivals,
    then adds the next block's part of y to its staged values, into z."""

    @T.prim_func
    def main(
        x: T.Buffer((BLOCKS * THREADS,), "float32"),
        y: T.Buffer((BLOCKS * THREADS,), "float32"),
        z: T.Buffer((BLOCKS * THREADS,), "float32"),
        arrived: T.Buffer((1,), "int32"),
    ):
        for g in T.thread_binding(BLOCKS, thread="blockIdx.x"):
            for t in T.thread_binding(THREADS, thread="threadIdx.x"):
                staged = T.alloc_buffer((THREADS,), "float32", scope="shared")
                staged[t] = x[g * THREADS + t] * T.float32(2)
                y[g * THREADS + t] = staged[t]
                T.evaluate(
                    cuda_func_call(
                        "grid_barrier",
                        T.address_of(arrived[0]),
                        blocks_waited_for,
                        source_code=BARRIER,
                        return_type="int32",
                    )
                )
                z[g * THREADS + t] = staged[t] + y[(g + 1) % BLOCKS * THREADS + t]

    return launcher(*lower(tvm.IRModule({"main": main})))


def test_a_grid_barrier_completes_and_keeps_each_blocks_shared_memory(rng):
    x = rng.standard_normal(BLOCKS * THREADS).astype(np.float32)
    y, z, arrived = np.full_like(x, np.nan), np.full_like(x, np.nan), np.zeros(1, np.int32)
    _kernel(BLOCKS)(x, y, z, arrived)
    assert np.array_equal(z, 2 * x + np.roll(2 * x, -THREADS)) and arrived[0] == BLOCKS


def test_a_barrier_waiting_for_a_block_too_many_is_a_deadlock(rng):
    x = rng.standard_normal(BLOCKS * THREADS).astype(np.float32)
    with pytest.raises(RuntimeError, match="deadlock: every block waits on memory that no block writes"):
        _kernel(BLOCKS + 1)(x, np.zeros_like(x), np.zeros_like(x), np.zeros(1, np.int32))
