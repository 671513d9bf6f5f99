"""Pass two over a snapshot's entries: each written as an event of vramlab's schema, and
the evidence for categories gathered on the way (the main thread's calls in time order,
where blocks were freed, workspaces), for the blocks alive at the peak, followed to their
end."""

import json
from array import array
from typing import TYPE_CHECKING, Any

from app.snapshots import categories as cat
from app.snapshots.chunks import ChunkWriter
from app.snapshots.evidence import Timeline
from app.snapshots.load import (
    FREE_ACTIONS,
    MAX_FRAMES,
    Invalid,
    as_int,
    block_size,
    frame_json,
    frames_json,
    num,
)
from vramlab.contract import MEMORY_VIZ_ACTIONS

if TYPE_CHECKING:
    from app.snapshots.entries import Sink, Trace

MAX_OOMS = 50
# PyTorch names the completion of a free "free_completed"; vramlab's schema says "free".
RENAME = {"free_completed": "free"}
NAMES = {a: RENAME.get(a, a) for a in MEMORY_VIZ_ACTIONS}

# A live block: size, seq, site, stack id, t_us, the identity of its frames list.
Live = tuple[int, int, int, int, float, Any]


class Stacks:
    """Frames to JSON and to a site, computed once per distinct stack (``sink``'s ids:
    0 is no frames)."""

    def __init__(self, sink: "Sink") -> None:
        self.frames = sink.stacks
        self.weird = sink.weird
        self._frame: dict[int, str] = {}
        self._json: dict[int, str] = {}
        self._site: dict[int, int] = {}
        self._zero: dict[int, bool] = {}
        self._hook: dict[int, bool] = {}
        self._all: dict[int, tuple[int, bool, bool, str]] = {}

    def check(self, sid: int) -> int:
        if sid in self.weird:
            raise Invalid("frames is not a list")
        return sid

    def json(self, sid: int) -> str:
        text = self._json.get(sid)
        if text is None:
            parts = []
            for frame in self.frames[sid][:MAX_FRAMES]:
                part = self._frame.get(id(frame))
                if part is None:
                    part = self._frame[id(frame)] = frame_json(frame)
                parts.append(part)
            text = self._json[sid] = "[" + ",".join(parts) + "]"
        return text

    def site(self, sid: int) -> int:
        where = self._site.get(sid)
        if where is None:
            where = self._site[sid] = cat.site(self.frames[sid])
        return where

    def in_backward(self, sid: int) -> bool:
        found = self._hook.get(sid)
        if found is None:
            found = self._hook[sid] = cat.runs_in_backward(self.frames[sid])
        return found

    def zero_grad(self, sid: int) -> bool:
        found = self._zero.get(sid)
        if found is None:
            found = self._zero[sid] = cat.has_zero_grad(self.frames[sid])
        return found

    def of(self, sid: int) -> tuple[int, bool, bool, str]:
        """Site, made inside zero_grad, inside backward, JSON (empty for no frames)."""
        found = self._all.get(sid)
        if found is None:
            found = self._all[sid] = (
                self.site(sid),
                self.zero_grad(sid),
                self.in_backward(sid),
                self.json(sid) if sid else "",
            )
        return found


class Walk:
    """Writes the events and keeps what categories need."""

    def __init__(self, device: str, writer: ChunkWriter, sink: "Sink") -> None:
        self.device = device
        self.writer = writer
        self.stacks = Stacks(sink)
        self.seq = 0
        self.offset = 0  # the first entry's seq, after the blocks from before the trace
        self.live: dict[Any, Live] = {}
        self.alive: dict[Any, Live] = {}  # at the peak
        self.fates: dict[int, cat.Fate] = {}  # seq of a block alive at the peak -> its end
        self.freed_t: dict[int, float] = {}  # and the time of that end
        self.timeline = Timeline()
        self.after_workspace: set[int] = set()  # allocations right after one, same stack
        self.after_output: set[int] = set()  # workspace-sized, right after the same stack's
        self.ooms: list[dict[str, Any]] = []
        self.oom_clocks: list[tuple[int, cat.Clock]] = []  # each OOM's seq and the clock then
        self.n_ooms = 0
        self.alloc_seqs = array("q")  # the seq of each of the trace's allocations, in order
        self.t_us = 0.0

    def pre_trace(self, segs: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
        """What was alive before the first entry, as events at time 0."""
        device, stacks, writer = self.device, self.stacks, self.writer
        for s in segs:
            writer.add(
                f'{{"seq":{self.seq},"t_us":0.0,"action":"segment_alloc","addr":{num(s["addr"])},'
                f'"size":{s["size"]},"device":"{device}","stream":null,"phase":null,'
                f'"pre_trace":true}}'
            )
            self.seq += 1
        for b in blocks:
            sid = b["stack"]
            writer.add(
                f'{{"seq":{self.seq},"t_us":0.0,"action":"alloc","addr":{num(b["addr"])},'
                f'"size":{b["size"]},"device":"{device}","stream":null,"phase":null,'
                f'"pre_trace":true,"frames":{stacks.json(sid)}}}'
            )
            site = stacks.site(sid)
            self.live[b["addr"]] = (b["size"], self.seq, site, sid, 0.0, b["token"])
            self.seq += 1
        self.offset = self.seq

    def run(
        self, trace: "Trace", t0: float | None, peak_at: int, sizes: dict[int, int] | None = None
    ) -> None:
        """Every entry; ``t0``: the first entry's time_us (None: times are entry numbers);
        ``peak_at``: the peak's entry (-1: before the first); ``sizes``: the blocks larger
        than their request rounded up, by entry (``Replay.sizes``)."""
        sizes = sizes or {}
        device, stacks, writer, live = self.device, self.stacks, self.writer, self.live
        timeline, fates = self.timeline, self.fates
        weird = stacks.weird
        alive: dict[Any, Live] = dict(live) if peak_at < 0 else {}
        workspace_at = -2  # the latest workspace-sized allocation's seq
        last_alloc = (-2, "")  # the latest allocation: seq, its stack
        zero_grad_addrs: set[Any] = set()
        prev = ""
        seq = self.seq
        t_us = 0.0
        of = stacks.of
        note_alloc = self.alloc_seqs.append
        for i, (action, addr, size, stream, t, free, sid, token) in enumerate(trace):
            if type(size) is not int:
                size = as_int(size, "size")
            key: int
            if action in FREE_ACTIONS:
                held = live.get(addr)
                if held is not None and held[5] == token:
                    key = 0  # the very list its allocation had (context="alloc")
                    own = False
                else:
                    key = stacks.check(sid) if weird else sid
                    own = bool(key) and (held is None or held[3] != key)
            else:
                key = stacks.check(sid) if weird else sid
                own = bool(key)
            if t0 is not None:
                t_us = float(t) - t0 if type(t) in (int, float) else t_us
            else:
                t_us = float(i)
            line = (
                f'{{"seq":{seq},"t_us":{t_us!r},"action":"{NAMES[action]}",'
                f'"addr":{addr if type(addr) is int else num(addr)},"size":{size},'
                f'"device":"{device}",'
                f'"stream":{stream if type(stream) is int else num(stream)},"phase":null'
            )
            if action == "oom":
                line += self._oom(seq, t_us, size, free, sid)
                self.oom_clocks.append((seq, timeline.now()))
            # A free whose frames are its block's (PyTorch's context="alloc") stores none:
            # readers take them from the allocation, which keeps the stored trace a third
            # of the size. A free recorded with its own call site (context="all") keeps it.
            if own:
                line += ',"frames":' + of(key)[3]
            writer.add(line + "}")
            if action == "alloc":
                note_alloc(seq)
                where, zero_grad, in_backward, stack = of(key)
                zero = where == cat.OPTIMIZER and zero_grad
                timeline.see(seq, where, zero, True, in_backward)
                # The same stack as the allocation just before (a new segment between):
                # the same op, as a workspace follows its matmul's output.
                same_op = stack == last_alloc[1] and last_alloc[0] == seq - 1 - (
                    prev == "segment_alloc"
                )
                if size in cat.WORKSPACE_SIZES:
                    if same_op and stack:
                        self.after_output.add(seq)
                    workspace_at = seq
                elif same_op and workspace_at == last_alloc[0]:
                    self.after_workspace.add(seq)
                last_alloc = (seq, stack)
                taken = sizes.get(i) or block_size(size)
                live[addr] = (taken, seq, timeline.where(where), key, t_us, token)
            elif own and action in FREE_ACTIONS:
                where, zero_grad, in_backward, _ = of(key)
                timeline.see(seq, where, zero_grad, False, in_backward)
            if action == "free_requested":
                if key and of(key)[1]:
                    zero_grad_addrs.add(addr)
            elif action == "free_completed":
                block = live.pop(addr, None)
                zero = addr in zero_grad_addrs or (bool(key) and of(key)[1])
                zero_grad_addrs.discard(addr)
                if block is not None:
                    then = alive.get(addr)
                    if then is not None and then[1] == block[1]:
                        fates[block[1]] = cat.Fate(seq, zero, timeline.now())
                        self.freed_t[block[1]] = t_us
            if i == peak_at:
                alive = dict(live)
            prev = action
            seq += 1
        writer.flush()
        self.seq, self.t_us, self.alive = seq, t_us, alive

    def _oom(self, seq: int, t_us: float, size: int, free: Any, sid: int) -> str:
        free = free if type(free) is int else None
        self.n_ooms += 1
        if len(self.ooms) < MAX_OOMS:
            self.ooms.append(
                {
                    "seq": seq,
                    "t_us": t_us,
                    "requested": size,
                    "device_free": free,
                    "frames": [json.loads(f) for f in frames_json(self.stacks.frames[sid])],
                }
            )
        return f',"device_free":{num(free)}'

    def oom_after(self, seq: int) -> cat.Clock | None:
        """The clock at the first out-of-memory error after ``seq`` (None: none)."""
        for at, clock in self.oom_clocks:
            if at > seq:
                return clock
        return None

    def end(self) -> cat.Fate:
        """How a block alive at the trace's end ended: it did not."""
        return cat.Fate(None, False, self.timeline.now())
