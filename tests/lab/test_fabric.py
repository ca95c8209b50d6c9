"""Multi-node fabric validation on the lab (issue 11): six hosts of one RDMA pool, one with a
marginal cable on one rail (ib-link-degraded). Pass 1 flags its pair, pass 2 confirms it
alone; mpirun really starts the peer's ranks over SSH with a per-run key, and the ranks really
exchange their rail state over MPI. No run key is left in any authorized_keys (read before and
after through the lab's back door, so a host whose sshd is down is read too), also when the run
is interrupted. A host without mpirun, an unreachable peer and a peer whose NCCL bootstrap hangs
each give an error row naming the pair within the pool's timeout, while the other pairs finish.

The hosts boot from the H100 host's converged snapshot that test_roles.py's converge made
(lab/snapshot.py); run alone, the module provisions them straight from the lab repository
instead: driver, fabric manager, nccl-tests (which brings Debian's Open MPI and mpi4py) and
ibstat.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from lab import clone, core
from lab import hosts as lab_hosts
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import DEBIAN12_CUDA, lab_apt_sources, running_lab, ssh
from validate import cli
from validate.model import ExitCode

POOL_TIMEOUT_S = 30  # inventory/lab/group_vars/all/validate.yml: gpu_thresholds.nccl_pair
# A hung pair is TERMed at the pool's timeout and KILLed 5 s later; allow for a loaded machine.
HUNG_PAIR_MAX_S = POOL_TIMEOUT_S + 5 + 10
HOSTS = [f"node{i}" for i in range(1, 7)]
# The packages bootstrap leaves on a fabric node (NVIDIA's debian12 repository and the site's),
# installed straight from the lab repository: the roles have their own converge tests. Apt runs
# on one host; the others get a copy of its disk.
PROVISION = """
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq nvidia-driver-cuda=550.90.07-1 nvidia-kernel-dkms=550.90.07-1 \\
  nvidia-persistenced=550.90.07-1 nvidia-fabricmanager-550=550.90.07-1 nccl-tests=2.17.1-1 \\
  infiniband-diags=2410mlnx54-1.2410068 >/dev/null
systemctl enable --now nvidia-persistenced nvidia-fabricmanager >/dev/null 2>&1
"""
READY = "test -x /usr/bin/mpirun && test -e /run/gpuready-lab/nv-fabricmanager.pid"
# What a run may leave behind on a host: its keys, its directories, its processes.
# (Anchored: the shell running this has the patterns in its own command line.)
LEFTOVERS = ("ls -d /tmp/gpuready-fabric.* 2>/dev/null; "
             "pgrep -a -f '^(mpirun|orted|all_reduce_perf)( |$)|^timeout -k' || true")


class FabricLab:
    def __init__(self, state: LabState, paths: LabPaths, reports: Path) -> None:
        self.state = state
        self.paths = paths
        self.reports = reports
        self.log: list[str] = []

    def host_exec(self, name: str, command: str) -> str:
        """A shell command inside a host, without its sshd (the lab's back door)."""
        proc = lab_hosts.host_exec(self.paths, name, ["sh", "-c", command])
        assert proc.returncode == 0, (name, command, proc.stderr)
        return proc.stdout

    def authorized_keys(self) -> dict[str, str]:
        return {h: self.host_exec(h, "cat /root/.ssh/authorized_keys") for h in HOSTS}

    def leftovers(self) -> dict[str, str]:
        found = {h: self.host_exec(h, LEFTOVERS).strip() for h in HOSTS}
        return {h: text for h, text in found.items() if text}

    def faults(self, name: str, *faults: str) -> None:
        """Exactly these faults on the host (runtime ones such as ssh-down applied)."""
        core.set_faults(self.paths, name, [], [], clear=True)
        if faults:
            core.set_faults(self.paths, name, list(faults), [], clear=False)

    def fabric(self, label: str, *args: str) -> tuple[int, pd.DataFrame, pd.DataFrame, str]:
        """`python -m validate fabric` in-process: exit code, result rows, pair runs, stderr."""
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        rc = cli.main(["fabric", "-i", str(self.paths.inventory_dir), "--out",
                       str(self.reports), "--run-id", label, *args], stdout=out, stderr=err)
        self.log.append(f"{label} {time.monotonic() - started:.0f} s")
        run_dir = self.reports / label
        return (rc, pd.read_parquet(run_dir / "results.parquet"),
                pd.read_csv(run_dir / "fabric_pairs.csv"), err.getvalue())


def _provision(paths: LabPaths, state: LabState) -> None:
    """Apt on node1, a copy of its disk on the others (lab/clone.py, as test_drift.py does)."""
    script = lab_apt_sources(state.repo_port, DEBIAN12_CUDA, "extras") + PROVISION
    proc = ssh(state.host(HOSTS[0]).address, script, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    clone.clone(paths, HOSTS[0], HOSTS[1:])


def _wait_ready(state: LabState) -> None:
    """Every host shows the tools and a running fabric manager."""
    deadline = time.monotonic() + 60
    waiting = list(HOSTS)
    while waiting and time.monotonic() < deadline:
        waiting = [h for h in waiting if ssh(state.host(h).address, READY).returncode != 0]
        if waiting:
            time.sleep(1)
    assert not waiting, f"not ready after provisioning: {waiting}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[FabricLab]:
    started = time.monotonic()
    paths = LabPaths.default()
    with running_lab(fleet="fabric", converged=True) as state:
        assert [h.name for h in state.hosts] == HOSTS
        the_lab = FabricLab(state, paths, tmp_path_factory.mktemp("reports"))
        provisioned = time.monotonic()
        if set(state.snapshots) != set(HOSTS):
            # Provision healthy: the degraded rail is a fault of the simulated hardware, put
            # back once the hosts are ready (as test_validate does with its faults).
            the_lab.faults("node4")
            _provision(paths, state)
            the_lab.faults("node4", "ib-link-degraded")
        _wait_ready(state)
        the_lab.log.append(f"boot {provisioned - started:.0f} s, "
                           + (f"booted from snapshot {state.snapshots['node1']}"
                              if state.snapshots else "provisioning")
                           + f" {time.monotonic() - provisioned:.0f} s")
        yield the_lab
    summary = f"test_fabric: {time.monotonic() - started:.0f} s in all ({'; '.join(the_lab.log)})"
    # Shown even without -s: the runtime of this module is a CI budget item.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{summary}")
    else:
        print(summary)


def _row(rows: pd.DataFrame, node: str) -> pd.Series:
    (found,) = [r for _, r in rows.iterrows() if r["node"] == node]
    return found


def test_degraded_rail_is_confirmed_on_its_host_only(lab: FabricLab) -> None:
    before = lab.authorized_keys()
    rc, rows, pairs, err = lab.fabric("degraded")
    assert rc == ExitCode.CHECK_FAILED, err
    first = pairs[pairs["pass"] == 1]
    assert sorted(zip(first["launcher"], first["peer"], first["status"], strict=True)) == [
        ("node1", "node2", "pass"), ("node3", "node4", "fail"), ("node5", "node6", "pass")]
    second = pairs[pairs["pass"] == 2]
    # Pass 2 pairs each suspect of the failing pair with a node that passed: two runs.
    assert sorted(second["peer"]) == ["node3", "node4"]
    assert set(second["launcher"]) <= {"node1", "node2", "node5", "node6"}
    assert dict(zip(second["peer"], second["status"], strict=True)) == {
        "node3": "pass", "node4": "fail"}
    assert list(rows["node"]) == HOSTS and set(rows["check"]) == {"fabric.nccl_pair"}
    verdicts = dict(zip(rows["node"], zip(rows["status"], rows["code"], strict=True),
                        strict=True))
    assert verdicts == {h: ("pass", "ok") for h in HOSTS if h != "node4"} | {
        "node4": ("fail", "fabric.nccl_pair.low_busbw")}
    node4 = _row(rows, "node4")
    # Half of the 2-node figure, with its peers named.
    assert 200 < node4["value"] < 280 and node4["fail"] == 400
    assert "node3-node4" in node4["detail"] and "confirmed" in node4["detail"]
    assert all(450 < _row(rows, h)["value"] < 520 for h in HOSTS if h != "node4")
    assert "cleared" in _row(rows, "node3")["detail"]
    # The per-run keys are gone, and nothing else changed in any authorized_keys.
    assert lab.authorized_keys() == before
    assert lab.leftovers() == {}
    # The capacity view counts node4's eight GPUs as out, with the pair's fault code.
    summary = (lab.reports / "degraded" / "summary.md").read_text()
    assert "| pool_h100_sxm | 6 | 48 | 40 | 8 |" in summary
    assert "| pool_h100_sxm | node4 | 8 |" in summary
    assert "fabric.nccl_pair.low_busbw" in summary.split("GPUs out:")[1]
    assert "SIMULATED" in summary


def test_missing_mpirun_and_unreachable_peer_are_error_rows(lab: FabricLab) -> None:
    # node3 launches its pass-1 pair but has no Open MPI; node6's sshd is stopped.
    lab.host_exec("node3", "dpkg --remove --force-depends openmpi-bin >/dev/null 2>&1; "
                           "! command -v mpirun")
    lab.faults("node6", "ssh-down")
    before = lab.authorized_keys()
    started = time.monotonic()
    rc, rows, pairs, err = lab.fabric("errors")
    took = time.monotonic() - started
    assert rc == ExitCode.UNREACHABLE, err
    node3, node6 = _row(rows, "node3"), _row(rows, "node6")
    assert (node3["status"], node3["code"]) == ("error", "tool.not_found")
    assert "pair node3-node4" in node3["detail"] and "mpirun" in node3["detail"]
    assert (node6["status"], node6["code"]) == ("error", "host.unreachable")
    assert "pair node5-node6" in node6["detail"]
    # Their partners are tested again with a node that passed: node5 is cleared, node4 (its
    # degraded rail) is confirmed; the healthy pair finished in pass 1.
    assert set(pairs[pairs["pass"] == 2]["peer"]) == {"node4", "node5"}
    assert (_row(rows, "node5")["status"], _row(rows, "node4")["status"]) == ("pass", "fail")
    assert {_row(rows, h)["status"] for h in ("node1", "node2")} == {"pass"}
    assert took < 2 * HUNG_PAIR_MAX_S
    assert lab.authorized_keys() == before and lab.leftovers() == {}
    # node4 has failed since the first run of this module: GPU-hours lost accrue.
    capacity = pd.read_csv(lab.reports / "errors" / "capacity.csv")
    assert capacity.loc[0, "gpus_out"] == 24 and capacity.loc[0, "gpu_hours_lost"] > 0


def test_peer_whose_bootstrap_hangs_is_an_error_within_the_pool_timeout(lab: FabricLab) -> None:
    lab.faults("node6", "tool-hang")
    before = lab.authorized_keys()
    rc, rows, pairs, err = lab.fabric("hang", "--limit", "node1,node2,node5,node6")
    assert rc == ExitCode.USAGE_OR_TOOL_ERROR, err
    node6 = _row(rows, "node6")
    assert (node6["status"], node6["code"]) == ("error", "tool.timeout")
    assert "pair node5-node6" in node6["detail"] and f"{POOL_TIMEOUT_S} s" in node6["detail"]
    hung = pairs[pairs["code"] == "tool.timeout"]
    assert len(hung) == 2 and all(hung["peer"] == "node6")  # pass 1, then with a good node
    assert all(hung["duration_s"] < HUNG_PAIR_MAX_S)
    assert {_row(rows, h)["status"] for h in ("node1", "node2", "node5")} == {"pass"}
    assert lab.authorized_keys() == before and lab.leftovers() == {}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_leaves_no_run_key(lab: FabricLab, sig: signal.Signals) -> None:
    lab.faults("node6", "tool-hang")  # a pair that holds its key until interrupted
    before = lab.authorized_keys()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "validate", "fabric", "-i", str(lab.paths.inventory_dir),
         "--limit", "node1,node2,node5,node6", "--out", str(lab.reports),
         "--run-id", f"interrupted-{sig.name}"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while "gpuready-fabric:" not in lab.host_exec("node6", "cat /root/.ssh/authorized_keys"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The same exit status as an interrupted `validate run`: a partial report, marked so.
    assert proc.returncode == ExitCode.INTERRUPTED, (out, err)
    assert "interrupted" in err and "report:" in out
    assert lab.authorized_keys() == before
    assert lab.leftovers() == {}
    rows = pd.read_parquet(lab.reports / f"interrupted-{sig.name}" / "results.parquet")
    assert set(rows["node"]) == {"node1", "node2", "node5", "node6"}  # no node lost
    assert "fabric.nccl_pair.interrupted" in set(rows["code"])
