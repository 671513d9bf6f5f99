"""Pass two over a snapshot's entries: each written as an event of vramlab's schema, and
the evidence for categories gathered on the way (the main thread's calls in time order,
where blocks were freed, workspaces), for the blocks alive at the peak, followed to their
end."""

import json
from typing import Any

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

MAX_OOMS = 50
# PyTorch names the completion of a free "free_completed"; vramlab's schema says "free".
RENAME = {"free_completed": "free"}

# A live block: size, seq, site, frames, t_us, stack key.
Live = tuple[int, int, int, Any, float, tuple[int, ...]]


class Stacks:
    """Frames to JSON and to a site, computed once per distinct stack."""

    def __init__(self) -> None:
        self._frame: dict[int, str] = {}
        self._json: dict[tuple[int, ...], str] = {}
        self._site: dict[tuple[int, ...], int] = {}
        self._zero: dict[tuple[int, ...], bool] = {}
        self._hook: dict[tuple[int, ...], bool] = {}

    def key(self, frames: Any) -> tuple[int, ...]:
        if not frames:
            return ()
        if type(frames) is not list and type(frames) is not tuple:
            raise Invalid("frames is not a list")
        return tuple(map(id, frames))

    def json(self, key: tuple[int, ...], frames: Any) -> str:
        text = self._json.get(key)
        if text is None:
            parts = []
            for frame in frames[:MAX_FRAMES]:
                part = self._frame.get(id(frame))
                if part is None:
                    part = self._frame[id(frame)] = frame_json(frame)
                parts.append(part)
            text = self._json[key] = "[" + ",".join(parts) + "]"
        return text

    def site(self, key: tuple[int, ...], frames: Any) -> int:
        where = self._site.get(key)
        if where is None:
            where = self._site[key] = cat.site(frames)
        return where

    def in_backward(self, key: tuple[int, ...], frames: Any) -> bool:
        found = self._hook.get(key)
        if found is None:
            found = self._hook[key] = cat.runs_in_backward(frames)
        return found

    def zero_grad(self, key: tuple[int, ...], frames: Any) -> bool:
        found = self._zero.get(key)
        if found is None:
            found = self._zero[key] = cat.has_zero_grad(frames)
        return found


class Walk:
    """Writes the events and keeps what categories need."""

    def __init__(self, device: str, writer: ChunkWriter) -> None:
        self.device = device
        self.writer = writer
        self.stacks = Stacks()
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
        self.n_ooms = 0
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
            key = stacks.key(b["frames"])
            writer.add(
                f'{{"seq":{self.seq},"t_us":0.0,"action":"alloc","addr":{num(b["addr"])},'
                f'"size":{b["size"]},"device":"{device}","stream":null,"phase":null,'
                f'"pre_trace":true,"frames":{stacks.json(key, b["frames"])}}}'
            )
            site = stacks.site(key, b["frames"])
            self.live[b["addr"]] = (b["size"], self.seq, site, b["frames"], 0.0, key)
            self.seq += 1
        self.offset = self.seq

    def run(self, trace: list[Any], t0: float | None, peak_at: int) -> None:
        """Every entry; ``t0``: the first entry's time_us (None: times are entry numbers);
        ``peak_at``: the peak's entry (-1: before the first)."""
        device, stacks, writer, live = self.device, self.stacks, self.writer, self.live
        timeline, fates = self.timeline, self.fates
        alive: dict[Any, Live] = dict(live) if peak_at < 0 else {}
        workspace_at = -2  # the latest workspace-sized allocation's seq
        last_alloc = (-2, "")  # the latest allocation: seq, its stack
        zero_grad_addrs: set[Any] = set()
        prev = ""
        seq = self.seq
        t_us = 0.0
        for i, e in enumerate(trace):
            action = e["action"]
            addr = e.get("addr")
            size = as_int(e.get("size", 0), "size")
            frames = e.get("frames") or ()
            key: tuple[int, ...]
            if action in FREE_ACTIONS:
                held = live.get(addr)
                if held is not None and held[3] is frames:
                    key = ()  # the very list its allocation had (context="alloc")
                    own = False
                else:
                    key = stacks.key(frames)
                    own = bool(key) and (held is None or held[5] != key)
            else:
                key = stacks.key(frames)
                own = bool(key)
            if t0 is not None:
                t = e.get("time_us")
                t_us = float(t) - t0 if type(t) in (int, float) else t_us
            else:
                t_us = float(i)
            line = (
                f'{{"seq":{seq},"t_us":{t_us!r},"action":"{RENAME.get(action, action)}",'
                f'"addr":{num(addr)},"size":{size},"device":"{device}",'
                f'"stream":{num(e.get("stream"))},"phase":null'
            )
            if action == "oom":
                line += self._oom(seq, t_us, size, e, frames)
            # A free whose frames are its block's (PyTorch's context="alloc") stores none:
            # readers take them from the allocation, which keeps the stored trace a third
            # of the size. A free recorded with its own call site (context="all") keeps it.
            if own:
                line += ',"frames":' + stacks.json(key, frames)
            writer.add(line + "}")
            if action == "alloc":
                where = stacks.site(key, frames)
                zero = where == cat.OPTIMIZER and stacks.zero_grad(key, frames)
                timeline.see(seq, where, zero, True, stacks.in_backward(key, frames))
                stack = stacks.json(key, frames) if key else ""
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
                live[addr] = (block_size(size), seq, timeline.where(where), frames, t_us, key)
            elif own and action in FREE_ACTIONS:
                timeline.see(
                    seq,
                    stacks.site(key, frames),
                    stacks.zero_grad(key, frames),
                    False,
                    stacks.in_backward(key, frames),
                )
            if action == "free_requested":
                if key and stacks.zero_grad(key, frames):
                    zero_grad_addrs.add(addr)
            elif action == "free_completed":
                block = live.pop(addr, None)
                zero = addr in zero_grad_addrs or (bool(key) and stacks.zero_grad(key, frames))
                zero_grad_addrs.discard(addr)
                if block is not None and block[1] in alive_seqs(alive, addr, block):
                    fates[block[1]] = cat.Fate(seq, zero, timeline.now())
                    self.freed_t[block[1]] = t_us
            if i == peak_at:
                alive = dict(live)
            prev = action
            seq += 1
        writer.flush()
        self.seq, self.t_us, self.alive = seq, t_us, alive

    def _oom(self, seq: int, t_us: float, size: int, e: dict[str, Any], frames: Any) -> str:
        free = e.get("device_free")
        free = free if type(free) is int else None
        self.n_ooms += 1
        if len(self.ooms) < MAX_OOMS:
            self.ooms.append(
                {
                    "seq": seq,
                    "t_us": t_us,
                    "requested": size,
                    "device_free": free,
                    "frames": [json.loads(f) for f in frames_json(frames)],
                }
            )
        return f',"device_free":{num(free)}'

    def end(self) -> cat.Fate:
        """How a block alive at the trace's end ended: it did not."""
        return cat.Fate(None, False, self.timeline.now())


def alive_seqs(alive: dict[Any, Live], addr: Any, block: Live) -> tuple[int, ...]:
    """The seq of the block alive at the peak at ``addr``, if it is this block."""
    held = alive.get(addr)
    return (held[1],) if held is not None and held[1] == block[1] else ()
