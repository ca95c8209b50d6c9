"""Result row shape, status roll-up and the exit-code table."""

from __future__ import annotations

import dataclasses

import pytest

from validate.model import COLUMNS, CheckResult, ExitCode, Status, exit_code_for, worst


def test_row_has_exactly_the_design_columns() -> None:
    assert COLUMNS == ("run_id", "time", "node", "pool", "profile", "check", "metric", "value",
                       "unit", "warn", "fail", "status", "code", "detail", "duration_s")
    row = CheckResult("r", "t", "n", "p", "prof", "gpu.count", "gpu_count", 8.0, "", None, None,
                      Status.PASS, "ok", "", 0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = Status.FAIL  # type: ignore[misc]
    assert row.as_dict()["status"] == "pass"


def test_exit_code_table_and_precedence() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 130]
    assert exit_code_for([Status.PASS, Status.WARN, Status.SKIP], ["ok"] * 3) is ExitCode.OK
    assert exit_code_for([Status.PASS, Status.FAIL], ["ok", "gpu.ecc.uncorrectable"]) is (
        ExitCode.CHECK_FAILED)
    assert exit_code_for([Status.FAIL, Status.ERROR], ["x", "tool.timeout"]) is (
        ExitCode.USAGE_OR_TOOL_ERROR)
    # an unreachable node outranks everything: the fleet picture is incomplete
    assert exit_code_for([Status.FAIL, Status.ERROR], ["x", "host.unreachable"]) is (
        ExitCode.UNREACHABLE)
    assert exit_code_for([Status.ERROR], ["host.hostkey_rejected"]) is ExitCode.UNREACHABLE
    # a node that answered SSH and then stalled, or ran past its deadline, was not fully asked
    for code in ("host.unresponsive", "host.deadline"):
        assert exit_code_for([Status.PASS, Status.ERROR], ["ok", code]) is ExitCode.UNREACHABLE


def test_worst_status() -> None:
    assert worst([Status.PASS, Status.SKIP, Status.WARN]) is Status.WARN
    assert worst([Status.FAIL, Status.ERROR]) is Status.ERROR
    assert worst([Status.SKIP, Status.PASS]) is Status.PASS
    assert worst([]) is Status.SKIP
