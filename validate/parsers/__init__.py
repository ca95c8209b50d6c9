"""Pure parsers: tool text -> typed records. One module per tool format.

Every parser raises :class:`ParseError` (and only that) on garbage, empty or truncated input,
so that a check can turn it into an ``error`` row instead of a traceback.
"""

from __future__ import annotations


class ParseError(ValueError):
    """The tool output could not be parsed. ``fmt`` names the format, ``reason`` says why."""

    def __init__(self, fmt: str, reason: str) -> None:
        super().__init__(f"{fmt}: {reason}")
        self.fmt = fmt
        self.reason = reason
