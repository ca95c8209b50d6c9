"""The cached root filesystems lab hosts boot from (copy-on-write overlays), one per OS.

A lab host runs one of ``OSES`` (``os: debian-12 | debian-13`` in a fleet file). Each OS has its
own cached debootstrap rootfs, rebuilt only when its recipe changes: the recipe (suite, mirror,
packages and the files this module writes into it) is hashed into the cache directory's name.
Only the OSes a fleet uses are built.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError


@dataclass(frozen=True)
class LabOs:
    """An OS lab hosts can run: its fleet-file key, Debian suite and what Ansible reports."""

    key: str  # the fleet files' `os:` value
    suite: str  # debootstrap suite
    distribution: str  # ansible_facts['distribution']
    major_version: str  # ansible_facts['distribution_major_version']

    @property
    def inventory_group(self) -> str:
        """The generated inventory's group of the hosts running this OS (e.g. os_debian_13)."""
        return "os_" + self.key.replace("-", "_")


OSES = {
    "debian-12": LabOs("debian-12", "bookworm", "Debian", "12"),
    "debian-13": LabOs("debian-13", "trixie", "Debian", "13"),
}
DEFAULT_OS = "debian-12"

MIRROR = "http://deb.debian.org/debian"
# What a bare Debian GPU host has before the roles run: systemd, sshd, python3 for Ansible,
# python3-apt for the apt module, kmod/procps/iproute2 as every real host has.
INCLUDE = (
    "systemd,systemd-sysv,dbus,openssh-server,python3,python3-apt,sudo,ca-certificates,"
    "gnupg,kmod,procps,iproute2,initramfs-tools,less"
)
# Downloaded (not installed) into the image's apt cache so that the roles' real installs of
# Debian packages on many hosts do not each fetch them again.
PREFETCH = ("containerd", "runc", "fio")
# Installed for the lab's own simulators, not for the roles: the SIMULATED NVIDIA device plugin
# (lab/sim/device_plugin.py) speaks the kubelet's device plugin gRPC API with Debian's gRPC and
# protobuf runtimes (grpcio 1.51, protobuf 3.21 on both bookworm and trixie), and reads its
# configuration (k8s-device-plugin's YAML config file, from the GPU Operator's ConfigMap) with
# Debian's PyYAML.
SIM_PACKAGES = ("python3-grpcio", "python3-protobuf", "python3-yaml")

SSHD_CONF = """\
# gpuready lab host: keys only; the lab writes ListenAddress per host before first boot.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
"""

RELEASE_NOTE = """\
This is a gpuready lab host (a systemd-nspawn container on loopback).
Its GPUs, NICs and vendor packages (NVIDIA driver, container toolkit, kubelet, nccl-tests,
ibstat) are SIMULATED by the gpuready lab simulator; Debian, systemd, sshd, apt, containerd
and fio are real. The simulated hardware is described in /opt/gpuready-lab/hw/.
"""

# Boot-time effects of the simulated hardware that live in the kernel log (Xid events): a lab
# unit, part of the simulated machine, not of anything the roles manage.
FAULTS_UNIT = """\
[Unit]
Description=gpuready lab simulator: kernel messages of the simulated GPUs (Xid faults)
ConditionPathExists=/opt/gpuready-lab/sim/lab_kmsg.py
After=systemd-journald.service

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /opt/gpuready-lab/sim/lab_kmsg.py
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""

# The simulated kernel loading the NVIDIA module at boot: the newest installed DKMS tree (what a
# real boot would load after a driver change). Part of the simulated machine, like the above.
MODULES_UNIT = """\
[Unit]
Description=gpuready lab simulator: load the simulated NVIDIA kernel module at boot
DefaultDependencies=no
Before=sysinit.target nvidia-persistenced.service nvidia-fabricmanager.service
ConditionPathExistsGlob=/usr/src/nvidia-*/dkms.conf

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'v=$(ls /usr/src | sed -n "s/^nvidia-//p" | sort -V | tail -n 1); \\
  mkdir -p /run/gpuready-lab && echo "$v" > /run/gpuready-lab/nvidia-module-version'

[Install]
WantedBy=sysinit.target
"""

# systemd-nspawn must leave CAP_SYS_ADMIN to the host's init, so logins (SSH: everything Ansible,
# testinfra and the validators do) run without it: they cannot mount, remount /proc/sys
# read-write or load modules, and so cannot change the machine the lab runs on.
SSHD_DROPIN = """\
[Service]
CapabilityBoundingSet=~CAP_SYS_ADMIN CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_TIME CAP_MKNOD
"""

# Timers that would take the dpkg lock in the middle of a converge on a freshly booted host.
MASKED_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer",
                "fstrim.timer", "systemd-timesyncd.service")


def lab_os(key: str) -> LabOs:
    try:
        return OSES[key]
    except KeyError:
        raise LabError(f"unknown os '{key}' (lab hosts run: {', '.join(OSES)})") from None


def recipe(os_key: str = DEFAULT_OS) -> dict[str, object]:
    return {
        "suite": lab_os(os_key).suite,
        "mirror": MIRROR,
        "include": INCLUDE,
        "prefetch": PREFETCH,
        "sim_packages": SIM_PACKAGES,
        "sshd": SSHD_CONF,
        "release": RELEASE_NOTE,
        "faults_unit": FAULTS_UNIT,
        "sshd_dropin": SSHD_DROPIN,
        "modules_unit": MODULES_UNIT,
        "masked": MASKED_UNITS,
        "version": 3,
    }


def recipe_hash(os_key: str = DEFAULT_OS) -> str:
    blob = json.dumps(recipe(os_key), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def rootfs_path(cache: Path, os_key: str = DEFAULT_OS) -> Path:
    return cache / f"rootfs-{lab_os(os_key).suite}-{recipe_hash(os_key)}"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise LabError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


# A recipe no checkout has used for this long is removed when another of its OS is built (a
# shared cache: a checkout at an older commit may still run hosts on its recipe).
STALE_RECIPE_S = 7 * 24 * 3600


def ensure_rootfs(cache: Path, log: bool = True, os_key: str = DEFAULT_OS) -> Path:
    """Return the cached rootfs of ``os_key`` for the current recipe, building it if needed.

    The cache may be shared by several checkouts: a build holds a lock per recipe, so a second
    checkout waits for it and then uses it instead of building its own over it.
    """
    suite = lab_os(os_key).suite
    target = rootfs_path(cache, os_key)
    complete = target / ".gpuready-lab-complete"
    if not complete.exists():
        if shutil.which("debootstrap") is None:
            raise LabError("debootstrap is not installed (run `make setup`)")
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f".{target.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another checkout is building this recipe: say so, rather than hang silently.
                print(f"lab: waiting for another process's build of {target} "
                      f"(lock {lock.name})", file=sys.stderr, flush=True)
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not complete.exists():
                _build(target, suite, os_key, log)
                _prune(cache, suite, target)
    os.utime(complete)  # last used: what pruning goes by
    return target


def _build(target: Path, suite: str, os_key: str, log: bool) -> None:
    building = target.with_name(target.name + ".building")
    if building.exists():
        shutil.rmtree(building)
    if log:
        print(f"lab: building {os_key} ({suite}) rootfs (a minute or two, cached in {target})",
              file=sys.stderr)
    _run(["debootstrap", "--variant=minbase", f"--include={INCLUDE}", suite, str(building),
          MIRROR], f"debootstrap {suite}")
    _customise(building)
    (building / ".gpuready-lab-complete").write_text(json.dumps(recipe(os_key), indent=1))
    building.rename(target)


def _prune(cache: Path, suite: str, target: Path) -> None:
    """Remove this OS's other recipes that no checkout has used for STALE_RECIPE_S."""
    now = time.time()
    for old in cache.glob(f"rootfs-{suite}-*"):
        if old == target or old.name.endswith(".building"):
            continue
        try:
            used = (old / ".gpuready-lab-complete").stat().st_mtime
        except OSError:
            used = 0.0  # never completed: nothing can be running on it
        if now - used > STALE_RECIPE_S:
            shutil.rmtree(old, ignore_errors=True)


def _customise(root: Path) -> None:
    # Host keys made by openssh-server's postinst would be shared by every host: each host
    # gets its own at `lab up`, collected into the lab's known_hosts.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/sshd_config.d/10-gpuready-lab.conf").write_text(SSHD_CONF)
    (root / "etc/gpuready-lab-release").write_text(RELEASE_NOTE)
    (root / "etc/motd").write_text(RELEASE_NOTE)
    unit_dir = root / "etc/systemd/system"
    (unit_dir / "ssh.service.d").mkdir(parents=True, exist_ok=True)
    (unit_dir / "ssh.service.d/10-gpuready-lab.conf").write_text(SSHD_DROPIN)
    (unit_dir / "gpuready-lab-faults.service").write_text(FAULTS_UNIT)
    wants = unit_dir / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "gpuready-lab-faults.service"
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/gpuready-lab-faults.service")
    (unit_dir / "gpuready-lab-modules.service").write_text(MODULES_UNIT)
    sysinit = unit_dir / "sysinit.target.wants"
    sysinit.mkdir(parents=True, exist_ok=True)
    link = sysinit / "gpuready-lab-modules.service"
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/gpuready-lab-modules.service")
    for unit in MASKED_UNITS:
        masked = unit_dir / unit
        if masked.exists() or masked.is_symlink():
            masked.unlink()
        masked.symlink_to("/dev/null")
    (root / "opt/gpuready-lab/hw").mkdir(parents=True, exist_ok=True)
    (root / "opt/gpuready-lab/sim").mkdir(parents=True, exist_ok=True)
    # Prefetch Debian packages the roles install for real, and leave fresh package lists.
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    shutil.copyfile("/etc/resolv.conf", resolv)
    _run(["chroot", str(root), "apt-get", "update", "-qq"], "apt-get update in the rootfs")
    _run(["chroot", str(root), "apt-get", "install", "-qq", "--download-only", "-y",
          *PREFETCH], "prefetching packages in the rootfs")
    _run(["chroot", str(root), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install",
          "-qq", "-y", "--no-install-recommends", *SIM_PACKAGES],
         "installing the simulators' packages in the rootfs")
