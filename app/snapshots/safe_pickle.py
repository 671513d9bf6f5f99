"""Loading a pickle as data: an unpickler that resolves no globals at all.

A PyTorch memory snapshot holds only dicts, lists, tuples, strings, numbers, booleans and
None. Every way a pickle can reach code goes through a global (``GLOBAL``,
``STACK_GLOBAL``, ``INST``, ``OBJ``, the ``EXT`` registry: all call ``find_class``) or a
persistent id; both are refused here, so ``REDUCE``, ``NEWOBJ`` and ``BUILD`` never get a
callable or a class to act on. What is left builds plain containers only.
"""

import gzip
import pickle
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"
_COPY = 1 << 20


class Refused(Exception):
    """The pickle asked for something a snapshot never holds (a class, a function)."""


class TooLarge(Exception):
    """The input expands past the size allowed."""


class NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise Refused(
            f"the pickle names {module[:100]}.{name[:100]}: a memory snapshot holds only plain "
            "data (dicts, lists, strings, numbers), never a class or a function"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("the pickle refers to a persistent id: a memory snapshot never does")


def load(stream: IO[bytes]) -> Any:
    """Unpickle ``stream`` with no globals; ``Refused`` names what it asked for."""
    return NoGlobalsUnpickler(stream).load()


def gunzip_to(src: IO[bytes], dst: IO[bytes], limit: int) -> int:
    """Decompress a gzip stream (every member) into ``dst``, refusing past ``limit`` bytes:
    a small bomb must not fill the disk. Returns the bytes written."""
    written = 0
    with gzip.GzipFile(fileobj=src, mode="rb") as gz:
        while True:
            block = gz.read(_COPY)
            if not block:
                return written
            written += len(block)
            if written > limit:
                raise TooLarge(f"the gzip data expands past {limit} bytes")
            dst.write(block)
