"""make test's closing table (tools/ci_times.py) from what the sessions wrote."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tools import ci_times


def test_each_lab_module_longest_first_then_the_totals(tmp_path: Path) -> None:
    lab, unit = tmp_path / "lab.json", tmp_path / "unit.json"
    lab.write_text(json.dumps({"session_s": 900.4, "exit_status": 0, "modules_s": {
        "tests/lab/test_lab.py": 60.2, "tests/lab/test_roles.py": 540.6}}))
    unit.write_text(json.dumps({"session_s": 400.0, "exit_status": 0, "modules_s": {}}))
    out = io.StringIO()
    assert ci_times.table(lab, unit, out) == 0
    rows = out.getvalue().splitlines()[2:]
    assert rows == ["| tests/lab/test_roles.py | 541 s | |", "| tests/lab/test_lab.py | 60 s | |",
                    "| tests/lab | 900 s | the lab tests in all |",
                    "| tests/unit | 400 s | the unit suite, beside the lab tests |"]


def test_a_session_that_wrote_nothing_is_said(tmp_path: Path) -> None:
    out = io.StringIO()
    assert ci_times.table(tmp_path / "none.json", tmp_path / "unit.json", out) == 1
    assert "no times:" in out.getvalue() and "none.json" in out.getvalue()
