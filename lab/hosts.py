"""Lab host lifecycle: overlay, identity, boot (through the supervisor), SSH readiness, halt.

Each host is the cached rootfs under a copy-on-write overlay in ``.lab/run/hosts/<name>/``.
Its simulated hardware description (``hw/``) is bind-mounted read-only into the host, so the
roles cannot change it and the lab can change it (faults) while the host runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab import exporter, hardware
from lab.errors import LabError
from lab.fleet import LabHost
from lab.paths import REPO_ROOT, LabPaths


def _write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_faults(paths: LabPaths, name: str, faults: tuple[str, ...]) -> None:
    hardware.write_faults(paths.host_dir(name) / "hw", list(faults))


def read_faults(paths: LabPaths, name: str) -> tuple[str, ...]:
    try:
        data = json.loads((paths.host_dir(name) / "hw" / "faults.json").read_text())
    except FileNotFoundError:
        return ()
    return tuple(data.get("faults", ()))


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def lab_mounts(paths: LabPaths) -> list[str]:
    """Every mount point under the lab's run directory (what `lab down` must leave none of)."""
    prefix = str(paths.run) + "/"
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]


def prepare(paths: LabPaths, host: LabHost, rootfs: Path, pubkey: str,
            nspawn_args: tuple[str, ...] = (), snapshot: Path | None = None) -> str:
    """Make the host's overlay and identity; return its known_hosts line. ``nspawn_args``:
    what this host needs of systemd-nspawn beyond the lab's default (lab.supervisor);
    ``snapshot``: a converged host's layer (lab.snapshot) between the host's own and the
    rootfs."""
    hdir = paths.host_dir(host.name)
    for sub in ("upper", "work", "merged", "hw"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    merged = hdir / "merged"
    if not is_mounted(merged):
        lower = f"{snapshot}:{rootfs}" if snapshot else str(rootfs)
        opts = f"lowerdir={lower},upperdir={hdir / 'upper'},workdir={hdir / 'work'}"
        proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"{host.name}: overlay mount failed: {proc.stderr.strip()}")
    if host.hw_profile:  # a control-plane host has no simulated GPUs to describe
        hardware.write_hardware(hdir / "hw", hardware.render_host(host.hw_profile, host.name))
        hardware.write_ib_counters(hdir / "hw", host.faults)
        exporter.provision(merged)
    write_faults(paths, host.name, host.faults)
    _write_json_atomic(hdir / "spec.json", {
        "name": host.name, "address": host.address, "port": str(host.port),
        "pool": host.pool, "hw_profile": host.hw_profile, "os": host.os,
        "sim_dir": str(paths.sim_dir), "nspawn_args": list(nspawn_args),
        "rootfs": str(rootfs), "snapshot": str(snapshot) if snapshot else "",
    })

    etc = merged / "etc"
    (etc / "hostname").write_text(f"{host.name}\n")
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{host.address}\t{host.name}\n")
    machine_id = hashlib.sha256(f"gpuready-lab:{host.name}".encode()).hexdigest()[:32]
    (etc / "machine-id").write_text(machine_id + "\n")
    (etc / "ssh/sshd_config.d/00-gpuready-lab-listen.conf").write_text(
        f"# gpuready lab: each host listens only on its own loopback address\n"
        f"ListenAddress {host.address}\nPort {host.port}\n")
    hostkey = etc / "ssh/ssh_host_ed25519_key"
    if not hostkey.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                        f"root@{host.name}", "-f", str(hostkey)], check=True)
    ssh_dir = merged / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    auth = ssh_dir / "authorized_keys"
    auth.write_text(pubkey)
    auth.chmod(0o600)
    keytype, keydata = hostkey.with_suffix(".pub").read_text().split()[:2]
    who = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    return f"{who} {keytype} {keydata}\n"


def start(paths: LabPaths, host: LabHost) -> int:
    """Start the host's supervisor in its own session; return its pid."""
    hdir = paths.host_dir(host.name)
    log = (hdir / "supervisor.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "lab.supervisor", str(hdir)],
                            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    (hdir / "supervisor.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def host_cgroups(paths: LabPaths, name: str) -> list[Path]:
    """The cgroups the host's supervisor made and moved into (lab.supervisor writes them)."""
    try:
        text = (paths.host_dir(name) / "cgroups").read_text()
    except FileNotFoundError:
        return []
    return [Path(line) for line in text.splitlines() if line]


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it exited between the two looks
        return False


def supervisor_pid(paths: LabPaths, name: str) -> int | None:
    pid = _read_pid(paths.host_dir(name) / "supervisor.pid")
    return pid if pid_alive(pid) else None


def leader_pid(paths: LabPaths, name: str) -> int | None:
    """PID (on this machine) of the host's init, the child of its systemd-nspawn."""
    nspawn = _read_pid(paths.host_dir(name) / "nspawn.pid")
    if not pid_alive(nspawn):
        return None
    try:
        children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(children[0]) if children else None


def host_exec(paths: LabPaths, name: str, argv: list[str],
              timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a command inside a running host (the lab's back door; it does not need its sshd)."""
    leader = leader_pid(paths, name)
    if leader is None:
        raise LabError(f"{name} is not running")
    return subprocess.run(["nsenter", "-t", str(leader), "-a", *argv], capture_output=True,
                          text=True, timeout=timeout, check=False)


def wait_ssh(host: LabHost, deadline: float) -> bool:
    """True once the host's sshd answers with an SSH banner."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.address, host.port), timeout=1.0) as sock:
                sock.settimeout(2.0)
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def wait_running(paths: LabPaths, name: str, deadline: float) -> bool:
    """True once systemd in the host has finished booting (running or degraded)."""
    while time.monotonic() < deadline:
        if leader_pid(paths, name) is not None:
            try:
                proc = host_exec(paths, name, ["systemctl", "is-system-running"], timeout=5)
                if proc.stdout.strip() in ("running", "degraded"):
                    return True
            except (LabError, subprocess.TimeoutExpired):
                pass
        time.sleep(0.3)
    return False


def stop(paths: LabPaths, name: str) -> None:
    """Halt the host (SIGTERM to its supervisor, which halts nspawn) and wait for it."""
    pid = supervisor_pid(paths, name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)


def wait_stopped(paths: LabPaths, name: str, deadline: float) -> None:
    pid = supervisor_pid(paths, name)
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid) and pid is not None:
        # The supervisor did not finish in time: end the host's processes we started.
        nspawn = _read_pid(paths.host_dir(name) / "nspawn.pid")
        for victim in (nspawn, pid):
            if pid_alive(victim) and victim is not None:
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)


def unmount(paths: LabPaths, name: str) -> None:
    merged = paths.host_dir(name) / "merged"
    # nspawn may leave mounts below the overlay in our namespace only if it crashed: deepest first.
    for mount in sorted((m for m in lab_mounts(paths) if m.startswith(str(merged))),
                        key=len, reverse=True):
        subprocess.run(["umount", mount], capture_output=True, check=False)
    if is_mounted(merged):
        proc = subprocess.run(["umount", str(merged)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", str(merged)], capture_output=True, check=False)
