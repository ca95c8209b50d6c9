"""Lab fixtures: boot a fleet for a test module and always stop it again, even on failure.

Converged snapshots (lab/snapshot.py, issue 39): test_roles.py runs first; once its second
converge has proven the roles idempotent on its healthy hosts, their disks become the snapshots
that the modules testing what comes after bootstrap boot from (``running_lab(converged=True)``;
their ``site.yml`` is then a re-converge). A module run alone, without them, converges from the
bare rootfs as before. The session removes every snapshot at its start and its end, so a
snapshot is always the roles' work earlier in the same run, never a stale one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import core, hosts, snapshot
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from lab.supervisor import cgroup_tag

pytestmark = pytest.mark.lab


# Modules that run before the others, in this order: test_roles.py makes the converged
# snapshots the later modules boot from.
FIRST = ("test_roles.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/lab/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return FIRST.index(name) if name in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: file order within each rank


@pytest.fixture(scope="session", autouse=True)
def _snapshots_of_this_run() -> Iterator[None]:
    """No snapshot from an earlier run is ever booted; none outlives this one."""
    paths = LabPaths.default()
    snapshot.remove_all(paths)
    yield
    snapshot.remove_all(paths)


@pytest.fixture(scope="session", autouse=True)
def _lab_prerequisites() -> None:
    if os.geteuid() != 0:
        pytest.fail("lab tests need root (systemd-nspawn, overlay mounts): run `make test` as root")


@contextlib.contextmanager
def running_lab(**kwargs: object) -> Iterator[LabState]:
    paths = LabPaths.default()
    core.down(paths)  # a lab left by an interrupted run must not make this one fail
    state = core.up(paths, log=False, **kwargs)  # type: ignore[arg-type]
    try:
        yield state
    finally:
        core.down(paths)


def assert_host_cgroups(paths: LabPaths, state: LabState) -> list[Path]:
    """Each host's supervisor moved into its own cgroup in every hierarchy (as its
    /proc/PID/cgroup shows), or said in its log which one it could not use (a machine may
    refuse one, say a delegated memory hierarchy). Returns the cgroups made, which all exist."""
    made = []
    for h in state.hosts:
        mine = hosts.host_cgroups(paths, h.name)
        log = (paths.host_dir(h.name) / "supervisor.log").read_text(errors="replace")
        pid = hosts.supervisor_pid(paths, h.name)
        assert pid and mine, (h.name, pid, mine, log)
        tag = cgroup_tag(paths.host_dir(h.name), h.name)
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        elsewhere = [line for line in lines if not line.endswith(f"/gpuready-lab/{tag}")]
        assert len(elsewhere) <= log.count("cannot use cgroup"), (elsewhere, log)
        assert all(c.is_dir() for c in mine), (mine, log)
        made += mine
    return made


@pytest.fixture
def lab_paths() -> LabPaths:
    return LabPaths.default()


# A shell script that points a Debian 12 lab host's apt at the lab repository straight away,
# for tests that need packages without a converge (the roles have their own tests). It does
# what a person installing NVIDIA's Debian packages by hand must do: pin the driver's source
# release, or apt picks each dependency's newest version and fails on the exact relations.
LAB_APT_SOURCES = """set -e
install -d -m 0755 /etc/apt/keyrings
python3 -c 'import urllib.request,sys; sys.stdout.buffer.write(urllib.request.urlopen(\\
  "http://127.0.0.1:{port}/keyring.gpg").read())' > /etc/apt/keyrings/gpuready-lab.gpg
for r in {repos}; do
  echo "deb [signed-by=/etc/apt/keyrings/gpuready-lab.gpg] http://127.0.0.1:{port}/$r/ /"
done > /etc/apt/sources.list.d/gpuready-lab.list
printf 'Package: src:nvidia-graphics-drivers\\nPin: version {driver}-1\\nPin-Priority: 1001\\n' \\
  > /etc/apt/preferences.d/gpuready-lab-driver.pref
apt-get update -qq -o APT::Update::Error-Mode=any
"""
DEBIAN12_CUDA = "compute/cuda/repos/debian12/x86_64"
# Docker's repository as the lab serves it (not flat: a suite per release, component stable).
LAB_DOCKER_SOURCE = """set -e
install -d -m 0755 /etc/apt/keyrings
python3 -c 'import urllib.request,sys; sys.stdout.buffer.write(urllib.request.urlopen(\\
  "http://127.0.0.1:{port}/keyring.gpg").read())' > /etc/apt/keyrings/gpuready-lab.gpg
echo "deb [signed-by=/etc/apt/keyrings/gpuready-lab.gpg] http://127.0.0.1:{port}/linux/debian \\
{suite} stable" > /etc/apt/sources.list.d/gpuready-lab-docker.list
"""
# containerd.io's Debian version per lab OS (inventory/lab/group_vars: the pins the roles use).
CONTAINERD_IO = {"debian-12": ("bookworm", "2.2.9-1~debian.12~bookworm"),
                 "debian-13": ("trixie", "2.2.9-1~debian.13~trixie")}


def lab_docker_source(port: int, os_key: str) -> str:
    """A shell script adding the lab's Docker repository for ``os_key`` (no apt update)."""
    return LAB_DOCKER_SOURCE.format(port=port, suite=CONTAINERD_IO[os_key][0])


DRIVER = "550.90.07"  # inventory/lab/group_vars/all/bootstrap.yml


def lab_apt_sources(port: int, *repos: str) -> str:
    return LAB_APT_SOURCES.format(port=port, repos=" ".join(repos), driver=DRIVER)


def ssh(host_address: str, command: str, timeout: float = 60,
        known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """OpenSSH to a lab host as root with strict host key checking against the lab's file."""
    paths = LabPaths.default()
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts or paths.known_hosts}",
            "-o", "ConnectTimeout=5", "-i", str(paths.ssh_key), f"root@{host_address}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def lab_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def print_past_capture(request: pytest.FixtureRequest, text: str) -> None:
    """Print ``text`` even without -s: a lab module's wall time is a CI budget item."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{text}")
    else:
        print(text)
