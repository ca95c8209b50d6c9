"""argparse types for every command-line option of ``python -m validate``: each value is
checked where it is parsed, so a bad one is a usage error naming the option (exit 2) before
anything is read or connected, never a traceback later.

Numbers must be finite (``float()`` also reads "nan" and "inf") and within a range: a timeout
of 1e9 seconds is a typo, and one that large breaks the timers it reaches. Paths must name
something: ``--out ''`` is the current directory to ``pathlib``, which is never what was
meant. A selection (``--checks``, ``--layers``, ``--limit``) names at least one thing: ``,``
selects nothing, and a run of nothing exits 0. A file written at the end of a run
(``--textfile``, ``--log``) is checked to be writable now, not after the fleet's work.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
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


def selection(option: str, what: str) -> Callable[[str], str]:
    """A comma-separated selection (``--checks``) that names at least one ``what``: ``,`` or
    blanks select nothing, and a run of nothing would exit 0 and read as a pass."""

    def parse(text: str) -> str:
        if not any(part.strip() for part in text.split(",")):
            raise argparse.ArgumentTypeError(
                f"{text!r} names no {what}: {option} selects what runs, and nothing run "
                "would read as a pass")
        return text

    parse.__name__ = what
    return parse


def limit(text: str) -> str:
    """An Ansible host pattern (``--limit``) with at least one term: ``''``, ``,`` or ``:``
    would be no limit at all to Ansible's inventory, every host instead of the few meant."""
    terms = [t.strip().lstrip("!&") for t in re.split(r"[,:]", text)]
    if not any(terms):
        raise argparse.ArgumentTypeError(
            f"{text!r} names no host or group (an empty --limit is no limit: every host)")
    return text


# The kernel's own file systems: a report written there is lost or, worse, read as a setting.
_PSEUDO = (Path("/proc"), Path("/sys"))


def output_file(text: str) -> Path:
    """A file the command writes at its end (replaced or appended to), checked now, before
    anything runs: not a directory, a device or anything else that is not a regular file,
    not under /proc or /sys, and in a directory this process can create files in (or
    below the nearest one that exists: a probe file is created there and removed). A path
    found unusable after a fleet's worth of work loses that work."""
    target = path(text)
    absolute = Path(os.path.abspath(target))
    for seen in (absolute, absolute.resolve()):
        root = next((p for p in _PSEUDO if seen == p or p in seen.parents), None)
        if root is not None:
            raise argparse.ArgumentTypeError(f"{text!r} is under {root}, the kernel's, not "
                                             "a place for a report")
    if absolute.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; name a file in it")
    if absolute.exists() and not absolute.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a regular file")
    folder = absolute.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpuready-probe-", dir=folder)
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} cannot be written: no file can be created in {folder} "
            f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    return target
