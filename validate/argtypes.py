"""argparse types for every command-line option of ``python -m validate``: each value is
checked where it is parsed, so a bad one is a usage error naming the option (exit 2) before
anything is read or connected, never a traceback later.

Numbers must be finite (``float()`` also reads "nan" and "inf") and within a range: a timeout
of 1e9 seconds is a typo, and one that large breaks the timers it reaches. Paths must name
something: ``--out ''`` is the current directory to ``pathlib``, which is never what was
meant.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

# Upper bounds of the options, in one place.
MAX_COMMAND_TIMEOUT_S = 86_400.0  # a day: longer is no validation check
MAX_NODE_DEADLINE_S = 7 * 86_400.0
MAX_STEP_TIMEOUT_S = 3_600.0  # one step of the SSH conversation
MAX_OUTPUT_MIB = 4_096.0
MAX_CONCURRENCY = 4_096  # one thread each


def seconds(high: float) -> Callable[[str], float]:
    """A finite number of seconds > 0 and at most ``high``."""

    def parse(text: str) -> float:
        return number(text, high, "seconds")

    parse.__name__ = "seconds"  # argparse names the type in its messages
    return parse


def mib(high: float) -> Callable[[str], float]:
    """A finite number of MiB > 0 and at most ``high``."""

    def parse(text: str) -> float:
        return number(text, high, "MiB")

    parse.__name__ = "MiB"
    return parse


def days(high: float) -> Callable[[str], float]:
    """A finite number of days > 0 and at most ``high``."""

    def parse(text: str) -> float:
        return number(text, high, "days")

    parse.__name__ = "days"
    return parse


def number(text: str, high: float, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= high:
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0 and at most {high:g} {unit}, not {text!r}")
    return value


def count(low: int, high: int) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be >= {low} and <= {high}, not {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def fraction(text: str) -> float:
    """A number from 0 up to (not including) 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 up to 1, not {text!r}")
    return value


def path(text: str) -> Path:
    """A path that names something (not '' or blanks, which pathlib reads as '.')."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or directory, not {text!r}")
    return Path(text)
