"""A synthetic PyTorch memory snapshot as PyTorch's own ``pickle.dump`` writes it
(protocol 4: every dict, list and string memoized where it is first written, and
referred back to after), written a piece at a time so that 1 GiB of it needs little
memory.

``torch.cuda.memory._dump_snapshot`` pickles ``_snapshot()`` with the standard pickler:
``{"segments": [...], "device_traces": [[entries...]], "allocator_settings": {...},
"external_annotations": [...]}``; each entry is ``{"action", "addr", "size", "stream",
"time_us", "compile_context", "user_metadata", "frames"}``, its frames a new list per
entry over frame dicts that every stack holding them shares, its ``compile_context`` a
new string per entry (``"N/A"``), as in ``tests/snapshots/data``. ``Snapshot`` writes the
opcodes the C pickler writes for that dict, with a memo that counts all it memoizes but
keeps only what is referred to again (the keys, the action names, the frames and their
strings): the entries are generated, never held. ``check`` compares its opcodes with
``pickle.dumps`` of the same snapshot built whole (all but the FRAME opcodes, which the
pickler puts at other opcode boundaries).
"""

import pickle
import pickletools
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

FRAME = 64 * 1024  # the pickler's frame size target
KEYS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "compile_context",
    "user_metadata",
    "frames",
)


def _long(v: int) -> bytes:
    if 0 <= v <= 0xFF:
        return b"K" + bytes([v])
    if 0 <= v <= 0xFFFF:
        return b"M" + struct.pack("<H", v)
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = pickle.encode_long(v)  # type: ignore[attr-defined]
    return b"\x8a" + bytes([len(raw)]) + raw


def _str(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


class Memo:
    """Opcodes for plain values with the pickler's memo: what is kept is referred back
    to; what is an entry's own is counted, as the unpickler counts it, and let go."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.kept: list[Any] = []  # alive, so their ids stay theirs
        self.n = 0

    def get(self, obj: Any) -> bytes:
        idx = self.ids[id(obj)]
        return b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)

    def put(self, obj: Any = None) -> bytes:
        """MEMOIZE; ``obj`` kept (None: an entry's own object, only counted)."""
        if obj is not None:
            self.ids[id(obj)] = self.n
            self.kept.append(obj)
        self.n += 1
        return b"\x94"

    def save(self, obj: Any) -> bytes:
        """``obj`` as the C pickler writes it (protocol 4), memoized and kept."""
        if obj is None:
            return b"N"
        if obj is True or obj is False:
            return b"\x88" if obj else b"\x89"
        if type(obj) is int:
            return _long(obj)
        if type(obj) is float:
            return b"G" + struct.pack(">d", obj)
        if id(obj) in self.ids:
            return self.get(obj)
        if type(obj) is str:
            return _str(obj) + self.put(obj)
        if type(obj) is tuple and 0 < len(obj) <= 3:
            body = b"".join(self.save(x) for x in obj)
            return body + bytes([0x84 + len(obj)]) + self.put(obj)
        if type(obj) is list:
            return b"]" + self.put(obj) + self.items(obj)
        if type(obj) is dict:
            out = [b"}", self.put(obj)]
            pairs = list(obj.items())
            if len(pairs) == 1:
                return b"".join([*out, self.save(pairs[0][0]), self.save(pairs[0][1]), b"s"])
            for i in range(0, len(pairs), 1000):
                out.append(b"(")
                for k, v in pairs[i : i + 1000]:
                    out += [self.save(k), self.save(v)]
                out.append(b"u")
            return b"".join(out)
        raise TypeError(f"not written here: {type(obj).__name__}")

    def items(self, items: list[Any]) -> bytes:
        """A list's items: APPEND for one, batches of 1000 in MARK ... APPENDS."""
        if len(items) == 1:
            return self.save(items[0]) + b"a"
        out = []
        for i in range(0, len(items), 1000):
            out += [b"(", *(self.save(x) for x in items[i : i + 1000]), b"e"]
        return b"".join(out)


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


def stacks(depth: int) -> dict[str, list[dict[str, Any]]]:
    """Python stacks (``stacks="python"``) of a training script, ``depth`` frames each,
    named as the bench's training loop names them; frames shared between stacks."""
    main = [_frame("train.py", 61, "train_step"), _frame("train.py", 88, "main")]
    own = {
        "to": [
            _frame("torch/nn/modules/module.py", 1341, "convert"),
            _frame("torch/nn/modules/module.py", 942, "_apply"),
            _frame("torch/nn/modules/module.py", 1355, "to"),
        ],
        "fwd": [
            _frame("torch/nn/modules/linear.py", 134, "forward"),
            _frame("torch/nn/modules/module.py", 1790, "_call_impl"),
        ],
        "bwd": [
            _frame("torch/autograd/graph.py", 829, "_engine_run_backward"),
            _frame("torch/autograd/__init__.py", 354, "backward"),
            _frame("torch/_tensor.py", 648, "backward"),
        ],
        "opt": [
            _frame("torch/optim/adam.py", 160, "_init_group"),
            _frame("torch/optim/adam.py", 230, "step"),
        ],
        "opt_tmp": [
            _frame("torch/optim/adam.py", 600, "_multi_tensor_adam"),
            _frame("torch/optim/adam.py", 230, "step"),
        ],
        "zero": [_frame("torch/optim/optimizer.py", 990, "zero_grad")],
        "data": [_frame("train.py", 30, "batch")],
    }
    out = {}
    for name, top in own.items():
        pad = [_frame("train.py", 100 + i, f"{name}_{i}") for i in range(depth)]
        out[name] = (top + pad)[: max(0, depth - len(main))] + main[:depth]
    return out


class Snapshot:
    """The snapshot's bytes: ``head()``, the entries (``entry()`` each, ``batch()`` to
    put up to 1000 of them in the trace list), then ``tail()``."""

    def __init__(self, depth: int = 8) -> None:
        self.memo = Memo()
        self.stacks = stacks(depth)
        self.t = 1_700_000_000_000_000
        self.segments: list[Any] = []
        self.settings = {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
        }
        self._known: dict[tuple[str, str], tuple[bytes, bytes, bytes, bytes]] = {}

    def head(self) -> bytes:
        m = self.memo
        top = b"}" + m.put() + b"("
        segments = m.save("segments") + m.save(self.segments)
        return (
            b"\x80\x04" + top + segments + m.save("device_traces") + b"]" + m.put() + b"]" + m.put()
        )

    def entry(self, action: str, addr: int, size: int, stack: str) -> bytes:
        """One entry, as ``pickle.dumps`` writes it in the trace."""
        self.t += 3
        m = self.memo
        known = self._known.get((action, stack))
        if known is not None:
            m.n += 3  # the entry's dict, its "N/A" and its frames list
            a, s, t, rest = known
            return a + _long(addr) + s + _long(size) + t + _long(self.t) + rest
        # The first entry of its action and stack: what it holds memoized where first
        # written (the keys, the action, the frames); after, the same bytes from parts.
        out = [b"}", m.put(), b"("]
        for key in KEYS:
            out.append(m.save(key))
            if key == "compile_context":
                out.append(_str("N/A") + m.put())
            elif key == "frames":
                out.append(b"]" + m.put() + m.items(self.stacks[stack]))
            else:
                value = {"action": action, "addr": addr, "size": size, "stream": 0}.get(key)
                out.append(m.save(self.t if key == "time_us" else "" if value is None else value))
        out.append(b"u")
        k = {key: m.get(key) for key in KEYS}
        frames = self.stacks[stack]
        self._known[(action, stack)] = (
            b"}\x94(" + k["action"] + m.get(action) + k["addr"],
            k["size"],
            k["stream"] + b"K\x00" + k["time_us"],
            k["compile_context"]
            + _str("N/A")
            + b"\x94"
            + k["user_metadata"]
            + m.get("")
            + k["frames"]
            + b"]\x94"
            + m.items(frames)
            + b"u",
        )
        return b"".join(out)

    def tail(self) -> bytes:
        m = self.memo
        settings = m.save("allocator_settings") + m.save(self.settings)
        return b"a" + settings + m.save("external_annotations") + m.save([]) + b"u."


class Framer:
    """Protocol 4's FRAME opcodes, each around about 64 KiB of opcodes (here at entry
    boundaries)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.buf = bytearray()
        self.started = False

    def add(self, data: bytes) -> None:
        if not self.started:  # PROTO comes before the first frame
            self.f.write(data[:2])
            data = data[2:]
            self.started = True
        self.buf += data
        if len(self.buf) >= FRAME:
            self._frame()

    def _frame(self) -> None:
        self.f.write(b"\x95" + struct.pack("<Q", len(self.buf)) + self.buf)
        self.buf.clear()

    def close(self) -> None:
        if self.buf:
            self._frame()


class Entries:
    """``entry`` as the bench's training loop calls it: each entry's bytes also kept in
    ``pending`` until written."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.pending: list[bytes] = []
        self.count = 0

    def entry(self, action: str, addr: int, size: int, stack: str) -> bytes:
        data = self.snap.entry(action, addr, size, stack)
        self.pending.append(data)
        self.count += 1
        return data


def write(f: IO[bytes], depth: int, loop: Callable[[Entries], Iterable[Any]]) -> int:
    """The snapshot into ``f``: ``loop(entries)`` calls ``entries.entry`` for each of the
    trace's entries. Returns how many. The trace list's items go in batches of 1000
    (MARK ... APPENDS), as the C pickler writes a list of more than one."""
    snap = Snapshot(depth)
    framer = Framer(f)
    framer.add(snap.head())
    entries = Entries(snap)

    def flush(n: int) -> None:
        while len(entries.pending) >= n and entries.pending:
            batch = entries.pending[:1000]
            del entries.pending[:1000]
            framer.add(b"(" + b"".join(batch) + b"e")

    for _ in loop(entries):
        flush(1000)
    if entries.count == 1:
        framer.add(entries.pending.pop() + b"a")
    flush(1)
    framer.add(snap.tail())
    framer.close()
    return entries.count


def opcodes(body: bytes) -> Iterator[tuple[str, Any]]:
    return ((op.name, arg) for op, arg, _ in pickletools.genops(body) if op.name != "FRAME")


def check(loop: Callable[[Any], Iterable[Any]], depth: int = 8) -> bool:
    """Whether the writer writes for the entries ``loop`` makes the opcodes
    ``pickle.dumps`` writes for the same snapshot built whole."""
    import io

    calls: list[tuple[str, int, int, str]] = []

    def recorded(entries: Entries) -> Iterator[Any]:
        class Recorder:
            def entry(self, action: str, addr: int, size: int, stack: str) -> bytes:
                calls.append((action, addr, size, stack))
                return entries.entry(action, addr, size, stack)

        yield from loop(Recorder())

    written = io.BytesIO()
    write(written, depth, recorded)
    shape = Snapshot(depth)
    trace = []
    t = shape.t
    for action, addr, size, stack in calls:
        t += 3
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "compile_context": "".join(["N", "/A"]),  # a new string each
                "user_metadata": "",
                "frames": list(shape.stacks[stack]),
            }
        )
    whole = {
        "segments": shape.segments,
        "device_traces": [trace],
        "allocator_settings": shape.settings,
        "external_annotations": [],
    }
    return list(opcodes(written.getvalue())) == list(opcodes(pickle.dumps(whole, protocol=4)))


def to_path(path: Path, depth: int, loop: Callable[[Entries], Iterable[Any]]) -> int:
    with path.open("wb") as f:
        return write(f, depth, loop)
