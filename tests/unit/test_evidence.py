"""validate/evidence.py on one node's real rows (tests/unit/gate_runs.py: every check judged on
real captures): the window's edges, a clock that is wrong, rows without a readable time, and
which empty values are legitimate (a check without a figure) and which are not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from tests.unit import gate_runs
from validate.checks import REGISTRY
from validate.evidence import node_evidence, required_checks
from validate.inventory import load
from validate.results import to_frame

MEASURED = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
DAY = 24 * 3600.0


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> pd.DataFrame:
    root = tmp_path_factory.mktemp("evidence")
    inv = gate_runs.write_inventory(root / "inventory", ["e-h100"], prefix="gpu.example.com",
                                    kubeconfig=root / "kubeconfig")
    (node,) = load(inv)
    return to_frame(gate_runs.node_rows(fixtures_dir, node, "r1", MEASURED.isoformat()))


def codes(found: object) -> list[str]:
    return [p.code for p in getattr(found, "problems", ())]


def test_a_complete_fresh_run_is_evidence(rows: pd.DataFrame) -> None:
    assert set(rows["check"]) == set(required_checks())
    found = node_evidence(rows, run_id="r1", now=MEASURED + timedelta(hours=23), max_age_s=DAY)
    assert codes(found) == [] and found.measured_at == MEASURED.isoformat()
    assert found.results is not None and found.results.passed
    assert (found.results.gpu_count, found.results.gpu_memory_mib) == (8, 81559)
    # Rows that carry no figure by nature (the driver version, the GPU product) are not
    # missing values: they are in the passing run above.
    named = rows[rows["check"].isin(["gpu.driver", "gpu.model"])]
    assert named["value"].isna().all() and set(named["status"].astype(str)) == {"pass"}


@pytest.mark.parametrize(("now", "words"), [
    (MEASURED + timedelta(hours=25), "25 h ago; its pool admits on runs no older than 24 h"),
    (MEASURED + timedelta(days=3), "3 days ago"),
    (MEASURED - timedelta(hours=1), "after this machine's time"),
])
def test_outside_the_window_or_from_the_future_is_stale(rows: pd.DataFrame, now: datetime,
                                                        words: str) -> None:
    found = node_evidence(rows, run_id="r1", now=now, max_age_s=DAY)
    assert codes(found) == ["gate.stale_run"] and words in found.problems[0].reason


def test_a_clock_a_few_minutes_ahead_is_not_the_future(rows: pd.DataFrame) -> None:
    found = node_evidence(rows, run_id="r1", now=MEASURED - timedelta(minutes=2), max_age_s=DAY)
    assert codes(found) == []


def test_rows_without_a_readable_time_are_not_fresh(rows: pd.DataFrame) -> None:
    bad = rows.assign(time=rows["time"].where(rows["check"] != "gpu.ecc", "yesterday"))
    found = node_evidence(bad, run_id="r1", now=MEASURED, max_age_s=DAY)
    assert codes(found) == ["gate.stale_run"] and "'yesterday'" in found.problems[0].reason
    assert found.measured_at is None


def test_a_figure_missing_from_a_passing_row_is_not_finite(rows: pd.DataFrame) -> None:
    # A passing fio row without its figure (a unit, thresholds, no value).
    fio = (rows["check"] == "storage.fio") & (rows["metric"] == "seq_read_mibps")
    blank = rows.assign(value=rows["value"].mask(fio))
    found = node_evidence(blank, run_id="r1", now=MEASURED, max_age_s=DAY)
    assert codes(found) == ["gate.non_finite_value"]
    assert "storage.fio seq_read_mibps = nan (pass)" in found.problems[0].reason
    # The same row as an error (what the validators write when a tool prints NaN) is a
    # failure of the node, not damaged evidence.
    errored = blank.assign(status=blank["status"].astype(str).mask(fio, "error"),
                           code=blank["code"].mask(fio, "check.non_finite_value"))
    found = node_evidence(errored, run_id="r1", now=MEASURED, max_age_s=DAY)
    assert codes(found) == [] and found.results is not None
    assert found.results.codes == ("check.non_finite_value",) and not found.results.passed


def test_missing_checks_are_named(rows: pd.DataFrame) -> None:
    partial = rows[~rows["check"].isin(["storage.fio", "nccl.allreduce"])]
    found = node_evidence(partial, run_id="r1", now=MEASURED, max_age_s=DAY)
    assert codes(found) == ["gate.incomplete_run"]
    assert f"2 of the {len(REGISTRY)} checks the node needs (storage.fio, nccl.allreduce)" in \
        found.problems[0].reason
