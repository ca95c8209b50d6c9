"""What a lab fleet needs from this machine, against what the machine allows.

`lab up` asks before it boots anything: a fleet that cannot boot here is refused with one line
naming the limit and the setting to raise, instead of hosts that never answer SSH (each booted
host's systemd, journald, logind and dbus create inotify instances; past the machine's
``fs.inotify.max_user_instances`` the next ones fail with "Failed to create inotify object: Too
many open files" on the host's console, and the host never finishes booting).

Per-host figures are measured on a booted debian-12 lab host (docs/lab.md, "The lab's limit"):
inotify instances the host's processes hold, and the memory it adds. Every instance the
machine's user already holds (other labs, desktop tools) counts against the same limit, so the
figure compared is what is left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError

# Measured on booted debian-12 lab hosts, idle and converged alike (docs/lab.md, "The lab's limit"):
# the host's systemd holds 5, dbus-daemon, systemd-logind and agetty 1 each; systemd-nspawn and
# the supervisor none.
INOTIFY_PER_HOST = 8
# Measured: a converged host (containerd running) adds ~97 MiB PSS, its supervisor ~7 MiB; an
# idle one ~16 MiB. Rounded up for a converge's apt and Python.
MEMORY_PER_HOST_KIB = 128 * 1024
INOTIFY_SETTING = "fs.inotify.max_user_instances"


@dataclass(frozen=True, slots=True)
class MachineLimits:
    """This machine's limits as the lab sees them (``/proc``)."""

    inotify_max_instances: int  # fs.inotify.max_user_instances
    inotify_in_use: int  # inotify instances the lab's user already holds
    memory_available_kib: int  # MemAvailable
    addresses: int  # loopback addresses the lab's /24 offers its hosts


def read_limits(addresses: int, proc: Path = Path("/proc"), uid: int | None = None
                ) -> MachineLimits:
    """The machine's limits from ``proc`` (a real /proc, or a copy of its files in tests)."""
    uid = os.geteuid() if uid is None else uid
    try:
        max_instances = int((proc / "sys/fs/inotify/max_user_instances").read_text())
        available = _meminfo_kib(proc / "meminfo", "MemAvailable")
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read this machine's limits from {proc}: {exc}") from exc
    return MachineLimits(max_instances, inotify_instances(proc, uid), available, addresses)


def _meminfo_kib(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0])
    raise ValueError(f"{path} has no {key}")


def inotify_instances(proc: Path, uid: int) -> int:
    """Inotify instances held by processes of ``uid`` (one per open inotify descriptor; the
    kernel counts them per user, so other labs and tools of the same user count too)."""
    count = 0
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if pid_dir.stat().st_uid != uid:
                continue
            fds = list((pid_dir / "fd").iterdir())
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == "anon_inode:inotify":
                    count += 1
            except OSError:
                continue
    return count


def max_hosts(limits: MachineLimits) -> int:
    """The largest fleet this machine can boot now."""
    by_inotify = max(0, limits.inotify_max_instances - limits.inotify_in_use) // INOTIFY_PER_HOST
    by_memory = limits.memory_available_kib // MEMORY_PER_HOST_KIB
    return min(by_inotify, by_memory, limits.addresses)


def check_fleet(hosts: int, limits: MachineLimits) -> None:
    """Refuse a fleet of ``hosts`` that this machine cannot boot, naming the first limit it
    passes and the setting to raise. Raises :class:`LabError` (one line)."""
    fits = max_hosts(limits)
    if hosts <= fits:
        return
    free = max(0, limits.inotify_max_instances - limits.inotify_in_use)
    need = hosts * INOTIFY_PER_HOST
    if need > free:
        raise LabError(
            f"{hosts} hosts need {need} inotify instances ({INOTIFY_PER_HOST} each) but "
            f"{INOTIFY_SETTING} is {limits.inotify_max_instances} with "
            f"{limits.inotify_in_use} in use; raise it with `sysctl -w {INOTIFY_SETTING}="
            f"{limits.inotify_in_use + need + INOTIFY_PER_HOST}` or boot at most {fits} hosts")
    mem_need = hosts * MEMORY_PER_HOST_KIB
    if mem_need > limits.memory_available_kib:
        raise LabError(
            f"{hosts} hosts need {mem_need // 1024} MiB of memory ({MEMORY_PER_HOST_KIB // 1024} "
            f"MiB each) but MemAvailable is {limits.memory_available_kib // 1024} MiB; free "
            f"memory or boot at most {fits} hosts")
    raise LabError(
        f"{hosts} hosts need {hosts} loopback addresses but the lab's /24 (GPUREADY_LAB_NET) "
        f"offers {limits.addresses}; boot at most {fits} hosts")
