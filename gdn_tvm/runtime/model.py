"""Model: the whole model's plan (`plan.model`) bound, decoding requests lane by lane with nothing but token ids and
finish flags crossing to the host.

A step is one launch sequence (one CUDA graph once captured): token ids in, next token ids out, every lane's
position, sampling counter and finish advanced on the device (ops/advance.py). A request is started on a free lane
(its prompt, budget and sampling parameters written to that lane's rows, a free slot's states zeroed); the prompt goes
in through the same step a token at a time. The host reads back one small `events` buffer per step ([2, B]: the token
each lane emitted, and whether it finished): on CUDA each of two captured graphs ends by copying it into its own
pinned host buffer, so the host reads step t - 1's events while step t runs and never waits for the GPU between
tokens. Finished lanes and their slots are handed to the next requests.
"""

from __future__ import annotations

import contextlib
import ctypes
import reprlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import LANE_INPUTS
from gdn_tvm.plan import model as model_plan
from gdn_tvm.runtime.checkpoint import Checkpoint
from gdn_tvm.runtime.graph import CudaGraph, cuda_check, gpu_seconds
from gdn_tvm.runtime.layers import Kernels, Layer, write_row
from gdn_tvm.runtime.stack import locked, require_cuda, require_present
from gdn_tvm.signature import ArgumentError, is_integer

# The lanes' inputs at rest: no lane active (slot -1), sampling greedy, no stop ids (-1), valid everywhere else.
_AT_REST = {"slots": -1, "top_p": 1.0, "prompt_lens": 1, "limits": 1, "stop_ids": -1}


@dataclass(frozen=True)
class Request:
    """One sequence to decode: `prompt` token ids (at least one), then up to `max_new_tokens` sampled ones (fewer at a
    stop id or the cache's end). `temperature <= 0` is greedy; `top_k <= 0` and `top_p >= 1` are off; `seed` keys the
    lane's random numbers (ops/sample.py), so a request decodes the same tokens on any lane, eagerly or replayed."""

    prompt: Sequence[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


class Model:
    """The model's plan bound to `kernels` on `device` with `weights` (by plan name: `checkpoint_weights`,
    `random_model_weights`); `stop_ids`: the token ids that end a request (EOS), at most `STOP_IDS`. Without
    `sampling` every request is greedy and the step picks tokens with `argmax` instead of `sample`.

    `generate(requests)` decodes them all, lanes refilled as requests finish. Lower level: `start(request)` takes a
    free lane, `launch()` runs one step, `events()` reads the events of the step launched last. Every public method
    holds the model's lock, so threads sharing a model never interleave their lane writes and launches; `generate`
    holds it for its whole run (two threads' calls run one after the other) and owns every lane meanwhile."""

    def __init__(
        self,
        cfg: DecodeConfig,
        kernels: Kernels,
        device: tvm.runtime.Device,
        weights: Mapping,
        stop_ids: Iterable[int] = (),
        sampling: bool = True,
    ):
        require_present(device, "model")
        self.cfg, self.device, self.sampling = cfg, device, sampling
        plan = model_plan(cfg, sampling)
        B = cfg.batch
        stops = _token_ids("stop_ids", stop_ids)
        if problem := cfg.model.stop_ids_problem(stops):
            raise ArgumentError(f"stop_ids: {problem}, got {stops}")
        self.inputs: dict[str, tvm.runtime.Tensor] = {}
        for name in ("ids", "slots", "positions", *LANE_INPUTS):
            buffer = plan.buffers[name]
            rest = np.full(buffer.shape, _AT_REST.get(name, 0), buffer.dtype)
            if name == "stop_ids":
                rest[: len(stops)] = stops
            self.inputs[name] = tvm.runtime.tensor(rest, device)
        if cfg.model.tie_word_embeddings and isinstance(weights, Mapping):  # the head is the table, as in transformers
            weights = {name: w for name, w in weights.items() if name != "lm_head"}
        self.bound = Layer(plan, cfg, kernels, weights, self.inputs)
        self.logits = self.bound.tensors["logits"]
        self._events = self.bound.out
        self._free_lanes, self._free_slots = deque(range(B)), deque(range(cfg.slots))
        self._lane_slot: dict[int, int] = {}
        self._unread: set[int] = set()  # tickets of launched steps whose events were not read yet
        self._resets = 0  # reset_lanes() calls: a generate() running across one has lost its lanes
        self._lock = threading.RLock()
        self._readback: _Eager | _Graphs = _Eager(self.bound, self._events)

    @locked
    def capture(self) -> None:
        """Capture the step as two CUDA graphs (each copying its events to its own pinned host buffer); later steps
        replay them in turn. One eager step with no lane active first loads every kernel."""
        require_cuda(self.device, "model")
        if self._lane_slot:
            raise RuntimeError("capture() with lanes in flight: capture before starting requests")
        self.bound.run()
        self._readback = _Graphs(self.bound, self._events, self.device.index)
        self._unread.clear()

    @locked
    def start(self, request: Request, slot: int | None = None) -> int:
        """Put `request` on a free lane with a free slot (`slot`, or the one free longest), its states zeroed; returns
        the lane. `ArgumentError` names the field of a bad request or a slot in use, before anything is written;
        `RuntimeError` when no lane is free."""
        prompt, fields = check_request(self.cfg, request, self.sampling)
        if not self._free_lanes:
            raise RuntimeError(f"all {self.cfg.batch} lanes are busy")
        if slot is None:
            slot = self._free_slots[0]
        elif not is_integer(slot) or slot not in self._free_slots:
            raise ArgumentError(f"slot: expected a free slot (free: {sorted(self._free_slots)}), got {slot!r}")
        slot, lane = int(slot), self._free_lanes[0]
        n, L = len(prompt), self.cfg.max_len
        row = np.zeros(L, np.int32)
        row[:n] = prompt
        values = {
            "prompts": row,
            "prompt_lens": n,
            "limits": min(n + fields.pop("max_new_tokens") - 1, L),
            **fields,
            "steps": 0,
            "ids": prompt[0],
            "positions": 0,
            "slots": slot,  # last: the lane is live from here
        }
        self.bound.reset_slot(slot)
        for name, value in values.items():
            write_row(self.inputs[name], lane, value)
        self._free_slots.remove(slot)
        self._free_lanes.popleft()
        self._lane_slot[lane] = slot
        return lane

    @locked
    def launch(self) -> int:
        """Launch one step for every live lane (replayed where captured); returns the ticket `events` takes. The host
        does not wait: the step's events come back behind it. `RuntimeError` (nothing launched) where the step
        launched two before has unread events: its ticket is this one's."""
        ticket = self._readback.next_ticket()
        if ticket in self._unread:
            raise RuntimeError(f"launch(): the events of ticket {ticket} are unread; read them (events) first")
        self._unread.add(self._readback.launch())
        return ticket

    @locked
    def events(self, ticket: int) -> np.ndarray:
        """[2, B] int32 of the step launched with `ticket` (waiting for it; read each before launching two more): the
        token each lane emitted (-1: none) and 1 where the lane finished. A finished lane and its slot are free again
        once read. `ArgumentError` for a ticket with no unread step (read already, or launched before `reset_lanes`
        or `capture`), the lanes untouched."""
        if not is_integer(ticket) or ticket not in self._unread:
            raise ArgumentError(f"ticket: expected an unread ticket of launch() {sorted(self._unread)}, got {ticket!r}")
        events = self._readback.wait(int(ticket))
        self._unread.remove(ticket)
        self._free([int(lane) for lane in np.flatnonzero(events[1])])
        return events

    @locked
    def elapsed(self, steps: int) -> float:
        """Seconds `steps` back-to-back replayed steps take on the GPU (CUDA events around them; after `capture`).
        Live lanes advance `steps` positions, their tokens unread; those that finish are free again."""
        if not isinstance(self._readback, _Graphs):
            raise RuntimeError("elapsed() times graph replays: capture() first")
        if self._unread:
            raise RuntimeError(f"elapsed(): the events of tickets {sorted(self._unread)} are unread; read them first")
        seconds = self._readback.elapsed(steps)
        slots = self.inputs["slots"].numpy()  # their events are not read: a lane that finished is free again
        self._free([lane for lane in self._lane_slot if slots[lane] < 0])
        return seconds

    @locked
    def reset_lanes(self) -> None:
        """Stop every lane (slot -1): every lane and slot free again (a slot's states are zeroed as a lane takes it)."""
        self.inputs["slots"].copyfrom(np.full(self.cfg.batch, -1, np.int32))
        self._lane_slot.clear()
        self._unread.clear()
        self._free_lanes, self._free_slots = deque(range(self.cfg.batch)), deque(range(self.cfg.slots))
        self._resets += 1

    @locked
    def generate(
        self, requests: Iterable[Request], on_token: Callable[[int, int], None] | None = None
    ) -> list[list[int]]:
        """Decode every request, lanes refilled as they free up; returns each request's emitted tokens in order, calling
        `on_token(request_index, token)` as each arrives. Step t + 1 is launched before step t's events are read, so the
        GPU always has a step queued (a freed lane sits out that one step)."""
        if isinstance(requests, Request) or not isinstance(requests, Iterable):
            raise ArgumentError(f"requests: expected an iterable of Request objects, got {reprlib.repr(requests)}")
        if on_token is not None and not callable(on_token):
            raise ArgumentError(f"on_token: expected a callable or None, got {reprlib.repr(on_token)}")
        queue = deque(enumerate(requests))
        for _, request in queue:
            check_request(self.cfg, request, self.sampling)
        if self._lane_slot or self._unread:  # each step's events hold every live lane's token: all lanes are ours
            raise RuntimeError(
                f"generate() with lanes {sorted(self._lane_slot)} live and tickets {sorted(self._unread)} unread "
                "from start()/launch(): read their steps until the lanes finish, or reset_lanes(), first"
            )
        resets = self._resets
        out: list[list[int]] = [[] for _ in queue]
        owner: dict[int, int] = {}  # lane -> request index
        previous = None
        try:
            while queue or owner:
                while queue and self._free_lanes:
                    index, request = queue.popleft()
                    owner[self.start(request)] = index
                ticket = self.launch()
                if previous is not None:
                    self._collect(self.events(previous), owner, out, on_token)
                if self._resets != resets:
                    raise RuntimeError("generate(): reset_lanes() was called while it ran; its requests are dropped")
                previous = ticket
            if previous is not None:
                self.events(previous)  # a step launched after the last lane finished: nothing live in it
        except BaseException:  # on_token raised, or the run was interrupted: the model stays usable
            with contextlib.suppress(Exception):  # (after a CUDA error it may not be: the first error is raised)
                self._abandon(owner)
            raise
        return out

    def _abandon(self, lanes) -> None:
        """After a `generate` that did not finish: every unread step read, then `lanes` stopped and freed."""
        for ticket in sorted(self._unread):
            self.events(ticket)
        live = [lane for lane in lanes if lane in self._lane_slot]
        slots = self.inputs["slots"].numpy()
        slots[live] = -1
        self.inputs["slots"].copyfrom(slots)
        self._free(live)

    def _free(self, lanes: list[int]) -> None:
        """`lanes` (live) and their slots free again."""
        for lane in lanes:
            self._free_lanes.append(lane)
            self._free_slots.append(self._lane_slot.pop(lane))

    def _collect(self, events, owner: dict[int, int], out, on_token) -> None:
        for lane, index in list(owner.items()):
            token = int(events[0, lane])
            if token >= 0:
                out[index].append(token)
                if on_token is not None:
                    on_token(index, token)
            if events[1, lane]:
                del owner[lane]


def check_request(cfg: DecodeConfig, request: Request, sampling: bool = True) -> tuple[np.ndarray, dict]:
    """`request`'s prompt as int32 and its other fields as a lane holds them (Python ints, float32), after checking
    every field against `cfg` (and, without `sampling`, that it is greedy): `ArgumentError` naming the field."""
    if not isinstance(request, Request):
        raise ArgumentError(f"request: expected a Request, got {reprlib.repr(request)}")
    V, L = cfg.model.vocab_size, cfg.max_len
    try:
        prompt = np.asarray(request.prompt)
    except (TypeError, ValueError):  # a ragged nesting, or an object numpy cannot hold
        got = reprlib.repr(request.prompt)
        raise ArgumentError(f"prompt: expected 1 to {L} integer token ids, got {got}") from None
    if prompt.ndim != 1 or not 1 <= len(prompt) <= L or prompt.dtype.kind not in "iu":
        got = "none" if prompt.size == 0 else f"{prompt.shape} {prompt.dtype}"
        raise ArgumentError(f"prompt: expected 1 to {L} integer token ids, got {got}")
    if prompt.min() < 0 or prompt.max() >= V:
        raise ArgumentError(f"prompt: token ids must be in [0, {V}), got {prompt.min()}..{prompt.max()}")
    if not is_integer(request.max_new_tokens) or request.max_new_tokens < 1:
        raise ArgumentError(f"max_new_tokens: expected an int >= 1, got {request.max_new_tokens!r}")
    temperature, top_p = (_float32(name, getattr(request, name)) for name in ("temperature", "top_p"))
    if temperature > 0 and not sampling:
        raise ArgumentError(f"temperature={request.temperature}: this model decodes greedily (sampling=False)")
    if not 0 < top_p <= 1:
        raise ArgumentError(f"top_p: expected a number in (0, 1] (float32), got {request.top_p}")
    for name in ("top_k", "seed"):
        value, bits = getattr(request, name), 63 if name == "seed" else 31
        if not is_integer(value) or not -(2**31) <= value < 2**bits:
            raise ArgumentError(f"{name}: expected an int in [-2^31, 2^{bits}), got {value!r}")
    fields = {"max_new_tokens": int(request.max_new_tokens), "temperature": temperature, "top_p": top_p}
    return prompt.astype(np.int32), fields | {"top_k": int(request.top_k), "seed": int(request.seed)}


def _token_ids(name: str, ids) -> list[int]:
    """`ids` (an iterable of integers, not a string) as Python ints: `ArgumentError` naming `name` otherwise."""
    try:
        out = list(ids) if not isinstance(ids, str | bytes) else None
    except TypeError:
        out = None
    if out is None or not all(is_integer(i) for i in out):
        raise ArgumentError(f"{name}: expected integer token ids, got {ids!r}")
    return [int(i) for i in out]


def _float32(name: str, value) -> np.float32:
    """`value` as the sampler holds it (float32): `ArgumentError` naming `name` where it is not a number, is not
    finite there, or is nonzero and rounds to zero there."""
    if isinstance(value, bool | np.bool_ | str | bytes) or np.ndim(value) != 0:
        raise ArgumentError(f"{name}: expected a number, got {reprlib.repr(value)}")
    try:
        with np.errstate(over="ignore", under="ignore"):
            held = np.float32(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}: expected a number, got {value!r}") from None
    if not np.isfinite(held) or (held == 0) != (value == 0):
        raise ArgumentError(f"{name}: {value!r} is not a finite float32 (the sampler's precision)")
    return held


def checkpoint_weights(checkpoint: Checkpoint) -> dict:
    """A loaded checkpoint's arrays by `plan.model` name: layer i's mixer and block weights under `layers.<i>.`, the
    embedding table, final norm and (untied) LM head at the top."""
    named = dict(checkpoint.weights)
    for i, (mixer, block) in enumerate(zip(checkpoint.layers, checkpoint.blocks, strict=True)):
        named |= {f"layers.{i}.{k}": v for k, v in (mixer | block).items()}
    return named


class _Eager:
    """Steps launched eagerly, each one's events copied to the host right after it (a ring of two)."""

    def __init__(self, bound: Layer, events: tvm.runtime.Tensor):
        self._bound, self._events = bound, events
        self._host: list[np.ndarray | None] = [None, None]
        self._count = 0

    def next_ticket(self) -> int:
        return self._count % 2

    def launch(self) -> int:
        ticket, self._count = self._count % 2, self._count + 1
        self._bound.run()
        self._host[ticket] = self._events.numpy()
        return ticket

    def wait(self, ticket: int) -> np.ndarray:
        events = self._host[ticket]
        if events is None:
            raise RuntimeError(f"events({ticket}): no step launched with that ticket")
        return events


class _Graphs:
    """Two CUDA graphs of the step, replayed in turn; graph k ends by copying the events into pinned host buffer k,
    and an event recorded behind each replay says when that copy is done."""

    def __init__(self, bound: Layer, events: tvm.runtime.Tensor, device_id: int):
        from cuda.bindings import runtime as cudart

        self._cudart = cudart
        self._nbytes = int(np.prod(events.shape)) * 4
        self._shape = tuple(events.shape)
        self._pinned = [cuda_check(cudart.cudaMallocHost(self._nbytes)) for _ in range(2)]
        launches, first = len(bound.launches), None
        self._graphs: list[CudaGraph] = []
        for host in self._pinned:  # both on the first one's stream: replays in order
            stream = first.stream if first else None
            graph = CudaGraph(bound.run, launches, device_id, then=self._copier(events.data_ptr(), host), stream=stream)
            first = first or graph
            self._graphs.append(graph)
        self._done = [cuda_check(cudart.cudaEventCreate()) for _ in range(2)]
        self._count = 0

    def _copier(self, src: int, dst: int) -> Callable[[object], None]:
        cudart = self._cudart

        def copy(stream) -> None:
            kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            cuda_check(cudart.cudaMemcpyAsync(dst, src, self._nbytes, kind, stream))

        return copy

    def next_ticket(self) -> int:
        return self._count % 2

    def launch(self) -> int:
        ticket, self._count = self._count % 2, self._count + 1
        graph = self._graphs[ticket]
        graph.replay()
        cuda_check(self._cudart.cudaEventRecord(self._done[ticket], graph.stream))
        return ticket

    def elapsed(self, steps: int) -> float:
        def steps_run() -> None:
            for _ in range(steps):
                self.launch()

        return gpu_seconds(self._graphs[0].stream, steps_run)

    def wait(self, ticket: int) -> np.ndarray:
        cuda_check(self._cudart.cudaEventSynchronize(self._done[ticket]))
        words = (ctypes.c_int32 * (self._nbytes // 4)).from_address(self._pinned[ticket])
        return np.array(words, np.int32).reshape(self._shape)

    def __del__(self):
        cudart = getattr(self, "_cudart", None)
        if cudart is None:
            return
        for event in getattr(self, "_done", ()):
            cudart.cudaEventDestroy(event)
        for host in getattr(self, "_pinned", ()):
            cudart.cudaFreeHost(host)
