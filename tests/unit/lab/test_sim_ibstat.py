"""lab/sim/ibstat.py held against the real ibstat captures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "ibstat.py"


def run_sim(hw_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUREADY_LAB_HW": str(hw_dir), "GPUREADY_SIM_TOOL": "ibstat",
           "GPUREADY_SIM_VERSION": "2410mlnx54"}
    return subprocess.run([sys.executable, str(SIM), *args], env=env, capture_output=True,
                          text=True, timeout=10, check=False)


@pytest.fixture
def h100(tmp_path: Path) -> Path:
    write_hardware(tmp_path, render_host("h100-sxm5-8x", "gpu-h100-01"))
    write_faults(tmp_path, [])
    return tmp_path


def keys(text: str) -> list[str]:
    return [line.split(":")[0].strip() for line in text.splitlines()]


def test_blocks_have_the_real_fields_in_the_real_order(h100: Path, fixtures_dir: Path):
    real = (fixtures_dir / "ibstat" / "ibstat-a100-node-all-active.txt").read_text()
    real_block = real.split("CA '")[1]
    out = run_sim(h100)
    assert out.returncode == 0
    blocks = out.stdout.split("CA '")[1:]
    assert len(blocks) == 8
    # Same fields, same order and the same tab indentation as the real (tab) capture.
    assert keys(blocks[0]) == keys(real_block)
    indents = [re.match(r"\t*", x).group(0) for x in blocks[0].splitlines()[1:]]
    assert indents == [re.match(r"\t*", x).group(0) for x in real_block.splitlines()[1:]]
    assert "\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n" in blocks[0]
    assert "\t\tLink layer: InfiniBand\n" in blocks[0]
    assert re.search(r"\tNode GUID: 0x[0-9a-f]{16}\n", blocks[0])


def test_list_and_single_ca(h100: Path):
    names = run_sim(h100, "-l").stdout.split()
    assert names == [f"mlx5_{i}" for i in range(8)]
    one = run_sim(h100, "mlx5_3")
    assert one.stdout.startswith("CA 'mlx5_3'\n") and one.stdout.count("CA '") == 1


def test_unknown_ca_panics_like_the_real_tool(h100: Path, fixtures_dir: Path):
    real = (fixtures_dir / "ibstat" / "ibstat-a100-azure-hdr200-ibpanic-exit255.txt").read_text()
    real_panic = next(x for x in real.splitlines() if x.startswith("ibpanic"))
    out = run_sim(h100, "mlx5_8")
    assert out.returncode == 255
    shape = r"ibpanic: \[\d+\] main: stat of IB device '(mlx5_8)' failed: No such file or directory"
    assert re.fullmatch(shape, real_panic) and re.fullmatch(shape, out.stderr.strip())


def test_port_down_fault(h100: Path):
    write_faults(h100, ["ib-port-down"])
    blocks = run_sim(h100).stdout.split("CA '")[1:]
    assert "\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 10\n" in blocks[0]
    assert all("State: Active" in b for b in blocks[1:])


def test_rail_down_and_degraded_link_faults(h100: Path):
    write_faults(h100, ["ib-rail-down"])
    blocks = run_sim(h100).stdout.split("CA '")[1:]
    # The switch disabled the last rail's port: Down/Disabled, no rate, no lids.
    assert blocks[-1].startswith("mlx5_7'")
    assert "\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 10\n" in blocks[-1]
    assert all("State: Active" in b for b in blocks[:-1])
    # A marginal link trains at full rate: ibstat cannot tell it from a healthy one.
    write_faults(h100, ["ib-link-degraded"])
    degraded = run_sim(h100).stdout
    write_faults(h100, [])
    assert degraded == run_sim(h100).stdout


def test_node_without_hcas(tmp_path: Path):
    write_hardware(tmp_path, render_host("l40s-pcie-4x", "gpu-l40s-01"))
    out = run_sim(tmp_path)
    assert out.returncode == 255 and out.stdout == ""
    assert out.stderr.startswith("ibpanic: [")
