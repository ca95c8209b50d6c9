"""lab/sim/lab_kmsg.py: simulated Xid lines in the real NVRM wording, once per boot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "lab_kmsg.py"
# The Xid line shape of the real captures (fixtures/dmesg-xid), prefix stripped.
XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+), (.*)$")


def run_sim(tmp_path: Path) -> str:
    env = {"GPUREADY_LAB_HW": str(tmp_path / "hw"), "GPUREADY_LAB_RUN": str(tmp_path / "run")}
    out = subprocess.run([sys.executable, str(SIM), "--stdout"], env=env, capture_output=True,
                         text=True, timeout=10, check=True)
    return out.stdout


def test_xid_lines_match_real_shape_and_emit_once(tmp_path: Path, fixtures_dir: Path):
    hw = render_host("h100-sxm5-8x", "gpu-h100-01")
    write_hardware(tmp_path / "hw", hw)
    write_faults(tmp_path / "hw", ["xid-79", "xid-48"])
    real = (fixtures_dir / "dmesg-xid" / "xid13-xid43-dmesg-decode-iso-635-lines.log").read_text()
    real_xid = next(XID.search(x) for x in real.splitlines() if "Xid" in x)
    assert real_xid is not None and real_xid.group(3).startswith("pid='<unknown>', name=<unknown>")
    lines = run_sim(tmp_path).splitlines()
    matches = [m for x in lines if (m := XID.search(x))]
    assert [m.group(2) for m in matches] == ["79", "48"]
    last_bus = hw["gpus"][-1]["pci_bus_id"].lower()  # 00000000:db:00.0
    assert matches[0].group(1) == last_bus[4:-2]
    assert matches[0].group(3) == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert matches[1].group(1) == hw["gpus"][0]["pci_bus_id"].lower()[4:-2]
    assert "An uncorrectable double bit error (DBE) has been detected on GPU" in lines[-1]
    # Second run in the same boot: nothing new.
    assert run_sim(tmp_path) == ""


def test_no_xid_faults_no_lines(tmp_path: Path):
    write_hardware(tmp_path / "hw", render_host("a100-sxm4-8x", "gpu-a100-01"))
    write_faults(tmp_path / "hw", ["ecc-uncorrectable"])
    assert run_sim(tmp_path) == ""
