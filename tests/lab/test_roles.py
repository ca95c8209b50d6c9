"""The bootstrap roles converge on the lab as on production hosts (issues 3, 14, 16).

One 4-host mixed lab (lab/fleets/mixed.yml) serves the whole module, and the tests run in file
order on it: node1-3 are one host per pool (H100/InfiniBand with NVSwitch, L40S/ethernet, A100
with NVSwitch) and node3 runs Debian 13 (NVIDIA's debian13 repository: its own key, the 590
branch, open kernel modules) beside the Debian 12 ones; node4 is a second H100 whose driver
install fails (lab fault ``driver-install-fail``, a DKMS build error in the driver package's
postinst). So the first converge proves both "a fresh lab converges" and "one failing host fails
alone", and the repair of node4 rides along with the second converge instead of needing a
second lab. Every converge, check and testinfra run covers both OSes.

Results come from ansible-runner's stats and events, never from stdout text.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import pandas as pd
import pytest
import yaml

from lab import core
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import lab_cli, running_lab, ssh
from validate.ansible_ssh import runner_settings

BOOTSTRAP = REPO_ROOT / "playbooks" / "bootstrap.yml"
HEALTHY = ("node1", "node2", "node3")
BROKEN = "node4"
DEBIAN13 = "node3"
DEBIAN12_HOSTS = ("node1", "node2", BROKEN)
INSTALL_TASK = "Install the packages at their pinned versions"  # vendor_apt_repo
# The files the hand-edit test changes, and the tasks that own them.
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
SYSCTL = "/etc/sysctl.d/90-gpuready.conf"
DROPIN_TASK = "Register the NVIDIA runtime with containerd (drop-in)"
SYSCTL_TASK = "Configure kernel parameters"
PERSISTENCED_TASK = "Enable and start nvidia-persistenced"
KUBELET_TASK = "Enable kubelet at boot"
RESCUE_TASK = "Fail with the reason the NVIDIA driver did not install"
# vendor_apt_repo: the one read per repository, and the first task of the chain it can spare.
PROBE_TASK = "Read the staged key, the keyring and the source as apt would use them"
KEY_TASK = "Download the repository key for verification"
PREF = "/etc/apt/preferences.d/gpuready-kubernetes.pref"
PREF_TASK = "Pin the package versions (apt preferences)"
# Tasks a converged host has nothing for, which its roles' reads (dpkg, file states, unit
# states) spare: apt loads the whole package cache, a template or copy costs two module runs,
# and a read after the changes repeats the first read where nothing changed.
SPARED_TASKS = (
    "Install base packages",  # gpu_kernel_prereqs
    "Blacklist nouveau so the NVIDIA driver can bind the GPUs",
    "Configure kernel modules loaded at boot",
    SYSCTL_TASK,
    "Mask swap.target so systemd activates no swap device at boot",
    "Install gpg to read repository keys",  # vendor_apt_repo
    "Create the key staging and keyring directories",
    "Install containerd",
    "Create the containerd drop-in directory",
    "Configure containerd (defaults, systemd cgroup driver, conf.d import)",
    "Enable and start containerd",
    "Read containerd's effective configuration and service state after the changes",
    DROPIN_TASK,  # nvidia_container_toolkit
    "Create the CDI spec directory",
    "Generate the CDI spec for the node's GPUs",
    "Read the drop-in, the CDI spec, containerd and nvidia-ctk again after the changes",
    PERSISTENCED_TASK,  # nvidia_driver
    "Enable and start the fabric manager",
    "Load nvidia-peermem at boot (GPUDirect RDMA fabric)",
    "Do not load nvidia-peermem (no RDMA fabric)",
    "Read the NVIDIA services, the peermem file, the driver and nvidia-smi again after the changes",
    KUBELET_TASK,  # kubelet
    "Read the kubelet binary's version and whether kubelet is enabled, after the change",
    # gpu_validation_tools
    "Read the validation tools' packages, fio and the tools' paths again after a change",
    # nvidia_dcgm
    "Enable and start the DCGM host engine",
    "Read the DCGM host engine's unit state and dcgmi's version again after the changes",
)
# What the nvidia_dcgm role installs per OS (the lab pins DCGM 3.3.6 on Debian 12 and 4.6.0 on
# Debian 13, whose 590 driver branch takes the CUDA 13 diagnostics).
DCGM_PACKAGES = {
    "debian-12": {"datacenter-gpu-manager": "1:3.3.6"},
    "debian-13": {"datacenter-gpu-manager-4-core": "1:4.6.0-1",
                  "datacenter-gpu-manager-4-cuda13": "1:4.6.0-1"},
}
DCGM_NOT_WANTED = {"debian-12": ("datacenter-gpu-manager-4-core",),
                   "debian-13": ("datacenter-gpu-manager", "datacenter-gpu-manager-4-cuda12")}


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run, as ansible-runner recorded it.

    ``stats``: {"ok"|"changed"|"failures"|"dark"|"skipped"|"rescued"...: {host: count}};
    ``events``: ansible-runner's event dicts (``event``, ``event_data`` with ``host``, ``task``,
    ``role``, ``res``); ``elapsed_s``: wall-clock seconds.
    """

    rc: int
    stats: dict[str, dict[str, int]]
    events: tuple[dict[str, Any], ...]
    elapsed_s: float

    def count(self, kind: str, host: str) -> int:
        return self.stats.get(kind, {}).get(host, 0)

    def host_events(self, host: str, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") in kinds
                and e.get("event_data", {}).get("host") == host]

    def changed_tasks(self, host: str) -> set[str]:
        return {e["event_data"]["task"] for e in self.host_events(host, "runner_on_ok")
                if e["event_data"].get("res", {}).get("changed")}

    def changed_installs(self, host: str) -> list[list[str]]:
        """The package lists of every package install that changed the host."""
        return [e["event_data"]["res"].get("invocation", {}).get("module_args", {}).get("name")
                for e in self.host_events(host, "runner_on_ok")
                if e["event_data"]["task"] == INSTALL_TASK
                and e["event_data"].get("res", {}).get("changed")]

    def failures(self, host: str) -> list[tuple[str, str, str]]:
        """(role, task, message) of every task that failed on the host (not ignored)."""
        found = []
        for event in self.host_events(host, "runner_on_failed", "runner_on_unreachable"):
            data = event["event_data"]
            if data.get("ignore_errors"):
                continue
            res = data.get("res", {})
            # A loop's own message is "One or more items failed"; the reason is per item.
            items = [str(r.get("msg", "")) for r in res.get("results", [])
                     if isinstance(r, dict) and r.get("failed")]
            found.append((data.get("role", ""), data.get("task", ""),
                          " ".join([str(res.get("msg", "")), *items])))
        return found


class Lab:
    """The module's lab: its state, inventory and a way to run playbooks against it."""

    def __init__(self, state: LabState, paths: LabPaths, artifacts: Path) -> None:
        self.state = state
        self.paths = paths
        self.inventory = paths.inventory_dir
        self.artifacts = artifacts
        self.runs = 0
        self.log: list[str] = []

    def address(self, name: str) -> str:
        return self.state.host(name).address

    def playbook(self, *, limit: str | None = None, cmdline: str = "",
                 inventory: Path | None = None, label: str = "",
                 playbook: Path = BOOTSTRAP) -> PlaybookRun:
        self.runs += 1
        private = self.artifacts / f"run{self.runs}"
        private.mkdir(parents=True)
        started = time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(REPO_ROOT),  # cwd: the project's ansible.cfg applies
            playbook=str(playbook),
            inventory=str(inventory or self.inventory),
            limit=limit,
            cmdline=cmdline or None,
            quiet=True,
            # Host keys verified as the validators verify them (validate/ansible_ssh.py).
            **runner_settings(Path(inventory or self.inventory), private, envvars={
                "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}),
        )
        elapsed = time.monotonic() - started
        self.log.append(f"{label or 'playbook'}: {elapsed:.0f} s")
        return PlaybookRun(rc=runner.rc, stats=runner.stats or {},
                           events=tuple(runner.events), elapsed_s=elapsed)

    def read(self, host: str, path: str) -> str:
        proc = ssh(self.address(host), f"cat {path}")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Lab]:
    started = time.monotonic()
    paths = LabPaths.default()
    with running_lab(fleet="mixed", faults=[f"{BROKEN}=driver-install-fail"]) as state:
        assert [h.name for h in state.hosts] == [*HEALTHY, BROKEN]
        assert [h.name for h in state.hosts if h.os == "debian-13"] == [DEBIAN13]
        the_lab = Lab(state, paths, tmp_path_factory.mktemp("runner"))
        yield the_lab
    summary = (f"test_roles: {time.monotonic() - started:.0f} s in all "
               f"({'; '.join(the_lab.log)})")
    # Shown even without -s: the runtime of this module is a CI budget item.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{summary}")
    else:
        print(summary)


@pytest.fixture(scope="module")
def first_converge(lab: Lab) -> PlaybookRun:
    return lab.playbook(label="first converge")


def test_fresh_lab_converges(lab: Lab, first_converge: PlaybookRun) -> None:
    pools = {h.name: h.pool for h in lab.state.hosts}
    assert {pools[h] for h in HEALTHY} == {"pool_h100_sxm", "pool_l40s_pcie", "pool_a100_sxm"}
    for host in HEALTHY:
        assert first_converge.failures(host) == [], host
        assert first_converge.count("ok", host) > 0
        # A bare host really changes: packages, files and services appear.
        assert first_converge.count("changed", host) > 10, host
    assert not first_converge.stats.get("dark")


def test_failed_driver_install_fails_only_that_host(first_converge: PlaybookRun) -> None:
    assert first_converge.rc != 0
    assert set(first_converge.stats.get("failures", {})) == {BROKEN}
    failures = first_converge.failures(BROKEN)
    # The last failure is the one that stopped the host (the rescue's message).
    role, task, message = failures[-1]
    assert (role, task) == ("nvidia_driver", RESCUE_TASK)
    assert "NVIDIA driver install failed" in message
    # Debian 12's package names and revision (NVIDIA's debian12 repository).
    assert "nvidia-kernel-dkms nvidia-driver-cuda" in message
    assert "550.90.07-1" in message
    # The DKMS error itself, as dpkg printed it, is in the message.
    assert "Bad return status for module build" in message
    # Nothing after the driver ran on the failed host. Before the roles, the play trusted every
    # vendor repository (bootstrap.yml's pre_tasks); from the first role on, only the roles up
    # to the driver's ran.
    ran = [e["event_data"] for e in first_converge.host_events(BROKEN, "runner_on_ok")]
    first_role = next((i for i, d in enumerate(ran) if d.get("role") == "gpu_kernel_prereqs"),
                      None)
    assert first_role is not None, "gpu_kernel_prereqs never ran on the broken host"
    trusted = {d["task"] for d in ran[:first_role] if d.get("role") == "vendor_apt_repo"}
    assert "Configure the repository (deb822 source)" in trusted
    later_roles = {d.get("role") for d in ran[first_role:] if d.get("role")}
    assert later_roles <= {"gpu_kernel_prereqs", "nvidia_driver", "vendor_apt_repo"}
    # The play went on for the others to the last role.
    for host in HEALTHY:
        roles = {e["event_data"].get("role") for e in first_converge.host_events(
            host, "runner_on_ok")}
        assert "gpu_validation_tools" in roles, host


def test_one_apt_update_reads_every_vendor_repository(first_converge: PlaybookRun) -> None:
    """bootstrap.yml trusts the four vendor repositories before any role installs: the first
    install's apt update reads them all, and no later install updates again (one per role
    before, each re-reading Debian's indexes too)."""
    for host in HEALTHY:
        installs = [e["event_data"]["res"] for e in first_converge.host_events(
            host, "runner_on_ok") if e["event_data"]["task"] == INSTALL_TASK]
        # The driver, the toolkit, kubelet and the validation tools (and the fabric manager).
        assert sum(1 for res in installs if res.get("changed")) >= 4, host
        assert [res.get("cache_updated", False) for res in installs].count(True) == 1, (
            host, [res.get("invocation", {}).get("module_args", {}).get("name")
                   for res in installs if res.get("cache_updated")])


def test_dcgm_is_installed_and_its_host_engine_runs(lab: Lab,
                                                    first_converge: PlaybookRun) -> None:
    """The nvidia_dcgm role (issue 31): DCGM from the CUDA repository at the pin, held, and the
    host engine (nvidia-dcgm, running the simulated nv-hostengine) active and enabled."""
    for host in HEALTHY:
        os_key = lab.state.host(host).os
        wanted = DCGM_PACKAGES[os_key]
        names = [*wanted, *DCGM_NOT_WANTED[os_key]]
        proc = ssh(lab.address(host), (
            "dpkg-query -W -f='${Package} ${Version} ${Status}\\n' " + " ".join(names)
            + " 2>/dev/null; echo unit $(systemctl is-active nvidia-dcgm)"
            " $(systemctl is-enabled nvidia-dcgm);"
            " test -e /run/gpuready-lab/nv-hostengine.pid && echo engine-pid; dcgmi --version"))
        lines = proc.stdout.splitlines()
        installed = {line.split(" ")[0]: line.split(" ", 2)[1:] for line in lines
                     if line.endswith(" installed")}
        assert installed == {name: [version, "hold ok installed"]
                             for name, version in wanted.items()}, (host, proc.stdout)
        assert "unit active enabled" in lines, (host, proc.stdout)
        assert "engine-pid" in lines, (host, proc.stdout)
        # dcgmi answers with the pinned release (1:<release>[-1]).
        release = next(iter(wanted.values())).split(":")[1].split("-")[0]
        assert release in proc.stdout.split("engine-pid", 1)[-1], (host, proc.stdout)
    # The role's own final assert ran and passed on each healthy host.
    for host in HEALTHY:
        asserted = [e for e in first_converge.host_events(host, "runner_on_ok")
                    if e["event_data"]["task"]
                    == "Assert the DCGM host engine runs and dcgmi is the pinned release"]
        assert asserted, host


@pytest.fixture(scope="module")
def second_converge(lab: Lab, first_converge: PlaybookRun) -> PlaybookRun:
    del first_converge  # ordering only
    proc = lab_cli("fault", BROKEN, "--clear")
    assert proc.returncode == 0, proc.stderr
    run = lab.playbook(label="second converge (node4 repaired)")
    # This run proves the healthy hosts converged (nothing left to change, nothing failed):
    # their disks become the snapshots the later lab modules boot from (lab/snapshot.py,
    # tests/lab/conftest.py), one per OS and pool. Each host is halted for its copy and booted
    # again, so the tests below run on converged hosts after a reboot, as a node runs.
    if run.rc == 0 and all(run.failures(h) == [] and run.count("changed", h) == 0
                           for h in HEALTHY):
        started = time.monotonic()
        taken = {host: core.take_snapshot(lab.paths, host).name for host in HEALTHY}
        lab.log.append(f"snapshots {taken}: {time.monotonic() - started:.0f} s")
    return run


def test_second_converge_changes_nothing(first_converge: PlaybookRun,
                                        second_converge: PlaybookRun) -> None:
    for host in HEALTHY:
        assert second_converge.failures(host) == [], host
        assert second_converge.count("changed", host) == 0, (
            host, sorted(second_converge.changed_tasks(host)))
    # A converged host's repositories are each read once (vendor_apt_repo's probe: the roles'
    # own, as bootstrap.yml trusts repositories first only on a host without its sources), and
    # the key chain is not run again; its packages and files are read, not run through apt and
    # template: those reads are what make a no-op converge cheap.
    for host in HEALTHY:
        ran = [e["event_data"]["task"] for e in second_converge.host_events(host, "runner_on_ok")]
        sources = [e for e in first_converge.host_events(host, "runner_on_ok")
                   if e["event_data"]["task"] == "Configure the repository (deb822 source)"
                   and e["event_data"]["res"].get("changed")]
        assert len(sources) >= 4, host
        assert ran.count(PROBE_TASK) == len(sources), (host, ran.count(PROBE_TASK))
        assert KEY_TASK not in ran, host
        assert set(ran) & set(SPARED_TASKS) == set(), host


def test_failed_host_is_repaired_by_the_next_converge(second_converge: PlaybookRun) -> None:
    assert second_converge.failures(BROKEN) == []
    assert second_converge.rc == 0
    assert second_converge.count("changed", BROKEN) > 0
    # The driver's install is what changed (after the hold was moved by the failed first run).
    installs = second_converge.changed_installs(BROKEN)
    assert any("nvidia-kernel-dkms=550.90.07-1" in names for names in installs), installs


def test_check_diff_on_converged_lab_reports_no_change(
        lab: Lab, second_converge: PlaybookRun) -> None:
    del second_converge  # ordering only
    check = lab.playbook(cmdline="--check --diff", label="check --diff")
    assert check.rc == 0
    for host in (*HEALTHY, BROKEN):
        assert check.failures(host) == [], host
        assert check.count("changed", host) == 0, (host, sorted(check.changed_tasks(host)))


def test_testinfra_passes_against_the_lab_inventory(
        lab: Lab, second_converge: PlaybookRun) -> None:
    del second_converge  # ordering only
    started = time.monotonic()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/infra", "--hosts=ansible://gpu_nodes",
         f"--ansible-inventory={lab.inventory}", "-q", "-p", "no:cacheprovider",
         "--junitxml", str(lab.artifacts / "infra.xml")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    lab.log.append(f"testinfra: {time.monotonic() - started:.0f} s")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # Every host was tested: the report names each of them in the test ids.
    report = (lab.artifacts / "infra.xml").read_text()
    for host in (*HEALTHY, BROKEN):
        assert f"ansible://{host}" in report, host


def test_a_source_written_without_its_update_is_read_before_installing(
        lab: Lab, second_converge: PlaybookRun) -> None:
    """A run stopped between writing a vendor source and the apt update that reads it (the
    trust-first step writes every source before the first install) leaves a host whose source
    is settled but whose lists were never fetched; the next converge must update before it
    installs, not take apt's lists as fresh because they are less than an hour old."""
    del second_converge  # node3 is converged
    host = "node3"
    proc = ssh(lab.address(host), (
        "set -e; rm -f /var/lib/apt/lists/*core:_stable:*; sleep 1; "
        "touch /etc/apt/sources.list.d/gpuready-kubernetes.sources; "
        "apt-mark unhold kubectl >/dev/null; dpkg --purge kubectl >/dev/null; "
        "apt-cache madison kubectl | grep -c ' 1.37.2-1.1 ' || true"))
    assert proc.returncode == 0, proc.stderr
    # The pinned version is not installable without an update (Debian 13 has a kubectl of its
    # own, which the pins keep out).
    assert proc.stdout.strip() == "0", proc.stdout
    run = lab.playbook(limit=host, cmdline="--tags kubelet", label="source without its update")
    assert run.rc == 0, run.failures(host)
    installs = [e["event_data"]["res"] for e in run.host_events(host, "runner_on_ok")
                if e["event_data"]["task"] == INSTALL_TASK]
    assert [(r.get("changed"), r.get("cache_updated")) for r in installs] == [(True, True)]
    # Back at its pin, held.
    proc = ssh(lab.address(host), "dpkg-query -W -f='${Version} ${db:Status-Abbrev}' kubectl")
    assert proc.stdout.split() == ["1.37.2-1.1", "hi"], proc.stdout


def test_hand_edited_files_are_reported_and_put_back(
        lab: Lab, second_converge: PlaybookRun) -> None:
    del second_converge  # ordering only
    host = "node1"
    dropin_before = lab.read(host, DROPIN)
    assert "nvidia-container-runtime" in dropin_before
    # Someone "fixes" the node by hand: drops the nvidia runtime, loosens files' modes (one of
    # them an apt pins file, which vendor_apt_repo's probe must see), stops the persistence
    # daemon and disables kubelet (which nvidia_driver's and kubelet's reads must see).
    proc = ssh(lab.address(host),
               f"echo 'version = 2' > {DROPIN} && chmod 0600 {SYSCTL} && chmod 0664 {PREF}"
               " && systemctl stop nvidia-persistenced && systemctl disable --quiet kubelet")
    assert proc.returncode == 0, proc.stderr
    edited = {DROPIN_TASK, SYSCTL_TASK, PREF_TASK, PERSISTENCED_TASK, KUBELET_TASK}

    check = lab.playbook(limit=host, cmdline="--check --diff", label="check after hand edit")
    assert check.failures(host) == []
    assert edited <= check.changed_tasks(host)
    # Check mode changed nothing on the host.
    assert lab.read(host, DROPIN) == "version = 2\n"

    converge = lab.playbook(limit=host, label="converge after hand edit")
    assert converge.failures(host) == []
    changed = converge.changed_tasks(host)
    assert edited <= changed
    # Only those files (and the restart they notify) changed.
    assert changed - edited <= {"Restart containerd for the NVIDIA runtime"}
    assert lab.read(host, DROPIN) == dropin_before
    mode = ssh(lab.address(host), f"stat -c %a {SYSCTL} {PREF}")
    assert mode.stdout.split() == ["644", "644"]
    units = ssh(lab.address(host),
                "systemctl is-active nvidia-persistenced; systemctl is-enabled kubelet")
    assert units.stdout.split() == ["active", "enabled"], units.stdout


def _bad_input_inventory(lab: Lab, target: Path) -> Path:
    """A copy of the lab inventory with one bad input per host (host vars and a new pool)."""
    hosts_yml = yaml.safe_load((lab.inventory / "hosts.yml").read_text())
    pools = hosts_yml["all"]["children"]["gpu_nodes"]["children"]
    host_entries = {name: entry for pool in pools.values()
                    for name, entry in pool["hosts"].items()}
    bad: dict[str, dict[str, Any]] = {
        "node1": {"nvidia_driver_version": "535.161.08"},  # not of the pinned 550 branch
        "node2": {"nvidia_driver_reboot_allowed": "yes"},  # a string, not a boolean
        "node3": {"gpu_profile": "h100-sxm5-80gb-9x"},  # no such profile
    }
    for name, overrides in bad.items():
        host_entries[name].update(overrides)
    for pool in pools.values():
        pool["hosts"].pop(BROKEN, None)
    # A pool whose group_vars forget gpu_profile.
    pools["pool_unprofiled"] = {
        "hosts": {BROKEN: host_entries[BROKEN]},
        "vars": {"gpu_pool": {"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                              "fabric": "infiniband", "workload": "inference",
                              "sharing": "full-gpu"}},
    }
    target.mkdir()
    (target / "hosts.yml").write_text(yaml.safe_dump(hosts_yml, sort_keys=False))
    (target / "group_vars").symlink_to((lab.inventory / "group_vars").resolve())
    return target


def test_bad_input_fails_before_any_change_naming_the_variable(
        lab: Lab, second_converge: PlaybookRun, tmp_path: Path) -> None:
    del second_converge  # the hosts are converged: a change now would show as changed
    inventory = _bad_input_inventory(lab, tmp_path / "inventory")
    run = lab.playbook(inventory=inventory, label="bad input")
    assert run.rc != 0
    wanted = {"node1": "nvidia_driver_version", "node2": "nvidia_driver_reboot_allowed",
              "node3": "gpu_profile", BROKEN: "gpu_profile"}
    assert set(run.stats.get("failures", {})) == set(wanted)
    for host, variable in wanted.items():
        assert run.count("changed", host) == 0, host
        assert run.changed_tasks(host) == set()
        failures = run.failures(host)
        assert len(failures) == 1, failures
        role, _task, message = failures[0]
        assert role == "preflight", (host, failures)
        assert variable in message, (host, message)
        # Nothing but preflight (and fact gathering) ran on the host.
        roles = {e["event_data"].get("role") for e in run.host_events(
            host, "runner_on_ok", "runner_on_skipped")}
        assert roles <= {"preflight", None, ""}, (host, roles)
    assert "h100-sxm5-80gb-9x" in run.failures("node3")[0][2]
    assert "missing required arguments: gpu_profile" in run.failures(BROKEN)[0][2]
    # A DCGM pin that is no exact release (YAML reads 3.3 as a number) fails there too.
    run = lab.playbook(limit="node1", cmdline="-e '{\"nvidia_dcgm_version\": 3.3}'",
                       label="bad DCGM pin")
    assert run.rc != 0
    assert run.count("changed", "node1") == 0
    [(role, _task, message)] = run.failures("node1")
    assert role == "preflight", message
    assert "nvidia_dcgm_version 3.3 is not an exact DCGM release" in message, message


def test_each_host_gets_its_own_os_repository_and_names(
        lab: Lab, second_converge: PlaybookRun) -> None:
    """Debian 13 reads debian13 (590, open modules, unversioned fabric manager), Debian 12 reads
    debian12 (550, branch in the fabric manager's name); Ubuntu's names reach neither."""
    del second_converge  # ordering only
    wanted = {
        DEBIAN13: ("13", "debian13", "nvidia-kernel-open-dkms", "nvidia-fabricmanager",
                   "590.48.01-1"),
        "node1": ("12", "debian12", "nvidia-kernel-dkms", "nvidia-fabricmanager-550",
                  "550.90.07-1"),
    }
    for host, (major, distro, kernel, fabric, version) in wanted.items():
        proc = ssh(lab.address(host), (
            ". /etc/os-release; echo $VERSION_ID; "
            "sed -n 's/^URIs: //p' /etc/apt/sources.list.d/gpuready-nvidia-cuda.sources; "
            f"dpkg-query -W -f='${{Version}} ${{db:Status-Abbrev}}\\n' {kernel} {fabric}; "
            "apt-cache show nvidia-utils-550 nvidia-driver-550 >/dev/null 2>&1; echo $?"))
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == major, (host, lines)
        assert lines[1].endswith(f"/compute/cuda/repos/{distro}/x86_64/"), (host, lines)
        assert [line.split()[0] for line in lines[2:4]] == [version, version], (host, lines)
        assert lines[4] != "0", f"{host} sees Ubuntu-named NVIDIA packages"


WRONG_KEY_PLAY = """---
- name: A vendor repository whose key is not the one pinned
  hosts: node2
  gather_facts: false
  tasks:
    - name: Add the repository through vendor_apt_repo
      ansible.builtin.include_role:
        name: vendor_apt_repo
      vars:
        vendor_apt_repo_name: wrong-key-check
        vendor_apt_repo_uris: "{{ gpuready_lab_repo_base }}/compute/cuda/repos/debian12/x86_64/"
        # The lab mirror publishes its own key under NVIDIA's file name, so NVIDIA's real
        # fingerprint (the role default on a site) does not match it.
        vendor_apt_repo_key_url: "{{ vendor_apt_repo_uris }}3bf863cc.pub"
        vendor_apt_repo_key_fingerprint: EB69 3B30 35CD 5710 E231  E123 A4B4 6996 3BF8 63CC
        vendor_apt_repo_packages: [nvidia-smi=550.90.07-1]
"""


def test_a_key_that_does_not_match_fails_before_apt_trusts_it(
        lab: Lab, second_converge: PlaybookRun, tmp_path: Path) -> None:
    del second_converge  # node2 is converged: only this repository is new to it
    play = tmp_path / "wrong-key.yml"
    play.write_text(WRONG_KEY_PLAY)
    run = lab.playbook(playbook=play, limit="node2", label="wrong repository key")
    assert run.rc != 0
    role, task, message = run.failures("node2")[-1]
    assert (role, task) == ("vendor_apt_repo", "Fail before apt trusts the key")
    assert "EB693B3035CD5710E231E123A4B469963BF863CC" in message
    assert lab.state.repo_port and f":{lab.state.repo_port}/compute/cuda" in message
    fingerprint = yaml.safe_load((lab.inventory / "hosts.yml").read_text())[
        "all"]["vars"]["gpuready_lab_repo_key_fingerprint"]
    assert fingerprint in message  # what the downloaded key really was
    # Nothing apt reads was written: no keyring, no source, no pin; the rejected key is gone.
    proc = ssh(lab.address("node2"), (
        "ls /etc/apt/keyrings/gpuready-wrong-key-check.* "
        "/etc/apt/sources.list.d/gpuready-wrong-key-check.sources "
        "/etc/apt/preferences.d/gpuready-wrong-key-check.pref "
        "/var/lib/gpuready/apt-keys/wrong-key-check-* 2>/dev/null | wc -l"))
    assert proc.stdout.strip() == "0", proc.stdout
    assert run.changed_tasks("node2") <= {"Download the repository key for verification",
                                         "Remove the rejected key from the staging directory"}


def test_validators_pass_on_the_healthy_debian_13_host(
        lab: Lab, second_converge: PlaybookRun, tmp_path: Path) -> None:
    del second_converge  # ordering only
    from validate import cli  # noqa: PLC0415  (lab tests connect lab and validate)

    started = time.monotonic()
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["run", "-i", str(lab.inventory), "--limit", DEBIAN13, "--timeout", "30",
                   "--out", str(tmp_path)], stdout=out, stderr=err)
    lab.log.append(f"validate {DEBIAN13}: {time.monotonic() - started:.0f} s")
    assert rc == 0, out.getvalue()[-3000:] + err.getvalue()[-2000:]
    run_dir = next(Path(line.removeprefix("report: ")) for line in out.getvalue().splitlines()
                   if line.startswith("report: "))
    results = pd.read_parquet(run_dir / "results.parquet")
    assert set(results["node"]) == {DEBIAN13}
    assert set(results["status"]) <= {"pass", "skip"}
    # The driver the validators saw is the Debian 13 pin, not the Debian 12 one.
    driver = results[results["check"] == "gpu.driver"]
    assert not driver.empty and driver["status"].eq("pass").all()
    assert driver["detail"].str.contains("590.48.01").any(), driver.to_string()
    # DCGM 4 (the nvidia_dcgm role's Debian 13 pin) is installed and its level-1 diagnostic ran.
    dcgm = results[results["check"] == "dcgm.diag"]
    assert not dcgm.empty and dcgm["status"].eq("pass").all(), dcgm.to_string()


UBUNTU_2004 = """PRETTY_NAME="Ubuntu 20.04.6 LTS"
NAME="Ubuntu"
VERSION_ID="20.04"
VERSION="20.04.6 LTS (Focal Fossa)"
VERSION_CODENAME=focal
ID=ubuntu
ID_LIKE=debian
"""


def test_a_host_claiming_an_unsupported_os_fails_in_preflight(lab: Lab) -> None:
    """An os-release naming another release (here Ubuntu 20.04 on node2): the host fails in
    preflight with the OS named, and nothing at all changes on it."""
    host = "node2"
    fake = UBUNTU_2004.replace("\n", "\\n")
    proc = ssh(lab.address(host), f"cp -P /etc/os-release /root/os-release.orig && "
               f"rm /etc/os-release && printf '{fake}' > /etc/os-release")
    assert proc.returncode == 0, proc.stderr
    try:
        run = lab.playbook(limit=host, label="unsupported OS")
    finally:
        restore = ssh(lab.address(host), "rm /etc/os-release && "
                      "mv /root/os-release.orig /etc/os-release")
        assert restore.returncode == 0, restore.stderr
    assert run.rc != 0
    failures = run.failures(host)
    assert len(failures) == 1, failures
    role, task, message = failures[0]
    assert (role, task) == ("preflight", "Assert the operating system is supported")
    assert "Ubuntu-20.04" in message and "Debian-13" in message
    assert run.count("changed", host) == 0
    roles = {e["event_data"].get("role") for e in run.host_events(
        host, "runner_on_ok", "runner_on_skipped")}
    assert roles <= {"preflight", None, ""}, roles


def test_lab_is_still_the_one_this_module_started(lab: Lab) -> None:
    # Guards the module's assumption that no other test stopped or replaced this lab.
    state = core.running_state(lab.paths)
    assert state is not None
    assert state.started == lab.state.started
