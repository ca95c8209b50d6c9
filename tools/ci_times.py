"""The wall time of each part of ``make test``, as one table (its last lines).

    python -m tools.ci_times LAB.json [UNIT.json]

Reads what the pytest sessions wrote with ``GPUREADY_TEST_TIMES`` (tests/conftest.py): every
lab module on its own row, longest first, then the lab tests and the unit suite in all. The unit
suite runs beside the lab tests (make test), so its time overlaps theirs; the lab tests are the
critical path. A file that is missing (a session that never started) is said, not skipped.
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


def table(lab: Path, unit: Path | None, out: TextIO) -> int:
    """Write the table; returns 0, or 1 if a session's times are missing."""
    missing = 0
    out.write("| part | wall | |\n|---|---|---|\n")
    lab_times = _read(lab)
    if lab_times is None:
        out.write(f"| tests/lab | - | no times: {lab} not written |\n")
        missing = 1
    else:
        for module, seconds in sorted(lab_times["modules_s"].items(), key=lambda kv: -kv[1]):
            out.write(f"| {module} | {seconds:.0f} s | |\n")
        out.write(f"| tests/lab | {lab_times['session_s']:.0f} s | the lab tests in all |\n")
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
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        sys.stderr.write("usage: python -m tools.ci_times LAB.json [UNIT.json]\n")
        return 2
    return table(Path(args[0]), Path(args[1]) if len(args) == 2 else None, out)


if __name__ == "__main__":
    sys.exit(main())
