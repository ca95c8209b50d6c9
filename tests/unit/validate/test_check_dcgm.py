"""dcgm.diag on REAL dcgmi captures served by a scripted transport: rows per failed test and
GPU with stable codes, no start while GPU processes run, levels 2 and 3 opt-in."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.unit.validate.test_checks_runner import ScriptedTransport, _node, _out
from validate import runner
from validate.checks import select
from validate.checks.dcgm import COMPUTE_APPS, diag_argv
from validate.model import Status

NO_APPS = ("timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, "
           "used_gpu_memory [MiB]\n")


def _capture(fixtures_dir: Path, rel: str) -> str:
    return (fixtures_dir / rel).read_text()


def _run(spec: str, answers: dict, **vars_: object) -> tuple[list, ScriptedTransport]:
    t = ScriptedTransport("n1", answers)
    rows = runner.run_node(_node(**vars_), select(spec), "r1", t)
    return rows, t


def test_level1_passes_on_the_real_all_pass_json(fixtures_dir: Path) -> None:
    diag = _capture(fixtures_dir, "dcgmi/diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt")
    rows, t = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS), diag_argv(1): _out(diag)})
    assert t.calls == [COMPUTE_APPS, diag_argv(1)]
    [row] = rows
    assert (row.status, row.code, row.value) == (Status.PASS, "ok", 17.0)
    assert "DCGM 3.1.0" in row.detail


def test_failures_become_rows_with_code_gpu_and_dcgm_message(fixtures_dir: Path) -> None:
    remap = _capture(fixtures_dir, "dcgmi/diag-deployment-error-row-remap-pending-gpu3-excerpt.txt")
    # dcgmi exits non-zero when a test fails; the output is judged all the same.
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS), diag_argv(1): _out(remap, 226)})
    [row] = rows
    assert (row.status, row.code, row.metric) == (Status.FAIL, "dcgm.diag.row_remap_pending",
                                                  "gpu3/Error")
    assert row.detail.endswith("GPU 3 has uncorrectable memory errors and row remappings are "
                               "pending")
    memory = _capture(fixtures_dir,
                      "dcgmi/diag-r2-gpu-memory-fail-gpu0-thermal-warning-excerpt.txt")
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS), diag_argv(1): _out(memory, 226)})
    [row] = rows
    assert (row.status, row.code, row.metric) == (Status.FAIL, "dcgm.diag.thermal_power",
                                                  "gpu0/GPU Memory")
    assert "Thermal violations totaling 13.3 seconds" in row.detail


def test_not_started_while_a_gpu_process_runs(fixtures_dir: Path) -> None:
    apps = _capture(fixtures_dir, "nvidia-smi-csv/h100-query-compute-apps-load.csv")
    rows, t = _run("dcgm.diag", {COMPUTE_APPS: _out(apps)})
    assert diag_argv(1) not in t.calls
    [row] = rows
    assert (row.status, row.code) == (Status.SKIP, "dcgm.diag.gpu_busy")
    assert "pid 11327 /root/tools/memhog on 00000000:00:09.0" in row.detail


def test_garbage_and_missing_tool_are_error_rows() -> None:
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS),
                                 diag_argv(1): _out("Error: unable to connect to host engine\n",
                                                    255)})
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "tool.exit_nonzero")]
    assert "unable to connect" in rows[0].detail
    # No dcgmi (exit 127) on a node whose inventory pins DCGM: an error naming the pin.
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS)}, nvidia_dcgm_version="3.3.6")
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "tool.not_found")]
    assert "nvidia_dcgm_version" in rows[0].detail
    # Where the inventory declares no DCGM, the node has none to run: a skip row saying so.
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS)})
    assert [(r.status, r.code) for r in rows] == [(Status.SKIP, "ok")]
    assert "DCGM is not installed" in rows[0].detail


def test_a_deployment_error_reported_as_runtime_error_is_the_nodes_fault() -> None:
    doc = ('{"DCGM GPU Diagnostic": {"version": "3.3.6", "runtime_error": '
           '"GPU 3 has uncorrectable memory errors and row remappings are pending"}}')
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS), diag_argv(1): _out(doc, 226)})
    assert [(r.status, r.code, r.metric) for r in rows] == [
        (Status.FAIL, "dcgm.diag.row_remap_pending", "gpu3/Error")]
    other = '{"DCGM GPU Diagnostic": {"version": "3.3.6", "runtime_error": "no GPUs found"}}'
    rows, _ = _run("dcgm.diag", {COMPUTE_APPS: _out(NO_APPS), diag_argv(1): _out(other, 226)})
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "tool.exit_nonzero")]


@pytest.mark.parametrize(("spec", "vars_", "runs"), [
    ("dcgm.diag*", {}, [1]),                                   # a pattern: opt-in levels skip
    ("dcgm.diag_r3", {}, [3]),                                 # named exactly: it runs
    ("dcgm.diag*", {"gpu_thresholds": {"dcgm": {"levels": [1, 2]}}}, [1, 2]),  # the profile's
])
def test_levels_2_and_3_are_opt_in(fixtures_dir: Path, spec: str, vars_: dict,
                                   runs: list[int]) -> None:
    diag = _capture(fixtures_dir, "dcgmi/diag-r2-p4de-8x-a100-80gb-dcgm3.3.3-pass.txt")
    answers = {COMPUTE_APPS: _out(NO_APPS), **{diag_argv(n): _out(diag) for n in (1, 2, 3)}}
    rows, t = _run(spec, answers, **vars_)
    assert [c for c in t.calls if c[0] == "dcgmi"] == [diag_argv(n) for n in runs]
    ran = {"dcgm.diag" if n == 1 else f"dcgm.diag_r{n}" for n in runs}
    skipped = {r.check for r in rows if r.status is Status.SKIP}
    assert skipped == {c.id for c in select(spec)} - ran
    assert all("opt-in" in r.detail for r in rows if r.status is Status.SKIP)


class _Timed(ScriptedTransport):
    """Two commands at once (as SSHTransport), each taking ``delay_s``: a round trip."""

    concurrent_runs = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.spans: dict[str, tuple[float, float]] = {}

    def run(self, argv, timeout):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        try:
            return super().run(argv, timeout)
        finally:
            self.spans[" ".join(argv[:2])] = (start, time.monotonic())


def test_level_1_costs_one_round_trip_beside_the_gpu_checks(fixtures_dir: Path) -> None:
    """The GPU-process query runs beside nvidia-smi -q -x (prefetched when the node starts);
    only dcgmi itself adds a round trip to the node's gpu.* checks."""
    xml = (fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()
    diag = _capture(fixtures_dir, "dcgmi/diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt")
    answers = {("nvidia-smi", "-q", "-x"): _out(xml), COMPUTE_APPS: _out(NO_APPS),
               diag_argv(1): _out(diag)}
    delay = 0.4
    walls = {}
    for spec in ("gpu.count,gpu.model", "gpu.count,gpu.model,dcgm.diag"):
        t = _Timed("n1", answers, delay_s=delay)
        started = time.monotonic()
        rows = runner.run_node(_node(), select(spec), "r1", t)
        walls[spec] = time.monotonic() - started
        assert all(r.status is not Status.ERROR for r in rows), rows
    smi, apps = t.spans["nvidia-smi -q"], t.spans["nvidia-smi " + COMPUTE_APPS[1]]
    assert apps[0] < smi[1] and smi[0] < apps[1], "the query ran beside nvidia-smi -q -x"
    extra = walls["gpu.count,gpu.model,dcgm.diag"] - walls["gpu.count,gpu.model"]
    assert 0.5 * delay < extra < 1.5 * delay, walls
