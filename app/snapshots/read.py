"""Reading a snapshot file: gunzipped within a bound, then its trace streamed into records
(``stream``, ``entries``) so that it is never held whole; where the stream reader does not
read the file exactly as an unpickler would, unpickled whole with no globals
(``safe_pickle``), as before, and the same records made from it."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.snapshots import safe_pickle, stream
from app.snapshots.entries import Sink, from_data
from app.snapshots.load import validate_top


@dataclass
class Loaded:
    """A snapshot read: its top dict (whose ``device_traces`` lists hold no entries when
    ``streamed``: they went into ``sink``'s records) and the pickle's size."""

    data: Any
    sink: Sink
    size: int
    streamed: bool


def load(src: Path, out: Path, max_expanded: int, delete_src: bool, whole: bool = False) -> Loaded:
    """``whole``: skip the stream reader (to compare the two)."""
    with src.open("rb") as f:
        magic = f.read(2)
    if magic == safe_pickle.GZIP_MAGIC:
        raw = out / "snapshot.pickle"
        with src.open("rb") as f, raw.open("wb") as dst:
            safe_pickle.gunzip_to(f, dst, max_expanded)
        if delete_src:  # the API's temp file: free its disk space early
            src.unlink(missing_ok=True)
        src = raw
    size = src.stat().st_size
    data: Any = None
    if not whole:
        sink = Sink(out)
        try:
            with src.open("rb") as f:
                reader = stream.Reader(f, sink)
                data = reader.read()
        except stream.Unsupported:
            data = None
        except BaseException:  # refused, or out of memory: no records left behind
            sink.close()
            sink.remove()
            raise
        sink.close()
        if data is not None and reader.traces is not None:
            return Loaded(data, sink, size, True)
        sink.remove()  # no trace where the reader looks for one: it is in ``data``, if any
    if data is None:
        with src.open("rb") as f:
            data = safe_pickle.load(f)
    traces, _ = validate_top(data)
    return Loaded(data, from_data(traces, out), size, False)
