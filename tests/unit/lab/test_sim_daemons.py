"""lab/sim/daemons.py: process names, real failure messages, clean SIGTERM exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "daemons.py"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    write_hardware(tmp_path / "hw", render_host("h100-sxm5-8x", "gpu-h100-01"))
    write_faults(tmp_path / "hw", [])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "nvidia-module-version").write_text("550.90.07\n")
    return tmp_path


def env(node: Path, tool: str, version: str) -> dict[str, str]:
    return {"GPUREADY_LAB_HW": str(node / "hw"), "GPUREADY_LAB_RUN": str(node / "run"),
            "GPUREADY_LAB_ROOT": str(node / "root"), "GPUREADY_SIM_TOOL": tool,
            "GPUREADY_SIM_VERSION": version, "PATH": "/usr/bin:/bin"}


def start(node: Path, tool: str, version: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SIM), *args], env=env(node, tool, version),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=5)
    return proc.returncode, out, err


@pytest.mark.parametrize(
    ("tool", "version", "args", "comm"),
    [
        ("nvidia-persistenced", "550.90.07", ["--foreground", "--verbose"], "nvidia-persiste"),
        ("gpu-feature-discovery", "0.17.0", [], "gpu-feature-dis"),
    ],
)
def test_daemon_names_itself_and_stops_cleanly(node, tool, version, args, comm):
    proc = start(node, tool, version, *args)
    comm_file = Path(f"/proc/{proc.pid}/comm")
    wait_for(lambda: comm_file.read_text().strip() == comm)
    code, out, err = stop(proc)
    assert code == 0
    assert "gpuready lab simulator" in out + err


def test_persistenced_fails_without_driver(node: Path):
    (node / "run" / "nvidia-module-version").unlink()
    proc = subprocess.run([sys.executable, str(SIM), "--foreground"],
                          env=env(node, "nvidia-persistenced", "550.90.07"),
                          capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 1
    assert "nvidia-persistenced: Failed to query NVIDIA devices." in proc.stderr


def test_fabricmanager_runs_on_nvswitch_and_marks_itself(node: Path):
    cfg = node / "fabricmanager.cfg"
    cfg.write_text("LOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=0\n")
    proc = start(node, "nv-fabricmanager", "550.90.07", "-c", str(cfg))
    marker = node / "run" / "nv-fabricmanager.pid"
    wait_for(marker.exists)
    assert int(marker.read_text()) == proc.pid
    wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "nv-fabricmanage")
    code, _, _ = stop(proc)
    assert code == 0 and not marker.exists()
    log = (node / "root" / "var" / "log" / "fabricmanager.log").read_text()
    # The log line format of the real FM log (fixtures/fabricmanager).
    assert re.search(r"^\[\w{3} \d{2} \d{4} \d{2}:\d{2}:\d{2}\] \[INFO\] \[tid \d+\] ", log, re.M)


def test_fabricmanager_exits_without_nvswitch_and_on_version_mismatch(node: Path, tmp_path: Path):
    other = tmp_path / "pcie"
    write_hardware(other / "hw", render_host("l40s-pcie-4x", "gpu-l40s-01"))
    (other / "run").mkdir(parents=True)
    (other / "run" / "nvidia-module-version").write_text("550.90.07\n")
    proc = subprocess.run([sys.executable, str(SIM)], env=env(other, "nv-fabricmanager",
                          "550.90.07"), capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 1
    assert "failed with error:WARNING Nothing to do" in proc.stderr
    mismatch = subprocess.run([sys.executable, str(SIM)], env=env(node, "nv-fabricmanager",
                              "550.54.15"), capture_output=True, text=True, timeout=10,
                              check=False)
    assert mismatch.returncode == 1 and "don't match with driver version 550.90.07" in (
        mismatch.stderr
    )
    assert not (node / "run" / "nv-fabricmanager.pid").exists()


def test_persistenced_forks_like_the_packaged_unit_expects(node: Path):
    proc = subprocess.run([sys.executable, str(SIM), "--verbose"],
                          env=env(node, "nvidia-persistenced", "550.90.07"),
                          capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0
    pid_file = node / "root" / "var" / "run" / "nvidia-persistenced" / "nvidia-persistenced.pid"
    wait_for(pid_file.exists)
    pid = int(pid_file.read_text())
    try:
        wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "nvidia-persiste")
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pid_file.exists())


@pytest.mark.parametrize(
    ("tool", "args", "pid_file", "comm"),
    [
        ("nvidia-persistenced", [], "root/var/run/nvidia-persistenced/nvidia-persistenced.pid",
         "nvidia-persiste"),
        ("nv-fabricmanager", [], "run/nv-fabricmanager.pid", "nv-fabricmanage"),
    ],
)
def test_daemon_is_the_only_process_left_when_its_starter_returns(node, tool, args, pid_file,
                                                                  comm):
    """systemd's Type=forking (no PIDFile=) takes the one process left when ExecStart exits as
    the main process: the intermediate fork must be gone and the daemon ready by then."""
    # Not pipes: run() would then also wait for the forks to let go of them.
    with (node / "stderr").open("w+") as err:
        # A daemon that takes a while to come up, as a real fabric manager does.
        proc = subprocess.run([sys.executable, str(SIM), *args],
                              env={**env(node, tool, "550.90.07"), "GPUREADY_SIM_INIT_S": "0.5"},
                              stdout=subprocess.DEVNULL, stderr=err, timeout=10, check=False)
    assert proc.returncode == 0, (node / "stderr").read_text()
    marker = node / pid_file
    ready_when_returned = marker.exists()
    wait_for(marker.exists)  # up in any case: stopped below even when the test fails
    pid = int(marker.read_text())
    try:
        assert ready_when_returned
        assert Path(f"/proc/{pid}/comm").read_text().strip() == comm
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        # Reparented: the intermediate child (a daemons.py process) has already exited.
        parent = Path(f"/proc/{ppid}/cmdline")
        assert not parent.exists() or str(SIM) not in parent.read_text()
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not marker.exists())


def test_a_process_in_another_pid_namespace_sees_the_fabric_manager_through_its_lock(
        node: Path) -> None:
    """all_reduce_perf in a container (the lab's acceptance Pods: another PID namespace, the
    run directory mounted in) cannot test the fabric manager's pid; it sees the lock the daemon
    holds while it runs, and no lock once it stopped."""
    reduce_sim = SIM.with_name("all_reduce_perf.py")

    def in_own_pid_namespace() -> str:
        proc = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(reduce_sim),
             "-b", "1M", "-e", "1M", "-g", "8"],
            env=env(node, "all_reduce_perf", "2.17.1"), capture_output=True, text=True,
            timeout=30, check=False)
        return proc.stdout + proc.stderr

    cfg = node / "fabricmanager.cfg"
    cfg.write_text("LOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=0\n")
    proc = start(node, "nv-fabricmanager", "550.90.07", "-c", str(cfg))
    try:
        wait_for((node / "run" / "nv-fabricmanager.pid").exists)
        # In a fresh PID namespace the daemon's pid is not there (or is someone else).
        assert "# Avg bus bandwidth" in in_own_pid_namespace()
    finally:
        code, _, _ = stop(proc)
    assert code == 0
    assert "'system not yet initialized'" in in_own_pid_namespace()
