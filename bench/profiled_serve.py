"""`vramlab serve` under cProfile, every thread of it, for bench/worker_batches.py.

    python bench/profiled_serve.py OUT.prof --port P [--log-level warning]

Each thread (the event loop's and the thread pool's) gets a profiler of its own timed by
that thread's CPU time (``time.thread_time``), so a thread waiting for work or a lock
counts nothing; when the server stops (SIGTERM) their statistics are merged into OUT.
"""

import argparse
import cProfile
import pstats
import signal
import sys
import threading
import time
from typing import Any

from app.cli import _migrate
from app.core.config import get_settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    settings = get_settings()
    _migrate(settings.database_url)
    import uvicorn

    from app.main import create_app

    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def profile_this_thread(*_: Any) -> None:
        profiler = cProfile.Profile(time.thread_time)
        with lock:
            profiles.append(profiler)
        profiler.enable()  # replaces this hook for the thread

    app = create_app(settings)
    sys.setswitchinterval(0.001)  # as `vramlab serve` does
    # uvicorn re-raises the signal that stopped it; with these it returns here instead.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    threading.setprofile(profile_this_thread)
    main_profile = cProfile.Profile(time.thread_time)
    profiles.append(main_profile)
    main_profile.enable()
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level=args.log_level)
    finally:
        main_profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        with lock:
            stats = pstats.Stats(profiles[0])
            for profiler in profiles[1:]:
                try:
                    stats.add(profiler)
                except TypeError:  # a thread that never ran a call: nothing to add
                    continue
        stats.dump_stats(args.out)


if __name__ == "__main__":
    main()
