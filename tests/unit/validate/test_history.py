"""validate.history: the runs' Parquet files read as one history (columnar, no per-file loop
over CSV), baselines, last change and the fleet table; written with the real report writer."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from validate.history import (
    BaselineSettings,
    HistoryError,
    fleet_table,
    node_series,
    parse_figure,
    run_files,
    summarise,
)
from validate.model import CheckResult, Status
from validate.report import write_report


def _row(run: str, node: str, check: str, metric: str, value: float,
         status: Status = Status.PASS) -> CheckResult:
    return CheckResult(run, f"2026-01-{int(run[-2:]):02d}T00:00:00+00:00", node, "pool_a",
                       "p", check, metric, value, "u", None, None, status,
                       "ok" if status is Status.PASS else "x", "", 0.1)


def _runs(root: Path, series: dict[str, list[tuple[float, Status]]]) -> list[str]:
    """One run per position; ``series`` maps node -> busbw per run."""
    runs = []
    n = max(len(v) for v in series.values())
    for i in range(n):
        run = f"2026010{i // 10}T00{i % 10}000Z-{i + 1:02d}"
        rows = []
        for node, values in series.items():
            if i < len(values):
                value, status = values[i]
                rows.append(_row(run, node, "nccl.allreduce", "busbw_gbps", value, status))
                rows.append(_row(run, node, "gpu.pcie", "pcie_width", 16.0))
                rows.append(_row(run, node, "gpu.count", "gpu_count", 8.0))
        write_report(rows, root, run)
        runs.append(run)
    return runs


P, F = Status.PASS, Status.FAIL


def test_series_baseline_and_last_change(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"n1": [(100, P), (102, P), (20, F), (98, P), (101, P), (80, P)],
                            "n2": [(50, P)] * 6})
    s = node_series(tmp_path, "n1", [parse_figure("nccl_busbw_gbps")])
    assert list(s["run_id"]) == runs and list(s["value"]) == [100, 102, 20, 98, 101, 80]
    summary = summarise(s, BaselineSettings(k=3, min_runs=3, margin=0.1)).iloc[0]
    # The failing run is not part of the baseline: median of 102, 98, 101.
    assert summary["baseline"] == 101 and summary["baseline_runs"] == 3
    assert summary["latest"] == 80 and summary["below"]
    assert summary["last_change_run"] == runs[-1]
    assert (summary["last_change_from"], summary["last_change_to"]) == (101, 80)
    assert set(s["node"]) == {"n1"}  # the filter, not the caller, kept n2 out


def test_latest_symlink_and_partial_runs_are_not_read_twice(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"n1": [(100, P)] * 3})
    assert (tmp_path / "latest").is_symlink()
    (tmp_path / f".{runs[0]}.partial").mkdir()
    assert len(run_files(tmp_path)) == 3
    assert len(node_series(tmp_path, "n1")) == 3 * 3  # three figures, once per run


def test_fleet_table_matches_per_node_summary(tmp_path: Path) -> None:
    _runs(tmp_path, {"n1": [(100, P), (101, P), (99, P), (70, P)],
                     "n2": [(50, P), (51, P), (49, P), (50, P)],
                     "n3": [(10, P)]})
    settings = BaselineSettings(k=5, min_runs=3, margin=0.1)
    fleet = fleet_table(tmp_path, settings).set_index(["node", "figure"])
    for node in ("n1", "n2", "n3"):
        one = summarise(node_series(tmp_path, node), settings).set_index(["node", "figure"])
        for key in one.index.intersection(fleet.index):
            for col in ("latest", "baseline", "below", "baseline_runs", "runs"):
                a, b = fleet.loc[key, col], one.loc[key, col]
                assert (pd.isna(a) and pd.isna(b)) or a == b, (key, col, a, b)
    assert fleet.loc[("n1", "nccl_busbw_gbps"), "below"]
    assert not fleet.loc[("n2", "nccl_busbw_gbps"), "below"]
    assert pd.isna(fleet.loc[("n3", "nccl_busbw_gbps"), "baseline"])  # one run: no baseline
    below = fleet[fleet["below"]].reset_index()
    assert list(zip(below["node"], below["figure"], strict=True)) == [("n1", "nccl_busbw_gbps")]


def test_overlapping_writers_lose_and_tear_nothing(tmp_path: Path) -> None:
    """Two runs written at the same moment (a barrier, not the clock) both land whole."""
    barrier = threading.Barrier(2)

    def write(run: str, value: float) -> None:
        rows = [_row(run, f"n{i}", "nccl.allreduce", "busbw_gbps", value) for i in range(500)]
        barrier.wait()
        write_report(rows, tmp_path, run)

    threads = [threading.Thread(target=write, args=(f"20260101T000000Z-{i:02d}", 10.0 + i))
               for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = pd.concat([node_series(tmp_path, f"n{i}") for i in range(0, 500, 99)])
    assert s.groupby("run_id").size().tolist() == [6, 6]
    assert sorted(set(s["value"])) == [11.0, 12.0]


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(HistoryError):
        run_files(tmp_path / "missing")
    with pytest.raises(HistoryError):
        parse_figure("busbw")
    assert parse_figure("gpu.pcie:pcie_width") == ("gpu.pcie", "pcie_width")
    with pytest.raises(HistoryError):
        BaselineSettings(k=2, min_runs=3)
    with pytest.raises(HistoryError):
        BaselineSettings(margin=1.5)
    assert node_series(tmp_path, "nobody").empty
    os.makedirs(tmp_path / "empty-run")
    assert fleet_table(tmp_path, BaselineSettings()).empty
