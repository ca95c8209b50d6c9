"""lab/sim/all_reduce_perf.py as a real MPI program (mpi4py under Open MPI's mpirun), held
against the real multi-node nccl-tests captures.

Two simulated nodes on this machine: one mpirun, one process per node (MPMD, each with its own
hardware directory), exchanging their rail state with a real MPI_Allreduce. Needs Debian's
openmpi-bin and python3-mpi4py (`make setup` installs them); the lab runs the same program on
two lab hosts over SSH (tests/lab/test_fabric.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from lab.hardware import render_host, write_faults, write_hardware
from validate.parsers import nccl

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "all_reduce_perf.py"
MULTINODE = "nccl-tests-multinode"
# 2.18.3, two nodes, complete (summary and trailer lines); 2.17.9, four nodes, header and rows.
GH200_2NODE = "all_reduce_perf-2node-8x-gh200-slingshot-ofi-srun-apptainer-1B-128M.txt"
GH200_4NODE = (
    "all_reduce_perf-4node-16x-gh200-slingshot-ofi-ll128-data-corruption-wrong-nonzero.txt"
)
P5_2NODE = "nccl-tests/all_reduce_perf-2x-p5-h100-srun-label-table-only.txt"
RANK_LINE = re.compile(
    r"^#  Rank (?P<rank>[ \d]\d) Group  0 Pid (?P<pid>[ \d]{5}\d) on (?P<host>[ \S]{10}) "
    r"device (?P<dev>[ \d]\d) \[[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\] (?P<name>.+)$"
)
EIGHT_GIB = ("-b", "8G", "-e", "8G", "-f", "2", "-g", "8", "-c", "1", "-n", "20", "-w", "5")

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/mpirun").exists() or not Path("/usr/bin/python3").exists(),
    reason="needs Debian's openmpi-bin and python3-mpi4py (make setup)",
)


def _node(root: Path, name: str, faults: list[str]) -> dict[str, Path]:
    hw, run = root / name / "hw", root / name / "run"
    write_hardware(hw, render_host("h100-sxm5-8x", name))
    write_faults(hw, faults)
    run.mkdir(parents=True, exist_ok=True)
    (run / "nvidia-module-version").write_text("550.90.07\n")
    # The fabric manager "runs" as this test process: the simulator checks the pid lives.
    (run / "nv-fabricmanager.pid").write_text(f"{os.getpid()}\n")
    return {"hw": hw, "run": run}


def mpirun_pair(
    tmp_path: Path, *args: str, a: list[str] | None = None, b: list[str] | None = None,
    env: dict[str, str] | None = None, timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """One mpirun, one process per simulated node (gpu-a is rank 0)."""
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader,tcp"]
    for i, (name, faults) in enumerate((("gpu-a", a or []), ("gpu-b", b or []))):
        node = _node(tmp_path, name, faults)
        if i:
            argv.append(":")
        argv += ["-np", "1"]
        for key, value in {"GPUREADY_LAB_HW": str(node["hw"]), "GPUREADY_LAB_RUN": str(node["run"]),
                           "GPUREADY_SIM_TOOL": "all_reduce_perf",
                           "GPUREADY_SIM_VERSION": "2.17.1", **(env or {})}.items():
            argv += ["-x", f"{key}={value}"]
        argv += ["/usr/bin/python3", str(SIM), *args]
    # Its own session, so that a hung run is killed with every rank it started.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _capture(fixtures_dir: Path, name: str) -> list[str]:
    return (fixtures_dir / MULTINODE / name).read_text().splitlines()


def _busbw(text: str) -> float:
    return nccl.parse_text(text).largest_row.busbw_gbps


def test_output_is_shaped_like_the_real_multinode_captures(tmp_path: Path, fixtures_dir: Path):
    out = mpirun_pair(tmp_path, "-b", "1", "-e", "128M", "-f", "2", "-g", "8")
    assert out.returncode == 0, out.stderr
    sim = out.stdout.splitlines()
    two, four = _capture(fixtures_dir, GH200_2NODE), _capture(fixtures_dir, GH200_4NODE)
    # Preamble: the same lines, the versions and the run's own numbers aside.
    assert re.fullmatch(r"# nccl-tests version 2\.17\.1 nccl-headers=\d+ nccl-library=\d+",
                        sim[0])
    assert sim[1] == two[1] == four[1] == "# Collective test starting: all_reduce_perf"
    assert sim[2] == four[2].replace("nGpus 1", "nGpus 8").replace("warmup iters: 1",
                                                                   "warmup iters: 5")
    assert sim[3:5] == four[3:5] == ["#", "# Using devices"]
    # Rank lines in rank order, every device of one node, then the next node's, numbered
    # per node, as gathered to rank 0 in the real runs.
    ranks = [RANK_LINE.match(line) for line in sim[5:21]]
    real = [RANK_LINE.match(line) for line in four[5:21]]
    assert all(ranks) and all(real)
    assert [m["rank"].strip() for m in ranks if m] == [str(i) for i in range(16)]
    assert [m["host"].strip() for m in ranks if m] == ["gpu-a"] * 8 + ["gpu-b"] * 8
    assert [m["dev"].strip() for m in ranks if m] == [str(i % 8) for i in range(16)]
    assert len({m["pid"] for m in ranks if m}) == 2  # one process per node drives 8 GPUs
    assert sim[21] == four[21] == "#"
    assert sim[22:25] == four[22:25]  # the three table header lines, byte for byte
    rows = [line for line in sim if re.match(r"^\s+\d+\s+\d+\s+float", line)]
    real_rows = [line for line in four if re.match(r"^\s+\d+\s+\d+\s+int8", line)]
    assert len(rows) == len(real_rows) == 28
    assert {len(r) for r in rows} == {len(r) for r in real_rows} == {118}
    tail = [x for x in sim if x.startswith("# Out of") or x.startswith("# Avg")
            or x.startswith("# Collective test concluded")]
    real_tail = [x for x in two if x.startswith("# Out of") or x.startswith("# Avg")
                 or x.startswith("# Collective test concluded")]
    assert [x.split(":")[0] for x in tail] == [x.split(":")[0] for x in real_tail]
    assert re.fullmatch(r"# Avg bus bandwidth    : [\d.]+ ", tail[1])
    assert re.fullmatch(r"# Avg bus bandwidth    : [\d.]+ ", real_tail[1])


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return mpirun_pair(tmp_path_factory.mktemp("healthy"), *EIGHT_GIB)


def test_healthy_pair_measures_what_published_h100_pairs_do(
    healthy: subprocess.CompletedProcess[str], fixtures_dir: Path
):
    assert healthy.returncode == 0, healthy.stderr
    run = nccl.parse_text(healthy.stdout)
    assert run.hosts == ("gpu-a", "gpu-b") and len(run.devices) == 16
    # 2x 8 H100 with 3200 Gb/s per node measured 479.28 GB/s at 8 GiB (row prefixed "0: ").
    real = next(line for line in (fixtures_dir / P5_2NODE).read_text().splitlines()
                if line.split()[1:2] == ["8589934592"])
    assert float(real.split()[8]) == 479.28
    assert run.largest_row.busbw_gbps == pytest.approx(479.28, rel=0.04)


@pytest.mark.parametrize(("fault", "on"), [("ib-link-degraded", "a"),
                                           ("ib-link-degraded", "b"), ("ib-rail-down", "b")])
def test_one_weak_rail_on_either_node_halves_the_pair(
    tmp_path: Path, healthy: subprocess.CompletedProcess[str], fault: str, on: str
):
    faulty = mpirun_pair(tmp_path, *EIGHT_GIB, **{on: [fault]})  # type: ignore[arg-type]
    assert faulty.returncode == 0, faulty.stderr
    assert 0.45 < _busbw(faulty.stdout) / _busbw(healthy.stdout) < 0.55


def test_nccl_ib_hca_selects_the_rails(tmp_path: Path, healthy: subprocess.CompletedProcess[str]):
    # Seven of eight HCAs: one rail carries two GPUs' channels, so the pair runs at half.
    seven = mpirun_pair(tmp_path, *EIGHT_GIB,
                        env={"NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6"})
    assert 0.45 < _busbw(seven.stdout) / _busbw(healthy.stdout) < 0.55
    assert _busbw(mpirun_pair(tmp_path, *EIGHT_GIB, env={"NCCL_IB_HCA": "mlx5"}).stdout) == (
        pytest.approx(_busbw(healthy.stdout), rel=0.01))
    # No HCA at all: NCCL falls back to sockets.
    assert _busbw(mpirun_pair(tmp_path, *EIGHT_GIB, env={"NCCL_IB_HCA": "^mlx5"}).stdout) < 5


def test_wrong_results_on_either_node_fail_the_pair(tmp_path: Path):
    out = mpirun_pair(tmp_path, *EIGHT_GIB, b=["nccl-wrong-results"])
    assert out.returncode != 0
    assert nccl.parse_text(out.stdout).largest_row.wrong


def test_a_failing_rank_ends_the_job_through_mpirun(tmp_path: Path):
    out = mpirun_pair(tmp_path, *EIGHT_GIB, b=["driver-not-loaded"])
    assert out.returncode != 0
    assert "gpu-b: Test CUDA failure common.cu:941 'no CUDA-capable device is detected'" in (
        out.stdout)
    # Open MPI's own report of the process that exited (not the simulator's text).
    assert "exited with non-zero status" in out.stderr or "non-zero exit code" in out.stderr
    with pytest.raises(nccl.ParseError, match="Test CUDA failure"):
        nccl.parse_text(out.stdout)


def test_a_hung_peer_holds_the_whole_job(tmp_path: Path):
    with pytest.raises(subprocess.TimeoutExpired):
        mpirun_pair(tmp_path, *EIGHT_GIB, b=["tool-hang"], timeout=5)
