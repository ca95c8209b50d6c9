#!/usr/bin/env python3
"""gpuready lab simulator: inject the simulated NVIDIA Xid kernel messages of a lab host.

Run inside a host at boot (by a lab systemd unit) and on demand after the lab changes
faults.json. For each Xid fault in $GPUREADY_LAB_HW (default /opt/gpuready-lab/hw)/faults.json
it writes the driver's lines to the journal as kernel messages, through
`systemd-cat -t kernel -p warning` (never the real machine's /dev/kmsg), so
`journalctl -o short-iso SYSLOG_IDENTIFIER=kernel` shows them as it shows real NVRM lines.
`--stdout` prints the lines instead (tests, hosts without journald).

Each fault is emitted at most once per boot: a marker `kmsg-<fault>` in $GPUREADY_LAB_RUN
(default /run/gpuready-lab, a tmpfs that resets at reboot) records it.

Lines, in the real driver's wording (public captures: Xid 79 with its companion
"NVRM: GPU ...: GPU has fallen off the bus." line from nvidia-bug-report excerpts, Xid 48 from
an NVIDIA/gpu-operator issue 1146 paste; the `pid='<unknown>', name=<unknown>` form matches
fixtures/dmesg-xid; the PCI address is the GPU's from hardware.json, lower-case, no function):
  xid-79 (the last GPU, the one gpu-missing removes):
    NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: GPU 0000:db:00.0: GPU has fallen off the bus.
  xid-48 (GPU 0, the one ecc-uncorrectable marks):
    NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double
    bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x... partition N,
    subpartition M
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

XID_FAULTS = ("xid-79", "xid-48")


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _pci(gpu: dict[str, Any]) -> tuple[str, str]:
    """('0000:18:00', '0000:18:00.0') from hardware.json's '00000000:18:00.0'."""
    bus_id = str(gpu.get("pci_bus_id", "00000000:00:00.0")).lower()
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    short = f"{domain[-4:]}:{bus}:{device}"
    return short, f"{short}.{rest.split('.')[1] if '.' in rest else '0'}"


def xid_lines(fault: str, hw: dict[str, Any]) -> list[str]:
    """The NVRM lines the real driver logs for this fault on this node."""
    gpus = hw.get("gpus", [])
    if not gpus:
        return []
    if fault == "xid-79":
        short, full = _pci(gpus[-1])
        return [
            f"NVRM: Xid (PCI:{short}): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            f"NVRM: GPU {full}: GPU has fallen off the bus.",
        ]
    if fault == "xid-48":
        short, _ = _pci(gpus[0])
        seed = hashlib.sha256(f"{hw.get('hostname', '')}:xid48".encode()).digest()
        phys = int.from_bytes(seed[:5], "big") & 0xFFFFFFFE0
        return [
            f"NVRM: Xid (PCI:{short}): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
            f"double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
            f"0x{phys:x} partition {seed[5] % 8}, subpartition {seed[6] % 2}"
        ]
    return []


def emit(lines: list[str], to_stdout: bool) -> None:
    text = "".join(line + "\n" for line in lines)
    if to_stdout:
        sys.stdout.write(text)
        return
    systemd_cat = shutil.which("systemd-cat") or "/usr/bin/systemd-cat"
    subprocess.run(
        [systemd_cat, "-t", "kernel", "-p", "warning"], input=text, text=True, check=True
    )


def main(argv: list[str]) -> int:
    to_stdout = "--stdout" in argv[1:]
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults_path = _hw_dir() / "faults.json"
    faults: list[str] = []
    if faults_path.exists():
        faults = list(json.loads(faults_path.read_text()).get("faults", []))
    run_dir = _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    for fault in XID_FAULTS:
        marker = run_dir / f"kmsg-{fault}"
        if fault not in faults or marker.exists():
            continue
        lines = xid_lines(fault, hw)
        if lines:
            emit(lines, to_stdout)
        marker.write_text("emitted\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
