"""The lab itself (issue 2): hosts, SSH with host key checking, the package repository, faults
as the simulators show them, isolation from this machine, bad input, and a clean `lab down`."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import core, hosts
from lab.core import LabState
from lab.fleet import ADDRESS_NET
from lab.paths import LabPaths
from tests.lab.conftest import (
    DEBIAN12_CUDA,
    assert_host_cgroups,
    lab_apt_sources,
    lab_cli,
    running_lab,
    ssh,
)


@pytest.fixture(scope="module")
def lab8() -> Iterator[LabState]:
    with running_lab(nodes=8) as state:
        yield state


def _listeners(prefix: str = str(ADDRESS_NET.network_address)[:-1]) -> list[str]:
    """Local TCP listeners on lab addresses (from /proc/net/tcp, state 0A = LISTEN)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state != "0A":
            continue
        hexip, hexport = local.split(":")
        ip = socket.inet_ntoa(bytes.fromhex(hexip)[::-1])
        if ip.startswith(prefix):
            found.append(f"{ip}:{int(hexport, 16)}")
    return found


def test_every_host_answers_ssh_with_host_key_checking(lab8: LabState) -> None:
    assert len(lab8.hosts) == 8
    assert {h.pool for h in lab8.hosts} == {"pool_h100_sxm", "pool_l40s_pcie", "pool_a100_sxm"}
    for host in lab8.hosts:
        proc = ssh(host.address, "hostname; cat /etc/gpuready-lab-release")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[0] == host.name
        assert "SIMULATED" in proc.stdout


def test_unknown_host_key_is_rejected(lab8: LabState, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = ssh(lab8.hosts[0].address, "true", known_hosts=empty)
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr


def test_hosts_have_distinct_host_keys(lab_paths: LabPaths, lab8: LabState) -> None:
    lines = lab_paths.known_hosts.read_text().splitlines()
    assert len(lines) == len(lab8.hosts)
    assert len({line.split()[2] for line in lines}) == len(lab8.hosts)


def test_idle_host_uses_under_64_mb(lab_paths: LabPaths, lab8: LabState) -> None:
    def tree(pid: int) -> list[int]:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:  # a short-lived process ended while we walked the tree
            return []
        return [pid, *(p for c in children for p in tree(int(c)))]

    def pss_kb(pid: int) -> int:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return 0
        return sum(int(line.split()[1]) for line in rollup.splitlines()
                   if line.startswith("Pss:"))

    for host in lab8.hosts[:3]:
        leader = hosts.leader_pid(lab_paths, host.name)
        assert leader is not None
        used = sum(pss_kb(pid) for pid in tree(leader))
        assert 0 < used < 64 * 1024, f"{host.name} uses {used / 1024:.1f} MiB"


def test_apt_install_of_a_lab_package(lab8: LabState) -> None:
    host = lab8.hosts[0]
    proc = ssh(host.address, lab_apt_sources(lab8.repo_port, DEBIAN12_CUDA, "extras")
               + "apt-get install -y -qq nvidia-smi=550.90.07-1 >/dev/null\n"
               + "dpkg-query -W -f='${Version} ${binary:Summary}\\n' nvidia-smi\n"
               + "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader", timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    version, _, description = proc.stdout.splitlines()[0].partition(" ")
    # NVIDIA's debian12 repository: Debian-style name and revision (tests/fixtures/vendor-repos).
    assert version == "550.90.07-1"
    assert "gpuready lab simulator" in description
    gpus = proc.stdout.splitlines()[1:]
    assert len(gpus) == 8
    assert gpus[0] == "NVIDIA H100 80GB HBM3, 550.90.07"


def test_host_cannot_change_this_machine(lab8: LabState) -> None:
    before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    proc = ssh(lab8.hosts[1].address, "sysctl -w net.ipv4.ip_forward=1; echo rc=$?; "
               "modprobe dummy; echo rc=$?; mount -o remount,rw /proc/sys; echo rc=$?; "
               "mount /dev/vda /mnt 2>&1; echo rc=$?")
    codes = re.findall(r"rc=(\d+)", proc.stdout)
    assert len(codes) == 4 and all(c != "0" for c in codes), proc.stdout + proc.stderr
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == before


def test_reboot_keeps_address_and_disk(lab_paths: LabPaths, lab8: LabState) -> None:
    host = lab8.hosts[2]
    assert ssh(host.address, "echo kept > /root/reboot-marker").returncode == 0
    boots = int((lab_paths.host_dir(host.name) / "boots").read_text())
    ssh(host.address, "systemctl reboot")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if int((lab_paths.host_dir(host.name) / "boots").read_text()) > boots:
            break
        time.sleep(0.2)
    assert hosts.wait_ssh(host, time.monotonic() + 60)
    assert hosts.wait_running(lab_paths, host.name, time.monotonic() + 60)
    proc = ssh(host.address, "cat /root/reboot-marker")
    assert proc.stdout.strip() == "kept"


def test_hosts_do_not_share_service_cgroups(lab_paths: LabPaths, lab8: LabState) -> None:
    """Stopping a unit in one host must not touch another host's processes (each host's
    systemd gets its own cgroup tree, not one shared /payload)."""
    one, other = lab8.hosts[3], lab8.hosts[4]
    hosts.host_exec(lab_paths, one.name, ["systemctl", "stop", "ssh.socket", "ssh.service"])
    try:
        assert ssh(other.address, "true").returncode == 0
        assert ssh(one.address, "true").returncode == 255
    finally:
        hosts.host_exec(lab_paths, one.name, ["systemctl", "start", "ssh.service"])
    assert ssh(one.address, "true").returncode == 0


def test_second_up_is_refused_and_leaves_lab_running(lab8: LabState) -> None:
    proc = lab_cli("up", "--nodes", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "already running" in proc.stderr
    assert ssh(lab8.hosts[0].address, "true").returncode == 0
    status = lab_cli("status")
    assert status.stdout.count("running") == 8


@pytest.mark.parametrize(("args", "message"), [
    (["--fault", "node1=melted-gpu"], "unknown fault 'melted-gpu'"),
    (["--nodes", "245"], "does not fit the lab address range"),
    (["--fault", "node99=ecc-uncorrectable"], "no host 'node99'"),
    (["--fleet", "nosuchfleet"], "unknown fleet 'nosuchfleet'"),
])
def test_bad_input_is_one_line_and_changes_nothing(lab8: LabState, args: list[str],
                                                   message: str) -> None:
    proc = lab_cli("up", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
    assert ssh(lab8.hosts[0].address, "true").returncode == 0


def test_unknown_hardware_profile_in_fleet(tmp_path: Path) -> None:
    fleet = tmp_path / "bad.yml"
    fleet.write_text("---\npools:\n  pool_x: {hw_profile: b300-imaginary}\n"
                     "hosts:\n  - {name: node1, pool: pool_x}\n")
    proc = lab_cli("up", "--fleet", str(fleet))
    assert proc.returncode == 2
    assert "unknown hardware profile 'b300-imaginary'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_fault_on_running_lab_rejects_unknown_name(lab8: LabState) -> None:
    proc = lab_cli("fault", lab8.hosts[0].name, "gpu-on-fire")
    assert proc.returncode == 2
    assert "unknown fault 'gpu-on-fire'" in proc.stderr


def test_down_leaves_nothing_behind(lab_paths: LabPaths) -> None:
    with running_lab(nodes=2) as state:
        assert _listeners()
        assert core.host_processes(lab_paths)
        cgroups = assert_host_cgroups(lab_paths, state)
    assert core.host_processes(lab_paths) == []
    assert hosts.lab_mounts(lab_paths) == []
    assert _listeners() == []
    assert not (lab_paths.inventory_dir / "hosts.yml").exists()
    assert not any(c.exists() for c in cgroups)
    assert lab_cli("status").stdout.strip() == "lab: not running"

