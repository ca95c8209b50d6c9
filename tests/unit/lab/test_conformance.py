"""Fidelity rule (DESIGN.md): each lab simulator and the REAL samples of the same tool go through
the same parser, and the parser finds the same fields in both.

The simulators never import the parsers (nor the reverse); only this test connects them. A field
the real sample has and the simulator's output lacks would make the lab prove less than
production needs, and the reverse would mean the simulator invents structure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import hardware
from tests.conftest import REPO_ROOT
from validate.parsers import (
    ibstat,
    nccl,
    nvidia_smi_csv,
    nvidia_smi_nvlink,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvidia_smi_xml,
    xid,
)

SIM = REPO_ROOT / "lab" / "sim"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Any]:
    """A simulated H100 node in tmp dirs; ``node(tool, script, version, *args, faults=())``."""

    def run(tool: str, script: str, version: str, *args: str,
            hw_profile: str = "h100-sxm5-8x", faults: tuple[str, ...] = ()) -> str:
        hw_dir = tmp_path / f"hw-{hw_profile}"
        run_dir = tmp_path / "run"
        hw_dir.mkdir(exist_ok=True)
        run_dir.mkdir(exist_ok=True)
        (hw_dir / "hardware.json").write_text(
            json.dumps(hardware.render_host(hw_profile, "node1")))
        (hw_dir / "faults.json").write_text(json.dumps({"faults": list(faults)}))
        # The simulated kernel has the driver loaded and fabric manager is up (this process
        # stands in for it: all the simulator checks is that the pid is alive).
        (run_dir / "nvidia-module-version").write_text("550.90.07\n")
        (run_dir / "nv-fabricmanager.pid").write_text(f"{os.getpid()}\n")
        env = {**os.environ, "GPUREADY_LAB_HW": str(hw_dir), "GPUREADY_LAB_RUN": str(run_dir),
               "GPUREADY_SIM_TOOL": tool, "GPUREADY_SIM_VERSION": version,
               "GPUREADY_LAB_ROOT": str(tmp_path)}
        proc = subprocess.run([sys.executable, str(SIM / script), *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False,
                              cwd=tmp_path)
        assert proc.returncode == 0, f"{tool} {args}: {proc.stderr}"
        return proc.stdout

    yield run


def populated(obj: Any, prefix: str = "") -> set[str]:
    """Dotted names of the fields a parser filled (not None, not empty)."""
    found: set[str] = set()
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            found |= populated(getattr(obj, f.name), f"{prefix}{f.name}.")
        return found
    if isinstance(obj, tuple | list):
        for item in obj:
            found |= populated(item, f"{prefix}[].")
        return found or ({prefix.rstrip(".")} if obj else set())
    return {prefix.rstrip(".")} if obj not in (None, "", ()) else set()


def fixture_text(fixtures_dir: Path, rel: str) -> str:
    return (fixtures_dir / rel).read_text()


def assert_conforms(sim: set[str], closest_real: set[str], any_real: set[str]) -> None:
    """Every field the closest real sample has, the simulator has; and every field the
    simulator has, some real sample of the tool has (it invents no structure)."""
    assert closest_real - sim == set(), "simulator lacks fields the real tool prints"
    assert sim - any_real == set(), "simulator prints fields no real sample has"


def test_xml_same_fields_as_real_v12(node: Any, fixtures_dir: Path) -> None:
    real = nvidia_smi_xml.parse(fixture_text(fixtures_dir,
                                             "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml"))
    sim = nvidia_smi_xml.parse(node("nvidia-smi", "nvidia_smi.py", "550.90.07", "-q", "-x"))
    assert len(sim.gpus) == 8
    every_real: set[str] = set()
    for sample in sorted((fixtures_dir / "nvidia-smi-xml").glob("*.xml")):
        for gpu in nvidia_smi_xml.parse(sample.read_text()).gpus:
            every_real |= populated(gpu)
    # The real sample is in MIG mode, the default simulated node is not: its MIG devices are
    # held to the sample in MIG mode (tests/unit/validate/test_mig.py).
    mig = {f for f in populated(real.gpus[0]) if f.startswith("mig_devices")}
    assert mig
    assert_conforms(populated(sim.gpus[0]), populated(real.gpus[0]) - mig, every_real)
    assert populated(sim) - {"gpus.[].clock_event_reasons_active"} >= {
        "driver_version", "cuda_version", "attached_gpus"}


def test_q_text_same_fields_as_real_h100(node: Any, fixtures_dir: Path) -> None:
    real = nvidia_smi_q.parse(fixture_text(
        fixtures_dir, "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt"))
    sim = nvidia_smi_q.parse(node("nvidia-smi", "nvidia_smi.py", "550.90.07", "-q"))
    assert len(sim.gpus) == len(real.gpus) == 8
    assert populated(sim) == populated(real)
    assert [g.pci_bus_id for g in sim.gpus] == [g.pci_bus_id for g in real.gpus]


# What an operator or validator asks nvidia-smi for, all present in the real 8x H100 capture.
CSV_FIELDS = (
    "index", "name", "uuid", "serial", "pci.bus_id", "driver_version", "memory.total",
    "memory.used", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "persistence_mode", "ecc.mode.current",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
    "remapped_rows.failure", "temperature.gpu", "power.draw", "power.limit",
    "clocks_event_reasons.active", "utilization.gpu", "mig.mode.current",
)


def test_query_gpu_csv_same_fields_as_real_h100(node: Any, fixtures_dir: Path) -> None:
    text = fixture_text(fixtures_dir, "nvidia-smi-csv/h100-80gb-hbm3-query-gpu-full-idle.csv")
    real_header = {name.split(" [")[0].strip(): name.strip()
                   for name in text.splitlines()[0].split(",")}
    assert set(CSV_FIELDS) <= real_header.keys()
    real = nvidia_smi_csv.parse_query_gpu(text)
    sim_text = node("nvidia-smi", "nvidia_smi.py", "550.90.07",
                    f"--query-gpu={','.join(CSV_FIELDS)}", "--format=csv")
    assert [c.strip() for c in sim_text.splitlines()[0].split(",")] == \
        [real_header[f] for f in CSV_FIELDS]
    sim = nvidia_smi_csv.parse_query_gpu(sim_text)
    assert len(sim) == 8
    # A number where the real tool prints a number, text where text, a marker where a marker.
    real_kinds = {k: type(real[0].value(k)).__name__ for k in CSV_FIELDS}
    sim_kinds = {k: type(sim[0].value(k)).__name__ for k in CSV_FIELDS}
    assert sim_kinds == real_kinds


def test_topo_same_structure_as_real_nv18_board(node: Any, fixtures_dir: Path) -> None:
    real = nvidia_smi_topo.parse(fixture_text(
        fixtures_dir,
        "nvidia-smi-topo/b200-8gpu-nv18-8nic-legend-gpu-numa-id-gke-a4-docspaces.txt"))
    sim = nvidia_smi_topo.parse(node("nvidia-smi", "nvidia_smi.py", "550.90.07", "topo", "-m"))
    assert sim.kind == real.kind == "link"
    assert len(sim.gpus) == len(real.gpus) == 8
    assert {sim.link(a.name, b.name) for a in sim.gpus for b in sim.gpus if a != b} == \
        {real.link(a.name, b.name) for a in real.gpus for b in real.gpus if a != b} == {"NV18"}
    assert all(d.nic_name for d in sim.nics)
    assert {code for code, _ in sim.legend} == {code for code, _ in real.legend}


def test_nvlink_same_fields_as_real_h100(node: Any, fixtures_dir: Path) -> None:
    real = nvidia_smi_nvlink.parse(fixture_text(
        fixtures_dir, "nvidia-smi-nvlink/h100-sxm-nvlink-s-18links.txt"))
    sim = nvidia_smi_nvlink.parse(node("nvidia-smi", "nvidia_smi.py", "550.90.07",
                                       "nvlink", "-s"))
    assert populated(sim[0]) == populated(real[0])
    assert len(sim[0].links) == len(real[0].links) == 18
    assert {link.speed_gbps for link in sim[0].links} == {link.speed_gbps for link in
                                                          real[0].links}


def test_nccl_text_same_fields_as_real_k8s_run(node: Any, fixtures_dir: Path) -> None:
    real = nccl.parse_text(fixture_text(
        fixtures_dir, "nccl-tests/all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt"))
    sim = nccl.parse_text(node("all_reduce_perf", "all_reduce_perf.py", "2.13.10",
                               "-b", "8", "-e", "8G", "-f", "2", "-g", "8"))
    assert populated(sim) == populated(real)
    assert sim.largest_row.size_bytes == real.largest_row.size_bytes == 8589934592


def test_nccl_json_same_fields_as_text(node: Any, tmp_path: Path) -> None:
    out = node("all_reduce_perf", "all_reduce_perf.py", "2.17.1",
               "-b", "1G", "-e", "8G", "-f", "2", "-g", "8", "-J", str(tmp_path / "r.json"))
    from_text = nccl.parse_text(out)
    from_json = nccl.parse_json((tmp_path / "r.json").read_text())
    assert [r.size_bytes for r in from_json.rows] == [r.size_bytes for r in from_text.rows]
    assert from_json.largest_row.busbw_gbps == pytest.approx(from_text.largest_row.busbw_gbps,
                                                             abs=0.01)
    assert from_json.largest_row.wrong == from_text.largest_row.wrong == 0


def test_ibstat_same_fields_as_real_h100(node: Any, fixtures_dir: Path) -> None:
    real = ibstat.parse(fixture_text(fixtures_dir,
                                     "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt"))
    sim = ibstat.parse(node("ibstat", "ibstat.py", "2410mlnx54"))
    assert len(sim) == 8
    assert populated(sim[0]) == populated(real[0])
    assert {p.rate_gbps for ca in sim for p in ca.ports} == {400}
    assert 400 in {p.rate_gbps for ca in real for p in ca.ports}


def test_xid_lines_parse_like_real_kernel_log(node: Any, fixtures_dir: Path) -> None:
    real = xid.parse(fixture_text(fixtures_dir,
                                  "dmesg-xid/xid13-xid43-dmesg-decode-iso-635-lines.log"))
    sim = xid.parse(node("lab_kmsg", "lab_kmsg.py", "0", "--stdout",
                         faults=("xid-79", "xid-48")))
    assert {e.xid for e in sim} == {79, 48}
    assert_conforms(populated(sim[0]), populated(real[0]) - {"timestamp", "uptime_s", "host"},
                    populated(real[0]) | {"pid", "process"})
    assert all(e.pci_bus_id for e in sim)
