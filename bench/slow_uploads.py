"""Slow snapshot uploads against another user's import, on a live `vramlab serve`.

    python bench/slow_uploads.py [--trickles 10] [--uploads 5] [--size-mib 4]
                                 [--database-url URL] [--window 30]

The API (and an idle CPU worker) runs open on a temporary SQLite file (or the database
given), so a submitter is its address: one client, from 127.0.0.2, opens ``--trickles``
connections that each declare a 1 GiB snapshot and send a kilobyte a second (the issue's
repro). Meanwhile another client, from 127.0.0.1, imports a synthetic snapshot of
``--size-mib`` MiB ``--uploads`` times, one after another; the same imports are timed
first with no trickle open. Printed: how the trickles were answered and when, and the
other client's import times with and without them, side by side.
"""

import argparse
import contextlib
import os
import select
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from service import _free_port, running_service
from snapshot_import import write_snapshot

SLOW = "127.0.0.2"


class Trickle(threading.Thread):
    """One connection that declares 1 GiB and sends 1 KiB a second until answered."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.answer = b""
        self.answered_after: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), source_address=(SLOW, 0))
        start = time.monotonic()
        sock.sendall(
            f"POST /v1/snapshots?name=trickle HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {2**30}\r\n\r\n".encode()
        )
        with sock:
            while not self.stop.is_set():
                # Once the API has answered and closed, read what it said.
                with contextlib.suppress(OSError):
                    sock.sendall(b"\0" * 1024)
                if select.select([sock], [], [], 1.0)[0]:
                    self.answer = sock.recv(4096)
                    self.answered_after = time.monotonic() - start
                    return


def _imports(url: str, body: bytes, n: int) -> tuple[list[float], list[int]]:
    took, statuses = [], []
    transport = httpx.HTTPTransport(local_address="127.0.0.1")
    with httpx.Client(base_url=url, transport=transport, timeout=600) as client:
        for i in range(n):
            start = time.monotonic()
            r = client.post(
                "/v1/snapshots",
                params={"name": f"other-{i}"},
                content=body,
                headers={"Content-Type": "application/octet-stream"},
            )
            took.append(time.monotonic() - start)
            statuses.append(r.status_code)
    return took, statuses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trickles", type=int, default=10)
    ap.add_argument("--uploads", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=4)
    ap.add_argument("--database-url")
    ap.add_argument("--window", type=float, default=30.0, help="the rate's window, seconds")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-"))
    snap = tmp / "snap.pickle"
    write_snapshot(snap, args.size_mib, frames=8)
    body = snap.read_bytes()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    os.environ["VRAMLAB_SNAPSHOT_UPLOAD_WINDOW_SECONDS"] = str(args.window)
    trickles: list[Trickle] = []
    with running_service("cpu", port=port, database_url=args.database_url):
        try:
            alone, alone_answers = _imports(url, body, args.uploads)
            trickles = [Trickle(port) for _ in range(args.trickles)]
            for t in trickles:
                t.start()
            # Past its share (2 by default) the client is refused at once: wait for that.
            deadline = time.monotonic() + 60
            while sum(t.answered_after is not None for t in trickles) < args.trickles - 2:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            beside, beside_answers = _imports(url, body, args.uploads)
            open_then = sum(1 for t in trickles if t.answered_after is None)
            # Each admitted trickle is cut at the end of its first window; give up a
            # window past that (the code before this rule never cut one).
            deadline = time.monotonic() + 2 * args.window + 10
            for t in trickles:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for t in trickles:
                t.stop.set()

    print(f"\n{args.trickles} trickles of 1 KiB/s from one address; window {args.window:g} s")
    print(f"{'answer':<34} {'count':>5} {'after (s)':>16}")
    by_status: dict[str, list[float]] = {}
    for t in trickles:
        status = t.answer.split(b"\r\n", 1)[0].decode() or "never"
        by_status.setdefault(status, []).append(t.answered_after or float("nan"))
    for status, after in sorted(by_status.items()):
        print(f"{status:<34} {len(after):>5} {min(after):>7.2f} to {max(after):<7.2f}")
    print(f"still being read while the other imports ran: {open_then}")
    print(f"\nthe other user's import of {args.size_mib} MiB, {args.uploads} times")
    print(f"{'':<22} {'median s':>9} {'max s':>7}  answers")
    for label, took, answers in (
        ("alone", alone, alone_answers),
        ("beside the trickles", beside, beside_answers),
    ):
        counted = ", ".join(f"{answers.count(c)} x {c}" for c in sorted(set(answers)))
        print(f"{label:<22} {statistics.median(took):>9.3f} {max(took):>7.3f}  {counted}")
    ratio = statistics.median(beside) / statistics.median(alone)
    print(f"ratio beside / alone (medians): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
