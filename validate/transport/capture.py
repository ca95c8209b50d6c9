"""Bounded capture of one command's stdout and stderr (shared by the transports)."""

from __future__ import annotations

# What is kept of each stream once the cap is passed: enough for the error message.
TAIL_BYTES = 4096


class Capture:
    """Collects stdout and stderr chunks up to ``limit`` bytes for both together. Past the
    limit ``over`` is True and only the last :data:`TAIL_BYTES` of each stream are kept, so
    memory stays bounded whatever the node prints."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.over = False
        self._out: list[bytes] = []
        self._err: list[bytes] = []

    def out(self, data: bytes) -> None:
        self._out.append(data)
        self._count(len(data))

    def err(self, data: bytes) -> None:
        self._err.append(data)
        self._count(len(data))

    def _count(self, size: int) -> None:
        self.total += size
        if self.total > self.limit:
            self.over = True
            self._out, self._err = [_tail(self._out)], [_tail(self._err)]

    def stdout(self) -> str:
        return b"".join(self._out).decode("utf-8", "replace")

    def stderr(self) -> str:
        return b"".join(self._err).decode("utf-8", "replace")


def _tail(chunks: list[bytes]) -> bytes:
    return b"".join(chunks)[-TAIL_BYTES:]
