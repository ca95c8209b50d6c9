"""One per lab host: runs its systemd-nspawn and brings the host back after a reboot.

`systemctl reboot` inside a host makes systemd-nspawn exit with status 133; a real machine comes
back with the same address and disk, so we start nspawn again on the same overlay. SIGTERM to
this process halts the host cleanly (SIGTERM to nspawn) and then exits.

Run as ``python -m lab.supervisor <host-dir>``; the lab starts it in its own session.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REBOOT_STATUS = 133
HALT_GRACE_S = 20.0


def nspawn_argv(host_dir: Path, spec: dict[str, str]) -> list[str]:
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
    ]


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
