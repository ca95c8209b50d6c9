"""Every injected fault changes what the simulators on a running lab host print, the way the
real tool shows that fault (formats themselves are held against real captures in tests/unit)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lab.core import LabState
from tests.lab.conftest import DEBIAN12_CUDA, lab_apt_sources, lab_cli, running_lab, ssh

INSTALL = """
apt-get install -y -qq nvidia-driver-cuda=550.90.07-1 nvidia-kernel-dkms=550.90.07-1 \
  nvidia-persistenced=550.90.07-1 nvidia-fabricmanager-550=550.90.07-1 nccl-tests=2.17.1-1 \
  infiniband-diags=2410mlnx54-1.2410068 >/dev/null
systemctl start nvidia-persistenced nvidia-fabricmanager
"""
NCCL = "all_reduce_perf -b 1G -e 8G -f 2 -g 8 -n 5 -w 1"
Check = Callable[[str, int], bool]

CASES: list[tuple[str, str, Check]] = [
    ("gpu-missing", "nvidia-smi -L", lambda out, rc: out.count("GPU ") == 7),
    ("ecc-uncorrectable",
     "nvidia-smi -i 0 --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader",
     lambda out, rc: rc == 0 and int(out.strip()) > 0),
    ("row-remap-pending", "nvidia-smi -q -i 1",
     lambda out, rc: any(line.split(":")[0].strip() == "Pending"
                         and line.split(":")[1].strip() == "Yes" for line in out.splitlines())),
    ("pcie-degraded",
     "nvidia-smi -i 2 --query-gpu=pcie.link.gen.current,pcie.link.width.current,"
     "pcie.link.gen.max,pcie.link.width.max --format=csv,noheader",
     lambda out, rc: out.strip() == "3, 8, 5, 16"),
    ("nvlink-down", "nvidia-smi nvlink -s -i 3", lambda out, rc: "inactive" in out.lower()),
    ("xid-79", "journalctl --no-pager -o short-iso SYSLOG_IDENTIFIER=kernel",
     lambda out, rc: "NVRM: Xid (PCI:" in out and "): 79," in out),
    ("xid-48", "journalctl --no-pager -o short-iso SYSLOG_IDENTIFIER=kernel",
     lambda out, rc: "): 48," in out),
    ("nccl-low-busbw", NCCL, lambda out, rc: _avg_busbw(out) < 0.8 * HEALTHY_BUSBW[0]),
    ("nccl-wrong-results", NCCL, lambda out, rc: rc != 0 and "FAILED" in out),
    ("tool-hang", "timeout 5 nvidia-smi -L", lambda out, rc: rc == 124 and out == ""),
    ("driver-not-loaded", "nvidia-smi",
     lambda out, rc: rc == 9 and "couldn't communicate with the NVIDIA driver" in out),
    ("ib-port-down", "ibstat mlx5_0",
     lambda out, rc: "State: Down" in out and "Rate: 10" in out),
    # (ib-link-degraded shows only between two nodes: tests/lab/test_fabric.py.)
    ("ib-rail-down", "ibstat mlx5_7",
     lambda out, rc: "State: Down" in out and "Physical state: Disabled" in out),
    # The simulated HCAs' sysfs counters (the lab inventory's gpuready_sysfs_root).
    ("ib-link-flap", "cat /opt/gpuready-lab/hw/sys/class/infiniband/mlx5_0/ports/1/counters/"
     "link_downed", lambda out, rc: rc == 0 and int(out) > 0),
]
HEALTHY_BUSBW: list[float] = []


def _avg_busbw(out: str) -> float:
    for line in out.splitlines():
        if "Avg bus bandwidth" in line:
            return float(line.split(":")[1])
    raise AssertionError(f"no average bus bandwidth in:\n{out}")


@pytest.fixture(scope="module")
def h100() -> Iterator[LabState]:
    with running_lab(nodes=1) as state:
        host = state.hosts[0]
        proc = ssh(host.address, lab_apt_sources(state.repo_port, DEBIAN12_CUDA, "extras")
                   + INSTALL,
                   timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield state


def test_healthy_baseline(h100: LabState) -> None:
    address = h100.hosts[0].address
    nccl = ssh(address, NCCL)
    assert nccl.returncode == 0, nccl.stdout + nccl.stderr
    HEALTHY_BUSBW.append(_avg_busbw(nccl.stdout))
    for fault, command, shows_fault in CASES:
        if fault.startswith("nccl"):
            continue
        proc = ssh(address, command, timeout=30)
        assert not shows_fault(proc.stdout, proc.returncode), f"healthy host shows {fault}"


@pytest.mark.parametrize(("fault", "command", "shows_fault"), CASES, ids=[c[0] for c in CASES])
def test_fault_changes_tool_output(h100: LabState, fault: str, command: str,
                                   shows_fault: Check) -> None:
    if fault == "nccl-low-busbw" and not HEALTHY_BUSBW:
        pytest.fail("healthy baseline did not run")
    host = h100.hosts[0]
    set_fault = lab_cli("fault", host.name, fault)
    assert set_fault.returncode == 0, set_fault.stderr
    try:
        proc = ssh(host.address, command, timeout=30)
        assert shows_fault(proc.stdout, proc.returncode), (
            f"{fault}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    finally:
        assert lab_cli("fault", host.name, "--clear").returncode == 0


def test_ssh_down_and_back(h100: LabState) -> None:
    host = h100.hosts[0]
    assert lab_cli("fault", host.name, "ssh-down").returncode == 0
    try:
        proc = ssh(host.address, "true", timeout=30)
        assert proc.returncode == 255
        assert "Connection refused" in proc.stderr
    finally:
        assert lab_cli("fault", host.name, "--clear").returncode == 0
    assert ssh(host.address, "true").returncode == 0


def test_driver_install_fail(h100: LabState) -> None:
    host = h100.hosts[0]
    assert lab_cli("fault", host.name, "driver-install-fail").returncode == 0
    try:
        proc = ssh(host.address, "apt-get install -y -qq --reinstall "
                   "nvidia-kernel-dkms=550.90.07-1", timeout=120)
        assert proc.returncode != 0
        assert "Bad return status for module build" in proc.stdout + proc.stderr
    finally:
        assert lab_cli("fault", host.name, "--clear").returncode == 0
        ssh(host.address, "dpkg --configure -a", timeout=120)
