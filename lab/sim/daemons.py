#!/usr/bin/env python3
"""gpuready lab simulator: long-running daemons behind systemd units.

One script, four daemons, picked by env GPUREADY_SIM_TOOL (the package version is env
GPUREADY_SIM_VERSION): nvidia-persistenced, nv-fabricmanager, DCGM's nv-hostengine
(hostengine() below) and, beside the real kubelet, gpu-feature-discovery (see
gpu_feature_discovery). Each names its process like the real one (prctl PR_SET_NAME; the
kernel keeps 15 bytes of comm, so /proc/<pid>/comm reads `nvidia-persiste`,
`nv-fabricmanage`, exactly as the real binaries show), logs that it is the simulator, and
exits 0 on SIGTERM/SIGINT.

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
gpu-feature-discovery
  Once kubeadm join has written /etc/kubernetes/kubelet.conf, with that kubeconfig's client
  certificate (NodeRestriction lets a kubelet set nvidia.com/ labels on its own Node): GPU
  Feature Discovery's labels (nvidia.com/gpu.product, .count, .memory, ... from hardware.json,
  as NVML sees the GPUs: none without a loaded driver, one fewer with gpu-missing, another
  SKU's product with the gfd-mismatch fault), set whenever they differ.
"""

from __future__ import annotations

import ctypes
import fcntl
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


def _write_pid(path: Path, pid: int) -> None:
    """Write a pid file whole: a reader that sees the file (the tests, the all_reduce_perf
    simulator's fabric manager check) never reads it empty or half-written."""
    tmp = path.with_name(f".{path.name}.{pid}")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


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


# The write end of the pipe the parent of _daemonize() reads until the daemon is ready.
_ready_fd: int | None = None


def _daemonize() -> bool:
    """Double fork; True in the daemon, False in the parent (which should exit 0).

    The parent returns only once the intermediate child has exited and the daemon has called
    _ready() (or died): a Type=forking unit without PIDFile= takes the one process left in its
    cgroup when the parent exits as the main process. Returning earlier let systemd take the
    intermediate child, see it exit 0, call the service finished and kill the daemon (seen in
    the lab: "nvidia-fabricmanager.service: Deactivated successfully" 5 ms after starting)."""
    global _ready_fd  # noqa: PLW0603  (one daemon per process)
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child > 0:
        os.close(write_fd)
        os.waitpid(child, 0)
        while os.read(read_fd, 1):  # EOF: the daemon is ready, or gone
            pass
        os.close(read_fd)
        return False
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _ready_fd = write_fd
    return True


def _initialize() -> None:
    """The daemon's start-up work before it is ready: none by default; GPUREADY_SIM_INIT_S
    seconds where set (real fabric managers take seconds to program the NVSwitches; the tests
    use it to show the starter waits)."""
    delay = float(os.environ.get("GPUREADY_SIM_INIT_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def _ready() -> None:
    """Tell the parent of _daemonize() that the daemon is up (its pid file written)."""
    global _ready_fd  # noqa: PLW0603
    if _ready_fd is not None:
        os.close(_ready_fd)
        _ready_fd = None


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
    _initialize()
    pid = os.getpid()
    run = _root("/var/run/nvidia-persistenced")
    run.mkdir(parents=True, exist_ok=True)
    pid_file = run / "nvidia-persistenced.pid"
    _write_pid(pid_file, pid)
    sock_path = run / "socket"
    sock_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(4)
    _ready()

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
    _initialize()
    marker = _run_dir() / "nv-fabricmanager.pid"
    marker.parent.mkdir(parents=True, exist_ok=True)
    # Held while it runs: a process in a container (another PID namespace, the run directory
    # mounted into its Pod by the lab's device plugin) cannot test the pid, but sees the lock.
    lock = os.open(marker.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _write_pid(marker, os.getpid())
    _ready()
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
    os.close(lock)
    log("INFO", "Fabric Manager is stopping on receiving signal 15")
    return 0


# -- GPU Feature Discovery (beside a real kubelet) ------------------------------------------
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
FLAGS_ENV = "/var/lib/kubelet/kubeadm-flags.env"
# The node labels GPU Feature Discovery sets (gfd_labels below): the only ones it changes or
# removes. Others under nvidia.com/ belong to someone else (the device plugin's configuration
# label, set by `validate cluster apply`; the MIG manager's), as NFD tracks what GFD created.
GFD_KEYS = frozenset(f"nvidia.com/{key}" for key in (
    "cuda.driver-version.full", "cuda.driver-version.major", "cuda.driver-version.minor",
    "cuda.driver-version.revision", "cuda.runtime-version.full", "cuda.runtime-version.major",
    "cuda.runtime-version.minor", "gfd.timestamp", "gpu.compute.major", "gpu.compute.minor",
    "gpu.count", "gpu.family", "gpu.machine", "gpu.memory", "gpu.mode", "gpu.present",
    "gpu.product", "gpu.replicas", "gpu.sharing-strategy", "mig.capable", "mig.strategy",
    "mps.capable"))
FAMILIES = {"Hopper": "hopper", "Ampere": "ampere", "Ada Lovelace": "ada-lovelace",
            "Blackwell": "blackwell", "Turing": "turing", "Volta": "volta"}
# What gfd-mismatch makes GFD report: another SKU's product (stale labels from a swapped board).
OTHER_PRODUCT = {True: "NVIDIA-A100-SXM4-80GB", False: "NVIDIA-H100-80GB-HBM3"}


def _label_value(text: str) -> str:
    """GFD's sanitising: spaces become '-', other characters labels refuse are dropped."""
    out = "".join(c if c.isalnum() or c in "-_." else "-" if c == " " else "" for c in text)
    return out.strip("-_.")[:63].rstrip("-_.")


def gfd_labels(hw: dict[str, Any], faults: set[str], driver: str | None,
               now: int) -> dict[str, str]:
    """The labels GPU Feature Discovery would put on this node (tests/fixtures/k8s-api shapes:
    gpu.product with spaces as '-', gpu.memory in MiB, gpu.count)."""
    gpus = list(hw.get("gpus", []))
    if "gpu-missing" in faults and gpus:
        gpus = gpus[:-1]
    if not gpus or driver is None or "driver-not-loaded" in faults:
        return {}  # no driver, no NVML: GFD labels nothing
    first = gpus[0]
    product = _label_value(str(first["name"]))
    if "gfd-mismatch" in faults:
        product = OTHER_PRODUCT["H100" in product]
    major, minor = [*str(first.get("compute_cap", "0.0")).split("."), "0"][:2]
    drv = [*driver.split("."), "0", "0"][:3]
    cuda = [*str(hw.get("cuda_version", "12.4")).split("."), "0"][:2]
    mig = str(first.get("architecture")) in ("Ampere", "Hopper", "Blackwell") and \
        "SXM" in str(hw.get("product_name", "")) + product
    return {
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": drv[0],
        "nvidia.com/cuda.driver-version.minor": drv[1],
        "nvidia.com/cuda.driver-version.revision": drv[2],
        "nvidia.com/cuda.runtime-version.full": ".".join(cuda),
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/gfd.timestamp": str(now),
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.family": FAMILIES.get(str(first.get("architecture")), "unknown"),
        "nvidia.com/gpu.machine": _label_value(str(hw.get("product_name", ""))),
        "nvidia.com/gpu.memory": str(first.get("memory_total_mib", 0)),
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true" if mig else "false",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mps.capable": "false",
    }


def _node_name() -> str:
    try:
        text = _root(FLAGS_ENV).read_text()
    except OSError:
        text = ""
    for word in text.replace('"', " ").split():
        if word.startswith("--hostname-override="):
            return word.split("=", 1)[1]
    return os.uname().nodename


def gpu_feature_discovery(args: list[str]) -> int:
    """SIMULATED GPU Feature Discovery beside a real kubelet (fleets with a control plane):
    once the host has joined, GFD's labels from the simulated hardware go on its Node, with the
    kubelet's credentials (NodeRestriction lets a kubelet set nvidia.com/ labels on its own
    Node), whenever they differ from what the Node has."""
    del args
    set_process_name("gpu-feature-dis")
    _install_signals()
    import kubeclient  # noqa: PLC0415

    interval = float(os.environ.get("GPUREADY_SIM_GFD_INTERVAL", "5"))
    conf = _root(KUBELET_CONF)
    print(f"{SIMULATOR}: GPU Feature Discovery (SIMULATED), waiting for {KUBELET_CONF}",
          flush=True)
    said = ""
    while not _stop.wait(interval):
        if not conf.exists():
            continue
        name = _node_name()
        try:
            client = kubeclient.kubeconfig_client(conf)
            node = client.request("GET", f"/api/v1/nodes/{name}")
            hw, faults = _load()
            current = {k: v for k, v in (node["metadata"].get("labels") or {}).items()
                       if k in GFD_KEYS and k != "nvidia.com/gfd.timestamp"}
            wanted = gfd_labels(hw, faults, _module_version(), int(time.time()))
            if current != {k: v for k, v in wanted.items() if k != "nvidia.com/gfd.timestamp"}:
                stale = {k: None for k in current if k not in wanted}
                client.request("PATCH", f"/api/v1/nodes/{name}",
                               {"metadata": {"labels": {**stale, **wanted}}},
                               "application/strategic-merge-patch+json")
                print(f"{SIMULATOR}: GPU Feature Discovery labels set on Node {name} "
                      f"(gpu.count {wanted.get('nvidia.com/gpu.count', '0')})", flush=True)
            said = ""
        except (kubeclient.ApiFailure, OSError, KeyError) as exc:
            if str(exc) != said:  # once per distinct failure (no Node yet, API down, ...)
                print(f"{SIMULATOR}: GPU Feature Discovery: {exc}", flush=True)
                said = str(exc)
    return 0


# -- nv-hostengine (DCGM) ------------------------------------------------------------------
def hostengine(args: list[str]) -> int:
    """``nv-hostengine [-n] [--service-account USER]``: DCGM's host engine, which dcgmi talks to.
    ``-n`` keeps it in the foreground (the packaged nvidia-dcgm.service runs it so); otherwise
    it daemonizes and prints where it listens, as the real one does ("Started host engine
    version V using port number: 5555"). Without a loaded driver NVML cannot start, and
    neither does the engine. While it runs, $GPUREADY_LAB_RUN/nv-hostengine.pid holds its pid
    (the simulated dcgmi connects only then)."""
    tool = "nv-hostengine"
    version = os.environ.get("GPUREADY_SIM_VERSION", "")
    if "--version" in args or "-v" in args:
        print(f"version: {version} ({SIMULATOR})")
        return 0
    _hw, faults = _load()
    if "driver-not-loaded" in faults or _module_version() is None:
        print(f"{tool}: NVML could not be initialized: the NVIDIA driver is not loaded "
              f"({SIMULATOR})", file=sys.stderr)
        return 1
    foreground = "-n" in args or "--no-daemon" in args
    if not foreground:
        print(f"Started host engine version {version} using port number: 5555", flush=True)
        if not _daemonize():
            return 0
    set_process_name(tool)
    _install_signals()
    _initialize()
    run = _run_dir()
    run.mkdir(parents=True, exist_ok=True)
    pid_file = run / "nv-hostengine.pid"
    _write_pid(pid_file, os.getpid())
    _ready()
    print(f"{tool}: DCGM {version} host engine running ({SIMULATOR})", file=sys.stderr,
          flush=True)
    _wait()
    pid_file.unlink(missing_ok=True)
    return 0


DAEMONS = {
    "nv-hostengine": hostengine,
    "nvidia-persistenced": persistenced,
    "nv-fabricmanager": fabricmanager,
    "gpu-feature-discovery": gpu_feature_discovery,
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
