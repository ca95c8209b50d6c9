"""One per lab host: runs its systemd-nspawn and brings the host back after a reboot.

`systemctl reboot` inside a host makes systemd-nspawn exit with status 133; a real machine comes
back with the same address and disk, so we start nspawn again on the same overlay. SIGTERM to
this process halts the host cleanly (SIGTERM to nspawn) and then exits.

Run as ``python -m lab.supervisor <host-dir>``; the lab starts it in its own session.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REBOOT_STATUS = 133
HALT_GRACE_S = 20.0


def nspawn_argv(host_dir: Path, spec: dict[str, Any]) -> list[str]:
    return [
        "systemd-nspawn",
        "--quiet",
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--machine={spec['name']}",
        f"--hostname={spec['name']}",
        f"--directory={host_dir / 'merged'}",
        f"--bind-ro={host_dir / 'hw'}:/opt/gpuready-lab/hw",
        f"--bind-ro={spec['sim_dir']}:/opt/gpuready-lab/sim",
        "--resolv-conf=copy-host",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        # What a host needs of nspawn beyond the default (a Kubernetes node's kubelet: writable
        # cgroups, /dev/kmsg); lab.hosts.prepare decides it per host.
        *spec.get("nspawn_args", []),
    ]


def cgroup_tag(host_dir: Path, name: str) -> str:
    """The host's cgroup name: unique per lab directory, so two labs never share one."""
    return hashlib.sha256(str(host_dir).encode()).hexdigest()[:10] + "-" + name


def cgroup_roots() -> list[Path]:
    """Where this process's per-host cgroup goes in each hierarchy: the root of cgroup2 and of
    the named systemd hierarchy (what systemd-nspawn uses), and this process's own cgroup in
    each cgroup v1 controller hierarchy (memory, cpu, ...), so that a host's kubelet writes
    only below the host's own cgroups and stays within any limit this process runs under."""
    current: dict[str, str] = {}
    with open("/proc/self/cgroup") as own:
        for line in own:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                current[controller] = path
    roots = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, target, fstype, options = line.split()[:4]
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options):
                roots.append(Path(target))
            elif fstype == "cgroup":
                mine = {current[o] for o in options.split(",") if o in current}
                if len(mine) == 1:
                    roots.append(Path(target) / mine.pop().lstrip("/"))
    return roots


def _make_cgroup(cgroup: Path) -> None:
    """mkdir -p, giving each new cpuset cgroup its parent's CPUs and memory nodes (a v1 cpuset
    cgroup starts with none, and nothing can join it until it has some)."""
    missing = [p for p in (cgroup, *cgroup.parents) if not p.exists()]
    for path in reversed(missing):
        path.mkdir()
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((path.parent / knob).read_text())


def _enter_own_cgroup(tag: str) -> list[Path]:
    """Move this process into its own cgroup in each hierarchy, so that the host's nspawn puts
    its `supervisor`/`payload` cgroups there. Without it every host shares one `/payload`
    tree and a unit stopped in one host (say ssh.service) is killed in all of them."""
    made = []
    for root in cgroup_roots():
        cgroup = root / "gpuready-lab" / tag
        try:
            _make_cgroup(cgroup)
            (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as exc:
            print(f"[gpuready lab] cannot use cgroup {cgroup}: {exc}", file=sys.stderr,
                  flush=True)
            continue
        made.append(cgroup)
    return made


def _leave_cgroups(cgroups: list[Path]) -> None:
    """Back to the hierarchy's root, then remove the (now empty) cgroups, deepest first."""
    for cgroup in cgroups:
        root = cgroup.parent.parent
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(f"{os.getpid()}\n")
        for dirpath, _dirs, _files in sorted(os.walk(cgroup), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        with contextlib.suppress(OSError):
            cgroup.parent.rmdir()  # gpuready-lab/, when no other host uses it


def _reapply_faults(host_dir: Path, name: str) -> None:
    from lab import core, hosts  # noqa: PLC0415 (only needed after a reboot)
    from lab.paths import LabPaths  # noqa: PLC0415

    paths = LabPaths(host_dir.parents[2])
    time.sleep(1.0)  # let the new nspawn write its pid
    try:
        core.apply_runtime_faults(paths, name, hosts.read_faults(paths, name),
                                  time.monotonic() + 60)
    except Exception as exc:
        print(f"[gpuready lab] {name}: re-applying faults after reboot failed: {exc}",
              file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    host_dir = Path(argv[1])
    spec = json.loads((host_dir / "spec.json").read_text())
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    cgroups = _enter_own_cgroup(cgroup_tag(host_dir, spec["name"]))
    # What `lab down` must leave empty, and what a test checks: the cgroups this host really
    # got (a hierarchy it could not use is said in supervisor.log above).
    (host_dir / "cgroups").write_text("".join(f"{c}\n" for c in cgroups))
    boots = 0
    with (host_dir / "console.log").open("ab") as console:
        while not stopping:
            boots += 1
            child = subprocess.Popen(nspawn_argv(host_dir, spec), stdin=subprocess.DEVNULL,
                                     stdout=console, stderr=console)
            (host_dir / "nspawn.pid").write_text(f"{child.pid}\n")
            (host_dir / "boots").write_text(f"{boots}\n")
            try:
                status = child.wait()
            except KeyboardInterrupt:
                status = child.wait()
            if stopping:
                break
            if status != REBOOT_STATUS:
                (host_dir / "exit_status").write_text(f"{status}\n")
                break
            console.write(f"\n[gpuready lab] {spec['name']} rebooted; starting it again\n"
                          .encode())
            console.flush()
            time.sleep(0.2)
            # Faults that live in the running host (sshd stopped, Xid lines) survive a reboot,
            # as broken hardware does: apply them again once the host has booted.
            threading.Thread(target=_reapply_faults, args=(host_dir, spec["name"]),
                             daemon=True).start()
        if child is not None and child.poll() is None:
            deadline = time.monotonic() + HALT_GRACE_S
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if child.poll() is None:
                child.kill()
                child.wait()
    (host_dir / "nspawn.pid").unlink(missing_ok=True)
    _leave_cgroups(cgroups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
