"""Drift findings, exit codes, the run directory (atomic, overlapping runs, run ids, an
interrupted run), `since`, the Prometheus textfile and retention."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from validate.drift import report
from validate.drift.model import Finding, FindingStatus, Layer, exit_code, merged
from validate.history import run_files
from validate.model import CheckResult, ExitCode, Status
from validate.results import RunDirError

D, S, U, E, X = (FindingStatus.DRIFT, FindingStatus.SKIPPED, FindingStatus.UNAVAILABLE,
                 FindingStatus.ERROR, FindingStatus.UNREACHABLE)


def _f(node: str, layer: Layer, item: str, status: FindingStatus = D, **kw: str) -> Finding:
    return Finding(node, "pool_a", layer, item, kw.get("declared", "want"),
                   kw.get("actual", "have"), status, kw.get("detail", ""),
                   kw.get("source", "probe"))


def test_merged_keeps_one_finding_per_item_and_the_probe_reading() -> None:
    probe = _f("n1", Layer.RUNTIME, "service a.service", declared="active", actual="inactive",
               source="probe: systemctl")
    check = _f("n1", Layer.RUNTIME, "service a.service", declared="state started",
               actual="ActiveState=inactive", detail="why", source="check mode: r / t")
    out = merged([probe, check, _f("n1", Layer.LABELS, "labels and taints", U)])
    assert len(out) == 2
    svc = out[0]
    assert (svc.declared, svc.actual, svc.detail) == ("active", "inactive", "why")
    assert svc.source == "probe: systemctl; check mode: r / t"
    worse = merged([_f("n1", Layer.VERSIONS, "x", S), _f("n1", Layer.VERSIONS, "x", E)])
    assert [f.status for f in worse] == [E]


def test_exit_codes_follow_the_one_table() -> None:
    assert exit_code([_f("n", Layer.PERFORMANCE, "p", S)]) is ExitCode.OK
    # A layer that could not be compared makes the run incomplete, drift or not.
    assert exit_code([_f("n", Layer.LABELS, "l", U), _f("n", Layer.PERFORMANCE, "p", S)]) \
        is ExitCode.USAGE_OR_TOOL_ERROR
    assert exit_code([_f("n", Layer.LABELS, "l", U), _f("n", Layer.VERSIONS, "v")]) \
        is ExitCode.USAGE_OR_TOOL_ERROR
    assert exit_code([_f("n", Layer.VERSIONS, "v")]) is ExitCode.CHECK_FAILED
    assert exit_code([_f("n", Layer.VERSIONS, "v"), _f("n", Layer.RUNTIME, "r", E)]) \
        is ExitCode.USAGE_OR_TOOL_ERROR
    assert exit_code([_f("n", Layer.RUNTIME, "r", E), _f("m", Layer.CONFIGURATION, "ssh", X)]) \
        is ExitCode.UNREACHABLE


def _write(root: Path, run_id: str, findings: list[Finding], nodes: tuple[str, ...],
           started: datetime, rows: list[CheckResult] | None = None,
           textfile: Path | None = None) -> Path:
    since = report.since_times(root, findings, started.isoformat(timespec="seconds"),
                               exclude=run_id)
    meta = report.RunMeta(run_id, started.isoformat(timespec="seconds"),
                          (started + timedelta(seconds=5)).isoformat(timespec="seconds"),
                          exit_code(findings), nodes, tuple(x.value for x in Layer), "staging",
                          {}, {})
    return report.write_run(root, meta, report.findings_frame(findings, since), rows or [],
                            dict.fromkeys(nodes, "pool_a"), 5.0, textfile)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_since_is_the_start_of_the_unbroken_streak(tmp_path: Path) -> None:
    hold = _f("n1", Layer.VERSIONS, "hold x")
    _write(tmp_path, "20260101T000000Z-drift-0001", [hold], ("n1", "n2"), T0)
    _write(tmp_path, "20260101T010000Z-drift-0002", [], ("n1", "n2"), T0 + timedelta(hours=1))
    _write(tmp_path, "20260101T020000Z-drift-0003", [hold], ("n1",), T0 + timedelta(hours=2))
    # A run that did not look at n1 does not break its streak.
    _write(tmp_path, "20260101T030000Z-drift-0004", [], ("n2",), T0 + timedelta(hours=3))
    run = _write(tmp_path, "20260101T040000Z-drift-0005", [hold], ("n1", "n2"),
                 T0 + timedelta(hours=4))
    table = pd.read_parquet(run / "drift.parquet")
    assert table["since"].tolist() == [(T0 + timedelta(hours=2)).isoformat()]
    assert (tmp_path / "latest-drift").resolve() == run


def test_run_directory_contents_and_textfile(tmp_path: Path) -> None:
    findings = [
        _f("n1", Layer.CONFIGURATION, "/etc/a.conf", detail="--- a\n+++ b\n-x\n+y"),
        _f("n1", Layer.CONFIGURATION, "/etc/b.conf"),
        _f("n2", Layer.LABELS, "labels and taints", U, detail="gate not landed"),
        _f("n3", Layer.CONFIGURATION, "ssh", X),
    ]
    row = CheckResult("r", "t", "n1", "pool_a", "p", "gpu.pcie", "pcie_width", 16.0, "lanes",
                      None, 16.0, Status.PASS, "ok", "", 0.1)
    textfile = tmp_path / "textfile" / "gpuready_drift.prom"
    run = _write(tmp_path / "reports", "20260101T000000Z-drift-00aa", findings,
                 ("n1", "n2", "n3"), T0, [row], textfile)
    assert {p.name for p in run.iterdir()} == {
        "drift.parquet", "drift.csv", "results.parquet", "results.csv", "summary.md",
        "index.html", "metrics.prom", "drift.json"}
    prom = textfile.read_text()
    assert prom == (run / "metrics.prom").read_text()
    assert 'gpuready_drift_items{node="n1",pool="pool_a",layer="configuration"} 2' in prom
    assert 'gpuready_drift_items{node="n2",pool="pool_a",layer="versions"} 0' in prom
    assert 'gpuready_drift_layer_checked{node="n2",pool="pool_a",layer="labels"} 0' in prom
    assert 'gpuready_drift_layer_checked{node="n1",pool="pool_a",layer="labels"} 1' in prom
    assert 'gpuready_drift_layer_checked{node="n3",pool="pool_a",layer="runtime"} 0' in prom
    assert "gpuready_drift_run_status 3" in prom
    assert f"gpuready_drift_last_run_timestamp_seconds {T0.timestamp() + 5:.0f}" in prom
    md = (run / "summary.md").read_text()
    assert "**Environment: staging**" in md and "```diff\n--- a" in md
    assert "| n1 | configuration | /etc/a.conf |" in md
    meta = json.loads((run / "drift.json").read_text())
    assert meta["exit_code"] == 3 and meta["nodes"] == ["n1", "n2", "n3"]
    # The performance rows are history like any run's.
    assert run_files(tmp_path / "reports") == [run / "results.parquet"]
    assert not list(textfile.parent.glob(".*"))  # no temporary file left behind


def test_overlapping_runs_get_their_own_directories(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)
    done: list[Path] = []

    def one(i: int) -> None:
        barrier.wait()
        done.append(_write(tmp_path, f"20260101T000000Z-drift-000{i}",
                           [_f(f"n{i}", Layer.VERSIONS, "v")], (f"n{i}",), T0))

    threads = [threading.Thread(target=one, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 2 and len(report.drift_runs(tmp_path)) == 2
    for path in done:
        assert len(pd.read_parquet(path / "drift.parquet")) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_prune_removes_only_old_drift_runs(tmp_path: Path) -> None:
    old = _write(tmp_path, "20250101T000000Z-drift-0001", [], ("n1",), T0 - timedelta(days=40))
    new = _write(tmp_path, "20260101T000000Z-drift-0002", [], ("n1",), T0)
    (tmp_path / "20250101T000000Z").mkdir()  # a validation run: not drift's to remove
    (tmp_path / "notes.txt").write_text("keep")
    removed = report.prune(tmp_path, 30, now=T0 + timedelta(days=1))
    assert removed == [old.name]
    assert new.exists() and (tmp_path / "20250101T000000Z").exists()
    assert (tmp_path / "notes.txt").exists()


def test_an_interrupted_run_is_kept_but_neither_latest_nor_a_streak(tmp_path: Path) -> None:
    hold = _f("n1", Layer.VERSIONS, "hold x")
    first = _write(tmp_path, "20260101T000000Z-drift-0001", [hold], ("n1",), T0)
    # Stopped before it looked at n1: it found nothing there, and must not end the streak.
    stopped = report.write_run(tmp_path, report.RunMeta(
        "20260101T010000Z-drift-0002", (T0 + timedelta(hours=1)).isoformat(),
        (T0 + timedelta(hours=1)).isoformat(), ExitCode.INTERRUPTED, ("n1",),
        tuple(x.value for x in Layer), None, {}, {}, interrupted=True, interrupted_by="SIGTERM"),
        report.findings_frame([], {}), [], {"n1": "pool_a"}, 1.0)
    assert "INTERRUPTED" in (stopped / "summary.md").read_text()
    assert "gpuready_drift_run_status 130" in (stopped / "metrics.prom").read_text()
    assert (tmp_path / "latest-drift").resolve() == first
    run = _write(tmp_path, "20260101T020000Z-drift-0003", [hold], ("n1",),
                 T0 + timedelta(hours=2))
    assert pd.read_parquet(run / "drift.parquet")["since"].tolist() == [T0.isoformat()]
    assert (tmp_path / "latest-drift").resolve() == run


@pytest.mark.parametrize("run_id", ["/etc/x", "../x", "latest", "x.partial", ""])
def test_reserve_refuses_run_ids_that_are_not_one_directory_under_out(
        tmp_path: Path, run_id: str) -> None:
    with pytest.raises(RunDirError, match="invalid run id"):
        report.reserve(tmp_path / "out", run_id, lambda: "unused")
    assert list((tmp_path / "out").iterdir()) == []
