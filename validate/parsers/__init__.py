"""Pure parsers: tool text -> typed records. One module per tool format.

Every parser raises :class:`ParseError` (and only that) on garbage, empty or truncated input,
so that a check can turn it into an ``error`` row instead of a traceback. A number that is NaN
or infinite (``nan`` in a table, ``NaN``/``Infinity`` in JSON, ``1e999``) is garbage too: it
compares false to every threshold, so it would pass any check (:func:`finite`).
"""

from __future__ import annotations

import math


class ParseError(ValueError):
    """The tool output could not be parsed. ``fmt`` names the format, ``reason`` says why."""

    def __init__(self, fmt: str, reason: str) -> None:
        super().__init__(f"{fmt}: {reason}")
        self.fmt = fmt
        self.reason = reason


def finite(value: float, fmt: str, what: str) -> float:
    """``value`` when it is a finite number, else :class:`ParseError` naming ``what``."""
    if math.isfinite(value):
        return value
    raise ParseError(fmt, f"{what} is not a finite number: {value!r}")
