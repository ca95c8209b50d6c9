"""lab/hardware.py: profiles agree with real captures, per-host identities, fault catalogue."""

from __future__ import annotations

import csv
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.hardware import (
    FAULTS,
    HW_PROFILES,
    UnknownProfile,
    check_fault,
    render_host,
    write_faults,
    write_hardware,
)

CONTRACT_FAULTS = {
    "gpu-missing", "ecc-uncorrectable", "row-remap-pending", "pcie-degraded", "nvlink-down",
    "xid-79", "xid-48", "nccl-low-busbw", "nccl-wrong-results", "tool-hang",
    "driver-not-loaded", "ib-port-down", "ssh-down", "driver-install-fail",
    "gfd-mismatch",  # the cluster (issue 7)
    "nccl-busbw-drop", "gpu-busy",  # drift (issue 10)
    "ib-link-degraded", "ib-rail-down",  # the fabric (issue 11)
    "mig-gpu-off", "ib-link-flap",  # MIG as declared, IB error counters (issue 31)
    "gpu-memory-fail",  # DCGM diagnostics (issue 31)
    "dcgm-exporter-down", "dcgm-exporter-stale",  # the DCGM exporter (issue 32)
}


def _q_values(text: str, key: str) -> set[str]:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s+: (.*)$", re.MULTILINE)
    return set(pattern.findall(text))


def test_three_profiles_with_expected_gpu_and_nic_counts() -> None:
    assert set(HW_PROFILES) == {"h100-sxm5-8x", "a100-sxm4-8x", "l40s-pcie-4x"}
    counts = {
        name: (len(render_host(name, "h")["gpus"]), len(render_host(name, "h")["nics"]))
        for name in HW_PROFILES
    }
    assert counts == {"h100-sxm5-8x": (8, 8), "a100-sxm4-8x": (8, 8), "l40s-pcie-4x": (4, 0)}


def test_h100_identity_matches_real_8x_capture(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt").read_text()
    hw = render_host("h100-sxm5-8x", "gpu-h100-01")
    gpu = hw["gpus"][0]
    assert _q_values(real, "Product Name") == {gpu["name"]}
    assert _q_values(real, "Device Id") == {gpu["pci_device_id"]}
    assert _q_values(real, "Sub System Id") == {gpu["pci_subsystem_id"]}
    assert _q_values(real, "VBIOS Version") == {gpu["vbios"]}
    assert f"{gpu['memory_total_mib']} MiB" in _q_values(real, "Total")
    # Same bus ids in the same order as the real node.
    assert re.findall(r"^GPU (\S+)$", real, re.MULTILINE) == [g["pci_bus_id"] for g in hw["gpus"]]
    assert hw["nvswitch"] is True
    assert {g["nvlinks"] for g in hw["gpus"]} == {18}


def test_h100_nics_match_real_ibstat(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt").read_text()
    ib_types = set(re.findall(r"CA type: (\S+)", real))
    nics = render_host("h100-sxm5-8x", "gpu-h100-01")["nics"]
    assert {n["ca_type"] for n in nics} <= ib_types
    assert {n["rate_gbps"] for n in nics} == {400}
    assert {n["link_layer"] for n in nics} == {"InfiniBand"}
    assert [n["name"] for n in nics] == [f"mlx5_{i}" for i in range(8)]
    # GUID shape as ibstat prints it: 0x + 16 hex digits, Mellanox 0300 infix.
    assert all(re.fullmatch(r"0x[0-9a-f]{6}0300[0-9a-f]{6}", n["node_guid"]) for n in nics)


def test_a100_identity_matches_real_v12_xml(fixtures_dir: Path) -> None:
    root = ET.parse(fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").getroot()
    real_gpu = root.find("gpu")
    assert real_gpu is not None
    gpu = render_host("a100-sxm4-8x", "gpu-a100-01")["gpus"][0]
    assert real_gpu.findtext("product_name") == gpu["name"]
    assert "0x" + (real_gpu.findtext("pci/pci_device_id") or "") == gpu["pci_device_id"]
    assert "0x" + (real_gpu.findtext("pci/pci_sub_system_id") or "") == gpu["pci_subsystem_id"]
    assert real_gpu.findtext("vbios_version") == gpu["vbios"]
    assert real_gpu.findtext("fb_memory_usage/total") == f"{gpu['memory_total_mib']} MiB"
    limit = f"{gpu['power_limit_w']:.2f} W"
    assert real_gpu.findtext("gpu_power_readings/max_power_limit") == limit


A100_TOPO = "nvidia-smi-topo/a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt"


def test_a100_numa_layout_matches_real_a100_epyc_topology(fixtures_dir: Path) -> None:
    real = (fixtures_dir / A100_TOPO).read_text()
    real_rows = [line.split("\t") for line in real.splitlines() if line.startswith("GPU")]
    real_affinity = [(row[-2], int(row[-1])) for row in real_rows]
    gpus = render_host("a100-sxm4-8x", "gpu-a100-01")["gpus"]
    assert [(g["cpu_affinity"], g["numa_node"]) for g in gpus] == real_affinity
    assert {g["nvlinks"] for g in gpus} == {12}


def test_l40s_identity_matches_real_csv(fixtures_dir: Path) -> None:
    with (fixtures_dir / "nvidia-smi-csv/l40s-query-gpu-full-load.csv").open() as handle:
        header, row = list(csv.reader(handle, skipinitialspace=True))
    real = dict(zip(header, row, strict=True))
    hw = render_host("l40s-pcie-4x", "gpu-l40s-01")
    gpu = hw["gpus"][0]
    assert real["name"] == gpu["name"]
    assert real["pci.device_id"] == gpu["pci_device_id"]
    assert real["pci.sub_device_id"] == gpu["pci_subsystem_id"]
    assert real["vbios_version"] == gpu["vbios"]
    assert real["memory.total [MiB]"] == f"{gpu['memory_total_mib']} MiB"
    assert int(real["pcie.link.gen.max"]) == gpu["pcie_gen_max"]
    assert real["power.limit [W]"] == f"{gpu['power_limit_w']:.2f} W"
    assert hw["nics"] == [] and hw["nvswitch"] is False
    assert {g["nvlinks"] for g in hw["gpus"]} == {0}


def test_identities_are_per_host_and_stable() -> None:
    a1 = render_host("h100-sxm5-8x", "gpu-h100-01")
    a2 = render_host("h100-sxm5-8x", "gpu-h100-01")
    b = render_host("h100-sxm5-8x", "gpu-h100-02")
    assert a1 == a2
    ids_a = {g["uuid"] for g in a1["gpus"]} | {g["serial"] for g in a1["gpus"]}
    ids_b = {g["uuid"] for g in b["gpus"]} | {g["serial"] for g in b["gpus"]}
    assert not ids_a & ids_b
    assert len({g["uuid"] for g in a1["gpus"]}) == 8
    assert {n["node_guid"] for n in a1["nics"]}.isdisjoint({n["node_guid"] for n in b["nics"]})
    for gpu in a1["gpus"]:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", gpu["uuid"])
        assert re.fullmatch(r"\d{13}", gpu["serial"])


def test_schema_keys_from_contract() -> None:
    hw = render_host("h100-sxm5-8x", "gpu-h100-01")
    assert hw["simulated"] == "gpuready lab simulator"
    assert {"hw_profile", "hostname", "product_name", "cpu", "cuda_version", "gpus", "nvswitch",
            "nics", "nvme", "nccl"} <= set(hw)
    assert {"sockets", "numa_nodes"} <= set(hw["cpu"])
    assert {"index", "name", "uuid", "serial", "pci_bus_id", "pci_device_id", "pci_subsystem_id",
            "memory_total_mib", "pcie_gen_max", "pcie_width_max", "power_limit_w", "vbios",
            "numa_node", "cpu_affinity", "nvlinks", "nvlink_speed_gbps"} <= set(hw["gpus"][0])
    assert {"name", "ca_type", "fw", "link_layer", "rate_gbps", "pci_bus_id", "numa_node",
            "node_guid", "port_guid"} <= set(hw["nics"][0])
    assert {"name", "model", "size_gb"} <= set(hw["nvme"][0])
    assert hw["nccl"]["allreduce_busbw_peak_gbps"] > 0
    json.dumps(hw)  # must be JSON-serialisable as written to hardware.json


def test_unknown_profile_names_known_ones() -> None:
    with pytest.raises(UnknownProfile) as err:
        render_host("v100-sxm2-8x", "h")
    message = str(err.value)
    assert "v100-sxm2-8x" in message
    assert all(name in message for name in HW_PROFILES)


def test_fault_catalogue_is_the_contract_list() -> None:
    assert set(FAULTS) == CONTRACT_FAULTS
    assert all(desc and "\n" not in desc for desc in FAULTS.values())
    for name in CONTRACT_FAULTS:
        check_fault(name)
    with pytest.raises(ValueError, match=r"unknown fault 'gpu-on-fire'; known: .*ecc-unc"):
        check_fault("gpu-on-fire")


def test_write_hardware_and_faults(tmp_path: Path) -> None:
    hw = render_host("l40s-pcie-4x", "gpu-l40s-01")
    path = write_hardware(tmp_path, hw)
    assert json.loads(path.read_text()) == hw
    faults = write_faults(tmp_path, ["tool-hang", "ecc-uncorrectable", "tool-hang"])
    assert json.loads(faults.read_text()) == {"faults": ["ecc-uncorrectable", "tool-hang"]}
    with pytest.raises(ValueError):
        write_faults(tmp_path, ["nope"])
    # The rejected write left the previous document in place.
    assert json.loads(faults.read_text())["faults"] == ["ecc-uncorrectable", "tool-hang"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faults.json", "hardware.json"]
