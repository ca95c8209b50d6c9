#!/usr/bin/env python3
"""gpuready lab simulator: long-running daemons behind systemd units.

One script, three daemons, picked by env GPUREADY_SIM_TOOL (the package version is env
GPUREADY_SIM_VERSION): nvidia-persistenced, nv-fabricmanager and kubelet. Each names its
process like the real one (prctl PR_SET_NAME; the kernel keeps 15 bytes of comm, so
/proc/<pid>/comm reads `nvidia-persiste`, `nv-fabricmanage`, `kubelet`, exactly as the real
binaries show), logs that it is the simulator, and exits 0 on SIGTERM/SIGINT.

The node is read from $GPUREADY_LAB_HW (default /opt/gpuready-lab/hw)/{hardware,faults}.json;
the loaded kernel module from $GPUREADY_LAB_RUN (default /run/gpuready-lab)/
nvidia-module-version. Root-owned runtime paths sit under $GPUREADY_LAB_ROOT (default /), so
tests can run the daemons unprivileged.

nvidia-persistenced [--user U] [--no-persistence-mode] [--verbose] [--foreground|-f]
  Forks into the background unless --foreground (the packaged unit is Type=forking), writes
  /var/run/nvidia-persistenced/nvidia-persistenced.pid and listens on
  /var/run/nvidia-persistenced/socket. Without a loaded driver or without GPUs it fails the way
  the real one does: "Failed to query NVIDIA devices. Please ensure that the NVIDIA device
  files (/dev/nvidia*) exist, ..." and exit 1.
nv-fabricmanager [-c CFG]
  Reads LOG_FILE_NAME (default /var/log/fabricmanager.log) and DAEMONIZE (default 1) from the
  config, logs `[Mon DD YYYY HH:MM:SS] [LEVEL] [tid N] message` lines there (the format of
  fixtures/fabricmanager). On a node without NVSwitch (hardware.json nvswitch false) it fails
  like the real FM: "request to query NVSwitch device information from NVSwitch driver failed
  with error:WARNING Nothing to do", exit 1. A driver whose version differs from the FM
  package's is refused ("fabric manager NVIDIA GPU driver interface version X don't match with
  driver version Y"). While it runs, $GPUREADY_LAB_RUN/nv-fabricmanager.pid holds its pid: the
  lab's CUDA tools (all_reduce_perf) read it, because on real NVSwitch systems CUDA reports
  'system not yet initialized' until the fabric manager has configured the fabric.
kubelet --version -> `Kubernetes v<version>`; otherwise runs in the foreground and logs, in
  klog form, that it is the lab simulator waiting for kubeadm join.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

SIMULATOR = "gpuready lab simulator"
PR_SET_NAME = 15

_stop = threading.Event()


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _root(path: str) -> Path:
    return Path(os.environ.get("GPUREADY_LAB_ROOT", "/")) / path.lstrip("/")


def _load() -> tuple[dict[str, Any], set[str]]:
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults_path = _hw_dir() / "faults.json"
    faults: set[str] = set()
    if faults_path.exists():
        faults = set(json.loads(faults_path.read_text()).get("faults", []))
    return hw, faults


def _module_version() -> str | None:
    path = _run_dir() / "nvidia-module-version"
    return path.read_text().strip() if path.exists() else None


def set_process_name(name: str) -> None:
    """Set /proc/self/comm; the kernel truncates to 15 bytes, as for the real binary."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        # Not Linux or no prctl: the name is cosmetic, the daemon still works.
        pass


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _stop.set()


def _install_signals() -> None:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def _daemonize() -> bool:
    """Double fork; True in the daemon, False in the parent (which should exit 0)."""
    if os.fork() > 0:
        return False
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return True


def _wait() -> None:
    while not _stop.wait(0.2):
        pass


# -- nvidia-persistenced ------------------------------------------------------------------
def persistenced(args: list[str]) -> int:
    tool = "nvidia-persistenced"
    verbose = "--verbose" in args or "-V" in args
    if "--version" in args:
        version = os.environ.get("GPUREADY_SIM_VERSION", "")
        print(f"{tool}: version {version} ({SIMULATOR})")
        return 0
    hw, faults = _load()
    gpus = hw.get("gpus", [])
    if "driver-not-loaded" in faults or _module_version() is None or not gpus:
        uid = os.getuid()
        print(
            f"{tool}: Failed to query NVIDIA devices. Please ensure that the NVIDIA device "
            f"files (/dev/nvidia*) exist, and that user {uid} has read and write permissions "
            "for those files.",
            file=sys.stderr,
        )
        return 1
    if not ({"--foreground", "-f"} & set(args)) and not _daemonize():
        return 0
    set_process_name(tool)
    _install_signals()
    pid = os.getpid()
    run = _root("/var/run/nvidia-persistenced")
    run.mkdir(parents=True, exist_ok=True)
    pid_file = run / "nvidia-persistenced.pid"
    pid_file.write_text(f"{pid}\n")
    sock_path = run / "socket"
    sock_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(4)

    def log(message: str) -> None:
        print(f"{tool}: {message}", file=sys.stderr, flush=True)

    if verbose:
        log("Verbose syslog connection opened")
    log(f"Started ({pid}) ({SIMULATOR})")
    for gpu in gpus:
        bus = str(gpu.get("pci_bus_id", ""))[4:].lower()
        log(f"device {bus} - registered")
    log("Local RPC services initialized")
    _wait()
    log("Received signal 15")
    server.close()
    sock_path.unlink(missing_ok=True)
    log("Socket closed.")
    pid_file.unlink(missing_ok=True)
    log("PID file unlocked.")
    log("PID file closed.")
    log(f"Shutdown ({pid})")
    return 0


# -- nv-fabricmanager ---------------------------------------------------------------------
def _fm_config(args: list[str]) -> dict[str, str]:
    cfg: dict[str, str] = {"LOG_FILE_NAME": "/var/log/fabricmanager.log", "DAEMONIZE": "1"}
    path = None
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            path = args[i + 1]
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith("#"):
                cfg[key.strip()] = value.strip()
    return cfg


def fabricmanager(args: list[str]) -> int:
    tool = "nv-fabricmanager"
    version = os.environ.get("GPUREADY_SIM_VERSION", "")
    if "--version" in args or "-v" in args:
        print(f"Fabric Manager version is : {version} ({SIMULATOR})")
        return 0
    cfg = _fm_config(args)
    log_name = cfg.get("LOG_FILE_NAME", "")
    log_path = _root(log_name) if log_name else None

    def log(level: str, message: str) -> None:
        stamp = time.strftime("%b %d %Y %H:%M:%S")
        line = f"[{stamp}] [{level}] [tid {threading.get_native_id()}] {message}\n"
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("a") as handle:
                handle.write(line)

    hw, faults = _load()
    log("INFO", f"Fabric Manager version {version} ({SIMULATOR})")
    driver = _module_version()
    if "driver-not-loaded" in faults or driver is None:
        message = "failed to open NVIDIA GPU driver interface: the nvidia module is not loaded"
        log("ERROR", message)
        print(message, file=sys.stderr)
        return 1
    if version and driver != version:
        message = (
            f"fabric manager NVIDIA GPU driver interface version {version} don't match with "
            f"driver version {driver}. Please update with matching NVIDIA driver package."
        )
        log("ERROR", message)
        print(message, file=sys.stderr)
        return 1
    if not hw.get("nvswitch"):
        message = (
            "request to query NVSwitch device information from NVSwitch driver failed with "
            "error:WARNING Nothing to do"
        )
        log("ERROR", message)
        print(message, file=sys.stderr)
        return 1
    if cfg.get("DAEMONIZE", "1") != "0" and not _daemonize():
        return 0
    set_process_name(tool)
    _install_signals()
    marker = _run_dir() / "nv-fabricmanager.pid"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{os.getpid()}\n")
    log("INFO", "Connected to 1 node.")
    log(
        "INFO",
        "Successfully configured all the available NVSwitches to route GPU NVLink traffic. "
        "NVLink Peer-to-Peer support will be enabled once the GPUs are successfully registered "
        "with the NVLink fabric.",
    )
    print("Connected to 1 node.", flush=True)
    _wait()
    marker.unlink(missing_ok=True)
    log("INFO", "Fabric Manager is stopping on receiving signal 15")
    return 0


# -- kubelet ------------------------------------------------------------------------------
def kubelet(args: list[str]) -> int:
    version = os.environ.get("GPUREADY_SIM_VERSION", "1.30.5")
    if any(a == "--version" or a.startswith("--version=") for a in args):
        print(f"Kubernetes v{version}")
        return 0
    set_process_name("kubelet")
    _install_signals()
    pid = os.getpid()

    def klog(message: str) -> None:
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
        micro = int((now % 1) * 1e6)
        print(f"I{stamp}.{micro:06d} {pid:7d} server.go:484] {message}", flush=True)

    klog(f'"Kubelet version" kubeletVersion="v{version}"')
    klog(f'"{SIMULATOR}: kubelet is waiting for kubeadm join" node="{os.uname().nodename}"')
    _wait()
    klog('"Shutdown signal received, stopping kubelet"')
    return 0


DAEMONS = {
    "nvidia-persistenced": persistenced,
    "nv-fabricmanager": fabricmanager,
    "kubelet": kubelet,
}


def main(argv: list[str]) -> int:
    tool = os.environ.get("GPUREADY_SIM_TOOL", "")
    handler = DAEMONS.get(tool)
    if handler is None:
        print(f"{SIMULATOR}: GPUREADY_SIM_TOOL must be one of {sorted(DAEMONS)}", file=sys.stderr)
        return 2
    return handler(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
