"""Converged snapshots: a lab host's disk as the roles left it, for other hosts to boot from.

Most lab tests are about what happens after bootstrap (join, validation, the gate, drift,
fabric, rolls); each used to pay a first converge of its own fleet, the most expensive thing
the lab does (the control node's Ansible work per host, and apt and dpkg on the same two
cores). A host that the roles converged can lend its disk instead: ``take`` copies its overlay's
upper layer (what the roles changed on the cached rootfs) into ``<lab dir>/snapshots/<key>``,
and ``python -m lab up --converged`` (``core.up(converged=True)``) boots every host whose key
has a snapshot with that layer between its own empty upper layer and the rootfs. The host then
runs ``site.yml`` as a re-converge, as a converged host in production would.

**The key** is the hash of everything that shaped a converge of that host (:func:`key`): the
rootfs recipe of its OS, its hardware profile and pool, the files the roles and playbooks are
made of (``roles/``, ``playbooks/``, ``ansible.cfg``), the inventory's values for it (the lab's
``group_vars/`` and what ``lab up`` generates, but for the host's own address and the values
only join and the gate read, :data:`NOT_BOOTSTRAP`), the lab's packages (the repository recipe,
its signing key and port) and the simulators the roles run. A change to any of them gives a new
key, so a stale snapshot is never found: it is never used, only left to ``lab down``.

**What is not kept**: the host's identity (SSH host keys, random seed, machine id, hostname:
``lab.hosts.prepare`` writes a booting host's own) and the CDI spec, which names the host's own
GPUs by UUID: after a host boots from a snapshot, the lab generates it again with the command
the nvidia_container_toolkit role runs, as ``lab.clone`` does for a copied disk.

**Who may take one**: a host the roles converged from the bare rootfs (not one that booted from
a snapshot itself), with no fault that acts while packages install (``hardware.CONVERGE_FAULTS``:
a host with one never boots from a snapshot either: its first converge is the test). The host is
halted while its disk is copied and booted again (a reboot), so no file is copied half-written.

Snapshots live in the lab directory (``snapshots/``), are made by the roles in the same lab
directory, and go with ``lab down --snapshots`` or ``make clean``; the lab tests remove them at
the start and the end of a session, so every snapshot a test boots from was made by the roles
earlier in the same test run (tests/lab/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lab import hardware, repo, rootfs
from lab import hosts as hosts_mod
from lab import inventory as inventory_mod
from lab.errors import LabError
from lab.fleet import CONTROL_PLANE, LabHost
from lab.paths import REPO_ROOT, LabPaths

FORMAT = 1
# The trees whose files shape a converge (roles, plays, Ansible's settings, what the roles run
# on a lab host: the simulators, and the lab code that writes what the roles read).
SHAPING = ("roles", "playbooks", "ansible.cfg", "lab/sim", "lab/packages.py", "lab/exporter.py",
           "lab/hardware.py", "lab/hardware", "lab/inventory.py", "lab/snapshot.py")
# Generated inventory values bootstrap.yml's roles never read (join and the gate do):
# tests/unit/lab/test_snapshot.py proves that no bootstrap role mentions them.
NOT_BOOTSTRAP = ("node_join_kubelet_configuration", "node_join_ignore_preflight_errors",
                 "gpuready_kubeconfig")
# The host's own: its address and port (each host has its own; nothing converged depends on it).
IDENTITY_VARS = ("ansible_host", "ansible_port")
# Files of a converged host that are the host's alone (relative to the overlay's upper dir).
IDENTITY_FILES = (
    "etc/ssh/ssh_host_ed25519_key",
    "etc/ssh/ssh_host_ed25519_key.pub",
    "etc/ssh/ssh_host_rsa_key",
    "etc/ssh/ssh_host_rsa_key.pub",
    "etc/ssh/ssh_host_ecdsa_key",
    "etc/ssh/ssh_host_ecdsa_key.pub",
    "var/lib/systemd/random-seed",
    "var/lib/systemd/credential.secret",
    "etc/machine-id",
    "etc/hostname",
    "etc/hosts",
    "etc/ssh/sshd_config.d/00-gpuready-lab-listen.conf",
    "root/.ssh/authorized_keys",
)
CDI_SPEC = "/etc/cdi/nvidia.yaml"
META = "snapshot.json"


def directory(paths: LabPaths) -> Path:
    return paths.root / "snapshots"


def _tree_digest(relative: Iterable[str]) -> str:
    """The content of these files and directories under the repository (names and bytes)."""
    digest = hashlib.sha256()
    for rel in relative:
        top = REPO_ROOT / rel
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def host_inputs(paths: LabPaths, host: LabHost, hosts: list[LabHost], repo_port: int,
                fingerprint: str) -> dict[str, Any]:
    """What, of the inventory, the repository and the host, shapes its converge."""
    rendered = inventory_mod.render(paths, hosts, repo_port, fingerprint)
    lab_vars = {k: v for k, v in rendered["all"]["vars"].items() if k not in NOT_BOOTSTRAP}
    pool = rendered["all"]["children"]["gpu_nodes"]["children"][host.pool]["hosts"][host.name]
    host_vars = {k: v for k, v in pool.items() if k not in (*NOT_BOOTSTRAP, *IDENTITY_VARS)}
    return {
        "format": FORMAT,
        "os": host.os,
        "rootfs": rootfs.recipe_hash(host.os),
        "hw_profile": host.hw_profile,
        "pool": host.pool,
        "lab_vars": lab_vars,
        "host_vars": host_vars,
        "group_vars": _tree_digest([str(paths.inventory_dir.relative_to(REPO_ROOT)
                                        / "group_vars")])
        if paths.inventory_dir.is_relative_to(REPO_ROOT)
        else _external_digest(paths.inventory_dir / "group_vars"),
        "repo": repo.recipe_hash(),
        "files": _tree_digest(SHAPING),
    }


def _external_digest(top: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in top.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(top)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def key(inputs: Mapping[str, Any]) -> str:
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def usable(host: LabHost) -> bool:
    """A GPU host without a fault that acts while packages install (its converge is the test)."""
    return host.kind != CONTROL_PLANE and not set(host.faults) & hardware.CONVERGE_FAULTS


def find(paths: LabPaths, snapshot_key: str) -> Path | None:
    """The snapshot's layer for this key, or None (never made in this lab directory)."""
    layer = directory(paths) / snapshot_key / "upper"
    return layer if (directory(paths) / snapshot_key / META).is_file() else None


def take(paths: LabPaths, name: str, inputs: Mapping[str, Any], timeout_s: float = 120.0,
         ) -> Path:
    """Halt ``name``, copy its upper layer into the snapshot of ``inputs``'s key, boot it again.

    The host must have booted from the bare rootfs (its spec names no snapshot layer). Returns
    the snapshot's directory; an existing one of the same key is kept (same inputs, same disk).
    """
    hdir = paths.host_dir(name)
    spec = json.loads((hdir / "spec.json").read_text())
    if spec.get("snapshot"):
        raise LabError(f"{name} booted from snapshot {spec['snapshot']}: only a host the roles "
                       "converged from the bare rootfs can be taken")
    snapshot_key = key(inputs)
    target = directory(paths) / snapshot_key
    if (target / META).is_file():
        return target
    host = _lab_host(spec)
    hosts_mod.stop(paths, name)
    hosts_mod.wait_stopped(paths, name, time.monotonic() + 30)
    building = target.with_name(target.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        # cp -a keeps owners, modes, xattrs (overlayfs opaque-directory marks) and the whiteout
        # device nodes that record files deleted from the rootfs: the layer works as a lower one.
        proc = subprocess.run(["cp", "-a", str(hdir / "upper"), str(building / "upper")],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"snapshot of {name}: {proc.stderr.strip()}")
        upper = building / "upper"
        had_cdi = (upper / CDI_SPEC.lstrip("/")).exists()
        for rel in (*IDENTITY_FILES, CDI_SPEC.lstrip("/")):
            (upper / rel).unlink(missing_ok=True)
        (building / META).write_text(json.dumps({
            "key": snapshot_key, "taken_from": name, "taken": time.time(), "cdi": had_cdi,
            "inputs": inputs}, indent=1, sort_keys=True, default=str) + "\n")
        os.replace(building, target) if not target.exists() else shutil.rmtree(building)
    finally:
        hosts_mod.start(paths, host)
        deadline = time.monotonic() + timeout_s
        if not (hosts_mod.wait_ssh(host, deadline) and hosts_mod.wait_running(paths, name,
                                                                              deadline)):
            raise LabError(f"snapshot: {name} did not boot again within {timeout_s:.0f} s")
        from lab import core  # noqa: PLC0415  (core imports this module)

        core.apply_runtime_faults(paths, name, hosts_mod.read_faults(paths, name), deadline)
    return target


def meta(layer: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((layer.parent / META).read_text())
    return data


def after_boot(paths: LabPaths, name: str, layer: Path) -> None:
    """What a host booted from ``layer`` needs to be the converged host it copies: its own CDI
    spec (its GPUs' UUIDs), made as the nvidia_container_toolkit role makes it."""
    if not meta(layer).get("cdi"):
        return
    proc = hosts_mod.host_exec(paths, name, ["nvidia-ctk", "cdi", "generate",
                                             f"--output={CDI_SPEC}"])
    if proc.returncode != 0:
        raise LabError(f"{name}: booted from snapshot {layer.parent.name}: nvidia-ctk cdi "
                       f"generate failed: {(proc.stderr or proc.stdout).strip()}")


def _lab_host(spec: Mapping[str, Any]) -> LabHost:
    return LabHost(name=spec["name"], pool=spec["pool"], hw_profile=spec["hw_profile"],
                   address=spec["address"], port=int(spec["port"]), os=spec["os"])


def remove_all(paths: LabPaths) -> int:
    """Remove every snapshot of this lab directory; returns how many there were."""
    top = directory(paths)
    if not top.exists():
        return 0
    count = sum(1 for p in top.iterdir() if (p / META).is_file())
    shutil.rmtree(top)
    return count

