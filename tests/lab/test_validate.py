"""The validators on the lab (issue 4): the fault fleet, bootstrapped by the roles, then
validated over SSH. Every healthy host passes; every faulty host fails the right check with its
code; a hung tool is a timeout row while the others finish; a dead sshd is an unreachable row;
exit codes follow the table; a run writes nothing outside its scratch paths. Issue 31: a MIG
pool with one GPU out of MIG mode fails, the same node in its full-GPU pool passes only with
MIG off; a link_downed counter that grows between two runs fails the port."""

from __future__ import annotations

import io
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ansible_runner
import pandas as pd
import pytest
import yaml

from lab import clone, core
from lab.core import LabState
from lab.fleet import LabHost
from lab.hardware import set_mig_layout
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import DEBIAN12_CUDA, lab_apt_sources, lab_cli, running_lab, ssh
from validate import cli
from validate.ansible_ssh import runner_settings
from validate.model import ExitCode

# Lab settings for this run: a hung tool gives up quickly (the profiles allow real NCCL
# minutes); everything else is what inventory/lab sets.
TIMEOUT_S = 10
NCCL_TIMEOUT_S = 30  # inventory/lab/group_vars/all/validate.yml
# fault -> (check, code) the report must show on that host
EXPECTED = {
    "gpu-missing": ("gpu.count", "gpu.count.missing"),
    "ecc-uncorrectable": ("gpu.ecc", "gpu.ecc.uncorrectable"),
    "row-remap-pending": ("gpu.ecc", "gpu.ecc.remap_pending"),
    "pcie-degraded": ("gpu.pcie", "gpu.pcie.degraded"),
    "nvlink-down": ("gpu.nvlink", "gpu.nvlink.down"),
    "xid-79": ("gpu.xid", "gpu.xid.79"),
    "xid-48": ("gpu.xid", "gpu.xid.48"),
    "nccl-low-busbw": ("nccl.allreduce", "nccl.allreduce.low_busbw"),
    "nccl-wrong-results": ("nccl.allreduce", "nccl.allreduce.wrong_results"),
    "driver-not-loaded": ("gpu.driver", "gpu.driver.not_loaded"),
    "ib-port-down": ("fabric.ib", "fabric.ib.port_down"),
    "tool-hang": ("gpu.count", "tool.timeout"),
    "ssh-down": ("gpu.count", "host.unreachable"),
}
# fault -> (DCGM level, code, GPU) dcgm.diag / dcgm.diag_r2 must show on that host: the SIMULATED
# dcgmi (lab/sim/dcgmi.py) fails a deployment test at level 1 on a pending row remap, and its
# load tests from level 2 on a degraded PCIe link and a failing GPU memory.
DCGM_EXPECTED = {
    "row-remap-pending": (1, "dcgm.diag.row_remap_pending", 1),
    "pcie-degraded": (2, "dcgm.diag.pcie", 2),
    "gpu-memory-fail": (2, "dcgm.diag.memory", 0),
}
SCRATCH = "/var/tmp"  # the profiles' scratch and checkpoint path
# Volatile places a booted systemd host writes by itself; everything else must be unchanged.
TREE = ("find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run "
        "-o -path /var/log/journal -o -path /var/lib/systemd -o -path /root/.ansible "
        "-o -path /tmp \\) -prune -o -printf '%p %s %m %T@\\n' | sort")


# The hosts boot from the converged snapshots test_roles.py's converge made where there is one
# for their OS and pool (lab/snapshot.py: the H100 and L40S hosts on Debian 12). The others (the
# Debian 12 A100 hosts: test_roles converges its A100 host on Debian 13), and every host when
# the module runs alone, get what bootstrap leaves on a node (the packages of NVIDIA's debian12
# repository) straight from the lab repository: converging 16 hosts on a 2-core CI machine
# would take most of CI's time to prove nothing new about the validators. Apt runs on one host
# per hardware profile; the others of that profile get a copy of its disk (lab/clone.py, as
# test_drift.py does), with their own identity and simulated GPUs.
PROVISION = """
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq nvidia-driver-cuda=550.90.07-1 nvidia-kernel-dkms=550.90.07-1 \\
  nvidia-persistenced=550.90.07-1 nccl-tests=2.17.1-1 kubelet=1.37.2-1.1 containerd fio \\
  datacenter-gpu-manager=1:3.3.6 {extra} >/dev/null
systemctl enable --now nvidia-persistenced containerd nvidia-dcgm {units} >/dev/null 2>&1
systemctl enable kubelet >/dev/null 2>&1
"""


def _provision(paths: LabPaths, state: LabState) -> None:
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    def one(host: LabHost) -> tuple[str, int, str]:
        nvswitch = host.hw_profile in ("h100-sxm5-8x", "a100-sxm4-8x")
        extra = ("nvidia-fabricmanager-550=550.90.07-1 "
                 "infiniband-diags=2410mlnx54-1.2410068") if nvswitch else ""
        script = lab_apt_sources(state.repo_port, DEBIAN12_CUDA, "extras",
                                 "core:/stable:/v1.37/deb") + PROVISION.format(
            extra=extra, units="nvidia-fabricmanager" if nvswitch else "")
        proc = ssh(host.address, script, timeout=600)
        return host.name, proc.returncode, proc.stderr[-2000:]

    by_profile: dict[str, list[LabHost]] = {}
    for host in state.hosts:
        if host.name not in state.snapshots:
            by_profile.setdefault(host.hw_profile, []).append(host)
    if not by_profile:
        return
    sources = [group[0] for group in by_profile.values()]
    with ThreadPoolExecutor(max_workers=len(sources)) as pool:
        failed = [r for r in pool.map(one, sources) if r[1] != 0]
    assert not failed, failed
    for source, *targets in by_profile.values():
        clone.clone(paths, source.name, [t.name for t in targets])


def _ensure_fabric_manager(state: LabState) -> None:
    # A CI run once found fabric manager gone on one NVSwitch host by validation time (NCCL
    # then fails 'system not yet initialized'). Say so with its status and start it again, so
    # that this test is about the validators; the daemon's own behaviour is unit-tested.
    for host in state.hosts:
        if host.hw_profile not in ("h100-sxm5-8x", "a100-sxm4-8x"):
            continue
        check = ssh(host.address, "systemctl is-active nvidia-fabricmanager && "
                    "test -e /run/gpuready-lab/nv-fabricmanager.pid")
        if check.returncode != 0:
            status = ssh(host.address, "systemctl status nvidia-fabricmanager --no-pager; "
                         "tail -5 /var/log/fabricmanager.log")
            print(f"WARNING {host.name}: fabric manager not running after provisioning:\n"
                  f"{status.stdout}", file=sys.stderr)
            assert ssh(host.address, "systemctl restart nvidia-fabricmanager").returncode == 0


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[LabState]:
    """The fault fleet, provisioned healthy, then given its faults (a tool that hangs or a host
    that is down would only test the provisioning's failure handling here)."""
    paths = LabPaths.default()
    module_started = time.monotonic()
    request.addfinalizer(lambda: _report_wall_time(request, time.monotonic() - module_started))
    with running_lab(fleet="faults", converged=True) as state:
        faults = {h.name: h.faults for h in state.hosts}
        for name, host_faults in faults.items():
            if host_faults:
                core.set_faults(paths, name, [], [], clear=True)
        started = time.monotonic()
        _provision(paths, state)
        print(f"provisioned {len(state.hosts) - len(state.snapshots)} hosts in "
              f"{time.monotonic() - started:.0f} s ({len(state.snapshots)} booted converged)")
        for name, host_faults in faults.items():
            if host_faults:
                core.set_faults(paths, name, list(host_faults), [], clear=False)
        _ensure_fabric_manager(state)
        yield core.running_state(paths) or state


def _report_wall_time(request: pytest.FixtureRequest, seconds: float) -> None:
    # Shown even without -s: the runtime of this module is a CI budget item.
    summary = f"\ntest_validate: {seconds:.0f} s in all"
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(summary)
    else:
        print(summary)


def _validate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["run", "-i", str(LabPaths.default().inventory_dir),
                   "--timeout", str(TIMEOUT_S), *args], stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def _run_dir(stdout: str) -> Path:
    for line in stdout.splitlines():
        if line.startswith("report: "):
            return Path(line.removeprefix("report: "))
    raise AssertionError(f"no report line in {stdout!r}")


@pytest.fixture(scope="module")
def lab_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def full_run(fleet: LabState, lab_reports: Path) -> tuple[int, pd.DataFrame, float]:
    out = lab_reports
    started = time.monotonic()
    rc, stdout, _ = _validate("--out", str(out))
    elapsed = time.monotonic() - started
    results = pd.read_parquet(_run_dir(stdout) / "results.parquet")
    # a lab run says it is simulated where a person reads it
    assert "SIMULATED" in (_run_dir(stdout) / "summary.md").read_text()
    return rc, results, elapsed


def test_every_node_is_in_the_report(fleet: LabState,
                                     full_run: tuple[int, pd.DataFrame, float]) -> None:
    _, results, _ = full_run
    assert set(results["node"]) == {h.name for h in fleet.hosts}


def test_healthy_hosts_pass(fleet: LabState, full_run: tuple[int, pd.DataFrame, float]) -> None:
    _, results, _ = full_run
    for host in fleet.hosts:
        if host.faults:
            continue
        rows = results[results["node"] == host.name]
        bad = rows[~rows["status"].isin(["pass", "skip"])]
        assert bad.empty, bad[["check", "metric", "status", "code", "detail"]].to_string()


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_faulty_host_fails_the_right_check(fleet: LabState, fault: str,
                                           full_run: tuple[int, pd.DataFrame, float]) -> None:
    _, results, _ = full_run
    host = next(h for h in fleet.hosts if fault in h.faults)
    check, code = EXPECTED[fault]
    rows = results[(results["node"] == host.name) & (results["check"] == check)]
    assert code in set(rows["code"]), rows[["metric", "status", "code", "detail"]].to_string()
    assert set(rows[rows["code"] == code]["status"]) & {"fail", "error"}


def test_dcgm_level_1_passes_healthy_hosts_and_finds_the_pending_remap(
        fleet: LabState, full_run: tuple[int, pd.DataFrame, float]) -> None:
    _, results, _ = full_run
    dcgm = results[results["check"] == "dcgm.diag"]
    for host in fleet.hosts:
        if not host.faults:
            rows = dcgm[dcgm["node"] == host.name]
            assert list(rows["status"]) == ["pass"], rows.to_string()
    host = next(h for h in fleet.hosts if "row-remap-pending" in h.faults)
    rows = dcgm[dcgm["node"] == host.name]
    assert list(zip(rows["status"], rows["code"], rows["metric"], strict=True)) == [
        ("fail", "dcgm.diag.row_remap_pending", "gpu1/Page Retirement/Row Remap")]
    assert "row remappings are pending" in rows["detail"].iloc[0]
    # levels 2 and 3 are opt-in: a skip row each
    assert set(results[results["check"].isin(["dcgm.diag_r2", "dcgm.diag_r3"])]["status"]
               ) <= {"skip", "error"}


def test_dcgm_level_2_fails_the_right_gpu_with_the_right_code(fleet: LabState,
                                                                tmp_path: Path) -> None:
    faulty = {f: next(h for h in fleet.hosts if f in h.faults) for f in DCGM_EXPECTED}
    healthy = next(h for h in fleet.hosts if not h.faults and h.pool == "pool_h100_sxm")
    names = ",".join([healthy.name, *(h.name for h in faulty.values())])
    rc, stdout, stderr = _validate("--limit", names, "--checks", "dcgm.diag,dcgm.diag_r2",
                                   "--out", str(tmp_path))
    assert rc == ExitCode.CHECK_FAILED, stdout + stderr
    results = pd.read_parquet(_run_dir(stdout) / "results.parquet")
    ok = results[results["node"] == healthy.name]
    assert set(ok["status"]) == {"pass"}, ok.to_string()
    for fault, (level, code, gpu) in DCGM_EXPECTED.items():
        rows = results[results["node"] == faulty[fault].name]
        check = "dcgm.diag" if level == 1 else "dcgm.diag_r2"
        bad = rows[(rows["check"] == check) & (rows["status"] == "fail")]
        assert list(bad["code"]) == [code], rows[["check", "metric", "code"]].to_string()
        assert bad["metric"].iloc[0].startswith(f"gpu{gpu}/"), bad.to_string()
        assert f"GPU {gpu}" in bad["detail"].iloc[0]


def test_hung_tool_costs_one_timeout_per_tool(fleet: LabState,
                                             full_run: tuple[int, pd.DataFrame, float]) -> None:
    _, results, elapsed = full_run
    host = next(h for h in fleet.hosts if "tool-hang" in h.faults)
    timeouts = results[results["code"] == "tool.timeout"]
    assert set(timeouts["node"]) == {host.name}, "only the hung host times out"
    # each hung command is killed at its timeout: the run's, or NCCL's own (inventory/lab)
    for check, duration in zip(timeouts["check"], timeouts["duration_s"], strict=True):
        limit = NCCL_TIMEOUT_S if check == "nccl.allreduce" else TIMEOUT_S
        assert duration < limit + 5, (check, duration)
    # One timeout per tool: nvidia-smi once (-q -x; topo -m is not started), all_reduce_perf
    # once. Before issue 8, topo -m cost a second nvidia-smi timeout.
    waited = timeouts[timeouts["duration_s"] > 1]
    assert sorted(waited["detail"].str.split().str[0]) == ["all_reduce_perf", "nvidia-smi"]
    topo = timeouts[timeouts["check"] == "gpu.topology"]
    assert list(topo["detail"].str[:54]) == [
        "not started: nvidia-smi already timed out on this node"]
    hung_s = results[results["node"] == host.name].drop_duplicates("check")["duration_s"].sum()
    waits = ", ".join(f"{d.split()[0]} {s:.1f} s"
                      for d, s in zip(waited["detail"], waited["duration_s"], strict=True))
    print(f"\nfault fleet validated in {elapsed:.0f} s; the tool-hang host's checks took "
          f"{hung_s:.0f} s, of which waiting on hung tools {waited['duration_s'].sum():.0f} s "
          f"({waits})", file=sys.__stderr__)


def test_unreachable_host_and_exit_code(fleet: LabState,
                                        full_run: tuple[int, pd.DataFrame, float]) -> None:
    rc, results, _ = full_run
    host = next(h for h in fleet.hosts if "ssh-down" in h.faults)
    rows = results[results["node"] == host.name]
    assert set(rows["code"]) == {"host.unreachable"}
    assert rc == ExitCode.UNREACHABLE


def test_rerender_equals_the_run(full_run: tuple[int, pd.DataFrame, float], lab_reports: Path,
                                 tmp_path: Path) -> None:
    """`validate report` on the lab run's results and run.json renders every file again byte
    for byte, the SIMULATED environment label included."""
    _, results, _ = full_run
    run_dir = lab_reports / str(results["run_id"].iloc[0])
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    # The run's inputs (its rows, run.json, the capacity inputs the cost view renders from) and
    # its log, which rendering neither reads nor writes.
    kept = ("results.parquet", "results.csv", "run.json", "capacity_inputs.json", "run.log")
    for rendered in copy.iterdir():
        if rendered.name not in kept:
            rendered.unlink()
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["report", str(copy)], stdout=out, stderr=err) == ExitCode.UNREACHABLE
    assert err.getvalue() == ""
    names = sorted(f.name for f in run_dir.iterdir())
    assert names == sorted(f.name for f in copy.iterdir()) and "run.json" in names
    assert [n for n in names if (run_dir / n).read_bytes() != (copy / n).read_bytes()] == []
    assert "SIMULATED" in (copy / "summary.md").read_text()
    assert "SIMULATED" in (copy / "index.html").read_text()


def test_exit_codes_for_pass_and_fail(fleet: LabState, tmp_path: Path) -> None:
    healthy = ",".join(h.name for h in fleet.hosts if not h.faults)
    rc, stdout, stderr = _validate("--limit", healthy, "--out", str(tmp_path))
    assert rc == ExitCode.OK, stdout + stderr
    ecc = next(h.name for h in fleet.hosts if "ecc-uncorrectable" in h.faults)
    rc, stdout, stderr = _validate("--limit", ecc, "--checks", "gpu.*", "--out", str(tmp_path))
    assert rc == ExitCode.CHECK_FAILED, stdout + stderr
    rc, _, stderr = _validate("--checks", "gpu.nonsense", "--out", str(tmp_path))
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR
    assert "gpu.nonsense" in stderr


def test_run_writes_nothing_outside_its_scratch_paths(fleet: LabState, tmp_path: Path) -> None:
    host = next(h for h in fleet.hosts if not h.faults)
    before = ssh(host.address, TREE)
    assert before.returncode == 0, before.stderr
    rc, stdout, stderr = _validate("--limit", host.name, "--out", str(tmp_path))
    assert rc == ExitCode.OK, stdout + stderr
    after = ssh(host.address, TREE)
    changed = set(before.stdout.splitlines()) ^ set(after.stdout.splitlines())
    # The scratch directory itself gets a new mtime (a run directory was made and removed in
    # it); nothing in it or anywhere else may differ.
    changed = {line for line in changed if not line.startswith(f"{SCRATCH} ")}
    assert changed == set(), sorted(changed)[:20]


def test_validate_playbook_fails_with_the_run(fleet: LabState) -> None:
    """playbooks/validate.yml runs the same validators and fails when they do."""
    ecc = next(h.name for h in fleet.hosts if "ecc-uncorrectable" in h.faults)
    paths = LabPaths.default()
    (paths.run / "runner-validate-play").mkdir(parents=True, exist_ok=True)
    run = ansible_runner.run(
        private_data_dir=str(paths.run / "runner-validate-play"), project_dir=str(REPO_ROOT),
        playbook=str(REPO_ROOT / "playbooks" / "validate.yml"),
        inventory=str(paths.inventory_dir), quiet=True,
        **runner_settings(paths.inventory_dir, paths.run, envvars={
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
            extravars={"validate_limit": ecc, "validate_checks": "gpu.ecc",
                       "validate_out": str(paths.run / "reports-play")}))
    assert run.status == "failed"
    messages = [e["event_data"]["res"].get("msg", "") for e in run.events
                if e.get("event") == "runner_on_failed"]
    assert any("a check failed" in m for m in messages), (messages, run.stdout.read()[-3000:])
    assert lab_cli("status").returncode == 0


# ---------------------------------------------------------------------------- issue 31

H100_MIG_LAYOUT = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


def _mig_inventory(tmp_path: Path, host: str) -> Path:
    """The lab inventory with ``host`` moved from pool_h100_sxm into a MIG pool of the same
    hardware, as a site would declare one."""
    inv = tmp_path / "inventory-mig"
    shutil.copytree(LabPaths.default().inventory_dir, inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    pools = hosts["all"]["children"]["gpu_nodes"]["children"]
    pools["pool_h100_mig"] = {"hosts": {host: pools["pool_h100_sxm"]["hosts"].pop(host)}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    pool = yaml.safe_load((inv / "group_vars/pool_h100_sxm/pool.yml").read_text())
    pool["gpu_pool"]["sharing"] = "mig"
    pool["gpu_mig_layout"] = H100_MIG_LAYOUT
    (inv / "group_vars/pool_h100_mig").mkdir()
    (inv / "group_vars/pool_h100_mig/pool.yml").write_text(yaml.safe_dump(pool))
    return inv


def _run_checks(inventory: Path, host: str, checks: str, out: Path) -> tuple[int, pd.DataFrame]:
    stdout, stderr = io.StringIO(), io.StringIO()
    rc = cli.main(["run", "-i", str(inventory), "--timeout", str(TIMEOUT_S), "--limit", host,
                   "--checks", checks, "--out", str(out)], stdout=stdout, stderr=stderr)
    assert rc in (ExitCode.OK, ExitCode.CHECK_FAILED), stdout.getvalue() + stderr.getvalue()
    return rc, pd.read_parquet(_run_dir(stdout.getvalue()) / "results.parquet")


def _codes(rows: pd.DataFrame) -> set[tuple[str, str, str]]:
    return {(m, s, c) for m, s, c in zip(rows["metric"], rows["status"], rows["code"],
                                          strict=True)}


def test_mig_pool_as_declared(fleet: LabState, tmp_path: Path) -> None:
    paths = LabPaths.default()
    host = next(h.name for h in fleet.hosts if h.pool == "pool_h100_sxm" and not h.faults)
    hw = paths.host_dir(host) / "hw"
    mig_inventory = _mig_inventory(tmp_path, host)
    try:
        set_mig_layout(hw, H100_MIG_LAYOUT)
        rc, rows = _run_checks(mig_inventory, host, "gpu.mig", tmp_path / "r")
        assert rc == ExitCode.OK, rows[["metric", "status", "code", "detail"]].to_string()
        assert _codes(rows) == {("mig_mode", "pass", "ok"), ("mig_pending", "pass", "ok"),
                                ("mig_layout", "pass", "ok")}
        core.set_faults(paths, host, ["mig-gpu-off"], [], clear=False)
        rc, rows = _run_checks(mig_inventory, host, "gpu.mig", tmp_path / "r")
        assert rc == ExitCode.CHECK_FAILED
        mode = rows[rows["metric"] == "mig_mode"].iloc[0]
        assert (mode["status"], mode["code"], mode["value"]) == (
            "fail", "gpu.mig.mode_disabled", 1.0)
        assert mode["detail"].startswith("expected MIG enabled: GPU1(")
        # The same node in its full-GPU pool: MIG on fails, MIG off passes.
        rc, rows = _run_checks(paths.inventory_dir, host, "gpu.mig", tmp_path / "r")
        assert rc == ExitCode.CHECK_FAILED
        assert ("mig_mode", "fail", "gpu.mig.mode_enabled") in _codes(rows)
        core.set_faults(paths, host, [], ["mig-gpu-off"], clear=False)
        set_mig_layout(hw, None)
        rc, rows = _run_checks(paths.inventory_dir, host, "gpu.mig", tmp_path / "r")
        assert rc == ExitCode.OK
        assert _codes(rows) == {("mig_mode", "pass", "ok"), ("mig_pending", "pass", "ok")}
    finally:
        set_mig_layout(hw, None)
        core.set_faults(paths, host, [], ["mig-gpu-off"], clear=False)


def test_growing_link_downed_fails_the_port(fleet: LabState, tmp_path: Path) -> None:
    paths = LabPaths.default()
    host = next(h for h in fleet.hosts if h.pool == "pool_h100_sxm" and not h.faults)
    out = tmp_path / "r"
    try:
        rc, first = _run_checks(paths.inventory_dir, host.name, "fabric.ib_counters", out)
        assert rc == ExitCode.OK
        assert len(first) == 8 * 5 and set(first["status"]) == {"pass"}
        assert first["detail"].str.startswith("first reading").all()
        rc, second = _run_checks(paths.inventory_dir, host.name, "fabric.ib_counters", out)
        assert rc == ExitCode.OK and set(second["status"]) == {"pass"}
        assert second["detail"].str.startswith("no growth since the previous run").all()
        core.set_faults(paths, host.name, ["ib-link-flap"], [], clear=False)
        rc, third = _run_checks(paths.inventory_dir, host.name, "fabric.ib_counters", out)
        assert rc == ExitCode.CHECK_FAILED
        bad = third[third["status"] != "pass"]
        assert _codes(bad) == {
            ("mlx5_0/1/link_downed", "fail", "fabric.ib.link_downed_growing"),
            ("mlx5_0/1/link_error_recovery", "fail", "fabric.ib.link_error_recovery_growing"),
            ("mlx5_0/1/symbol_error", "fail", "fabric.ib.symbol_error_growing")}, \
            bad[["metric", "status", "code", "detail"]].to_string()
        assert bad[bad["metric"] == "mlx5_0/1/link_downed"]["detail"].iloc[0].startswith(
            "grew by 3 to 3 in ")
    finally:
        core.set_faults(paths, host.name, [], ["ib-link-flap"], clear=False)
