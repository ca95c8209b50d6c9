"""Scheduled drift checks on the lab (issue 10, "Done when").

One 8-host lab of the cheapest pool (4x L40S PCIe: no fabric manager, no InfiniBand) serves the
module, and the tests run in file order on it:

1. The eight hosts boot from the L40S host's converged snapshot that test_roles.py's converge
   made (lab/snapshot.py: a converge costs the control node's Ansible work per host; a
   converged disk costs seconds); run alone, the module converges node1 by the bootstrap roles
   and copies its disk to node2-8 (lab/clone.py). Either way the first drift run's check mode
   over all eight proves every host converged;
   the lab is validated (`python -m validate run`), which starts the performance history.
2. Drift runs twice on the clean lab: nothing drifted (no false positives). This fleet has no
   Kubernetes API: the first run (every layer) says the labels layer was not compared and
   exits 2 (incomplete); the second leaves the layer out with --layers and exits 0.
3. One drift case per host is injected, then drift runs once more; every host's package list,
   files under /etc and unit states are compared before and after that run (a drift run
   changes nothing, not even on drifted hosts). Each host reports exactly its case.
4. Trust and bounds, with the lab's real sshd: drift on an inventory whose known_hosts names
   another host's key for node2 (an impostor) and none for node3, plus a silent SSH peer
   (tests/hostile_ssh.py: takes commands, never answers). node2 and node3 are unreachable
   with their keys named and no login reached their sshd; no known_hosts file is written; the
   silent peer is given up within the documented deadline; node1's finding is intact.
5. The drift_schedule role converges on node8 as a management host.

(The labels layer against a cluster: tests/lab/test_cluster.py.)
"""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ansible_runner
import pandas as pd
import paramiko
import pytest
import yaml

from lab import clone, core
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.hostile_ssh import Endpoint, HostileSSHServer
from tests.lab.conftest import lab_cli, print_past_capture, running_lab, ssh
from validate import cli
from validate.ansible_ssh import runner_settings
from validate.model import ExitCode

HOSTS = tuple(f"node{i}" for i in range(1, 9))
# This fleet has no Kubernetes API: runs that are to be complete leave the labels layer out.
NO_LABELS = ("--layers", "configuration,versions,runtime,performance")
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
SYSCTL = "/etc/sysctl.d/90-gpuready.conf"
# The driver packages the nvidia_driver role installs at their exact version and holds on
# Debian 12 (roles/nvidia_driver/vars/Debian-12.yml).
DRIVER = ("nvidia-kernel-dkms", "nvidia-driver-cuda", "nvidia-smi", "libnvidia-ml1", "libcuda1",
          "nvidia-persistenced")
OLD_DRIVER = "550.54.15-1"  # the older release NVIDIA's debian12 repository carries
# host -> shell command (over SSH) or lab fault that injects its case
INJECT: dict[str, str] = {
    "node1": f"sed -i '0,/SystemdCgroup = true/s//SystemdCgroup = false/' {DROPIN}",
    "node2": "apt-mark unhold nvidia-driver-cuda",
    "node3": f"echo 'vm.swappiness = 10' >> {SYSCTL}",
    "node4": "systemctl stop nvidia-persistenced",
    # Someone installs another driver release by hand (every installed package built from the
    # driver's source, which depend on each other at the exact version) and holds it again:
    # the library changes, the loaded kernel module stays until a reboot.
    "node5": ("set -e; pkgs=$(dpkg-query -W -f='${Package} ${source:Package}\\n' "
              "| awk '$2 == \"nvidia-graphics-drivers\" {print $1}'); "
              "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades "
              "--allow-change-held-packages "
              f"$(for p in $pkgs nvidia-persistenced; do echo $p={OLD_DRIVER}; done) "
              f">/dev/null; apt-mark hold {' '.join(DRIVER)} >/dev/null"),
}
FAULTS = {"node6": "pcie-degraded", "node7": "nccl-busbw-drop", "node8": "gpu-busy"}
# host -> the (layer, item) findings of status drift the injected run must show, exactly
EXPECTED: dict[str, set[tuple[str, str]]] = {
    "node1": {("configuration", DROPIN)},
    "node2": {("versions", "hold nvidia-driver-cuda")},
    "node3": {("configuration", SYSCTL)},
    "node4": {("runtime", "service nvidia-persistenced.service"),
              ("runtime", "persistence mode")},
    "node5": {("versions", "driver library"), ("versions", "driver module/library"),
              *{("versions", f"package {p}") for p in DRIVER}},
    "node6": {("performance", "gpu.pcie pcie_width"), ("performance", "gpu.pcie pcie_gen")},
    "node7": {("performance", "nccl.allreduce busbw_gbps")},
    "node8": set(),
}
# What a drift run must not change: packages and selections, every file under /etc, the unit
# files and the units' states (login sessions come and go with the SSH probes themselves; the
# kubelet of a host that has not joined restarts every 10 s until kubeadm join configures it,
# as on any node, so its run state is its own and only its unit file's state is compared).
SNAPSHOT = (
    "dpkg-query --show --showformat='${Package} ${Version} ${Status}\\n'; echo ==; "
    "find /etc -xdev \\( -type f -o -type l \\) -printf '%p %s %m %u %g %T@\\n' | sort; "
    "echo ==; systemctl list-unit-files --no-legend --no-pager; echo ==; "
    "systemctl list-units --all --no-legend --no-pager --plain "
    "--type=service,socket,timer,mount,path "
    "| grep -v -e '^session-' -e '^user' -e '^kubelet\\.service ' | sort"
)


@dataclass
class DriftLab:
    state: LabState
    paths: LabPaths
    reports: Path
    artifacts: Path
    log: list[str]

    def address(self, name: str) -> str:
        return self.state.host(name).address


@dataclass(frozen=True)
class DriftRun:
    rc: int
    stdout: str
    stderr: str
    run_dir: Path
    table: pd.DataFrame

    def drifted(self, node: str) -> set[tuple[str, str]]:
        t = self.table
        rows = t[(t["node"] == node) & (t["status"] == "drift")]
        return set(zip(rows["layer"], rows["item"], strict=True))


def _playbook(lab: DriftLab, playbook: Path, inventory: Path, label: str,
              limit: str | None = None, cmdline: str | None = None) -> ansible_runner.Runner:
    private = lab.artifacts / label.replace(" ", "-")
    private.mkdir(parents=True)
    started = time.monotonic()
    run = ansible_runner.run(
        private_data_dir=str(private), project_dir=str(REPO_ROOT), playbook=str(playbook),
        inventory=str(inventory), limit=limit, cmdline=cmdline, quiet=True,
        # Host keys verified as the validators verify them (validate/ansible_ssh.py).
        **runner_settings(inventory, private, envvars={
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}))
    lab.log.append(f"{label}: {time.monotonic() - started:.0f} s")
    return run


def _drift(lab: DriftLab, label: str, *extra: str) -> DriftRun:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    rc = cli.main(["drift", "-i", str(lab.paths.inventory_dir), "--out", str(lab.reports),
                   "--timeout", "30", *extra], stdout=out, stderr=err)
    lab.log.append(f"{label}: {time.monotonic() - started:.0f} s")
    run_dir = next(Path(line.removeprefix("report: ")) for line in out.getvalue().splitlines()
                   if line.startswith("report: "))
    table = pd.read_parquet(run_dir / "drift.parquet")
    return DriftRun(rc, out.getvalue(), err.getvalue(), run_dir, table)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[DriftLab]:
    started = time.monotonic()
    paths = LabPaths.default()
    log: list[str] = []
    with running_lab(fleet="drift", converged=True) as state:
        assert [h.name for h in state.hosts] == list(HOSTS)
        assert {h.pool for h in state.hosts} == {"pool_l40s_pcie"}
        the_lab = DriftLab(state, paths, tmp_path_factory.mktemp("reports"),
                           tmp_path_factory.mktemp("runner"), log)
        if set(state.snapshots) == set(HOSTS):
            log.append(f"booted from converged snapshot {state.snapshots['node1']}")
        else:  # no snapshot in this run (the module alone): converge one host, copy it
            run = _playbook(the_lab, REPO_ROOT / "playbooks" / "bootstrap.yml",
                            paths.inventory_dir, "converge node1", limit="node1")
            assert run.rc == 0, run.stats
            t = time.monotonic()
            clone.clone(paths, "node1", list(HOSTS[1:]))
            log.append(f"clone to node2-8: {time.monotonic() - t:.0f} s")
        out, err = io.StringIO(), io.StringIO()
        t = time.monotonic()
        rc = cli.main(["run", "-i", str(paths.inventory_dir), "--out", str(the_lab.reports),
                       "--timeout", "30"], stdout=out, stderr=err)
        log.append(f"validate: {time.monotonic() - t:.0f} s")
        assert rc == ExitCode.OK, out.getvalue() + err.getvalue()[-3000:]
        yield the_lab
    print_past_capture(request, f"test_drift: {time.monotonic() - started:.0f} s in all "
                                f"({'; '.join(log)})")


@pytest.fixture(scope="module")
def clean_runs(lab: DriftLab) -> list[DriftRun]:
    no_api = lab.artifacts / "no-such-kubeconfig"
    return [_drift(lab, "clean drift 1", "--kubeconfig", str(no_api)),
            _drift(lab, "clean drift 2", *NO_LABELS)]


def test_clean_lab_reports_nothing_twice(lab: DriftLab, clean_runs: list[DriftRun]) -> None:
    for run in clean_runs:
        assert run.table[run.table["status"] == "drift"].empty
        assert "SIMULATED" in (run.run_dir / "summary.md").read_text()
    first, second = clean_runs
    # Every layer asked: the labels layer could not be, and the run says so and is incomplete.
    assert first.rc == ExitCode.USAGE_OR_TOOL_ERROR, first.stderr[-3000:]
    assert set(first.table["status"]) <= {"skipped", "unavailable"}
    labels = first.table[first.table["layer"] == "labels"]
    assert set(labels["node"]) == set(HOSTS) and set(labels["status"]) == {"unavailable"}
    assert "cannot load the kubeconfig" in labels["detail"].iloc[0]
    assert "NOT COMPARED labels and taints: cannot load the kubeconfig" in first.stdout
    assert ('gpuready_drift_layer_checked{node="node1",pool="pool_l40s_pcie",layer="labels"} 0'
            in (first.run_dir / "metrics.prom").read_text())
    # The labels layer left out: complete, clean.
    assert second.rc == ExitCode.OK, second.table[second.table["status"] != "skipped"]
    assert set(second.table["status"]) <= {"skipped"}
    assert "NOT COMPARED" not in second.stdout
    # The figures of the clean runs are the history the injected run is judged against.
    assert (clean_runs[1].run_dir / "results.parquet").exists()


def _snapshot(lab: DriftLab) -> dict[str, str]:
    out = {}
    for name in HOSTS:
        proc = ssh(lab.address(name), SNAPSHOT, timeout=120)
        assert proc.returncode == 0, proc.stderr
        # systemctl pads its columns to the widest value of the moment: one unit passing through
        # "activating" while either snapshot is taken widens every line of the other.
        out[name] = "\n".join(" ".join(line.split()) for line in proc.stdout.splitlines())
    return out


@pytest.fixture(scope="module")
def injected(lab: DriftLab, clean_runs: list[DriftRun]
             ) -> tuple[DriftRun, dict[str, str], dict[str, str], Path]:
    del clean_runs  # ordering only
    for name, command in INJECT.items():
        proc = ssh(lab.address(name), command, timeout=300)
        assert proc.returncode == 0, (name, proc.stderr)
    for name, fault in FAULTS.items():
        proc = lab_cli("fault", name, fault)
        assert proc.returncode == 0, proc.stderr
    before = _snapshot(lab)
    textfile = lab.artifacts / "textfile" / "gpuready_drift.prom"
    run = _drift(lab, "injected drift", "--textfile", str(textfile), *NO_LABELS)
    after = _snapshot(lab)
    return run, before, after, textfile


def test_injected_run_exits_with_drift(injected: tuple[DriftRun, dict[str, str],
                                                         dict[str, str], Path]) -> None:
    run = injected[0]
    assert run.rc == ExitCode.CHECK_FAILED, run.stderr[-3000:]
    assert not set(run.table["status"]) & {"error", "unreachable"}, \
        run.table[run.table["status"].isin(["error", "unreachable"])].to_string()


@pytest.mark.parametrize("host", HOSTS)
def test_each_case_is_reported_with_its_layer_and_item_and_nothing_else(
        host: str, injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    run = injected[0]
    mine = run.table[run.table["node"] == host]
    assert run.drifted(host) == EXPECTED[host], mine.drop(columns=["detail"]).to_string()
    started = json.loads((run.run_dir / "drift.json").read_text())["started"]
    assert set(mine.loc[mine["status"] == "drift", "since"]) <= {started}  # new in this run


def test_drift_details_name_what_differs(
        injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    t = injected[0].table.set_index(["node", "item"])
    dropin = t.loc[("node1", DROPIN)]
    # The diff: '-' what is on the node, '+' what the role declares.
    assert "-        SystemdCgroup = false" in dropin["detail"]
    assert "+        SystemdCgroup = true" in dropin["detail"]
    assert "-vm.swappiness = 10" in t.loc[("node3", SYSCTL)]["detail"]
    hold = t.loc[("node2", "hold nvidia-driver-cuda")]
    assert (hold["declared"], hold["actual"]) == ("hold", "install")
    lib = t.loc[("node5", "driver library")]
    assert (lib["declared"], lib["actual"]) == ("550.90.07", "550.54.15")
    assert "Driver/library version mismatch" in t.loc[("node5", "driver module/library")]["detail"]
    pkg = t.loc[("node5", "package nvidia-smi")]
    assert (pkg["declared"], pkg["actual"]) == ("550.90.07-1", OLD_DRIVER)
    width = t.loc[("node6", "gpu.pcie pcie_width")]
    assert width["actual"] == "8 lanes" and "baseline 16" in width["declared"]
    busbw = t.loc[("node7", "nccl.allreduce busbw_gbps")]
    assert "below the median" in busbw["detail"]


def test_busy_node_skips_heavy_tests_with_the_reason(
        injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    run = injected[0]
    t = run.table
    skipped = t[(t["node"] == "node8") & (t["status"] == "skipped")]
    assert {"nccl.allreduce", "storage.fio"} <= set(skipped["item"])
    for reason in skipped[skipped["item"].isin(["nccl.allreduce", "storage.fio"])]["detail"]:
        assert "GPU work in progress" in reason and "gpuready-lab-gpu-job" in reason
    rows = pd.read_parquet(run.run_dir / "results.parquet")
    mine = rows[rows["node"] == "node8"]
    heavy = mine[mine["check"].isin(["nccl.allreduce", "storage.fio"])]
    assert set(heavy["status"]) == {"skip"} and set(heavy["code"]) == {"drift.gpu_busy"}
    # The light check still ran and passed.
    assert set(mine.loc[mine["check"] == "gpu.pcie", "status"]) == {"pass"}


def test_a_drift_run_changes_nothing_on_any_host(
        injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    _, before, after, _ = injected
    for host in HOSTS:
        diff = set(before[host].splitlines()) ^ set(after[host].splitlines())
        assert diff == set(), (host, sorted(diff)[:20])


def test_prometheus_textfile(injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]
                             ) -> None:
    run, _, _, textfile = injected
    text = textfile.read_text()
    assert text == (run.run_dir / "metrics.prom").read_text()
    assert ('gpuready_drift_items{node="node1",pool="pool_l40s_pcie",layer="configuration"} 1'
            in text)
    versions = len(EXPECTED["node5"])  # every held driver package, library, module/library
    assert (f'gpuready_drift_items{{node="node5",pool="pool_l40s_pcie",layer="versions"}} '
            f'{versions}' in text)
    assert ('gpuready_drift_items{node="node8",pool="pool_l40s_pcie",layer="performance"} 0'
            in text)
    assert 'layer="labels"' not in text  # left out of this run: not measured, not zero
    assert "gpuready_drift_run_status 1" in text
    assert "gpuready_drift_last_run_timestamp_seconds " in text


def test_history_shows_the_drop_and_its_baseline(
        lab: DriftLab, injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    run = injected[0]
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["history", str(lab.reports), "--node", "node7", "--figure",
                   "nccl_busbw_gbps"], stdout=out, stderr=err)
    assert rc == ExitCode.OK, err.getvalue()
    text = out.getvalue()
    # validate + two clean drift runs + the injected one
    assert text.count("drift") >= 3 and f"last change: {run.run_dir.name}" in text
    below: set[tuple[str, str]] = set()
    # The fleet view per figure; fio is left out: the lab's shared disk swings by more than
    # the default margin (drift itself applies the lab inventory's wider fio margin).
    for figure in ("nccl_busbw_gbps", "pcie_width_lanes", "pcie_gen"):
        out = io.StringIO()
        assert cli.main(["history", str(lab.reports), "--figure", figure, "--format", "csv"],
                        stdout=out) == 0
        fleet = pd.read_csv(io.StringIO(out.getvalue()))
        assert set(fleet["node"]) == set(HOSTS)
        below |= set(zip(fleet.loc[fleet["below"], "node"], fleet.loc[fleet["below"], "figure"],
                         strict=True))
    assert below == {("node6", "pcie_width_lanes"), ("node6", "pcie_gen"),
                     ("node7", "nccl_busbw_gbps")}


def test_drift_playbook_runs_the_same_check(
        lab: DriftLab, injected: tuple[DriftRun, dict[str, str], dict[str, str], Path]) -> None:
    """playbooks/drift.yml fails with drift's exit code (the PCIe figure of node6 only, against
    the module's history: no check mode, so it is quick)."""
    del injected  # ordering only
    private = lab.artifacts / "drift-play"
    private.mkdir()
    run = ansible_runner.run(
        private_data_dir=str(private), project_dir=str(REPO_ROOT),
        playbook=str(REPO_ROOT / "playbooks" / "drift.yml"),
        inventory=str(lab.paths.inventory_dir), quiet=True,
        **runner_settings(lab.paths.inventory_dir, private, envvars={
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
            extravars={"drift_limit": "node6", "drift_out": str(lab.reports.parent / "play"),
                       "drift_extra_args": ["--layers", "performance", "--perf-checks",
                                            "gpu.pcie", "--history", str(lab.reports)]}))
    assert run.status == "failed"
    messages = [e["event_data"]["res"].get("msg", "") for e in run.events
                if e.get("event") == "runner_on_failed"]
    assert any("drift found" in m for m in messages), messages


def _journal_logins(lab: DriftLab, host: str, since: float, until: float) -> str:
    proc = ssh(lab.address(host), f"journalctl -u ssh --no-pager -o cat --since @{since:.0f} "
                                  f"--until @{until:.0f}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_unknown_and_impostor_keys_and_a_silent_node(
        lab: DriftLab, injected: tuple[DriftRun, dict[str, str], dict[str, str], Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host keys and the silent-node bound, on the lab's real sshd (module docstring, 4)."""
    injected_run = injected[0]
    key = paramiko.Ed25519Key.from_private_key_file(str(lab.paths.ssh_key))
    silent = Endpoint(name="silent1", address="127.0.21.240", behaviour="slow",
                      delay_s=1e6)
    known_lab = lab.paths.known_hosts.read_text()
    by_address: dict[str, list[str]] = {}
    for line in known_lab.splitlines():
        if line.strip():
            by_address.setdefault(line.split()[0], []).append(line.split(None, 1)[1])
    n1, n2 = lab.address("node1"), lab.address("node2")
    with HostileSSHServer([silent], key) as server:
        assert silent.host_key is not None
        known = tmp_path / "known_hosts"
        known.write_text("".join(
            [f"{n1} {k}\n" for k in by_address[n1]]
            + [f"{n2} {k}\n" for k in by_address[n1]]  # node1's key named for node2
            # node3: not listed at all
            + [f"[{silent.address}]:{silent.port} {silent.host_key.get_name()} "
               f"{silent.host_key.get_base64()}\n"]))
        inv = tmp_path / "inventory"
        shutil.copytree(lab.paths.inventory_dir / "group_vars", inv / "group_vars")
        hosts = yaml.safe_load((lab.paths.inventory_dir / "hosts.yml").read_text())
        hosts["all"]["vars"].update({
            "gpuready_ssh_known_hosts": str(known),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known}"})
        pool = hosts["all"]["children"]["gpu_nodes"]["children"]["pool_l40s_pcie"]["hosts"]
        pool["silent1"] = {"ansible_host": silent.address, "ansible_port": silent.port}
        (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
        # A short HOME (Ansible's ControlPath must fit a socket address); OpenSSH itself
        # reads the account's home from the password database.
        home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
        account = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"
        account_before = account.read_bytes() if account.exists() else None
        monkeypatch.setenv("HOME", str(home))
        task_timeout = 30
        started = time.time()
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        try:
            rc = cli.main(["drift", "-i", str(inv), "--out", str(lab.reports.parent / "trust"),
                           "--limit", "node1,node2,node3,silent1", "--timeout", "10",
                           "--check-task-timeout", str(task_timeout),
                           "--layers", "configuration,versions,runtime"],
                          stdout=out, stderr=err)
            took = time.monotonic() - t0
            assert not (home / ".ssh").exists()
        finally:
            shutil.rmtree(home)
        ended = time.time() + 1
        time.sleep(1.5)
        silent_events = server.events("silent1")
    lab.log.append(f"trust drift: {took:.0f} s")
    assert rc == ExitCode.UNREACHABLE, err.getvalue()[-3000:]
    run_dir = Path(next(line[8:] for line in out.getvalue().splitlines()
                        if line.startswith("report: ")))
    table = pd.read_parquet(run_dir / "drift.parquet").set_index(["node", "item"])
    # Refused with the key named, and no login reached either sshd (a connection that ended
    # before authentication is all they saw).
    assert table.loc[("node2", "ssh"), "actual"] == "host.hostkey_rejected"
    assert "host key mismatch: got SHA256:" in table.loc[("node2", "ssh"), "detail"]
    assert table.loc[("node3", "ssh"), "actual"] == "host.hostkey_rejected"
    assert "unknown" in table.loc[("node3", "ssh"), "detail"]
    assert "host key SHA256:" in table.loc[("node3", "ssh"), "detail"]
    for host in ("node2", "node3"):
        assert table.loc[(host, "ssh"), "status"] == "unreachable"
        assert "check mode" in table.loc[(host, "ssh"), "source"]
        logins = _journal_logins(lab, host, started - 1, ended)
        assert "Accepted publickey" not in logins, logins
        assert "preauth" in logins, logins  # drift did try, and was stopped before login
    assert (account.read_bytes() if account.exists() else None) == account_before
    assert lab.paths.known_hosts.read_text() == known_lab
    # The silent peer: error rows, given up within its deadline; node1's finding intact.
    assert table.loc[("silent1", "check mode"), "status"] == "error"
    assert table.loc[("silent1", "ssh"), "actual"] == "host.unresponsive"
    assert len([e for e in silent_events if e["event"] == "connect"]) == len(
        [e for e in silent_events if e["event"] == "disconnect"])
    node1 = table.loc["node1"]
    assert set(zip(node1["layer"], node1.index, node1["status"], strict=True)) == {
        ("configuration", DROPIN, "drift")}
    assert table.loc[("node1", DROPIN), "detail"] == injected_run.table.set_index(
        ["node", "item"]).loc[("node1", DROPIN), "detail"]
    # The bound: a silent node costs at most one check-mode task timeout more than the
    # healthy nodes' check mode (the injected run's, over eight of them).
    print(f"\ntrust drift: {took:.0f} s (task timeout {task_timeout} s)", file=sys.__stderr__)
    assert took <= _check_mode_s(injected_run) + task_timeout + 30, took


def _check_mode_s(run: DriftRun) -> float:
    timings = json.loads((run.run_dir / "drift.json").read_text())["timings"]
    return float(timings["check_mode_s"])


def test_drift_schedule_role_converges_on_a_management_host(lab: DriftLab, tmp_path: Path
                                                            ) -> None:
    host = "node8"
    address = lab.address(host)
    # The suite's checkout on the management host (the role checks it is there); the lab host
    # has no virtual environment, so its Debian python3 stands in for the checkout's.
    tar = subprocess.run(["tar", "-C", str(REPO_ROOT), "-cf", "-", "validate", "playbooks",
                          "ansible.cfg", "inventory/lab/group_vars"],
                         capture_output=True, check=True).stdout
    proc = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.paths.known_hosts}",
         "-i", str(lab.paths.ssh_key), f"root@{address}",
         "mkdir -p /opt/gpuready && tar -xf - -C /opt/gpuready"],
        input=tar, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    inventory = tmp_path / "mgmt.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(lab.paths.ssh_key),
                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab.paths.known_hosts} "
                                            "-o StrictHostKeyChecking=yes"},
        "children": {"drift_managers": {
            "hosts": {host: {"ansible_host": address}},
            "vars": {"drift_schedule_checkout": "/opt/gpuready",
                     "drift_schedule_inventory": "/opt/gpuready/inventory/lab",
                     "drift_schedule_python": "/usr/bin/python3",
                     "drift_schedule_keep_days": 14}}}}}))
    role_play = REPO_ROOT / "playbooks" / "drift_schedule.yml"
    first = _playbook(lab, role_play, inventory, "drift_schedule converge")
    assert first.rc == 0, first.stats
    assert first.stats["changed"].get(host, 0) > 0
    second = _playbook(lab, role_play, inventory, "drift_schedule converge again")
    assert second.rc == 0 and second.stats["changed"].get(host, 0) == 0, second.stats
    timers = ssh(address, "systemctl list-timers --all --no-pager --no-legend")
    assert "gpuready-drift.timer" in timers.stdout and "gpuready-drift.service" in timers.stdout
    verify = ssh(address, "systemd-analyze verify /etc/systemd/system/gpuready-drift.service "
                          "/etc/systemd/system/gpuready-drift.timer")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    unit = ssh(address, "systemctl cat gpuready-drift.service").stdout
    assert "User=gpuready-drift" in unit and "--keep-days 14" in unit
    assert "/var/lib/prometheus/node-exporter/gpuready_drift.prom" in unit
    user = ssh(address, "getent passwd gpuready-drift")
    assert user.returncode == 0 and "/var/lib/gpuready-drift" in user.stdout


def test_lab_is_still_the_one_this_module_started(lab: DriftLab) -> None:
    state = core.running_state(lab.paths)
    assert state is not None and state.started == lab.state.started
