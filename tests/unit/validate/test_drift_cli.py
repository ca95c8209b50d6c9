"""`python -m validate drift` and `history` through the one main(): usage errors, run ids
outside --out refused, a node that refuses connections (a real closed port, through real
Ansible and paramiko), a reports root that survives a first drift run with no performance
rows, and the history views."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.kube_helpers import TEST_NET
from validate import cli
from validate.drift import report as drift_report
from validate.model import CheckResult, ExitCode, Status
from validate.report import write_report

# Inside this worktree's loopback range; nothing listens on this port.
DEAD = {"ansible_host": "127.0.16.250", "ansible_port": 9}


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_usage_errors(tmp_path: Path) -> None:
    rc, _, err = _main("drift", "-i", str(tmp_path), "--layers", "configuration,bogus")
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR and "unknown layer" in err
    rc, _, err = _main("drift", "-i", str(tmp_path / "nope"), "--out", str(tmp_path))
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR and "does not exist" in err
    rc, _, err = _main("history", str(tmp_path), "--node", "n1", "--figure", "busbw")
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR and "unknown figure" in err


@pytest.mark.parametrize("argv, message", [
    (("--layers", ","), "--layers: ',' names no layer"),
    (("--layers", " , "), "--layers: ' , ' names no layer"),
    (("--perf-checks", ","), "--perf-checks: ',' names no check"),
    (("--layers", "performance", "--perf-checks", ""), "compares nothing"),
    (("--limit", ","), "--limit: ',' names no host or group"),
    (("--limit", ""), "--limit: '' names no host or group"),
    (("--textfile", "/etc"), "--textfile: '/etc' is a directory"),
    (("--textfile", "/proc/gpuready.prom"), "--textfile: '/proc/gpuready.prom' is under /proc"),
    (("--textfile", "/proc/sys/gpuready/x.prom"), "is under /proc"),
    (("--textfile", "/sys/gpuready.prom"), "is under /sys"),
    (("--textfile", "/dev/null"), "'/dev/null' exists and is not a regular file"),
])
def test_nothing_to_compare_or_nowhere_to_write_stops_before_any_connection(
        tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    """A drift that would compare nothing exited 0 "no drift"; a --textfile that cannot be
    written failed after the whole drift (and moved latest-drift). Both are usage errors now,
    before the inventory is read: a real listener in the node's place counts connections."""
    listener = socket.socket()
    listener.bind((f"{TEST_NET}.251", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    inv = _dead_inventory(tmp_path, {"ansible_host": f"{TEST_NET}.251",
                                     "ansible_port": listener.getsockname()[1]})
    out = tmp_path / "reports"
    try:
        rc, stdout, stderr = _main("drift", "-i", str(inv), "--out", str(out), *argv)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR, stdout + stderr
    assert message in stderr and "Traceback" not in stderr, stderr
    assert not out.exists()


def test_a_textfile_in_a_directory_to_be_made_is_accepted_and_written(tmp_path: Path) -> None:
    inv = _dead_inventory(tmp_path)
    textfile = tmp_path / "collector" / "new" / "gpuready.prom"
    rc, stdout, stderr = _main("drift", "-i", str(inv), "--out", str(tmp_path / "reports"),
                               "--layers", "versions", "--timeout", "5", "--textfile",
                               str(textfile), "--accept-unknown-host-keys")
    assert rc == ExitCode.UNREACHABLE, stdout + stderr
    assert "gpuready_drift_run_status 3" in textfile.read_text()
    assert [p.name for p in textfile.parent.iterdir()] == ["gpuready.prom"]  # no probe left


def _dead_inventory(tmp_path: Path, host: dict[str, object] | None = None) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "children": {"pool_l40s_pcie": {"hosts": {"dead1": host or DEAD}}}}}}}))
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        "gpu_profile": "l40s-pcie-48gb-4x", "nvidia_driver_version": "550.90.07",
        "gpu_pool": {"accelerator": "l40s-48gb", "topology": "4gpu-pcie", "fabric": "ethernet",
                     "workload": "inference", "sharing": "time-slicing"},
        "ansible_ssh_common_args": "-o ConnectTimeout=5"}))
    return inv


@pytest.mark.parametrize("run_id", ["/abs/elsewhere", "../x", "a/b", "latest-drift", ".x"])
def test_run_ids_outside_out_are_refused_before_anything_runs(tmp_path: Path,
                                                              run_id: str) -> None:
    inv = _dead_inventory(tmp_path)
    out = tmp_path / "reports"
    out.mkdir()
    (out / "latest-drift").symlink_to("nowhere")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, stdout, stderr = _main("drift", "-i", str(inv), "--out", str(out), "--run-id", run_id)
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR, stdout + stderr
    assert ("invalid run id" in stderr or "exists; run ids are never reused" in stderr), stderr
    assert "check mode" not in stderr  # refused before any node was asked
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not Path("/abs").exists()


def test_unreachable_node_exits_3_and_stays_in_the_table(tmp_path: Path) -> None:
    inv = _dead_inventory(tmp_path)
    out = tmp_path / "reports"
    rc, stdout, stderr = _main("drift", "-i", str(inv), "--out", str(out), "--timeout", "5",
                               "--accept-unknown-host-keys")
    assert rc == ExitCode.UNREACHABLE, stdout + stderr
    run = Path(next(ln for ln in stdout.splitlines() if ln.startswith("report: "))[8:])
    table = pd.read_parquet(run / "drift.parquet")
    ssh = table[(table["node"] == "dead1") & (table["item"] == "ssh")]
    assert list(ssh["status"]) == ["unreachable"]
    # both sources saw it (probes over paramiko, check mode over OpenSSH): one finding
    assert "probe" in ssh["source"].iloc[0] and "check mode" in ssh["source"].iloc[0]
    assert "gpuready_drift_run_status 3" in (run / "metrics.prom").read_text()
    assert json.loads((run / "drift.json").read_text())["exit_code"] == 3
    info = json.loads((run / "run.json").read_text())
    assert (info["run_kind"], info["exit_code"]) == ("drift", 3)
    # The first run under this root measured nothing: its results still say their text
    # columns are text, so a later run with rows and the history views read the root.
    schema = pq.read_schema(run / "results.parquet")
    assert pq.read_table(run / "results.parquet").num_rows == 0
    assert schema.field("run_id").type == schema.field("node").type == pa.large_string()
    later = "20991231T000000Z-drift-0002"
    meta = drift_report.RunMeta(later, "2099-12-31T00:00:00+00:00", "2099-12-31T00:00:05+00:00",
                                ExitCode.OK, ("dead1",), ("performance",), None, {}, {})
    drift_report.write_run(out, meta, drift_report.findings_frame([], {}), [CheckResult(
        later, "t", "dead1", "pool_l40s_pcie", "l40s-pcie-48gb-4x", "nccl.allreduce",
        "busbw_gbps", 21.5, "GB/s", None, None, Status.PASS, "ok", "", 0.1)],
        {"dead1": "pool_l40s_pcie"}, 5.0)
    rc, stdout, stderr = _main("history", str(out), "--node", "dead1", "--figure",
                               "nccl_busbw_gbps")
    assert rc == ExitCode.OK, stderr
    assert later in stdout and "21.5" in stdout


def test_history_views(tmp_path: Path) -> None:
    for i, value in enumerate([100.0, 101.0, 99.0, 70.0]):
        run = f"2026010{i}T000000Z"
        write_report([CheckResult(run, "t", "n1", "p", "prof", "nccl.allreduce", "busbw_gbps",
                                  value, "GB/s", None, None, Status.PASS, "ok", "", 0.1)],
                     tmp_path, run)
    rc, out, _ = _main("history", str(tmp_path), "--node", "n1", "--figure", "nccl_busbw_gbps")
    assert rc == 0
    assert "baseline (median of last 3 passing runs before the latest): 100" in out
    assert "last change: 20260103T000000Z: 99 -> 70" in out
    rc, out, _ = _main("history", str(tmp_path), "--format", "json")
    fleet = json.loads(out)
    assert rc == 0 and fleet[0]["node"] == "n1" and fleet[0]["below"] is True
    rc, out, _ = _main("history", str(tmp_path), "--figure", "pcie_gen")
    assert rc == 0 and out == "(no rows)\n"
    rc, out, _ = _main("history", str(tmp_path), "--node", "n1", "--format", "csv")
    assert rc == 0 and out.startswith("node,pool,figure,") and "nccl_busbw_gbps" in out
