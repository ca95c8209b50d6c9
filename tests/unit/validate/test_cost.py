"""The capacity and cost view, checked against an example worked by hand below."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pandas as pd
import pytest

from validate import cost, history, runinfo
from validate.cli import main
from validate.drift import report as drift_report
from validate.model import CheckResult, ExitCode, Status
from validate.profiles import load_profile
from validate.report import write_report
from validate.results import to_frame
from validate.runinfo import ProfileUse

T0 = pd.Timestamp("2026-03-01T00:00:00+00:00")


def _at(hours: float) -> str:
    return (T0 + pd.Timedelta(hours=hours)).isoformat()


def _rows(run_id: str, hours: float, statuses: dict[str, tuple[Status, str]],
          pool: str = "pool_h100", profile: str = "h100-sxm5-80gb-8x") -> list[CheckResult]:
    return [CheckResult(run_id, _at(hours), node, pool, profile, check, "", None, "", None,
                        None, status, code, "", 0.0)
            for node, (status, code) in statuses.items()
            for check in ("gpu.count", "fabric.nccl_pair")]


OK = (Status.PASS, "ok")
WARN = (Status.WARN, "gpu.ecc.correctable_high")
BAD = (Status.FAIL, "fabric.nccl_pair.low_busbw")

# The worked example. Pool of 4 nodes x 8 H100 = 32 GPUs declared; gpu-4 fails, so 24 GPUs
# are accepted (gpu-3 only warns: accepted) and 8 are out.
# Costs per hour:
#   compute     2.00 per GPU-hour x 32 GPUs declared  = 64.00
#   network     7300 per month / 730 h                = 10.00
#   storage     3650 per month / 730 h                =  5.00
#   support      730 per month / 730 h                =  1.00
#   idle        0.25 per GPU-hour x 32                =  8.00
#   failed_runs 1460 per month / 730 h                =  2.00
#   operations  2920 per month / 730 h                =  4.00
#   total                                             = 94.00 per hour
# Effective cost per accepted GPU-hour: 94.00 / 24 = 3.916666...
# History: gpu-4 was accepted at T0, failed at T0+3h and T0+6h (and now, T0+12h): out since
# T0+3h, 9 hours x 8 GPUs = 72 GPU-hours lost. gpu-2 failed at T0+6h but passes now: nothing
# is lost now. gpu-1 was not in the T0+6h run: a gap does not end or start a streak.
INPUTS = {
    "currency": "USD",
    "compute": {"per_gpu_hour": 2.0},
    "network": {"monthly": 7300},
    "storage": {"monthly": 3650},
    "support": {"monthly": 730},
    "idle": {"per_gpu_hour": 0.25},
    "failed_runs": {"monthly": 1460},
    "operations": {"monthly": 2920},
}
NOW = {"gpu-1": OK, "gpu-2": OK, "gpu-3": WARN, "gpu-4": BAD}


def _recorded(nodes: tuple[str, ...] = tuple(NOW), name: str = "h100-sxm5-80gb-8x",
              **hardware: object) -> ProfileUse:
    """A profile as run.json records it (runinfo.profiles_used): the shipped one's hardware,
    with ``hardware`` changed where given (a site's edited copy)."""
    p = load_profile(name)
    return ProfileUse(name, p.source, None, {**dataclasses.asdict(p.hardware), **hardware}, {},
                      p.thresholds, ("pool_h100",), nodes)


# The worked example's profile as its run recorded it: 8 GPUs per node.
H100 = (_recorded(),)


def _info(run_id: str, hours: float, profiles: tuple[ProfileUse, ...] = H100) -> runinfo.RunInfo:
    return runinfo.RunInfo(run_id, None, "/inventory", None, None, ("gpu.count",), len(NOW),
                           profiles, "0", None, None, _at(hours))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reports directory holding the example's earlier runs (and one after it)."""
    root = tmp_path_factory.mktemp("reports")
    for run_id, hours, statuses in (
        ("r0", 0, {"gpu-1": OK, "gpu-2": OK, "gpu-3": OK, "gpu-4": OK}),
        ("r3", 3, {"gpu-1": OK, "gpu-2": OK, "gpu-3": OK, "gpu-4": BAD}),
        ("r6", 6, {"gpu-2": BAD, "gpu-3": OK, "gpu-4": BAD}),
        ("later", 20, {"gpu-4": OK}),  # after this run: must not count
    ):
        write_report(_rows(run_id, hours, statuses), root, run_id)
    return root


def test_the_worked_example(reports: Path):
    df = to_frame(_rows("now", 12, NOW))
    inputs = {"pool_h100": cost.parse_inputs("pool_h100", INPUTS)}
    (pool,) = cost.for_run(df, inputs, reports, reports / "now", H100)
    assert (pool.nodes, pool.gpus_declared, pool.gpus_accepted, pool.gpus_out) == (4, 32, 24, 8)
    (out,) = pool.out
    assert (out.node, out.gpus, out.codes) == ("gpu-4", 8, ("fabric.nccl_pair.low_busbw",))
    assert out.since == _at(3)
    assert out.gpu_hours_lost == pool.gpu_hours_lost == 72.0
    assert pool.cost_per_hour == pytest.approx(94.0)
    assert pool.cost_per_accepted_gpu_hour == pytest.approx(94.0 / 24)
    assert (pool.missing, pool.errors, pool.notes) == ((), (), ())
    md = cost.markdown([pool])
    assert "| pool_h100 | 4 | 32 | 24 | 8 | 72 | USD 94.00 | USD 3.92 |" in md
    assert f"| pool_h100 | gpu-4 | 8 | {_at(3)} | 72 | fabric.nccl_pair.low_busbw |" in md
    prom = cost.prometheus([pool])
    for line in ('gpuready_pool_gpus_declared{pool="pool_h100"} 32',
                 'gpuready_pool_gpus_accepted{pool="pool_h100"} 24',
                 'gpuready_pool_gpus_out{pool="pool_h100"} 8',
                 'gpuready_pool_gpus_out_by_code{pool="pool_h100",'
                 'code="fabric.nccl_pair.low_busbw"} 8',
                 'gpuready_pool_gpu_hours_lost{pool="pool_h100"} 72.0',
                 'gpuready_pool_cost_per_hour{pool="pool_h100",currency="USD"} 94.0'):
        assert line in prom.splitlines()
    assert "gpuready_pool_cost_input_missing" not in prom


def test_a_failure_that_starts_now_has_lost_nothing_yet(tmp_path: Path):
    df = to_frame(_rows("first", 0, NOW))
    (pool,) = cost.for_run(df, {}, tmp_path, tmp_path / "first", H100)
    assert pool.out[0].since == _at(0) and pool.gpu_hours_lost == 0.0


def test_missing_inputs_are_named_and_nothing_is_invented():
    df = to_frame(_rows("now", 12, NOW))
    partial = {k: v for k, v in INPUTS.items() if k not in ("support", "idle")}
    (pool,) = cost.capacity(df, {"pool_h100": cost.parse_inputs("pool_h100", partial)},
                            profiles=H100)
    assert pool.missing == ("support", "idle")
    assert pool.cost_per_hour is None and pool.cost_per_accepted_gpu_hour is None
    assert pool.gpus_accepted == 24  # capacity still counted: it needs no cost input
    md = cost.markdown([pool])
    assert "gpuready_cost lacks support, idle: the effective cost is not computed" in md
    assert "| USD 94" not in md and "| - | - |" in md
    prom = cost.prometheus([pool])
    assert 'gpuready_pool_cost_input_missing{pool="pool_h100",input="support"} 1' in prom
    assert "gpuready_pool_cost_per_accepted_gpu_hour" not in prom
    (none,) = cost.capacity(df, {"pool_h100": cost.parse_inputs("pool_h100", None)},
                            profiles=H100)
    assert none.missing == ("currency", *cost.COMPONENTS)
    assert "no cost inputs (gpuready_cost is not set for this pool)" in cost.markdown([none])


@pytest.mark.parametrize(("raw", "problem"), [
    ({**INPUTS, "network": {"monthly": -1}}, "gpuready_cost.network.monthly must be a number >= 0"),
    ({**INPUTS, "network": {"weekly": 10}}, "gpuready_cost.network must be one of"),
    ({**INPUTS, "network": {"monthly": 1, "per_gpu_hour": 1}}, "gpuready_cost.network must be"),
    ({**INPUTS, "power": {"monthly": 1}}, "unknown keys ['power']"),
    ({**INPUTS, "compute": {"per_gpu_hour": "2.10"}}, "must be a number >= 0, got '2.10'"),
    ({**INPUTS, "currency": ""}, "currency must be a non-empty string"),
    (["USD", 2.1], "gpuready_cost must be a mapping, got list"),
])
def test_malformed_inputs_are_named(raw: object, problem: str):
    parsed = cost.parse_inputs("pool_h100", raw)
    assert not parsed.complete and any(problem in e for e in parsed.errors), parsed.errors
    (pool,) = cost.capacity(to_frame(_rows("now", 0, NOW)), {"pool_h100": parsed},
                            profiles=H100)
    assert pool.cost_per_accepted_gpu_hour is None
    assert problem.split(" must", maxsplit=1)[0] in cost.markdown([pool])


def test_no_accepted_gpu_means_no_cost_per_accepted_gpu_hour():
    df = to_frame(_rows("now", 0, {"gpu-1": BAD, "gpu-2": BAD}))
    (pool,) = cost.capacity(df, {"pool_h100": cost.parse_inputs("pool_h100", INPUTS)},
                            profiles=H100)
    assert pool.gpus_accepted == 0 and pool.cost_per_accepted_gpu_hour is None
    assert pool.cost_per_hour == pytest.approx(2.0 * 16 + 10 + 5 + 1 + 0.25 * 16 + 2 + 4)
    assert "not defined" in cost.markdown([pool])


def test_report_carries_the_section_and_renders_it_again(reports: Path):
    df = to_frame(_rows("now", 12, NOW))
    inputs = {"pool_h100": cost.parse_inputs("pool_h100", INPUTS)}
    report = write_report(df, reports, "now", run_info=_info("now", 12),
                          extras=cost.report_extras(df, inputs, reports, reports / "now", H100))
    page = (report.run_dir / "index.html").read_text()
    assert 'id="capacity"' in page and "USD 3.92" in page
    summary = (report.run_dir / "summary.md").read_text()
    metrics = (report.run_dir / "metrics.prom").read_text()
    assert "## Capacity and cost" in summary and "USD 3.92" in summary
    assert "gpuready_pool_gpu_hours_lost" in metrics
    assert "gpuready_check_status" in metrics  # the run's own metrics stay
    table = pd.read_csv(report.run_dir / "capacity.csv")
    assert table.loc[0, "cost_per_accepted_gpu_hour"] == pytest.approx(94 / 24)
    # `validate report` renders the same view from the recorded inputs and history.
    out, err = io.StringIO(), io.StringIO()
    main(["report", str(report.run_dir)], out, err)
    assert (report.run_dir / "summary.md").read_text() == summary
    assert (report.run_dir / "metrics.prom").read_text() == metrics
    assert (report.run_dir / "index.html").read_text() == page


def test_gpus_are_counted_by_the_profile_the_run_recorded(tmp_path: Path):
    """The run judged its nodes against a 4-GPU copy of h100-sxm5-80gb-8x (a site's edited
    profile; the shipped file says 8): its cost view, and `validate report` rendering it again
    later, count the 4 GPUs run.json records, not what the shipped file reads today."""
    root = tmp_path / "reports"
    df = to_frame(_rows("r", 12, NOW))
    four = (_recorded(gpu_count=4),)
    inputs = {"pool_h100": cost.parse_inputs("pool_h100", INPUTS)}
    report = write_report(df, root, "r", run_info=_info("r", 12, four),
                          extras=cost.report_extras(df, inputs, root, root / "r", four))
    (report.run_dir / "capacity.csv").unlink()
    main(["report", str(report.run_dir)], io.StringIO(), io.StringIO())
    table = pd.read_csv(report.run_dir / "capacity.csv")
    assert (table.loc[0, "gpus_declared"], table.loc[0, "gpus_accepted"],
            table.loc[0, "gpus_out"]) == (16, 12, 4)
    assert table.loc[0, "cost_per_hour"] == pytest.approx(2.0 * 16 + 10 + 5 + 1 + 0.25 * 16 + 2 + 4)


def test_a_node_without_a_recorded_profile_is_named_and_its_gpus_not_counted():
    df = to_frame(_rows("now", 12, NOW))
    broken = ProfileUse("h100-sxm5-80gb-8x", "inventory", None, {}, {}, {}, ("pool_h100",),
                        ("gpu-2",), error="thresholds.nccl: not a mapping")
    profiles = (_recorded(("gpu-1", "gpu-4")), broken)
    (pool,) = cost.capacity(df, {"pool_h100": cost.parse_inputs("pool_h100", INPUTS)},
                            profiles=profiles)
    assert (pool.gpus_declared, pool.gpus_accepted, pool.gpus_out) == (16, 8, 8)
    assert pool.notes == (
        "gpu-2: profile h100-sxm5-80gb-8x could not be loaded (thresholds.nccl: not a mapping), "
        "its GPUs not counted",
        "gpu-3: the run recorded no profile for it (profile h100-sxm5-80gb-8x in its rows), "
        "its GPUs not counted")
    (none,) = cost.capacity(df, {}, profiles=())  # a run without run.json: nothing is guessed
    assert none.gpus_declared == 0 and len(none.notes) == 4


def test_a_drift_run_between_two_failing_validation_runs_changes_no_streak(tmp_path: Path):
    """A drift run's performance rows pass on a node that validation keeps failing: the node
    stays out since its first failing validation run, and the GPU-hours lost count from
    there. Both ways a drift run is known: its layout (drift.json, as the drift code writes
    it) and run.json's run_kind."""
    root = tmp_path / "reports"
    perf = [CheckResult(run_id, _at(hours), "gpu-4", "pool_h100", "h100-sxm5-80gb-8x",
                        "nccl.allreduce", "busbw_gbps", 480.0, "GB/s", 470.0, 460.0,
                        Status.PASS, "ok", "", 1.0) for run_id, hours in (("d1", 1), ("d2", 2))]
    write_report(_rows("v0", 0, {"gpu-4": BAD}), root, "v0")
    # d1: a drift run as validate drift writes it (drift.json beside its results).
    meta = drift_report.RunMeta("d1", _at(1), _at(1), ExitCode.OK, ("gpu-4",),
                                ("performance",), None, {}, {})
    drift_report.write_run(root, meta, drift_report.findings_frame([], {}), perf[:1],
                           {"gpu-4": "pool_h100"}, 1.0)
    # d2: a run whose run.json says it is a drift run.
    info = runinfo.RunInfo("d2", None, "/inventory", None, "nccl.allreduce",
                           ("nccl.allreduce",), 1, (), "0", None, None, _at(2),
                           run_kind=runinfo.DRIFT)
    write_report(perf[1:], root, "d2", run_info=info)
    write_report(_rows("v3", 3, {"gpu-4": BAD}), root, "v3")
    assert [runinfo.run_kind(root / r) for r in ("v0", "d1", "d2", "v3")] == [
        "validation", "drift", "drift", "validation"]
    df = to_frame(_rows("now", 5, {"gpu-4": BAD}))
    (pool,) = cost.for_run(df, {}, root, root / "now", H100)
    (out,) = pool.out
    assert out.since == _at(0)  # not after d2: the drift runs did not accept the node
    assert out.gpu_hours_lost == pool.gpu_hours_lost == 5 * 8.0
    # validate history tells the kinds apart, and reads one kind when asked.
    series = history.node_series(root, "gpu-4", [("nccl.allreduce", "busbw_gbps")])
    assert list(zip(series["run_id"], series["run_kind"], strict=True)) == [
        ("d1", "drift"), ("d2", "drift")]
    assert history.node_series(root, "gpu-4", kinds=("validation",)).empty  # no figures
    text = io.StringIO()
    main(["history", str(root), "--node", "gpu-4", "--figure", "nccl_busbw_gbps",
          "--kind", "drift", "--format", "csv"], text, io.StringIO())
    assert text.getvalue().splitlines()[:3] == [
        "run_id,run_kind,time,value,status", f"d1,drift,{_at(1)},480.0,pass",
        f"d2,drift,{_at(2)},480.0,pass"]
