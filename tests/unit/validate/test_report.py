"""Report files: contents, node roll-up, outliers below the pool median, JUnit, Prometheus,
and the latest symlink."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from validate import cli
from validate.model import CheckResult, ExitCode, Status
from validate.report import finish_run, write_report
from validate.results import ResultsError, load_results, start_run


def _r(node: str, check: str, metric: str, status: Status, value: float | None = None,
       code: str = "ok", pool: str = "pool_h100_sxm", fail: float | None = None,
       detail: str = "") -> CheckResult:
    return CheckResult("run1", "2026-12-02T12:00:00+00:00", node, pool, "h100-sxm5-80gb-8x",
                       check, metric, value, "GB/s" if value is not None else "", None, fail,
                       status, code, detail, 0.5)


@pytest.fixture()
def rows() -> list[CheckResult]:
    out = []
    busbw = {"n1": 482.0, "n2": 479.0, "n3": 481.0, "n4": 420.0, "n5": 478.0}
    for node, bw in busbw.items():
        status = Status.PASS if bw >= 460 else Status.FAIL
        out.append(_r(node, "nccl.allreduce", "busbw_gbps", status, bw,
                      "ok" if status is Status.PASS else "nccl.allreduce.low_busbw", fail=460))
        out.append(_r(node, "gpu.count", "gpu_count", Status.PASS, 8.0))
    out.append(_r("n5", "gpu.ecc", "uncorrectable_volatile", Status.FAIL, 2.0,
                  "gpu.ecc.uncorrectable", detail='GPU0 <"&>'))
    # PCIe pool: its own median, far lower, and one slow node that still passes
    for node, bw in {"l1": 19.0, "l2": 18.5, "l3": 15.0}.items():
        out.append(_r(node, "nccl.allreduce", "busbw_gbps", Status.PASS, bw, pool="pool_l40s",
                      fail=14))
    out.append(_r("x1", "gpu.count", "", Status.ERROR, None, "host.unreachable",
                  pool="pool_l40s", detail="timed out"))
    return out


def test_report_files_and_rollups(rows: list[CheckResult], tmp_path: Path) -> None:
    report = write_report(rows, tmp_path, "run1")
    d = tmp_path / "run1"
    for name in ("results.parquet", "results.csv", "nodes.csv", "fleet.csv", "summary.md",
                 "index.html", "junit.xml", "metrics.prom"):
        assert (d / name).stat().st_size > 0, name
    assert (tmp_path / "latest").resolve() == d.resolve()
    assert report.exit_code is ExitCode.UNREACHABLE
    nodes = pd.read_csv(d / "nodes.csv", keep_default_na=False).set_index("node")
    assert len(nodes) == 9
    assert nodes.loc["n4", "status"] == "fail" and nodes.loc["n4", "failed_checks"] == (
        "nccl.allreduce")
    assert nodes.loc["n5", "failed_checks"] == "gpu.ecc"
    assert nodes.loc["x1", "status"] == "error" and nodes.loc["n1", "status"] == "pass"
    assert float(nodes.loc["n1", "nccl_busbw_gbps"]) == 482.0
    assert list(nodes.index[:2]) == ["x1", "n4"]  # worst first


def test_fleet_flags_nodes_far_below_their_pool_median(rows: list[CheckResult],
                                                        tmp_path: Path) -> None:
    report = write_report(rows, tmp_path, "run1")
    flagged = set(report.fleet.loc[report.fleet["outlier"], "node"])
    # n4: 420 vs median 479 (0.877); l3: 15.0 vs 18.5 (0.81) even though it passed its 14 floor
    assert flagged == {"n4", "l3"}
    l3 = report.fleet.set_index("node").loc["l3"]
    assert l3["pool_median"] == 18.5


def test_junit_and_prometheus_are_well_formed(rows: list[CheckResult], tmp_path: Path) -> None:
    write_report(rows, tmp_path, "run1")
    root = ET.parse(tmp_path / "run1" / "junit.xml").getroot()
    suites = {s.get("name"): s for s in root}
    assert suites["n5"].get("failures") == "1" and suites["x1"].get("errors") == "1"
    failure = suites["n5"].find("testcase[@name='gpu.ecc[uncorrectable_volatile]']/failure")
    assert failure is not None and failure.get("message") == 'gpu.ecc.uncorrectable: GPU0 <"&>'
    prom = (tmp_path / "run1" / "metrics.prom").read_text().splitlines()
    assert ('gpuready_check_value{node="n4",pool="pool_h100_sxm",check="nccl.allreduce",'
            'metric="busbw_gbps",unit="GB/s"} 420.0') in prom
    assert 'gpuready_node_status{node="x1",pool="pool_l40s"} 3' in prom
    assert all(line.startswith(("#", "gpuready_")) for line in prom)


def test_report_rerenders_from_results(rows: list[CheckResult], tmp_path: Path) -> None:
    write_report(rows, tmp_path, "run1")
    df = load_results(tmp_path / "run1")
    assert len(df) == len(rows) and df["status"].dtype.name == "category"
    (tmp_path / "run1" / "nodes.csv").unlink()
    again = write_report(df, tmp_path, "run1", run_dir=tmp_path / "run1", update_latest=False)
    assert (tmp_path / "run1" / "nodes.csv").exists() and again.exit_code is ExitCode.UNREACHABLE
    md = (tmp_path / "run1" / "summary.md").read_text()
    assert "host.unreachable" in md and "| l3 |" in md


def test_environment_label_heads_the_summary(rows: list[CheckResult], tmp_path: Path) -> None:
    """The inventory's gpuready_environment (the lab says SIMULATED) is on the human pages."""
    label = "gpuready lab: SIMULATED GPUs"
    report = write_report(rows, tmp_path, "r-env", environment=label)
    summary = (report.run_dir / "summary.md").read_text()
    assert summary.splitlines()[2] == f"**Environment: {label}**"
    assert label in (report.run_dir / "index.html").read_text()
    plain = write_report(rows, tmp_path, "r-plain")
    assert "Environment" not in (plain.run_dir / "summary.md").read_text()


def test_latest_only_ever_points_at_a_whole_run(rows: list[CheckResult], tmp_path: Path) -> None:
    done = start_run(tmp_path, "r-complete", lambda: "unused")
    assert done.partial_dir == tmp_path / "r-complete.partial" and done.partial_dir.is_dir()
    done.append(rows[:2])
    report = finish_run(done, rows)
    assert report.run_dir == tmp_path / "r-complete" and not report.interrupted
    assert not done.partial_dir.exists() and not (report.run_dir / "rows.jsonl").exists()
    assert (tmp_path / "latest").resolve() == report.run_dir.resolve()
    # An interrupted run is placed (marked) but latest stays on the last whole run.
    cut = [*rows[:3], replace(rows[3], status=Status.ERROR, code="run.interrupted",
                              detail="not started: run interrupted (SIGINT)")]
    stopped = finish_run(start_run(tmp_path, "r-stopped", lambda: "unused"), cut, interrupted=True)
    assert stopped.interrupted and stopped.run_dir == tmp_path / "r-stopped"
    summary = (stopped.run_dir / "summary.md").read_text().splitlines()
    assert summary[0] == "# gpuready validation run r-stopped"
    assert summary[2].startswith("**INTERRUPTED")
    assert (tmp_path / "latest").resolve() == report.run_dir.resolve()
    # rendering it again keeps the mark (the rows carry run.interrupted)
    again = write_report(load_results(stopped.run_dir), tmp_path, "r-stopped",
                         run_dir=stopped.run_dir, update_latest=False)
    assert again.interrupted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_killed_runs_rows_render_from_its_partial_directory(rows: list[CheckResult],
                                                              tmp_path: Path) -> None:
    pending = start_run(tmp_path, None, lambda: "20261202T120000Z-abcd")
    pending.append(rows[:4])
    pending.append(rows[4:6])
    pending.close()
    # the line being written when the process died
    with pending.rows_file.open("a") as f:
        f.write('{"run_id": "run1", "node": "n9", "sta')
    df = load_results(pending.partial_dir)
    assert len(df) == 6 and set(df["node"]) == {r.node for r in rows[:6]}
    report = write_report(df, tmp_path, pending.run_id, run_dir=pending.partial_dir,
                          update_latest=False)
    assert (report.run_dir / "summary.md").exists() and (report.run_dir / "rows.jsonl").exists()


def test_a_results_file_missing_a_column_or_with_a_bad_status_is_named(
        rows: list[CheckResult], tmp_path: Path) -> None:
    run = write_report(rows, tmp_path, "r1").run_dir
    parquet = run / "results.parquet"
    pd.read_parquet(parquet).drop(columns=["node", "code"]).to_parquet(parquet)
    with pytest.raises(ResultsError, match=rf"^{parquet}: no column 'node', 'code' \(a results "
                                           "file has the columns run_id, time, node,"):
        load_results(run)
    parquet.unlink()
    csv = run / "results.csv"
    table = pd.read_csv(csv, keep_default_na=False)
    table.loc[1, "status"] = "bogus"
    table.loc[2, "status"] = ""
    table.to_csv(csv, index=False)
    with pytest.raises(ResultsError, match=(
            rf"^{csv}: line 3 \(node {table.loc[1, 'node']}, check {table.loc[1, 'check']}\): "
            r"status 'bogus' is not a status \(one of skip, pass, warn, fail, error\); 1 more "
            "rows like it$")):
        load_results(run)


def test_report_names_the_file_and_row_of_a_value_it_cannot_render(
        rows: list[CheckResult], tmp_path: Path) -> None:
    """Infinity (JSON has none) in a results file rendered again: exit 2 naming the file, the
    row, the node, the check and the column, and the run's files left as they were."""
    run = write_report(rows, tmp_path, "r1").run_dir
    parquet, csv = run / "results.parquet", run / "results.csv"
    table = pd.read_parquet(parquet)
    table.loc[3, "warn"] = float("-inf")
    table.to_parquet(parquet)
    before = {p.name: p.read_bytes() for p in run.iterdir()}

    def report() -> tuple[int, str]:
        import io  # noqa: PLC0415

        out, err = io.StringIO(), io.StringIO()
        return cli.main(["report", str(run)], out, err), err.getvalue()

    code, err = report()
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"{parquet}: row 4 (node {table.loc[3, 'node']}, check {table.loc[3, 'check']}): "
            "warn is -inf, not a finite number") in err
    assert "JSON compliant" not in err and "internal error" not in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    parquet.unlink()
    text = csv.read_text().splitlines()
    text[2] = text[2].replace(',"gpu_count",8,', ',"gpu_count",inf,', 1)
    assert ",inf," in text[2]
    csv.write_text("\n".join(text) + "\n")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code, err = report()
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert f"{csv}: line 3 (node n1, check gpu.count): value is inf, not a finite" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
