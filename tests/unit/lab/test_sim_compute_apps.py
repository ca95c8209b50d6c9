"""The simulated `nvidia-smi --query-compute-apps` against the real H100 capture: the same
header, the same row shape through the same parser, and a process appears only while it holds
a simulated GPU's device node open (the lab's gpu-busy job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lab import hardware
from tests.conftest import REPO_ROOT
from tests.unit.validate.parsers.test_nvidia_smi_golden import capture_sections
from validate.parsers import nvidia_smi_csv

SIM = REPO_ROOT / "lab" / "sim"
CAPTURE = "nvidia-smi-captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
FIELDS = "timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,used_gpu_memory"


def _env(tmp_path: Path) -> dict[str, str]:
    hw, run = tmp_path / "hw", tmp_path / "run"
    hw.mkdir(exist_ok=True)
    run.mkdir(exist_ok=True)
    (hw / "hardware.json").write_text(json.dumps(hardware.render_host("h100-sxm5-8x", "node1")))
    (hw / "faults.json").write_text(json.dumps({"faults": []}))
    (run / "nvidia-module-version").write_text("550.90.07\n")
    return {**os.environ, "GPUREADY_LAB_HW": str(hw), "GPUREADY_LAB_RUN": str(run),
            "GPUREADY_SIM_VERSION": "550.90.07"}


def _smi(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, str(SIM / "nvidia_smi.py"), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_idle_output_equals_the_real_idle_section(tmp_path: Path, fixtures_dir: Path) -> None:
    sections = capture_sections(fixtures_dir / CAPTURE)
    real_idle = sections["idle :: query-compute-apps (per-process)"]
    sim = _smi(_env(tmp_path), f"--query-compute-apps={FIELDS}", "--format=csv")
    assert sim.strip() == real_idle.strip()
    assert nvidia_smi_csv.parse_query_compute_apps(sim) == []


def test_a_job_holding_a_gpu_is_listed_like_the_real_load_rows(tmp_path: Path,
                                                               fixtures_dir: Path) -> None:
    env = _env(tmp_path)
    real = (fixtures_dir / "nvidia-smi-csv/h100-query-compute-apps-load.csv").read_text()
    job = subprocess.Popen([sys.executable, str(SIM / "gpu_job.py"), "0", "3"], env=env)
    try:
        ready = Path(env["GPUREADY_LAB_RUN"]) / "gpu-job.ready"
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sim = _smi(env, f"--query-compute-apps={FIELDS}", "--format=csv")
    finally:
        job.terminate()
        job.wait(timeout=30)
    assert sim.splitlines()[0] == real.splitlines()[0]
    apps = nvidia_smi_csv.parse_query_compute_apps(sim)
    real_apps = nvidia_smi_csv.parse_query_compute_apps(real)
    assert [a.pid for a in apps] == [job.pid, job.pid]
    gpus = json.loads((Path(env["GPUREADY_LAB_HW"]) / "hardware.json").read_text())["gpus"]
    assert [a.gpu_bus_id for a in apps] == [gpus[0]["pci_bus_id"], gpus[3]["pci_bus_id"]]
    # Every field the real rows fill, the simulated rows fill too.
    for field in ("gpu_uuid", "gpu_bus_id", "pid", "process_name", "used_memory_mib"):
        assert getattr(real_apps[0], field) is not None
        assert getattr(apps[0], field) is not None, field
    # Its cells have the real rows' shape (count, units, timestamp form).
    real_cells, sim_cells = real.splitlines()[1].split(", "), sim.splitlines()[1].split(", ")
    assert len(real_cells) == len(sim_cells) and sim_cells[-1].endswith(" MiB")
    assert len(sim_cells[0]) == len(real_cells[0])
    # The job is gone: the list is empty again, and its ready marker with it.
    assert nvidia_smi_csv.parse_query_compute_apps(
        _smi(env, f"--query-compute-apps={FIELDS}", "--format=csv")) == []
    assert not ready.exists()


def test_unknown_field_and_nounits(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = subprocess.run([sys.executable, str(SIM / "nvidia_smi.py"),
                           "--query-compute-apps=pid,bogus", "--format=csv"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and 'Field "bogus" is not a valid field' in proc.stdout
    out = _smi(env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert out == ""
