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
    assert ci_times.table([lab], unit, out) == 0
    rows = out.getvalue().splitlines()[2:]
    assert rows == ["| tests/lab/test_roles.py | 541 s | |", "| tests/lab/test_lab.py | 60 s | |",
                    "| tests/lab | 900 s | the lab tests in all |",
                    "| tests/unit | 400 s | the unit suite, beside the lab tests |"]


def test_a_session_that_wrote_nothing_is_said(tmp_path: Path) -> None:
    out = io.StringIO()
    assert ci_times.table([tmp_path / "none.json"], tmp_path / "unit.json", out) == 1
    assert "no times:" in out.getvalue() and "none.json" in out.getvalue()


def test_two_lab_sessions_merge_their_modules_and_each_says_its_total(tmp_path: Path) -> None:
    first, second = tmp_path / "lab-first.json", tmp_path / "lab-second.json"
    first.write_text(json.dumps({"session_s": 1400.0, "exit_status": 0, "modules_s": {
        "tests/lab/test_roles.py": 500.0, "tests/lab/test_drift.py": 340.0}}))
    second.write_text(json.dumps({"session_s": 1100.0, "exit_status": 1, "modules_s": {
        "tests/lab/test_upgrade.py": 900.0}}))
    out = io.StringIO()
    assert ci_times.main([str(first), str(second), "--unit", str(tmp_path / "u.json")],
                         out=out) == 1  # the unit suite's times are missing: said
    rows = out.getvalue().splitlines()[2:]
    assert rows[:3] == ["| tests/lab/test_upgrade.py | 900 s | |",
                        "| tests/lab/test_roles.py | 500 s | |",
                        "| tests/lab/test_drift.py | 340 s | |"]
    assert rows[3].startswith("| tests/lab[first] | 1400 s |")
    assert rows[4].startswith("| tests/lab[second] | 1100 s |")
    assert rows[5].startswith("| tests/unit | - | no times:")


def test_a_wrong_call_is_refused() -> None:
    assert ci_times.main(["--unit"]) == 2
    assert ci_times.main(["--bogus"]) == 2
