"""The wall time of each part of ``make test``, as one table (its last lines).

    python -m tools.ci_times LAB.json [LAB.json ...] [--unit UNIT.json]

Reads what the pytest sessions wrote with ``GPUREADY_TEST_TIMES`` (tests/conftest.py): every
lab module on its own row, longest first, then each lab session in all, then the unit suite.
``make test`` runs the lab tests as two sessions side by side (tools/lab_tests.py), named by
their files (``test-times-lab-first.json``: ``tests/lab[first]``), and the unit suite beside
them, so their times overlap: the longest lab session is the critical path. A file that is
missing (a session that never started) is said, not skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def _session(path: Path) -> str:
    """``tests/lab[first]`` for ``...-first.json``; ``tests/lab`` for a lone session's file."""
    stem = path.stem
    for name in ("first", "second"):
        if stem.endswith("-" + name):
            return f"tests/lab[{name}]"
    return "tests/lab"


def table(labs: list[Path], unit: Path | None, out: TextIO) -> int:
    """Write the table; returns 0, or 1 if a session's times are missing."""
    missing = 0
    out.write("| part | wall | |\n|---|---|---|\n")
    modules: dict[str, float] = {}
    totals: list[str] = []
    for lab in labs:
        lab_times = _read(lab)
        if lab_times is None:
            totals.append(f"| {_session(lab)} | - | no times: {lab} not written |\n")
            missing = 1
            continue
        modules.update(lab_times["modules_s"])
        what = ("the lab tests in all" if len(labs) == 1
                else "this lab session in all, beside the other")
        totals.append(f"| {_session(lab)} | {lab_times['session_s']:.0f} s | {what} |\n")
    for module, seconds in sorted(modules.items(), key=lambda kv: -kv[1]):
        out.write(f"| {module} | {seconds:.0f} s | |\n")
    out.writelines(totals)
    if unit is not None:
        unit_times = _read(unit)
        if unit_times is None:
            out.write(f"| tests/unit | - | no times: {unit} not written |\n")
            missing = 1
        else:
            out.write(f"| tests/unit | {unit_times['session_s']:.0f} s | "
                      "the unit suite, beside the lab tests |\n")
    return missing


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    unit = None
    if "--unit" in args:
        at = args.index("--unit")
        if at + 1 >= len(args):
            sys.stderr.write("python -m tools.ci_times: --unit needs a file\n")
            return 2
        unit = Path(args[at + 1])
        del args[at:at + 2]
    if not args or any(a.startswith("-") for a in args):
        sys.stderr.write("usage: python -m tools.ci_times LAB.json [LAB.json ...] "
                         "[--unit UNIT.json]\n")
        return 2
    return table([Path(a) for a in args], unit, out)


if __name__ == "__main__":
    sys.exit(main())
