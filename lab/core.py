"""Lab operations behind the CLI: up, down, status and faults on a running lab."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lab import controlplane, inventory, limits, repo, rootfs, snapshot
from lab import fleet as fleet_mod
from lab import hardware as hardware_mod
from lab import hosts as hosts_mod
from lab.errors import LabError
from lab.fleet import LabHost
from lab.paths import LabPaths

REQUIRED_TOOLS = ("systemd-nspawn", "debootstrap", "nsenter", "ssh-keygen", "gpg", "dpkg-deb",
                  "dpkg-scanpackages", "mount", "umount")
BOOT_TIMEOUT_S = 90.0
# Faults that act on the running host rather than on what the simulators print.
RUNTIME_FAULTS = ("ssh-down", "xid-79", "xid-48", "gpu-busy")
GPU_JOB_UNIT = "gpuready-lab-gpu-job"


@dataclass(frozen=True)
class LabState:
    fleet: str
    hosts: tuple[LabHost, ...]
    repo_port: int
    repo_pid: int | None
    started: float
    # host -> the converged snapshot it booted from (lab/snapshot.py); absent: the bare rootfs
    snapshots: dict[str, str] = field(default_factory=dict)

    def host(self, name: str) -> LabHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(f"no host '{name}' in the running lab ({', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


def load_state(paths: LabPaths) -> LabState | None:
    try:
        data = json.loads(paths.state_file.read_text())
    except FileNotFoundError:
        return None
    hosts = tuple(LabHost(**{**h, "faults": tuple(h["faults"])}) for h in data["hosts"])
    return LabState(fleet=data["fleet"], hosts=hosts, repo_port=data["repo_port"],
                    repo_pid=data.get("repo_pid"), started=data["started"],
                    snapshots=dict(data.get("snapshots") or {}))


def save_state(paths: LabPaths, state: LabState) -> None:
    paths.run.mkdir(parents=True, exist_ok=True)
    tmp = paths.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=1))
    os.replace(tmp, paths.state_file)


@contextlib.contextmanager
def locked(paths: LabPaths) -> Iterator[None]:
    """One lab command at a time on a lab directory."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with paths.lock_file.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"another lab command is running on {paths.root}") from None
        yield


def _check_tools() -> None:
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)} (run `make setup` as root)")
    if os.geteuid() != 0:
        raise LabError("the lab needs root (systemd-nspawn, overlay mounts)")


def _check_ssh_ports(hosts: list[LabHost]) -> None:
    for host in hosts:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host.address, host.port))
            except OSError as exc:
                raise LabError(
                    f"{host.name}: cannot listen on {host.address}:{host.port} "
                    f"({exc.strerror}; is a local sshd listening on 0.0.0.0:{host.port}? "
                    f"use --ssh-port)") from None


def ensure_ssh_key(paths: LabPaths) -> str:
    paths.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not paths.ssh_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuready-lab",
                        "-f", str(paths.ssh_key)], check=True)
    return paths.ssh_key.with_suffix(".pub").read_text()


def running_state(paths: LabPaths) -> LabState | None:
    """The state of a lab that has at least one live host, else None."""
    state = load_state(paths)
    if state is None:
        return None
    if any(hosts_mod.supervisor_pid(paths, h.name) for h in state.hosts):
        return state
    return state if hosts_mod.pid_alive(state.repo_pid) else None


def plan(fleet: str, nodes: int | None, faults: list[str], ssh_port: int) -> list[LabHost]:
    hosts = fleet_mod.load_fleet(fleet, nodes=nodes, port=ssh_port)
    return fleet_mod.apply_fault_args(hosts, faults)


def up(paths: LabPaths, fleet: str = "default", nodes: int | None = None,
       faults: list[str] | None = None, repo_port: int = repo.DEFAULT_PORT,
       ssh_port: int = 22, log: bool = True, converged: bool = False) -> LabState:
    """Boot the fleet. Every input, and what the fleet needs of this machine, is checked
    before anything starts. ``converged``: every GPU host whose converged snapshot exists in
    this lab directory boots from it (lab/snapshot.py); the others from the bare rootfs."""
    hosts = plan(fleet, nodes, faults or [], ssh_port)
    with locked(paths):
        current = running_state(paths)
        if current is not None:
            raise LabError(f"the lab is already running ({len(current.hosts)} hosts, fleet "
                           f"'{current.fleet}'); run `python -m lab down` first")
        limits.check_fleet(len(hosts), limits.read_limits(fleet_mod.MAX_HOSTS))
        _check_tools()
        _cleanup_leftovers(paths)
        _check_ssh_ports(hosts)
        # One cached rootfs per OS the fleet runs (built the first time it is needed).
        cached = {os_key: rootfs.ensure_rootfs(paths.cache, log=log, os_key=os_key)
                  for os_key in sorted({h.os for h in hosts})}
        repo.ensure_repo(paths)
        layers = _snapshot_layers(paths, hosts, repo_port) if converged else {}
        pubkey = ensure_ssh_key(paths)
        paths.run.mkdir(parents=True, exist_ok=True)
        state = LabState(fleet=fleet, hosts=tuple(hosts), repo_port=repo_port, repo_pid=None,
                         started=time.time(),
                         snapshots={n: layer.parent.name for n, layer in layers.items()})
        save_state(paths, state)
        try:
            state = replace(state, repo_pid=repo.start_server(paths, repo_port))
            save_state(paths, state)
            # A host booting from a converged snapshot boots healthy first: the lab then makes
            # what the snapshot leaves out as the roles made it on a healthy host (its CDI
            # spec), and gives it its faults after (as hardware that fails after a converge).
            known = [hosts_mod.prepare(paths, replace(h, faults=()) if h.name in layers else h,
                                       cached[h.os], pubkey,
                                       nspawn_args=controlplane.nspawn_args(paths, h),
                                       snapshot=layers.get(h.name))
                     for h in hosts]
            paths.known_hosts.write_text("".join(known))
            controlplane.provision(paths, hosts)
            for h in hosts:
                hosts_mod.start(paths, h)
            deadline = time.monotonic() + BOOT_TIMEOUT_S
            late = [h.name for h in hosts if not hosts_mod.wait_ssh(h, deadline)]
            if late:
                raise LabError(f"hosts did not answer SSH within {BOOT_TIMEOUT_S:.0f} s: "
                               f"{', '.join(late)} (logs kept in {paths.root}/last-failure/)")
            # A host answers SSH before systemd has finished booting (pam_nologin would greet
            # the first logins): wait for the boot to finish so the fleet is usable at once.
            late = [h.name for h in hosts if not hosts_mod.wait_running(paths, h.name, deadline)]
            if late:
                raise LabError(f"hosts did not finish booting within {BOOT_TIMEOUT_S:.0f} s: "
                               f"{', '.join(late)} (logs kept in {paths.root}/last-failure/)")
            for name, layer in layers.items():
                snapshot.after_boot(paths, name, layer)
                faults = state.host(name).faults
                hosts_mod.write_faults(paths, name, faults)
                if (paths.host_dir(name) / "hw" / "hardware.json").exists():
                    hardware_mod.write_ib_counters(paths.host_dir(name) / "hw", faults)
            for h in hosts:
                apply_runtime_faults(paths, h.name, h.faults, deadline)
            controlplane.boot(paths, hosts, time.monotonic() + controlplane.BOOT_TIMEOUT_S)
            inventory.write(paths, hosts, repo_port,
                            repo_key_fingerprint=repo.key_fingerprint(paths))
        except BaseException:
            _keep_logs(paths, state)
            _teardown(paths, state)
            raise
        return state


def _snapshot_layers(paths: LabPaths, hosts: list[LabHost], repo_port: int) -> dict[str, Path]:
    """The converged snapshot layer of each host that has one (lab/snapshot.py)."""
    fingerprint = repo.key_fingerprint(paths)
    layers = {}
    for h in hosts:
        if snapshot.usable(h):
            inputs = snapshot.host_inputs(paths, h, hosts, repo_port, fingerprint)
            layer = snapshot.find(paths, snapshot.key(inputs))
            if layer is not None:
                layers[h.name] = layer
    return layers


def take_snapshot(paths: LabPaths, name: str) -> Path:
    """Take the converged snapshot of running host ``name`` (lab/snapshot.py); returns it."""
    with locked(paths):
        state = running_state(paths)
        if state is None:
            raise LabError("the lab is not running (`python -m lab up` first)")
        host = state.host(name)
        if not snapshot.usable(host):
            raise LabError(f"{name}: a control-plane host, or one with a fault that acts while "
                           f"packages install ({', '.join(host.faults)}): not a converged "
                           "host another can stand for")
        inputs = snapshot.host_inputs(paths, host, list(state.hosts), state.repo_port,
                                      repo.key_fingerprint(paths))
        return snapshot.take(paths, name, inputs)


def _keep_logs(paths: LabPaths, state: LabState) -> None:
    """Save the hosts' console and supervisor logs before a failed `up` removes its hosts."""
    keep = paths.root / "last-failure"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for h in state.hosts:
        for log in ("console.log", "supervisor.log"):
            src = paths.host_dir(h.name) / log
            if src.exists():
                shutil.copyfile(src, keep / f"{h.name}-{log}")


def apply_runtime_faults(paths: LabPaths, name: str, faults: tuple[str, ...],
                         deadline: float, previous: tuple[str, ...] = ()) -> None:
    """Make the running host show faults that are not just simulator output."""
    if not (set(faults) | set(previous)) & set(RUNTIME_FAULTS):
        return
    if not hosts_mod.wait_running(paths, name, deadline):
        raise LabError(f"{name}: systemd did not finish booting in time")
    if "ssh-down" in faults:
        hosts_mod.host_exec(paths, name, ["systemctl", "stop", "ssh.socket", "ssh.service"])
    elif "ssh-down" in previous:
        hosts_mod.host_exec(paths, name, ["systemctl", "start", "ssh.service"])
    if "gpu-busy" in faults and "gpu-busy" not in previous:
        _start_gpu_job(paths, name, deadline)
    elif "gpu-busy" in previous and "gpu-busy" not in faults:
        hosts_mod.host_exec(paths, name, ["systemctl", "stop", GPU_JOB_UNIT])
    if {"xid-79", "xid-48"} & set(faults):
        proc = hosts_mod.host_exec(paths, name, ["python3", "/opt/gpuready-lab/sim/lab_kmsg.py"])
        if proc.returncode != 0:
            raise LabError(f"{name}: injecting Xid kernel messages failed: "
                           f"{(proc.stderr or proc.stdout).strip()}")


def _start_gpu_job(paths: LabPaths, name: str, deadline: float) -> None:
    """A process holding GPU 0 (lab/sim/gpu_job.py) as a transient unit; wait until it holds."""
    argv = ["systemd-run", f"--unit={GPU_JOB_UNIT}", "--collect",
            "--description=gpuready lab simulator: a GPU job (gpu-busy fault)",
            "/bin/bash", "-c", f"exec -a {GPU_JOB_UNIT} python3 /opt/gpuready-lab/sim/gpu_job.py 0"]
    hosts_mod.host_exec(paths, name, ["rm", "-f", "/run/gpuready-lab/gpu-job.ready"])
    proc = hosts_mod.host_exec(paths, name, argv)
    if proc.returncode != 0:
        raise LabError(f"{name}: starting the GPU job failed: "
                       f"{(proc.stderr or proc.stdout).strip()}")
    while time.monotonic() < deadline:
        if hosts_mod.host_exec(paths, name, ["test", "-e", "/run/gpuready-lab/gpu-job.ready"]
                               ).returncode == 0:
            return
        time.sleep(0.2)
    raise LabError(f"{name}: the GPU job did not start in time")


def set_faults(paths: LabPaths, name: str, add: list[str], remove: list[str],
               clear: bool) -> LabHost:
    """Change a running host's faults; the simulators see it on their next invocation."""
    for fault in (*add, *remove):
        fleet_mod.check_fault(fault)
    with locked(paths):
        state = running_state(paths)
        if state is None:
            raise LabError("the lab is not running (`python -m lab up` first)")
        host = state.host(name)
        before = hosts_mod.read_faults(paths, name)
        after = () if clear else tuple(f for f in dict.fromkeys((*before, *add))
                                       if f not in remove)
        hosts_mod.write_faults(paths, name, after)
        if (paths.host_dir(name) / "hw" / "hardware.json").exists():
            hardware_mod.write_ib_counters(paths.host_dir(name) / "hw", after, before)
        apply_runtime_faults(paths, name, after, time.monotonic() + 30, previous=before)
        new_host = replace(host, faults=after)
        save_state(paths, replace(state, hosts=tuple(new_host if h.name == name else h
                                                     for h in state.hosts)))
        return new_host


def down(paths: LabPaths) -> int:
    """Stop every host and the repository server; unmount everything. Returns hosts stopped."""
    with locked(paths):
        state = load_state(paths)
        if state is None:
            _cleanup_leftovers(paths)
            return 0
        return _teardown(paths, state)


def _teardown(paths: LabPaths, state: LabState) -> int:
    stopped = 0
    for h in state.hosts:
        if hosts_mod.supervisor_pid(paths, h.name):
            hosts_mod.stop(paths, h.name)
            stopped += 1
    deadline = time.monotonic() + 30
    for h in state.hosts:
        hosts_mod.wait_stopped(paths, h.name, deadline)
        hosts_mod.unmount(paths, h.name)
    repo.stop_server(state.repo_pid)
    inventory.remove(paths)
    _cleanup_leftovers(paths)
    return stopped


def _cleanup_leftovers(paths: LabPaths) -> None:
    """Unmount and delete a previous run's hosts (their disks do not outlive the lab)."""
    for mount in sorted(hosts_mod.lab_mounts(paths), key=len, reverse=True):
        subprocess.run(["umount", mount], capture_output=True, check=False)
    for mount in sorted(hosts_mod.lab_mounts(paths), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    if paths.run.exists():
        if hosts_mod.lab_mounts(paths):
            raise LabError(f"could not unmount everything under {paths.run}")
        shutil.rmtree(paths.run)


def host_processes(paths: LabPaths) -> list[int]:
    """PIDs of processes this lab started that are still alive (supervisors, nspawn, server)."""
    marker = str(paths.root)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found
