"""Several worker loops over one runner: ``vramlab worker --concurrency N``.

Each loop is an ordinary WorkerLoop (its own registration, claims, heartbeats and
reports) in a thread; the runner they share runs up to N children at once, and each
result says how many experiments shared its device (``environment.concurrent``).
Signals reach all loops: a first SIGTERM (or Ctrl-C) stops claiming and lets running
experiments finish; a second cancels them and gives their leases back.
"""

import logging
import signal
import threading
from collections.abc import Sequence

from workers.loop import WorkerLoop

log = logging.getLogger("vramlab.worker")


def install_signal_handlers(loops: Sequence[WorkerLoop]) -> threading.Event:
    """Signals reach every loop in ``loops`` (which may be filled later: the event
    returned says whether a first signal came meanwhile)."""
    signalled = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if signalled.is_set() and all(loop.stopping.is_set() for loop in loops):
            log.warning("second %s: cancelling the running experiments", name)
            for loop in loops:
                loop.aborting.set()
        else:
            log.info("%s: finishing the current experiments, then exiting", name)
            signalled.set()
            for loop in loops:
                loop.stopping.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return signalled


def run_all(loops: Sequence[WorkerLoop]) -> int:
    """Run every loop in its own thread until all have stopped; the experiments they ran."""
    if len(loops) == 1:
        return loops[0].run()
    # The runner starts its forkserver and probes the host once, before the threads race.
    loops[0].runner.start()
    loops[0].runner.capabilities()
    done = [0] * len(loops)
    errors: list[Exception] = []

    def work(i: int) -> None:
        try:
            done[i] = loops[i].run()
        except Exception as exc:
            errors.append(exc)
            log.info("worker loop %d failed (%s); stopping the others", i, exc)
            for loop in loops:
                loop.stopping.set()

    threads = [
        threading.Thread(target=work, args=(i,), name=f"vramlab-loop-{i}", daemon=True)
        for i in range(len(loops))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # short waits: the main thread must stay free for signals
    if errors:  # as one loop alone raises it (an API that refuses the worker: its exit code)
        raise errors[0]
    return sum(done)
