"""Simulated GPU node hardware: profiles, per-host rendering and the fault catalogue.

Runs on the control machine. A hardware profile (``lab/hardware/<name>.yml``) describes one
node SKU as a real capture shows it (GPU model, PCI ids, vbios, bus ids, NUMA layout, HCAs);
``render_host`` turns it into the ``hardware.json`` a lab host's simulators read from
``/opt/gpuready-lab/hw/``. Identities that differ per physical board (serials, UUIDs, GUIDs) are
derived from the hostname, so two hosts differ and a rebuilt host keeps its identity.

``hardware.json`` schema (keys may be added, never renamed)::

    {"simulated": "gpuready lab simulator", "hw_profile": str, "hostname": str,
     "product_name": str, "cpu": {"model", "sockets", "numa_nodes", "cores_per_socket",
     "threads_per_core", "affinity": {"<numa>": "<cpu list>"}}, "memory_gib": int,
     "cuda_version": "12.4", "nvswitch": bool, "same_switch_link": "PIX" | "PXB",
     "gpus": [{"index", "name", "brand", "architecture", "compute_cap", "uuid", "serial",
               "pci_bus_id", "pci_device_id", "pci_subsystem_id", "memory_total_mib",
               "memory_reserved_mib", "bar1_total_mib", "pcie_gen_max", "pcie_width_max",
               "power_limit_w", "power_min_w", "power_idle_w", "temp_idle_c",
               "memory_temp_idle_c" (int | null), "temp_tlimit_c", "vbios",
               "board_part_number", "gpu_part_number", "inforom_img", "inforom_oem",
               "inforom_ecc", "clocks_idle_mhz", "clocks_max_mhz", "voltage_mv",
               "remap_banks_max", "numa_node", "cpu_affinity", "pcie_switch", "module_id",
               "board_id", "minor_number", "nvlinks", "nvlink_speed_gbps"}],
     "nics": [{"name", "ca_type", "fw", "link_layer", "rate_gbps", "pci_bus_id", "numa_node",
               "pcie_switch", "node_guid", "port_guid", "system_image_guid"}],
     "nvme": [{"name", "model", "size_gb", "serial"}],
     "nccl": {"allreduce_busbw_peak_gbps": float,
              "allreduce_multinode_busbw_peak_gbps": float (optional: all rails healthy)},
     "mig_layout": [str, ...] (optional: every GPU in MIG mode with these MIG devices, by
                   profile name, as an operator configured it; set_mig_layout)}

``faults.json`` is ``{"faults": [<fault name>, ...]}``; every name is a key of ``FAULTS``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

SIMULATED = "gpuready lab simulator"
PROFILES_DIR = Path(__file__).resolve().parent / "hardware"

# One line per fault: what the lab makes the simulated node do. The GPU indices are the ones the
# simulators use, so a report can be checked against a specific device.
FAULTS: dict[str, str] = {
    "gpu-missing": "the last GPU falls off the bus: nvidia-smi lists one GPU fewer",
    "ecc-uncorrectable": "GPU 0 reports uncorrectable volatile and aggregate DRAM ECC errors",
    "row-remap-pending": "GPU 1 has a remapped row pending (reset required), as after an Xid 63",
    "pcie-degraded": "GPU 2 trains its PCIe link at gen 3 x8 while the max stays at spec",
    "nvlink-down": "all NVLinks of GPU 3 are inactive: nvlink -s fails, topo -m shows PCIe paths",
    "xid-79": "the kernel log carries an Xid 79 (GPU has fallen off the bus) for one GPU",
    "xid-48": "the kernel log carries an Xid 48 (double bit ECC error) for one GPU",
    "nccl-low-busbw": "all_reduce_perf reports bus bandwidth well below the node's healthy peak",
    "nccl-busbw-drop": "all_reduce_perf bus bandwidth ~15% below the node's usual, still above "
                       "the profile's floors (only the node's own history shows it)",
    "nccl-wrong-results": "all_reduce_perf reports a non-zero #wrong count (data corruption)",
    "tool-hang": "GPU tools (nvidia-smi, ...) hang forever before printing anything",
    "driver-not-loaded": "no NVIDIA kernel module: nvidia-smi says it cannot talk to the driver",
    "ib-port-down": "one InfiniBand HCA port is Down/Polling instead of Active/LinkUp",
    "ib-link-degraded": "the last HCA's link carries half its rate (a marginal cable: ibstat still "
    "shows Active at full rate; only traffic between nodes, a multi-node NCCL run, shows it)",
    "ib-rail-down": "the last HCA's rail is taken out at the switch: its port is Down/Disabled "
    "and NCCL runs across nodes over the other rails",
    "ssh-down": "the host's sshd is stopped: the node is unreachable",
    "driver-install-fail": "installing the NVIDIA driver package fails in its postinst (DKMS)",
    "gfd-mismatch": "GPU Feature Discovery labels the node with another GPU product",
    "gpu-busy": "a GPU job holds GPU 0: nvidia-smi --query-compute-apps lists its process",
    "ib-link-flap": "the first HCA's link went down and came back: each time the fault is "
                    "injected its sysfs link_downed grows by 3, link_error_recovery by 1 and "
                    "symbol_error by 12 (ibstat shows the port Active again)",
    "mig-gpu-off": "GPU 1 is out of MIG mode (current and pending Disabled, no MIG devices) "
                   "on a host whose GPUs are in MIG mode (set_mig_layout)",
    "gpu-memory-fail": "GPU 0's memory fails DCGM's memory test under load (a miscompare, dcgmi "
                       "diag -r 2 and up); nvidia-smi shows nothing",
    "dcgm-exporter-down": "the node's dcgm-exporter does not listen: a scrape of :9400 is refused",
    "dcgm-exporter-stale": "the node's dcgm-exporter reports the last GPU with the UUID of the "
                           "board it replaced",
}


class UnknownProfile(KeyError):
    """A hardware profile name that lab/hardware/ does not define."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown hardware profile {name!r}; known: {', '.join(known)}")

    def __str__(self) -> str:
        return str(self.args[0])


# Faults that act while packages install (the driver package's postinst): a host with one is
# converged from the bare rootfs, never booted from a converged snapshot (lab/snapshot.py).
CONVERGE_FAULTS = frozenset({"driver-install-fail"})


def check_fault(name: str) -> None:
    """Raise ValueError naming the known faults when ``name`` is not one of them."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")


def _load_profiles(directory: Path) -> dict[str, dict[str, Any]]:
    profiles: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("name") != path.stem:
            raise ValueError(f"{path}: top-level 'name' must equal the file name {path.stem!r}")
        profiles[path.stem] = data
    return profiles


HW_PROFILES: dict[str, dict[str, Any]] = _load_profiles(PROFILES_DIR)


def _digest(*parts: object) -> bytes:
    # sha256 of the host and the device's place in it: stable across rebuilds of the same host,
    # different between hosts and between devices of one host.
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


def _gpu_uuid(hostname: str, index: int) -> str:
    h = _digest(hostname, "gpu-uuid", index).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _gpu_serial(hostname: str, index: int) -> str:
    # Real boards print 13 decimal digits starting with the factory prefix 1650 (see fixtures).
    number = int.from_bytes(_digest(hostname, "gpu-serial", index)[:8], "big") % 10**9
    return f"1650{number:09d}"


def _guid(oui: str, hostname: str, name: str) -> str:
    # Mellanox GUIDs are OUI + 0x0300 + 24 device bits (ibstat fixtures: 0x58a2e10300a7820e).
    tail = _digest(hostname, "guid", name).hex()[:6]
    return f"0x{oui}0300{tail}"


def render_host(hw_profile: str, hostname: str) -> dict[str, Any]:
    """The ``hardware.json`` document for one host (schema in the module docstring)."""
    if hw_profile not in HW_PROFILES:
        raise UnknownProfile(hw_profile, sorted(HW_PROFILES))
    prof = copy.deepcopy(HW_PROFILES[hw_profile])
    affinity = {int(k): str(v) for k, v in prof["cpu"]["affinity"].items()}
    model = prof["gpu_model"]
    gpus: list[dict[str, Any]] = []
    for index, slot in enumerate(prof["gpus"]):
        gpu = dict(model)
        gpu.update(slot)
        gpu.update(
            index=index,
            minor_number=index,
            uuid=_gpu_uuid(hostname, index),
            serial=_gpu_serial(hostname, index),
            cpu_affinity=affinity[int(slot["numa_node"])],
        )
        gpus.append(gpu)
    nics: list[dict[str, Any]] = []
    nic_model = prof.get("nic_model") or {}
    for slot in prof.get("nics") or []:
        nic = {k: v for k, v in nic_model.items() if k != "guid_oui"}
        nic.update(slot)
        guid = _guid(str(nic_model["guid_oui"]), hostname, slot["name"])
        nic.update(node_guid=guid, port_guid=guid, system_image_guid=guid)
        nics.append(nic)
    nvme = [
        dict(d, serial="S" + _digest(hostname, "nvme", d["name"]).hex()[:13].upper())
        for d in prof.get("nvme") or []
    ]
    return {
        "simulated": SIMULATED,
        "hw_profile": hw_profile,
        "hostname": hostname,
        "product_name": prof["product_name"],
        "cpu": {**prof["cpu"], "affinity": {str(k): v for k, v in affinity.items()}},
        "memory_gib": prof["memory_gib"],
        "cuda_version": str(prof["cuda_version"]),
        "nvswitch": bool(prof["nvswitch"]),
        "same_switch_link": prof["same_switch_link"],
        "gpus": gpus,
        "nics": nics,
        "nvme": nvme,
        "nccl": dict(prof["nccl"]),
    }


def _write_atomic(path: Path, document: dict[str, Any]) -> None:
    # Simulators read these files on every invocation while the lab may rewrite them: a reader
    # must see the old or the new document, never half of one, so write aside and rename.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_hardware(hw_dir: Path, hardware: dict[str, Any]) -> Path:
    """Write ``hardware.json`` into a host's hardware directory atomically; return its path."""
    path = Path(hw_dir) / "hardware.json"
    _write_atomic(path, hardware)
    return path


# The per-port error counters the lab writes under <hw>/sys/class/infiniband/<hca>/ports/1/
# counters/ (one decimal value per file, as sysfs has them: fixtures/sysfs-infiniband/), and
# how much one ib-link-flap grows each on the first HCA.
IB_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
               "excessive_buffer_overrun_errors", "port_xmit_discards", "VL15_dropped")
FLAP_GROWTH = {"link_downed": 3, "link_error_recovery": 1, "symbol_error": 12}


def write_ib_counters(hw_dir: Path, faults: list[str] | tuple[str, ...] = (),
                      previous: list[str] | tuple[str, ...] = ()) -> Path:
    """Write (keeping what is there) the counters of every HCA of the host's hardware.json
    under ``<hw_dir>/sys/class/infiniband``; a newly injected ib-link-flap grows the first
    HCA's. Returns that directory (the lab inventory's gpuready_sysfs_root/class/infiniband)."""
    hardware = json.loads((Path(hw_dir) / "hardware.json").read_text(encoding="utf-8"))
    root = Path(hw_dir) / "sys" / "class" / "infiniband"
    flap = "ib-link-flap" in faults and "ib-link-flap" not in previous
    for index, nic in enumerate(hardware.get("nics") or []):
        counters = root / str(nic["name"]) / "ports" / "1" / "counters"
        counters.mkdir(parents=True, exist_ok=True)
        for name in IB_COUNTERS:
            path = counters / name
            value = int(path.read_text(encoding="ascii")) if path.exists() else 0
            if flap and index == 0:
                value += FLAP_GROWTH.get(name, 0)
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(f"{value}\n", encoding="ascii")
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
    return root


_MIG_PROFILE = re.compile(r"^(?:[1-9]c\.)?[1-9]g\.\d+gb(?:\+me)?$")


def set_mig_layout(hw_dir: Path, layout: list[str] | None) -> Path:
    """Put every GPU of the host in MIG mode with ``layout``'s MIG devices (None or []: MIG
    off), as an operator's ``nvidia-smi -mig 1`` and ``nvidia-smi mig -cgi ... -C`` would; the
    simulated nvidia-smi shows it on its next call. Returns hardware.json's path."""
    for name in layout or []:
        if not _MIG_PROFILE.match(name):
            raise ValueError(f"{name!r} is not a MIG profile name such as 1g.10gb")
    path = Path(hw_dir) / "hardware.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    if layout:
        document["mig_layout"] = list(layout)
    else:
        document.pop("mig_layout", None)
    _write_atomic(path, document)
    return path


def write_faults(hw_dir: Path, faults: list[str]) -> Path:
    """Validate and write ``faults.json`` (``{"faults": [...]}``) atomically; return its path."""
    for name in faults:
        check_fault(name)
    path = Path(hw_dir) / "faults.json"
    _write_atomic(path, {"faults": sorted(set(faults))})
    return path
