"""Copy one lab host's disk (its overlay's upper layer) to other hosts of the running lab.

A converge of N hosts costs about N times the control node's Ansible work, and on a 2-core
machine the hosts' apt and dpkg run on the same cores: converging one host and copying its
disk gives N converged hosts for the price of one. The copies keep their own identity: the lab
writes hostname, hosts file, machine-id, sshd listen address and a new SSH host key again, as
for a fresh host; the CDI spec (which names the GPUs, whose UUIDs differ per host) is generated
again on each copy with the same command the nvidia_container_toolkit role runs.

Every host involved is halted while its disk is copied or replaced, then booted again (a
reboot, as after a kernel update), so no file is copied half-written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from lab import core, rootfs, snapshot
from lab import hosts as hosts_mod
from lab.errors import LabError
from lab.paths import LabPaths

# What belongs to the source alone (its identity) and the CDI spec (its GPUs) are not copied.
IDENTITY = snapshot.IDENTITY_FILES
CDI_SPEC = snapshot.CDI_SPEC


def clone(paths: LabPaths, source: str, targets: list[str], timeout_s: float = 120.0) -> None:
    """Give every host in ``targets`` a copy of ``source``'s disk (module docstring)."""
    if not targets:
        return
    with core.locked(paths):
        state = core.running_state(paths)
        if state is None:
            raise LabError("the lab is not running (`python -m lab up` first)")
        names = [source, *targets]
        hosts = {n: state.host(n) for n in names}
        if source in targets or len(set(targets)) != len(targets):
            raise LabError("clone: the source and each target must be different hosts")
        for name in names:
            hosts_mod.stop(paths, name)
        deadline = time.monotonic() + 30
        for name in names:
            hosts_mod.wait_stopped(paths, name, deadline)
            hosts_mod.unmount(paths, name)
        # The copies stand on the source's lower layers (its OS's rootfs, and the converged
        # snapshot it booted from, if any): its upper layer means nothing on others.
        specs = {n: json.loads((paths.host_dir(n) / "spec.json").read_text()) for n in names}
        lowers = {n: specs[source] if n in targets else specs[n] for n in names}
        upper = paths.host_dir(source) / "upper"
        had_cdi = (upper / CDI_SPEC.lstrip("/")).exists()
        for name in targets:
            tdir = paths.host_dir(name)
            for sub in ("upper", "work"):
                shutil.rmtree(tdir / sub, ignore_errors=True)
            # cp -a keeps owners, modes, xattrs (overlayfs opaque-directory marks) and the
            # whiteout device nodes that record files deleted from the lower layer.
            proc = subprocess.run(["cp", "-a", str(upper), str(tdir / "upper")],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise LabError(f"clone {source} -> {name}: {proc.stderr.strip()}")
            for rel in (*IDENTITY, CDI_SPEC.lstrip("/")):
                (tdir / "upper" / rel).unlink(missing_ok=True)
        pubkey = core.ensure_ssh_key(paths)
        lines = {h.name: "" for h in state.hosts}
        for name in names:
            host = hosts[name]
            # prepare() writes the faults the state lists; keep the ones the host has now.
            host = replace(host, faults=hosts_mod.read_faults(paths, name))
            lines[name] = hosts_mod.prepare(
                paths, host, Path(lowers[name].get("rootfs") or rootfs.ensure_rootfs(
                    paths.cache, log=False, os_key=host.os)), pubkey,
                nspawn_args=tuple(specs[name].get("nspawn_args", ())),
                snapshot=Path(lowers[name]["snapshot"]) if lowers[name].get("snapshot")
                else None)
        known = [ln for ln in paths.known_hosts.read_text().splitlines(keepends=True)
                 if not any(ln.startswith(f"{hosts[n].address} ") or
                            ln.startswith(f"[{hosts[n].address}]:") for n in names)]
        paths.known_hosts.write_text("".join(known) + "".join(lines[n] for n in names))
        for name in names:
            hosts_mod.start(paths, hosts[name])
        deadline = time.monotonic() + timeout_s
        late = [n for n in names if not (hosts_mod.wait_ssh(hosts[n], deadline)
                                        and hosts_mod.wait_running(paths, n, deadline))]
        if late:
            raise LabError(f"clone: hosts did not boot again within {timeout_s:.0f} s: "
                           f"{', '.join(late)}")
        for name in names:
            core.apply_runtime_faults(paths, name, hosts_mod.read_faults(paths, name),
                                      deadline)
        if had_cdi:
            for name in targets:
                proc = hosts_mod.host_exec(paths, name, ["nvidia-ctk", "cdi", "generate",
                                                         f"--output={CDI_SPEC}"])
                if proc.returncode != 0:
                    raise LabError(f"clone: {name}: nvidia-ctk cdi generate failed: "
                                   f"{(proc.stderr or proc.stdout).strip()}")
