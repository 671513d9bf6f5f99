"""``vramlab worker --max-experiments N``: the worker's N, shared by all its loops.

Each loop (``--concurrency``, or the CPU's and GPU's defaults of several) takes its
claim's share before it claims and gives back what the claim did not bring, so that the
loops together run N and stop: a loop that finds none left ends, and the one that holds
the last share waits for work as a lone loop would. A quota for each loop of its own made
the worker wait for N experiments a loop (a worker of two loops asked for one experiment
ran it and then waited for a second one that never came).
"""

import threading


class Quota:
    def __init__(self, total: int) -> None:
        self._left = max(0, total)
        self._lock = threading.Lock()

    def take(self, most: int) -> int:
        """Up to ``most`` of what is left, now the caller's to claim (0: none left)."""
        with self._lock:
            share = min(most, self._left)
            self._left -= share
            return share

    def give_back(self, unused: int) -> None:
        """What a claim did not bring, for any loop's next claim."""
        if unused > 0:
            with self._lock:
                self._left += unused
