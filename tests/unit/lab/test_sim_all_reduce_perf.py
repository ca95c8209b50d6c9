"""lab/sim/all_reduce_perf.py held against the real nccl-tests captures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "all_reduce_perf.py"
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)((?:\s+\S+){8})\s*$")


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    hw_dir, run_dir = tmp_path / "hw", tmp_path / "run"
    write_hardware(hw_dir, render_host("h100-sxm5-8x", "gpu-h100-01"))
    write_faults(hw_dir, [])
    run_dir.mkdir()
    (run_dir / "nvidia-module-version").write_text("550.90.07\n")
    return {"hw": hw_dir, "run": run_dir}


def run_sim(
    node: dict[str, Path], *args: str, faults: list[str] | None = None, fm: bool = True,
    version: str = "2.13.10", tool: str = "all_reduce_perf", timeout: float = 10,
) -> subprocess.CompletedProcess[str]:
    if faults is not None:
        write_faults(node["hw"], faults)
    pid_file = node["run"] / "nv-fabricmanager.pid"
    if fm:
        # The fabric manager "runs" as this test process: the simulator checks the pid lives.
        pid_file.write_text(f"{__import__('os').getpid()}\n")
    else:
        pid_file.unlink(missing_ok=True)
    env = {
        "GPUREADY_LAB_HW": str(node["hw"]), "GPUREADY_LAB_RUN": str(node["run"]),
        "GPUREADY_SIM_TOOL": tool, "GPUREADY_SIM_VERSION": version, "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, str(SIM), *args], env=env, capture_output=True, text=True,
        timeout=timeout, check=False, cwd=node["hw"].parent,
    )


def table_rows(text: str) -> list[list[str]]:
    return [m.group(0).split() for line in text.splitlines() if (m := ROW.match(line))]


def _capture(fixtures_dir: Path, name: str) -> list[str]:
    return (fixtures_dir / "nccl-tests" / name).read_text().splitlines()


# A complete 2-node all_reduce (its publisher's markdown dropped trailing spaces) and a complete
# all_gather that kept them: the run's shape comes from the first, header bytes from the second.
K8S_ALL_REDUCE = "all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt"
SPACED_ALL_GATHER = "all_gather_perf-2node-2x-h200-gke-trailing-spaces-1K-8G.txt"


def test_header_and_table_lines_match_real_capture(node: dict[str, Path], fixtures_dir: Path):
    real = _capture(fixtures_dir, K8S_ALL_REDUCE)
    spaced = _capture(fixtures_dir, SPACED_ALL_GATHER)
    out = run_sim(node, "-b", "1024", "-e", "8G", "-f", "2", "-g", "8")
    assert out.returncode == 0, out.stderr
    sim = out.stdout.splitlines()
    # The nThread line differs only in the numbers the run asked for.
    assert sim[0] == real[0].replace("nGpus 1", "nGpus 8")
    assert sim[1:3] == real[1:3] == spaced[1:3] == ["#", "# Using devices"]
    # The three table header lines, byte for byte.
    spaced_hdr = spaced.index(next(x for x in spaced if "out-of-place" in x))
    sim_hdr = sim.index(next(x for x in sim if "out-of-place" in x))
    assert sim[sim_hdr : sim_hdr + 3] == spaced[spaced_hdr : spaced_hdr + 3]
    # Same sizes and counts as the capture's rows (same -b/-e/-f), same column layout.
    real_rows, sim_rows = table_rows("\n".join(real)), table_rows(out.stdout)
    assert [r[:5] for r in sim_rows] == [r[:5] for r in real_rows]
    for real_row, sim_row in zip(real_rows, sim_rows, strict=True):
        assert len(sim_row) == len(real_row) == 13
    assert "# Out of bounds values : 0 OK" in sim
    summary = re.compile(r"^# Avg bus bandwidth    : [\d.]+ $", re.M)
    assert summary.search(out.stdout) and summary.search("\n".join(spaced))


def test_rank_lines_carry_host_pid_bus_and_name(node: dict[str, Path]):
    hw = json.loads((node["hw"] / "hardware.json").read_text())
    out = run_sim(node, "-g", "8")
    ranks = [x for x in out.stdout.splitlines() if x.startswith("#  Rank")]
    assert len(ranks) == 8
    bus = int(hw["gpus"][3]["pci_bus_id"].split(":")[1], 16)
    # The layout of the real line: '#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s'
    assert re.fullmatch(
        rf"#  Rank  3 Group  0 Pid +\d+ on gpu-h100-01 device  3 \[0x{bus:02x}\] "
        r"NVIDIA H100 80GB HBM3",
        ranks[3],
    )


def test_busbw_saturates_towards_the_hardware_peak(node: dict[str, Path]):
    out = run_sim(node, "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    rows = table_rows(out.stdout)
    assert len(rows) == 31
    busbw = [float(r[7]) for r in rows]
    assert busbw[0] < 1.0  # latency bound at 8 bytes, as in the real curves
    assert 0.9 * 480 < busbw[-1] <= 480 * 1.02
    assert busbw[-1] > busbw[len(busbw) // 2] > busbw[0]
    # All-reduce bus bandwidth is algbw * 2(n-1)/n.
    for row in rows[-5:]:
        assert float(row[7]) == pytest.approx(float(row[6]) * 2 * 7 / 8, abs=0.02)
    # Deterministic: a rerun prints the same table.
    assert table_rows(run_sim(node, "-b", "8", "-e", "8G", "-f", "2", "-g", "8").stdout) == rows


def test_low_busbw_fault_lowers_the_peak(node: dict[str, Path]):
    healthy = table_rows(run_sim(node, "-b", "1G", "-e", "8G", "-f", "2", "-g", "8").stdout)
    low = table_rows(
        run_sim(
            node, "-b", "1G", "-e", "8G", "-f", "2", "-g", "8", faults=["nccl-low-busbw"]
        ).stdout
    )
    ratio = float(low[-1][7]) / float(healthy[-1][7])
    assert 0.5 < ratio < 0.7


def test_wrong_results_fault_reports_failures(node: dict[str, Path]):
    out = run_sim(
        node, "-b", "32M", "-e", "1G", "-f", "2", "-g", "8", faults=["nccl-wrong-results"]
    )
    assert out.returncode == 1
    rows = table_rows(out.stdout)
    assert int(rows[0][8]) == 0 and int(rows[-1][8]) > 0 and int(rows[-1][12]) > 0
    m = re.search(r"^# Out of bounds values : (\d+) FAILED$", out.stdout, re.M)
    assert m and int(m.group(1)) > 0


@pytest.mark.parametrize(
    ("faults", "fm", "error"),
    [
        (["driver-not-loaded"], True, "no CUDA-capable device is detected"),
        ([], False, "system not yet initialized"),
    ],
)
def test_cuda_failures_have_the_real_shape(
    node: dict[str, Path], fixtures_dir: Path, faults: list[str], fm: bool, error: str
):
    header = _capture(fixtures_dir, K8S_ALL_REDUCE)
    (real_failure,) = _capture(
        fixtures_dir,
        "all_gather_perf-4worker-b200-test-cuda-failure-invalid-device-ordinal-excerpt.txt",
    )
    out = run_sim(node, "-b", "8", "-e", "128M", "-f", "2", "-g", "8", faults=faults, fm=fm)
    assert out.returncode != 0
    lines = out.stdout.splitlines()
    assert lines[0] == (
        header[0]
        .replace("nGpus 1", "nGpus 8")
        .replace("minBytes 1024", "minBytes 8")
        .replace("maxBytes 8589934592", "maxBytes 134217728")
    )
    assert lines[1:3] == header[1:3]
    assert lines[3] == f"gpu-h100-01: Test CUDA failure common.cu:941 '{error}'"
    assert re.fullmatch(r" \.\. gpu-h100-01 pid \d+: Test failure common\.cu:891", lines[4])
    shape = re.compile(r"^\S+: Test CUDA failure common\.cu:\d+ '[^']+'$")
    assert shape.match(real_failure) and shape.match(lines[3])


def test_too_many_gpus_and_gpu_missing(node: dict[str, Path]):
    assert "'invalid device ordinal'" in run_sim(node, "-g", "9").stdout
    missing = run_sim(node, "-g", "8", faults=["gpu-missing"])
    assert missing.returncode == 2 and "'invalid device ordinal'" in missing.stdout
    assert run_sim(node, "-g", "7", faults=["gpu-missing"]).returncode == 0


def test_tool_hang_never_returns(node: dict[str, Path]):
    with pytest.raises(subprocess.TimeoutExpired):
        run_sim(node, "-g", "8", faults=["tool-hang"], timeout=1.5)


def test_other_collectives(node: dict[str, Path], fixtures_dir: Path):
    out = run_sim(node, "-b", "8", "-e", "64M", "-f", "2", "-g", "8", tool="all_gather_perf")
    rows = table_rows(out.stdout)
    # Sizes under one element per rank round down to 0, as in the real all_gather capture.
    assert rows[0][:4] == ["0", "0", "float", "none"]
    assert rows[-1][:2] == [str(64 * 1024 * 1024), str(64 * 1024 * 1024 // 4 // 8)]
    last = rows[-1]
    assert float(last[7]) == pytest.approx(float(last[6]) * 7 / 8, abs=0.02)


def test_json_only_from_2_17_and_in_the_real_schema(node: dict[str, Path]):
    old = run_sim(node, "-g", "8", "-J", "r.json")
    assert "invalid option" in old.stdout and not (node["hw"].parent / "r.json").exists()
    out = run_sim(node, "-b", "1M", "-e", "4M", "-f", "2", "-g", "8", "-J", "r.json",
                  version="2.17.1")
    assert out.returncode == 0
    assert out.stdout.startswith("# Writing JSON output to r.json\n# nccl-tests version 2.17.1")
    doc = json.loads((node["hw"].parent / "r.json").read_text())
    assert doc["version"] == 1 and doc["nccl_version"] == 22105
    assert doc["config"]["ngpus"] == 8 and doc["config"]["step_factor"] == 2
    assert doc["config"]["blocking_collectives"] == "false"
    assert doc["config"]["devices"][0]["device_hex"] == "0000:19:00"
    sizes = [r["size"] for r in doc["results"]]
    assert sizes == [1 << 20, 2 << 20, 4 << 20]
    text_rows = table_rows(out.stdout)
    assert doc["results"][-1]["in_place"]["bus_bw"] == pytest.approx(float(text_rows[-1][11]),
                                                                      abs=0.01)
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["average_bus_bandwidth"]["okay"] == "unchecked"
