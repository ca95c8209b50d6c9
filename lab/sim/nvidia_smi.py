#!/usr/bin/env python3
"""Simulated ``nvidia-smi`` for lab hosts (gpuready lab simulator).

Stdlib only: it runs inside lab hosts with the Debian python3, from the read-only bind mount
``/opt/gpuready-lab/sim/``, behind the thin wrapper a simulated package installs::

    GPUREADY_SIM_TOOL=nvidia-smi GPUREADY_SIM_VERSION=550.90.07 \
        exec /usr/bin/python3 /opt/gpuready-lab/sim/nvidia_smi.py "$@"

Inputs, read on every invocation so the lab can change them while the host runs:
- ``$GPUREADY_LAB_HW`` (default ``/opt/gpuready-lab/hw``): ``hardware.json`` and ``faults.json``
  (schema in lab/hardware.py).
- ``$GPUREADY_SIM_VERSION``: the installed driver userland version, e.g. ``550.90.07``.
- ``$GPUREADY_LAB_RUN`` (default ``/run/gpuready-lab``): simulated kernel state; the file
  ``nvidia-module-version`` is the loaded kernel module's version (tmpfs: gone after reboot).
- ``/proc/*/comm``: persistence mode is Enabled only while nvidia-persistenced runs.
- ``/proc/*/fd``: a process that holds ``$GPUREADY_LAB_RUN/dev/nvidia<N>`` open (the lab's
  stand-in for the GPU's device node; the gpu-busy fault's job does) has a compute context on
  GPU N, as NVML reports a process with a context on the real device.

Output is shaped like the real tool of the 535/550 driver generation (the real captures in
tests/fixtures are the reference). "gpuready lab simulator" appears only in the banners
(--version, -h) and as a note under the default table, never inside data output.

Supported: (no args) table, -L, -q [-i N] [-x], --query-gpu=... --format=csv[,noheader][,nounits]
[-i N], --query-compute-apps=... --format=csv[,noheader][,nounits], topo -m, nvlink -s/--status
[-i N], --version, -h. Faults: gpu-missing,
ecc-uncorrectable, row-remap-pending, pcie-degraded, nvlink-down, tool-hang, driver-not-loaded,
mig-gpu-off. MIG: hardware.json's ``mig_layout`` puts every GPU in MIG mode with those MIG
devices (XML, -q, -L, the table and --query-gpu show it as the real MIG captures do).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIMULATED = "gpuready lab simulator"

# Which GPU each fault hits; lab/hardware.py FAULTS describes the same choice.
ECC_GPU = 0
REMAP_GPU = 1
PCIE_GPU = 2
NVLINK_GPU = 3
MIG_OFF_GPU = 1

# MIG devices as real nvidia-smi reports them, per GPU product and profile: SMs, copy engines,
# encoders, decoders, OFAs, JPEG engines, the GPU instance's memory and BAR1 (MiB), and the GPU
# instance ids the driver hands out for that profile, in order. Only profiles seen in a real
# capture: H100 80GB HBM3 from nvidia-smi-captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt
# (-q and -L), A100-SXM4-80GB 1g.20gb from nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml.
MigProfile = tuple[int, int, int, int, int, int, int, int, tuple[int, ...]]
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "NVIDIA H100 80GB HBM3": {
        "3g.40gb": (60, 3, 0, 3, 0, 3, 40448, 24739, (2, 1)),
        "2g.20gb": (32, 2, 0, 2, 0, 2, 20096, 12369, (3, 4, 5)),
        "1g.10gb": (16, 1, 0, 1, 0, 1, 9984, 6184, (9, 10, 11, 12, 13, 14, 7)),
    },
    "NVIDIA A100-SXM4-80GB": {
        "1g.20gb": (14, 1, 0, 1, 0, 0, 19968, 32767, (3, 4, 5, 6)),
    },
}

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
# Exit codes of the real tool (nvidia-smi(1) RETURN VALUE).
RC_OK = 0
RC_INVALID_ARG = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_LIB_MISMATCH = 18

# CUDA version each driver branch reports (a property of the driver, not of the board).
CUDA_BY_BRANCH = {"535": "12.2", "545": "12.3", "550": "12.4", "555": "12.5", "560": "12.6"}

TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""  # noqa: E501  (the real legend lines are this long)

NA = "N/A"


class Usage(Exception):
    """Bad command line: the real tool prints a message and exits with RC_INVALID_ARG."""


# --------------------------------------------------------------------------------------------
# State: hardware.json + faults.json + host processes -> what the "driver" reports
# --------------------------------------------------------------------------------------------


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _load_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


def _in_my_pid_namespace(proc: Path) -> bool:
    """Whether the process shares this one's PID namespace, as a daemon of the same host does.

    A machine that runs lab hosts sees their daemons in its /proc, each in its host's own
    namespace: those are other hosts' daemons. Where the kernel will not say (another user's
    process, read without privilege) the process is taken as this host's.
    """
    try:
        return os.readlink(proc / "ns" / "pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return True


def _persistenced_running() -> bool:
    # The kernel truncates comm to 15 bytes: "nvidia-persistenced" shows as "nvidia-persiste".
    wanted = "nvidia-persistenced"[:15]
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text(encoding="utf-8").strip() == wanted and _in_my_pid_namespace(
                    comm.parent):
                return True
        except OSError:
            continue
    return False


class Node:
    """The GPUs as the driver would report them right now."""

    def __init__(self, hw: dict[str, Any], faults: set[str], version: str,
                 persistenced: bool | None = None) -> None:
        self.hw = hw
        self.faults = faults
        self.version = version
        self.branch = version.split(".", maxsplit=1)[0]
        self.nvml_version = ".".join(version.split(".")[:2])
        self.cuda_version = CUDA_BY_BRANCH.get(self.branch, str(hw.get("cuda_version", "12.4")))
        if persistenced is None:  # a lab host: is the daemon running there now?
            persistenced = _persistenced_running()
        self.persistence = "Enabled" if persistenced else "Disabled"
        self.now = time.time()
        gpus = [dict(g) for g in hw.get("gpus", [])]
        if "gpu-missing" in faults and gpus:
            gpus.pop()
        for gpu in gpus:
            self._apply_state(gpu)
        self.gpus = gpus

    def _apply_state(self, gpu: dict[str, Any]) -> None:
        idx = gpu["index"]
        # Boards of one node idle a few watts and degrees apart; derive the spread from the
        # UUID so it is stable per host.
        spread = int(str(gpu["uuid"])[4:8], 16)
        gpu["power_idle_w"] = float(gpu["power_idle_w"]) + (spread % 7) - 3 + (spread % 100) / 100
        gpu["temp_idle_c"] = int(gpu["temp_idle_c"]) + (spread % 5) - 2
        gpu.update(
            dram_corr_vol=0, dram_corr_agg=0, dram_unc_vol=0, dram_unc_agg=0,
            remap_corr=0, remap_unc=0, remap_pending="No", remap_failure="No",
            hist_max=int(gpu.get("remap_banks_max", 0)), hist_high=0,
            pcie_gen_cur=gpu["pcie_gen_max"], pcie_width_cur=gpu["pcie_width_max"],
            nvlink_active=int(gpu.get("nvlinks", 0)) > 0,
        )
        if "ecc-uncorrectable" in self.faults and idx == ECC_GPU:
            gpu.update(dram_unc_vol=2, dram_unc_agg=2)
        if "row-remap-pending" in self.faults and idx == REMAP_GPU:
            # What a real A100 showed after Xid 63 (fixtures/nvidia-smi-q-text/a100-sxm4-80gb-
            # remapped-rows-pending-*): correctable DRAM errors, one row remapped, reset pending.
            gpu.update(dram_corr_vol=177, dram_corr_agg=177, remap_corr=1, remap_pending="Yes",
                       hist_max=gpu["hist_max"] - 1, hist_high=1)
        if "pcie-degraded" in self.faults and idx == PCIE_GPU:
            gpu.update(pcie_gen_cur=3, pcie_width_cur=8)
        if "nvlink-down" in self.faults and idx == NVLINK_GPU:
            gpu["nvlink_active"] = False
        # MIG as the lab's operator configured it (hardware.json "mig_layout": the profiles of
        # every GPU's MIG devices), unless a fault took this GPU out of MIG mode.
        layout = list(self.hw.get("mig_layout") or [])
        if "mig-gpu-off" in self.faults and idx == MIG_OFF_GPU:
            layout = []
        gpu["mig"] = "Enabled" if layout else "Disabled"
        gpu["mig_devices"] = _mig_devices(gpu, layout)

    def select(self, ident: str | None) -> list[dict[str, Any]]:
        """GPUs matching ``-i`` (index, PCI bus id or UUID); all when ident is None."""
        if ident is None:
            return self.gpus
        chosen = []
        for part in ident.split(","):
            key = part.strip()
            for gpu in self.gpus:
                bus = gpu["pci_bus_id"].upper()
                if key == str(gpu["index"]) or key == gpu["uuid"] or key.upper() in (
                    bus, bus[4:]
                ):
                    chosen.append(gpu)
                    break
            else:
                raise LookupError(key)
        return chosen


def _mig_devices(gpu: dict[str, Any], layout: list[str]) -> list[dict[str, Any]]:
    table = MIG_PROFILES.get(str(gpu["name"]), {})
    used: dict[str, int] = {}
    devices = []
    for index, profile in enumerate(layout):
        if profile not in table:
            raise ValueError(f"{SIMULATED}: no real capture of MIG profile {profile!r} on "
                        f"{gpu['name']}")
        sms, ce, enc, dec, ofa, jpg, mem, bar1, ids = table[profile]
        nth = used.get(profile, 0)
        used[profile] = nth + 1
        digest = hashlib.sha256(f"{gpu['uuid']}/mig/{index}".encode()).hexdigest()
        devices.append({
            "index": index, "profile": profile, "gi": ids[nth % len(ids)], "ci": 0,
            "sms": sms, "ce": ce, "enc": enc, "dec": dec, "ofa": ofa, "jpg": jpg,
            "mem": mem, "bar1": bar1,
            "uuid": f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                    f"{digest[20:32]}",
        })
    return devices


# --------------------------------------------------------------------------------------------
# Small formatting helpers
# --------------------------------------------------------------------------------------------


def _ts_long(now: float) -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now))


def _ts_csv(now: float) -> str:
    ms = int((now % 1) * 1000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{ms:03d}"


def _watts(value: float) -> str:
    return f"{value:.2f} W"


def _gpu_name_line(gpu: dict[str, Any]) -> str:
    return f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})"


def _memory_used_mib(gpu: dict[str, Any]) -> int:
    return 1


def _mem_temp(gpu: dict[str, Any]) -> str:
    value = gpu.get("memory_temp_idle_c")
    return NA if value is None else f"{value} C"


# --------------------------------------------------------------------------------------------
# -L, nvlink -s, topo -m
# --------------------------------------------------------------------------------------------


def render_list(node: Node) -> str:
    out = []
    for g in node.gpus:
        out.append(_gpu_name_line(g) + "\n")
        # The MIG lines as the 590 capture prints them (fixtures/nvidia-smi-captures/*-mig*).
        out += [f"  MIG {d['profile']:<12}Device {d['index']:>2}: (UUID: {d['uuid']})\n"
                for d in g["mig_devices"]]
    return "".join(out)


def render_nvlink_status(node: Node, gpus: list[dict[str, Any]]) -> str:
    if not any(int(g.get("nvlinks", 0)) for g in node.hw.get("gpus", [])):
        # 535-era drivers print nothing on PCIe boards without NVLink (fixtures
        # nvidia-smi-nvlink/a10-nvlink-status-empty-output.txt); 570+ print a sentence.
        if int(node.branch) < 570:
            return ""
        return "".join(
            _gpu_name_line(g) + "\nDevice does not have or support Nvlink\n" for g in gpus
        )
    out = []
    for gpu in gpus:
        out.append(_gpu_name_line(gpu) + "\n")
        if not gpu["nvlink_active"]:
            out.append("NVML: Unable to retrieve NVLink information as all links are inactive\n")
            continue
        speed = f"{float(gpu['nvlink_speed_gbps']):g}"
        out.extend(f"\t Link {link}: {speed} GB/s\n" for link in range(int(gpu["nvlinks"])))
    return "".join(out)


def _pcie_path(a: dict[str, Any], b: dict[str, Any], same_switch: str) -> str:
    if a.get("pcie_switch") == b.get("pcie_switch"):
        return same_switch
    if a.get("numa_node") == b.get("numa_node"):
        return "NODE"
    return "SYS"


def render_topo(node: Node, tty: bool) -> str:
    gpus = node.gpus
    nics = node.hw.get("nics", [])
    same_switch = str(node.hw.get("same_switch_link", "PIX"))
    nvswitch = bool(node.hw.get("nvswitch"))
    cols = [f"GPU{g['index']}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    header = "\t".join([*cols, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    # On a terminal the real tool underlines the header row (fixtures/*-topo-m-ansi.txt).
    lines = ["\t\x1b[4m" + header + "\x1b[0m" if tty else "\t" + header]

    def gpu_gpu(a: dict[str, Any], b: dict[str, Any]) -> str:
        if a is b:
            return " X "
        if nvswitch and a["nvlink_active"] and b["nvlink_active"]:
            return f"NV{min(int(a['nvlinks']), int(b['nvlinks']))}"
        return _pcie_path(a, b, same_switch)

    for a in gpus:
        cells = [gpu_gpu(a, b) for b in gpus]
        cells += [_pcie_path(a, n, same_switch) for n in nics]
        # "<cpus>\t<numa>\t\tN/A": the real tool leaves an empty cell before GPU NUMA ID.
        cells += [str(a["cpu_affinity"]), str(a["numa_node"]), "", NA]
        lines.append(f"GPU{a['index']}\t" + "\t".join(cells))
    for i, n in enumerate(nics):
        cells = [_pcie_path(n, g, same_switch) for g in gpus]
        cells += [" X " if m is n else _pcie_path(n, m, same_switch) for m in nics]
        cells += ["", "", "", ""]
        lines.append(f"NIC{i}\t" + "\t".join(cells))
    out = "\n".join(lines) + "\n" + TOPO_LEGEND
    if nics:
        out += "\nNIC Legend:\n\n" + "".join(
            f"  NIC{i}: {n['name']}\n" for i, n in enumerate(nics)
        )
    return out


# --------------------------------------------------------------------------------------------
# Default table (535/550 layout: fixtures/nvidia-smi-table/h100-x8-drv550.90.07-default-table)
# --------------------------------------------------------------------------------------------

_SEP_GPU = "+-----------------------------------------+------------------------+----------------------+"  # noqa: E501 (real table width)
_SEP_WIDE = "+-----------------------------------------------------------------------------------------+"  # noqa: E501 (real table width)


def render_table(node: Node) -> str:
    pm = "On" if node.persistence == "Enabled" else "Off"
    out = [
        _ts_long(node.now),
        _SEP_WIDE,
        f"| NVIDIA-SMI {node.version:<23}Driver Version: {node.version:<15}"
        f"CUDA Version: {node.cuda_version:<9}|",
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",  # noqa: E501 (real table width)
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",  # noqa: E501 (real table width)
        "|                                         |                        |               MIG M. |",  # noqa: E501 (real table width)
        "|=========================================+========================+======================|",
    ]
    for g in node.gpus:
        ecc = str(g["dram_unc_vol"])
        usage = f"{round(float(g['power_idle_w']))}W"
        cap = f"{round(float(g['power_limit_w']))}W"
        used = f"{_memory_used_mib(g)}MiB"
        total = f"{g['memory_total_mib']}MiB"
        out += [
            f"|{g['index']:>4}  {g['name']:<31}{pm:<4}|{g['pci_bus_id']:>19} Off |{ecc:>21} |",
            f"|{NA:>4}{str(g['temp_idle_c']) + 'C':>6}{'P0':>6}{usage:>16} / {cap:>5} "
            f"|{used:>11} / {total:>9} |{'0%':>8}{'Default':>13} |",
            f"|{'':41}|{'':24}|{g['mig']:>21} |",
            _SEP_GPU,
        ]
    out += [
        "",
        _SEP_WIDE,
        "| Processes:                                                                              |",  # noqa: E501 (real table width)
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",  # noqa: E501 (real table width)
        "|        ID   ID                                                               Usage      |",  # noqa: E501 (real table width)
        "|=========================================================================================|",
        "|  No running processes found                                                             |",  # noqa: E501 (real table width)
        _SEP_WIDE,
        f"({SIMULATED})",
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# -q (text), shaped like fixtures/nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt
# --------------------------------------------------------------------------------------------

Tree = list[tuple[str, Any]]  # (title, value) where value is a str or a nested Tree


def _idle_reasons() -> list[tuple[str, bool]]:
    # An idle GPU with nothing capping it: only the Idle reason is active (real idle samples).
    return [
        ("Idle", True), ("Applications Clocks Setting", False), ("SW Power Cap", False),
        ("HW Slowdown", False), ("HW Thermal Slowdown", False),
        ("HW Power Brake Slowdown", False), ("Sync Boost", False),
        ("SW Thermal Slowdown", False), ("Display Clock Setting", False),
    ]


def _q_gpu(node: Node, g: dict[str, Any]) -> Tree:
    act = {True: "Active", False: "Not Active"}
    reasons = dict(_idle_reasons())
    clocks_idle = g["clocks_idle_mhz"]
    clocks_max = g["clocks_max_mhz"]
    bus = g["pci_bus_id"]
    fabric = ("Completed", "Success") if node.hw.get("nvswitch") else (NA, NA)
    power = [
        ("Power Draw", _watts(float(g["power_idle_w"]))),
        ("Current Power Limit", _watts(float(g["power_limit_w"]))),
        ("Requested Power Limit", _watts(float(g["power_limit_w"]))),
        ("Default Power Limit", _watts(float(g["power_limit_w"]))),
        ("Min Power Limit", _watts(float(g["power_min_w"]))),
        ("Max Power Limit", _watts(float(g["power_limit_w"]))),
    ]
    sram = [("SRAM Correctable", "0"), ("SRAM Uncorrectable Parity", "0"),
            ("SRAM Uncorrectable SEC-DED", "0")]
    mem_total = int(g["memory_total_mib"])
    mem_res = int(g["memory_reserved_mib"])
    used = _memory_used_mib(g)
    return [
        ("Product Name", g["name"]),
        ("Product Brand", g["brand"]),
        ("Product Architecture", g["architecture"]),
        ("Display Mode", "Enabled"),
        ("Display Active", "Disabled"),
        ("Persistence Mode", node.persistence),
        ("Addressing Mode", "None"),
        ("MIG Mode", [("Current", g["mig"]), ("Pending", g["mig"])]),
        ("Accounting Mode", "Disabled"),
        ("Accounting Mode Buffer Size", "4000"),
        ("Driver Model", [("Current", NA), ("Pending", NA)]),
        ("Serial Number", g["serial"]),
        ("GPU UUID", g["uuid"]),
        ("Minor Number", str(g["minor_number"])),
        ("VBIOS Version", g["vbios"]),
        ("MultiGPU Board", "No"),
        ("Board ID", g["board_id"]),
        ("Board Part Number", g["board_part_number"]),
        ("GPU Part Number", g["gpu_part_number"]),
        ("FRU Part Number", NA),
        ("Module ID", str(g["module_id"])),
        ("Inforom Version", [
            ("Image Version", g["inforom_img"]), ("OEM Object", g["inforom_oem"]),
            ("ECC Object", g["inforom_ecc"]), ("Power Management Object", NA)]),
        ("GPU Operation Mode", [("Current", NA), ("Pending", NA)]),
        ("GSP Firmware Version", node.version),
        ("GPU Virtualization Mode", [("Virtualization Mode", "None"), ("Host VGPU Mode", NA)]),
        ("GPU Reset Status", [
            ("Reset Required", "Yes" if g["remap_pending"] == "Yes" else "No"),
            ("Drain and Reset Recommended", "No")]),
        ("IBMNPU", [("Relaxed Ordering Mode", NA)]),
        ("PCI", [
            ("Bus", "0x" + bus[9:11]),
            ("Device", "0x" + bus[12:14]),
            ("Domain", "0x" + bus[4:8]),
            ("Device Id", g["pci_device_id"]),
            ("Bus Id", bus),
            ("Sub System Id", g["pci_subsystem_id"]),
            ("GPU Link Info", [
                ("PCIe Generation", [
                    ("Max", str(g["pcie_gen_max"])), ("Current", str(g["pcie_gen_cur"])),
                    ("Device Current", str(g["pcie_gen_cur"])),
                    ("Device Max", str(g["pcie_gen_max"])), ("Host Max", str(g["pcie_gen_max"]))]),
                ("Link Width", [
                    ("Max", f"{g['pcie_width_max']}x"), ("Current", f"{g['pcie_width_cur']}x")]),
            ]),
            ("Bridge Chip", [("Type", NA), ("Firmware", NA)]),
            ("Replays Since Reset", "0"),
            ("Replay Number Rollovers", "0"),
            ("Tx Throughput", "0 KB/s"),
            ("Rx Throughput", "0 KB/s"),
            ("Atomic Caps Inbound", NA),
            ("Atomic Caps Outbound", NA),
        ]),
        ("Fan Speed", NA),
        ("Performance State", "P0"),
        ("Clocks Event Reasons", [
            ("Idle", act[reasons["Idle"]]),
            ("Applications Clocks Setting", act[reasons["Applications Clocks Setting"]]),
            ("SW Power Cap", act[reasons["SW Power Cap"]]),
            ("HW Slowdown", act[reasons["HW Slowdown"]]),
            ("    HW Thermal Slowdown", act[reasons["HW Thermal Slowdown"]]),
            ("    HW Power Brake Slowdown", act[reasons["HW Power Brake Slowdown"]]),
            ("Sync Boost", act[reasons["Sync Boost"]]),
            ("SW Thermal Slowdown", act[reasons["SW Thermal Slowdown"]]),
            ("Display Clock Setting", act[reasons["Display Clock Setting"]]),
        ]),
        ("Sparse Operation Mode", "Disabled"),
        ("FB Memory Usage", [
            ("Total", f"{mem_total} MiB"), ("Reserved", f"{mem_res} MiB"),
            ("Used", f"{used} MiB"), ("Free", f"{mem_total - mem_res - used} MiB")]),
        ("BAR1 Memory Usage", [
            ("Total", f"{g['bar1_total_mib']} MiB"), ("Used", "1 MiB"),
            ("Free", f"{int(g['bar1_total_mib']) - 1} MiB")]),
        ("Conf Compute Protected Memory Usage", [
            ("Total", "0 MiB"), ("Used", "0 MiB"), ("Free", "0 MiB")]),
        ("Compute Mode", "Default"),
        ("Utilization", [("Gpu", "0 %"), ("Memory", "0 %"), ("Encoder", "0 %"),
                         ("Decoder", "0 %"), ("JPEG", "0 %"), ("OFA", "0 %")]),
        ("Encoder Stats", [("Active Sessions", "0"), ("Average FPS", "0"),
                           ("Average Latency", "0")]),
        ("FBC Stats", [("Active Sessions", "0"), ("Average FPS", "0"),
                       ("Average Latency", "0")]),
        ("ECC Mode", [("Current", "Enabled"), ("Pending", "Enabled")]),
        ("ECC Errors", [
            ("Volatile", [*sram, ("DRAM Correctable", str(g["dram_corr_vol"])),
                          ("DRAM Uncorrectable", str(g["dram_unc_vol"]))]),
            ("Aggregate", [*sram, ("DRAM Correctable", str(g["dram_corr_agg"])),
                           ("DRAM Uncorrectable", str(g["dram_unc_agg"])),
                           ("SRAM Threshold Exceeded", "No")]),
            ("Aggregate Uncorrectable SRAM Sources", [
                ("SRAM L2", "0"), ("SRAM SM", "0"), ("SRAM Microcontroller", "0"),
                ("SRAM PCIE", "0"), ("SRAM Other", "0")]),
        ]),
        ("Retired Pages", [("Single Bit ECC", NA), ("Double Bit ECC", NA),
                           ("Pending Page Blacklist", NA)]),
        ("Remapped Rows", [
            ("Correctable Error", str(g["remap_corr"])),
            ("Uncorrectable Error", str(g["remap_unc"])),
            ("Pending", g["remap_pending"]),
            ("Remapping Failure Occurred", g["remap_failure"]),
            ("Bank Remap Availability Histogram", [
                ("Max", f"{g['hist_max']} bank(s)"), ("High", f"{g['hist_high']} bank(s)"),
                ("Partial", "0 bank(s)"), ("Low", "0 bank(s)"), ("None", "0 bank(s)")]),
        ]),
        ("Temperature", [
            ("GPU Current Temp", f"{g['temp_idle_c']} C"),
            ("GPU T.Limit Temp", f"{g['temp_tlimit_c']} C"),
            ("GPU Shutdown T.Limit Temp", "-8 C"),
            ("GPU Slowdown T.Limit Temp", "-2 C"),
            ("GPU Max Operating T.Limit Temp", "0 C"),
            ("GPU Target Temperature", NA),
            ("Memory Current Temp", _mem_temp(g)),
            ("Memory Max Operating T.Limit Temp", "0 C" if g.get("memory_temp_idle_c") else NA),
        ]),
        ("GPU Power Readings", power),
        ("Module Power Readings", [(k, NA) for k, _ in power]),
        ("Clocks", [("Graphics", f"{clocks_idle['graphics']} MHz"),
                    ("SM", f"{clocks_idle['sm']} MHz"),
                    ("Memory", f"{clocks_idle['memory']} MHz"),
                    ("Video", f"{clocks_idle['video']} MHz")]),
        ("Applications Clocks", [("Graphics", f"{clocks_max['graphics']} MHz"),
                                 ("Memory", f"{clocks_max['memory']} MHz")]),
        ("Default Applications Clocks", [("Graphics", f"{clocks_max['graphics']} MHz"),
                                         ("Memory", f"{clocks_max['memory']} MHz")]),
        ("Deferred Clocks", [("Memory", NA)]),
        ("Max Clocks", [("Graphics", f"{clocks_max['graphics']} MHz"),
                        ("SM", f"{clocks_max['sm']} MHz"),
                        ("Memory", f"{clocks_max['memory']} MHz"),
                        ("Video", f"{clocks_max['video']} MHz")]),
        ("Max Customer Boost Clocks", [("Graphics", f"{clocks_max['graphics']} MHz")]),
        ("Clock Policy", [("Auto Boost", NA), ("Auto Boost Default", NA)]),
        ("Voltage", [("Graphics", f"{float(g['voltage_mv']):.3f} mV")]),
        ("Fabric", [("State", fabric[0]), ("Status", fabric[1])]),
        ("Processes", "None"),
    ]


def _render_tree(tree: Tree, depth: int, out: list[str]) -> None:
    for title, value in tree:
        prefix = "    " * depth + title
        if isinstance(value, list):
            out.append(prefix)
            _render_tree(value, depth + 1, out)
        else:
            out.append(f"{prefix:<42}: {value}")


def render_query(node: Node, gpus: list[dict[str, Any]]) -> str:
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp':<42}: {_ts_long(node.now)}",
        f"{'Driver Version':<42}: {node.version}",
        f"{'CUDA Version':<42}: {node.cuda_version}",
        "",
        f"{'Attached GPUs':<42}: {len(node.gpus)}",
    ]
    for g in gpus:
        out.append(f"GPU {g['pci_bus_id']}")
        _render_tree(_q_gpu(node, g), 1, out)
        out.append("")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# -q -x, element layout of DTD v12 (fixtures/nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml)
# --------------------------------------------------------------------------------------------


def _dtd_version(branch: str) -> str:
    # v12 from R525 through R560 (535 sample); v13 from R570 (590 samples).
    return "v13" if int(branch) >= 570 else "v12"


def _x_gpu(node: Node, g: dict[str, Any]) -> Tree:
    bus = g["pci_bus_id"]
    reasons = dict(_idle_reasons())
    act = {True: "Active", False: "Not Active"}
    clk_i = g["clocks_idle_mhz"]
    clk_m = g["clocks_max_mhz"]
    mem_total = int(g["memory_total_mib"])
    mem_res = int(g["memory_reserved_mib"])
    used = _memory_used_mib(g)
    fabric = ("Completed", "Success") if node.hw.get("nvswitch") else (NA, NA)
    limit = _watts(float(g["power_limit_w"]))
    supported = [
        ("supported_mem_clock", [
            ("value", f"{clk_m['memory']} MHz"),
            *[("supported_graphics_clock", f"{mhz} MHz")
              for mhz in range(int(clk_m["graphics"]), 209, -15)],
        ])
    ]

    def errs(corr: int, unc: int) -> Tree:
        return [("sram_correctable", "0"), ("sram_uncorrectable", "0"),
                ("dram_correctable", str(corr)), ("dram_uncorrectable", str(unc))]

    return [
        ("product_name", g["name"]),
        ("product_brand", g["brand"]),
        ("product_architecture", g["architecture"]),
        ("display_mode", "Enabled"),
        ("display_active", "Disabled"),
        ("persistence_mode", node.persistence),
        ("addressing_mode", "None"),
        ("mig_mode", [("current_mig", g["mig"]), ("pending_mig", g["mig"])]),
        ("mig_devices", [("mig_device", _x_mig(d)) for d in g["mig_devices"]]
         if g["mig_devices"] else "None"),
        ("accounting_mode", "Disabled"),
        ("accounting_mode_buffer_size", "4000"),
        ("driver_model", [("current_dm", NA), ("pending_dm", NA)]),
        ("serial", g["serial"]),
        ("uuid", g["uuid"]),
        ("minor_number", str(g["minor_number"])),
        ("vbios_version", g["vbios"]),
        ("multigpu_board", "No"),
        ("board_id", g["board_id"]),
        ("board_part_number", g["board_part_number"]),
        ("gpu_part_number", g["gpu_part_number"]),
        ("gpu_fru_part_number", NA),
        ("gpu_module_id", str(g["module_id"])),
        ("inforom_version", [
            ("img_version", g["inforom_img"]), ("oem_object", g["inforom_oem"]),
            ("ecc_object", g["inforom_ecc"]), ("pwr_object", NA)]),
        ("gpu_operation_mode", [("current_gom", NA), ("pending_gom", NA)]),
        ("gsp_firmware_version", node.version),
        ("gpu_virtualization_mode", [("virtualization_mode", "None"),
                                     ("host_vgpu_mode", NA)]),
        ("gpu_reset_status", [
            ("reset_required", "Yes" if g["remap_pending"] == "Yes" else "No"),
            ("drain_and_reset_recommended", "No")]),
        ("ibmnpu", [("relaxed_ordering_mode", NA)]),
        ("pci", [
            ("pci_bus", bus[9:11]),
            ("pci_device", bus[12:14]),
            ("pci_domain", bus[4:8]),
            ("pci_device_id", g["pci_device_id"][2:]),
            ("pci_bus_id", bus),
            ("pci_sub_system_id", g["pci_subsystem_id"][2:]),
            ("pci_gpu_link_info", [
                ("pcie_gen", [
                    ("max_link_gen", str(g["pcie_gen_max"])),
                    ("current_link_gen", str(g["pcie_gen_cur"])),
                    ("device_current_link_gen", str(g["pcie_gen_cur"])),
                    ("max_device_link_gen", str(g["pcie_gen_max"])),
                    ("max_host_link_gen", str(g["pcie_gen_max"]))]),
                ("link_widths", [
                    ("max_link_width", f"{g['pcie_width_max']}x"),
                    ("current_link_width", f"{g['pcie_width_cur']}x")]),
            ]),
            ("pci_bridge_chip", [("bridge_chip_type", NA), ("bridge_chip_fw", NA)]),
            ("replay_counter", "0"),
            ("replay_rollover_counter", "0"),
            ("tx_util", "0 KB/s"),
            ("rx_util", "0 KB/s"),
            ("atomic_caps_inbound", NA),
            ("atomic_caps_outbound", NA),
        ]),
        ("fan_speed", NA),
        ("performance_state", "P0"),
        ("clocks_event_reasons", [
            ("clocks_event_reason_gpu_idle", act[reasons["Idle"]]),
            ("clocks_event_reason_applications_clocks_setting",
             act[reasons["Applications Clocks Setting"]]),
            ("clocks_event_reason_sw_power_cap", act[reasons["SW Power Cap"]]),
            ("clocks_event_reason_hw_slowdown", act[reasons["HW Slowdown"]]),
            ("clocks_event_reason_hw_thermal_slowdown", act[reasons["HW Thermal Slowdown"]]),
            ("clocks_event_reason_hw_power_brake_slowdown",
             act[reasons["HW Power Brake Slowdown"]]),
            ("clocks_event_reason_sync_boost", act[reasons["Sync Boost"]]),
            ("clocks_event_reason_sw_thermal_slowdown", act[reasons["SW Thermal Slowdown"]]),
            ("clocks_event_reason_display_clocks_setting",
             act[reasons["Display Clock Setting"]]),
        ]),
        ("fb_memory_usage", [
            ("total", f"{mem_total} MiB"), ("reserved", f"{mem_res} MiB"),
            ("used", f"{used} MiB"), ("free", f"{mem_total - mem_res - used} MiB")]),
        ("bar1_memory_usage", [
            ("total", f"{g['bar1_total_mib']} MiB"), ("used", "1 MiB"),
            ("free", f"{int(g['bar1_total_mib']) - 1} MiB")]),
        ("cc_protected_memory_usage", [("total", "0 MiB"), ("used", "0 MiB"),
                                       ("free", "0 MiB")]),
        ("compute_mode", "Default"),
        ("utilization", [("gpu_util", "0 %"), ("memory_util", "0 %"),
                         ("encoder_util", "0 %"), ("decoder_util", "0 %"),
                         ("jpeg_util", "0 %"), ("ofa_util", "0 %")]),
        ("encoder_stats", [("session_count", "0"), ("average_fps", "0"),
                           ("average_latency", "0")]),
        ("fbc_stats", [("session_count", "0"), ("average_fps", "0"),
                       ("average_latency", "0")]),
        ("ecc_mode", [("current_ecc", "Enabled"), ("pending_ecc", "Enabled")]),
        ("ecc_errors", [
            ("volatile", errs(g["dram_corr_vol"], g["dram_unc_vol"])),
            ("aggregate", errs(g["dram_corr_agg"], g["dram_unc_agg"])),
        ]),
        ("retired_pages", [
            ("multiple_single_bit_retirement", [("retired_count", NA),
                                                ("retired_pagelist", NA)]),
            ("double_bit_retirement", [("retired_count", NA), ("retired_pagelist", NA)]),
            ("pending_blacklist", NA),
            ("pending_retirement", NA),
        ]),
        # N/A in MIG mode, as in the MIG samples (v11, v12); else the v11 and v13 samples' layout.
        ("remapped_rows", NA if g["mig_devices"] else [
            ("remapped_row_corr", str(g["remap_corr"])),
            ("remapped_row_unc", str(g["remap_unc"])),
            ("remapped_row_pending", g["remap_pending"]),
            ("remapped_row_failure", g["remap_failure"]),
            ("row_remapper_histogram", [
                ("row_remapper_histogram_max", f"{g['hist_max']} bank(s)"),
                ("row_remapper_histogram_high", f"{g['hist_high']} bank(s)"),
                ("row_remapper_histogram_partial", "0 bank(s)"),
                ("row_remapper_histogram_low", "0 bank(s)"),
                ("row_remapper_histogram_none", "0 bank(s)"),
            ]),
        ]),
        ("temperature", [
            ("gpu_temp", f"{g['temp_idle_c']} C"),
            ("gpu_temp_tlimit", f"{g['temp_tlimit_c']} C"),
            ("gpu_temp_max_threshold", "92 C"),
            ("gpu_temp_slow_threshold", "89 C"),
            ("gpu_temp_max_gpu_threshold", "85 C"),
            ("gpu_target_temperature", NA),
            ("memory_temp", _mem_temp(g)),
            ("gpu_temp_max_mem_threshold", "95 C" if g.get("memory_temp_idle_c") else NA),
        ]),
        ("supported_gpu_target_temp", [("gpu_target_temp_min", NA),
                                       ("gpu_target_temp_max", NA)]),
        ("gpu_power_readings", [
            ("power_state", "P0"),
            ("power_draw", _watts(float(g["power_idle_w"]))),
            ("current_power_limit", limit),
            ("requested_power_limit", limit),
            ("default_power_limit", limit),
            ("min_power_limit", _watts(float(g["power_min_w"]))),
            ("max_power_limit", limit),
        ]),
        ("module_power_readings", [
            ("power_state", "P0"), ("power_draw", NA), ("current_power_limit", NA),
            ("requested_power_limit", NA), ("default_power_limit", NA),
            ("min_power_limit", NA), ("max_power_limit", NA)]),
        ("clocks", [("graphics_clock", f"{clk_i['graphics']} MHz"),
                    ("sm_clock", f"{clk_i['sm']} MHz"),
                    ("mem_clock", f"{clk_i['memory']} MHz"),
                    ("video_clock", f"{clk_i['video']} MHz")]),
        ("applications_clocks", [("graphics_clock", f"{clk_m['graphics']} MHz"),
                                 ("mem_clock", f"{clk_m['memory']} MHz")]),
        ("default_applications_clocks", [("graphics_clock", f"{clk_m['graphics']} MHz"),
                                         ("mem_clock", f"{clk_m['memory']} MHz")]),
        ("deferred_clocks", [("mem_clock", NA)]),
        ("max_clocks", [("graphics_clock", f"{clk_m['graphics']} MHz"),
                        ("sm_clock", f"{clk_m['sm']} MHz"),
                        ("mem_clock", f"{clk_m['memory']} MHz"),
                        ("video_clock", f"{clk_m['video']} MHz")]),
        ("max_customer_boost_clocks", [("graphics_clock", f"{clk_m['graphics']} MHz")]),
        ("clock_policy", [("auto_boost", NA), ("auto_boost_default", NA)]),
        ("voltage", [("graphics_volt", f"{float(g['voltage_mv']):.3f} mV")]),
        ("fabric", [("state", fabric[0]), ("status", fabric[1])]),
        ("supported_clocks", supported),
        ("processes", []),
        ("accounted_processes", []),
    ]


def _x_mig(d: dict[str, Any]) -> Tree:
    # Element for element as in nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml.
    used = 12
    return [
        ("index", str(d["index"])),
        ("gpu_instance_id", str(d["gi"])),
        ("compute_instance_id", str(d["ci"])),
        ("device_attributes", [("shared", [
            ("multiprocessor_count", str(d["sms"])), ("copy_engine_count", str(d["ce"])),
            ("encoder_count", str(d["enc"])), ("decoder_count", str(d["dec"])),
            ("ofa_count", str(d["ofa"])), ("jpg_count", str(d["jpg"])),
        ])]),
        ("ecc_error_count", [("volatile_count", [("sram_uncorrectable", "0")])]),
        ("fb_memory_usage", [("total", f"{d['mem']} MiB"), ("reserved", "0 MiB"),
                             ("used", f"{used} MiB"), ("free", f"{d['mem'] - used - 1} MiB")]),
        ("bar1_memory_usage", [("total", f"{d['bar1']} MiB"), ("used", "0 MiB"),
                               ("free", f"{d['bar1']} MiB")]),
    ]


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _render_xml_tree(tree: Tree, depth: int, out: list[str]) -> None:
    pad = "\t" * depth
    for tag, value in tree:
        if isinstance(value, list):
            out.append(f"{pad}<{tag}>")
            _render_xml_tree(value, depth + 1, out)
            out.append(f"{pad}</{tag}>")
        elif tag == "mig_devices":
            # The real tool writes "None" as indented text inside the element.
            out += [f"{pad}<{tag}>", f"{pad}\t{value}", f"{pad}</{tag}>"]
        else:
            out.append(f"{pad}<{tag}>{_xml_escape(str(value))}</{tag}>")


def render_xml(node: Node, gpus: list[dict[str, Any]]) -> str:
    out = [
        '<?xml version="1.0" ?>',
        f'<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_{_dtd_version(node.branch)}.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{_ts_long(node.now)}</timestamp>",
        f"\t<driver_version>{node.version}</driver_version>",
        f"\t<cuda_version>{node.cuda_version}</cuda_version>",
        f"\t<attached_gpus>{len(node.gpus)}</attached_gpus>",
    ]
    for g in gpus:
        out.append(f'\t<gpu id="{g["pci_bus_id"]}">')
        _render_xml_tree(_x_gpu(node, g), 2, out)
        out.append("\t</gpu>")
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# --query-gpu
# --------------------------------------------------------------------------------------------

Field = tuple[str, Callable[[Node, dict[str, Any]], str]]  # (unit, value getter)


def _const(value: str) -> Callable[[Node, dict[str, Any]], str]:
    return lambda _n, _g: value


def _key(name: str) -> Callable[[Node, dict[str, Any]], str]:
    return lambda _n, g: str(g[name])


def _ecc_fields() -> dict[str, Field]:
    fields: dict[str, Field] = {}
    for kind, attr in (("corrected", "dram_corr"), ("uncorrected", "dram_unc")):
        for scope, suffix in (("volatile", "vol"), ("aggregate", "agg")):
            base = f"ecc.errors.{kind}.{scope}"
            getter = _key(f"{attr}_{suffix}")
            for part in ("device_memory", "dram", "total"):
                fields[f"{base}.{part}"] = ("", getter)
            for part in ("register_file", "l1_cache", "l2_cache", "texture_memory", "cbu"):
                fields[f"{base}.{part}"] = ("", _const("[N/A]"))
            fields[f"{base}.sram"] = ("", _const("0"))
    return fields


def _reason_fields() -> dict[str, Field]:
    fields: dict[str, Field] = {}
    names = {
        "gpu_idle": "Idle", "applications_clocks_setting": "Applications Clocks Setting",
        "sw_power_cap": "SW Power Cap", "hw_slowdown": "HW Slowdown",
        "hw_thermal_slowdown": "HW Thermal Slowdown",
        "hw_power_brake_slowdown": "HW Power Brake Slowdown",
        "sw_thermal_slowdown": "SW Thermal Slowdown", "sync_boost": "Sync Boost",
    }
    reasons = dict(_idle_reasons())
    # Both spellings answer: 535+ renamed throttle -> event and kept the old name as an alias.
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
        fields[f"{prefix}.supported"] = ("", _const("0x00000000000001FF"))
        fields[f"{prefix}.active"] = ("", _const("0x0000000000000001"))
        for field, title in names.items():
            fields[f"{prefix}.{field}"] = (
                "", _const("Active" if reasons[title] else "Not Active"))
    return fields


def _query_fields() -> dict[str, Field]:
    mhz = "MHz"

    def clock(kind: str, which: str) -> Field:
        return (mhz, lambda _n, g: str(g[kind][which]))

    fields: dict[str, Field] = {
        "timestamp": ("", lambda n, _g: _ts_csv(n.now)),
        "driver_version": ("", lambda n, _g: n.version),
        "count": ("", lambda n, _g: str(len(n.gpus))),
        "name": ("", _key("name")),
        "serial": ("", _key("serial")),
        "uuid": ("", _key("uuid")),
        "pci.bus_id": ("", _key("pci_bus_id")),
        "pci.domain": ("", lambda _n, g: "0x" + g["pci_bus_id"][4:8]),
        "pci.bus": ("", lambda _n, g: "0x" + g["pci_bus_id"][9:11]),
        "pci.device": ("", lambda _n, g: "0x" + g["pci_bus_id"][12:14]),
        "pci.device_id": ("", _key("pci_device_id")),
        "pci.sub_device_id": ("", _key("pci_subsystem_id")),
        "pcie.link.gen.current": ("", _key("pcie_gen_cur")),
        "pcie.link.gen.gpucurrent": ("", _key("pcie_gen_cur")),
        "pcie.link.gen.max": ("", _key("pcie_gen_max")),
        "pcie.link.gen.gpumax": ("", _key("pcie_gen_max")),
        "pcie.link.gen.hostmax": ("", _key("pcie_gen_max")),
        "pcie.link.width.current": ("", _key("pcie_width_cur")),
        "pcie.link.width.max": ("", _key("pcie_width_max")),
        "index": ("", _key("index")),
        "display_mode": ("", _const("Enabled")),
        "display_active": ("", _const("Disabled")),
        "persistence_mode": ("", lambda n, _g: n.persistence),
        "addressing_mode": ("", _const("None")),
        "accounting.mode": ("", _const("Disabled")),
        "accounting.buffer_size": ("", _const("4000")),
        "driver_model.current": ("", _const("[N/A]")),
        "driver_model.pending": ("", _const("[N/A]")),
        "vbios_version": ("", _key("vbios")),
        "inforom.img": ("", _key("inforom_img")),
        "inforom.oem": ("", _key("inforom_oem")),
        "inforom.ecc": ("", _key("inforom_ecc")),
        "inforom.pwr": ("", _const("[N/A]")),
        "gom.current": ("", _const("[N/A]")),
        "gom.pending": ("", _const("[N/A]")),
        "fan.speed": ("%", _const("[N/A]")),
        "pstate": ("", _const("P0")),
        "memory.total": ("MiB", _key("memory_total_mib")),
        "memory.reserved": ("MiB", _key("memory_reserved_mib")),
        "memory.used": ("MiB", lambda _n, g: str(_memory_used_mib(g))),
        "memory.free": ("MiB", lambda _n, g: str(
            int(g["memory_total_mib"]) - int(g["memory_reserved_mib"]) - _memory_used_mib(g))),
        "compute_mode": ("", _const("Default")),
        "compute_cap": ("", _key("compute_cap")),
        "utilization.gpu": ("%", _const("0")),
        "utilization.memory": ("%", _const("0")),
        "utilization.encoder": ("%", _const("0")),
        "utilization.decoder": ("%", _const("0")),
        "utilization.jpeg": ("%", _const("0")),
        "utilization.ofa": ("%", _const("0")),
        "encoder.stats.sessionCount": ("", _const("0")),
        "encoder.stats.averageFps": ("", _const("0")),
        "encoder.stats.averageLatency": ("", _const("0")),
        "ecc.mode.current": ("", _const("Enabled")),
        "ecc.mode.pending": ("", _const("Enabled")),
        "retired_pages.single_bit_ecc.count": ("", _const("[N/A]")),
        "retired_pages.double_bit.count": ("", _const("[N/A]")),
        "retired_pages.pending": ("", _const("[N/A]")),
        "remapped_rows.correctable": ("", _key("remap_corr")),
        "remapped_rows.uncorrectable": ("", _key("remap_unc")),
        "remapped_rows.pending": ("", _key("remap_pending")),
        "remapped_rows.failure": ("", _key("remap_failure")),
        "remapped_rows.histogram.max": ("", _key("hist_max")),
        "remapped_rows.histogram.high": ("", _key("hist_high")),
        "remapped_rows.histogram.partial": ("", _const("0")),
        "remapped_rows.histogram.low": ("", _const("0")),
        "remapped_rows.histogram.none": ("", _const("0")),
        "temperature.gpu": ("", _key("temp_idle_c")),
        "temperature.gpu.tlimit": ("", _key("temp_tlimit_c")),
        "temperature.memory": ("", lambda _n, g: _mem_temp(g).removesuffix(" C")),
        "power.management": ("", _const("Enabled")),
        "power.draw": ("W", lambda _n, g: f"{float(g['power_idle_w']):.2f}"),
        "power.draw.average": ("W", lambda _n, g: f"{float(g['power_idle_w']):.2f}"),
        "power.draw.instant": ("W", lambda _n, g: f"{float(g['power_idle_w']):.2f}"),
        "power.limit": ("W", lambda _n, g: f"{float(g['power_limit_w']):.2f}"),
        "enforced.power.limit": ("W", lambda _n, g: f"{float(g['power_limit_w']):.2f}"),
        "power.default_limit": ("W", lambda _n, g: f"{float(g['power_limit_w']):.2f}"),
        "power.min_limit": ("W", lambda _n, g: f"{float(g['power_min_w']):.2f}"),
        "power.max_limit": ("W", lambda _n, g: f"{float(g['power_limit_w']):.2f}"),
        "clocks.current.graphics": clock("clocks_idle_mhz", "graphics"),
        "clocks.current.sm": clock("clocks_idle_mhz", "sm"),
        "clocks.current.memory": clock("clocks_idle_mhz", "memory"),
        "clocks.current.video": clock("clocks_idle_mhz", "video"),
        "clocks.applications.graphics": clock("clocks_max_mhz", "graphics"),
        "clocks.applications.memory": clock("clocks_max_mhz", "memory"),
        "clocks.default_applications.graphics": clock("clocks_max_mhz", "graphics"),
        "clocks.default_applications.memory": clock("clocks_max_mhz", "memory"),
        "clocks.max.graphics": clock("clocks_max_mhz", "graphics"),
        "clocks.max.sm": clock("clocks_max_mhz", "sm"),
        "clocks.max.memory": clock("clocks_max_mhz", "memory"),
        "mig.mode.current": ("", _key("mig")),
        "mig.mode.pending": ("", _key("mig")),
    }
    fields.update(_ecc_fields())
    fields.update(_reason_fields())
    aliases = {
        "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid",
        "gpu_bus_id": "pci.bus_id", "inforom.image": "inforom.img",
        "inforom.power": "inforom.pwr", "gpu_operation_mode.current": "gom.current",
        "gpu_operation_mode.pending": "gom.pending", "retired_pages.sbe":
        "retired_pages.single_bit_ecc.count", "retired_pages.dbe":
        "retired_pages.double_bit.count", "clocks.gr": "clocks.current.graphics",
        "clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory",
        "clocks.video": "clocks.current.video",
        "clocks.applications.gr": "clocks.applications.graphics",
        "clocks.applications.mem": "clocks.applications.memory",
        "clocks.default_applications.gr": "clocks.default_applications.graphics",
        "clocks.default_applications.mem": "clocks.default_applications.memory",
        "clocks.max.gr": "clocks.max.graphics", "clocks.max.mem": "clocks.max.memory",
    }
    fields.update({alias: fields[target] for alias, target in aliases.items()})
    return fields


QUERY_FIELDS = _query_fields()


# --------------------------------------------------------------------------------------------
# --query-compute-apps: processes holding a simulated GPU's device node open
# --------------------------------------------------------------------------------------------

AppField = tuple[str, Callable[[dict[str, Any], int, str, int], str]]  # (unit, getter)
APP_FIELDS: dict[str, AppField] = {
    "timestamp": ("", lambda _g, _p, _n, _m: _ts_csv(time.time())),
    "gpu_name": ("", lambda g, _p, _n, _m: str(g["name"])),
    "gpu_bus_id": ("", lambda g, _p, _n, _m: str(g["pci_bus_id"])),
    "gpu_serial": ("", lambda g, _p, _n, _m: str(g["serial"])),
    "gpu_uuid": ("", lambda g, _p, _n, _m: str(g["uuid"])),
    "pid": ("", lambda _g, p, _n, _m: str(p)),
    "process_name": ("", lambda _g, _p, n, _m: n),
    "name": ("", lambda _g, _p, n, _m: n),
    "used_gpu_memory": ("MiB", lambda _g, _p, _n, m: str(m)),
    "used_memory": ("MiB", lambda _g, _p, _n, m: str(m)),
}


def compute_apps(node: Node) -> list[tuple[dict[str, Any], int, str, int]]:
    """(gpu, pid, process name, used MiB) for every process with a simulated device open."""
    devices = {str(_run_dir() / "dev" / f"nvidia{g['index']}"): g for g in node.gpus}
    found = []
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            targets = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue  # gone, or not ours to read
        for path, gpu in devices.items():
            if path in targets:
                pid = int(proc.name)
                # A job's footprint, stable per process: what NVML would report as its usage.
                found.append((gpu, pid, argv0, 1024 + (pid * 7919) % 30000))
    return sorted(found, key=lambda app: (app[0]["index"], app[1]))


def render_compute_apps(node: Node, names: list[str], fmt: set[str]) -> str:
    units = "nounits" not in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(f"{n} [{APP_FIELDS[n][0]}]" if APP_FIELDS[n][0] else n
                               for n in names))
    for gpu, pid, name, mem in compute_apps(node):
        cells = []
        for field in names:
            unit, getter = APP_FIELDS[field]
            value = getter(gpu, pid, name, mem)
            cells.append(f"{value} {unit}" if unit and units else value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def render_query_gpu(node: Node, gpus: list[dict[str, Any]], names: list[str],
                     fmt: set[str]) -> str:
    units = "nounits" not in fmt
    specs = [QUERY_FIELDS[n] for n in names]
    lines = []
    if "noheader" not in fmt:
        # The header keeps its units even with nounits, as the real tool does.
        heads = [f"{n} [{u}]" if u else n for n, (u, _) in zip(names, specs, strict=True)]
        lines.append(", ".join(heads))
    for g in gpus:
        cells = []
        for unit, getter in specs:
            value = getter(node, g)
            if unit and units and not value.startswith("["):
                value = f"{value} {unit}"
            cells.append(value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------------------------
# Banners
# --------------------------------------------------------------------------------------------


def render_version(version: str, cuda: str) -> str:
    nvml = ".".join(version.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {version}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {version}\n"
        f"CUDA Version        : {cuda}\n"
        f"({SIMULATED}: simulated NVIDIA userland, no GPU behind it)\n"
    )


def render_help(version: str) -> str:
    return f"""NVIDIA System Management Interface -- v{version}
({SIMULATED}: only the options below are simulated)

NVSMI provides monitoring information for Tesla and select Quadro devices.
The data is presented in either a plain text or an XML format, via stdout or a file.

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.

  LIST OPTIONS:

    -L,   --list-gpus           Display a list of GPUs connected to the system.

  SUMMARY OPTIONS:

    <no arguments>              Show a summary of GPUs connected to the system.

  QUERY OPTIONS:

    -q,   --query               Display GPU or Unit info.
    -i,   --id=                 Target a specific GPU or Unit.
    -x,   --xml-format          Produce XML output.

  SELECTIVE QUERY OPTIONS:

    --query-gpu                 Information about GPU.
    --query-compute-apps        List of currently active compute processes.
    --format=                   Comma separated list of format options:
                                  csv - comma separated values (MANDATORY)
                                  noheader - skip the first line with column headers
                                  nounits - don't print units for numerical values

  TOPOLOGY:

    topo -m                     Display the GPUDirect communication matrix.

  NVLINK:

    nvlink -s, --status         Display link state.
"""


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

INVALID_COMBINATION = (
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
)


# Flags that choose what the tool prints, as the real one names them.
_MODE_FLAGS = {"-h": "help", "--help": "help", "--version": "version", "-L": "list",
               "--list-gpus": "list", "-q": "query", "--query": "query"}
# --name=a,b,c options: the mode they choose (None: a setting only).
_LIST_OPTIONS = {"--query-gpu": "query-gpu", "--query-compute-apps": "query-compute-apps",
                 "--format": None}


def _parse(argv: list[str]) -> dict[str, Any]:
    """The options as the real tool takes them, or Usage with its "invalid combination"."""
    opts: dict[str, Any] = {"mode": "table", "id": None, "xml": False, "fields": None,
                            "format": None}
    args = list(argv)
    if args and args[0] in ("topo", "nvlink"):
        return _parse_subcommand(args.pop(0), args, opts)
    while args:
        arg = args.pop(0)
        name, equals, value = arg.partition("=")
        if arg in _MODE_FLAGS:
            opts["mode"] = _MODE_FLAGS[arg]
        elif arg in ("-x", "--xml-format"):
            opts["xml"] = True
        elif arg == "-qx":
            opts["mode"], opts["xml"] = "query", True
        elif _took_id(arg, args, opts):
            continue
        elif equals and name in _LIST_OPTIONS:
            items = [f.strip() for f in value.split(",")]
            if name == "--format":
                opts["format"] = set(items)
            else:
                opts["mode"], opts["fields"] = _LIST_OPTIONS[name], [f for f in items if f]
        else:
            raise Usage(INVALID_COMBINATION)
    if opts["xml"] and opts["mode"] != "query":
        raise Usage(INVALID_COMBINATION)
    return opts


def _parse_subcommand(sub: str, args: list[str], opts: dict[str, Any]) -> dict[str, Any]:
    """``topo -m`` and ``nvlink -s`` (each with an optional ``-i``), nothing else."""
    opts["mode"] = sub
    rest = []
    while args:
        arg = args.pop(0)
        if not _took_id(arg, args, opts):
            rest.append(arg)
    if sub == "topo" and rest not in (["-m"], ["--matrix"]):
        raise Usage(INVALID_COMBINATION)
    if sub == "nvlink" and rest not in (["-s"], ["--status"]):
        raise Usage(INVALID_COMBINATION)
    return opts


def _took_id(arg: str, args: list[str], opts: dict[str, Any]) -> bool:
    """``-i ID``, ``--id ID`` or ``--id=ID`` into opts (taking ID from args); False if not one."""
    if arg in ("-i", "--id"):
        if not args:
            raise Usage(INVALID_COMBINATION)
        opts["id"] = args.pop(0)
        return True
    if arg.startswith("--id="):
        opts["id"] = arg.split("=", 1)[1]
        return True
    return False


def _module_check(version: str) -> str | None:
    """Simulated kernel module: load ours if none is loaded; a different one is a mismatch."""
    run = _run_dir()
    state = run / "nvidia-module-version"
    try:
        loaded = state.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        try:
            run.mkdir(parents=True, exist_ok=True)
            state.write_text(version + "\n", encoding="utf-8")
        except OSError:
            pass  # a read-only /run still lets this call report; the next one retries
        return None
    if loaded and loaded != version:
        nvml = ".".join(version.split(".")[:2])
        return (
            "Failed to initialize NVML: Driver/library version mismatch\n"
            f"NVML library version: {nvml}\n"
        )
    return None


def main(argv: list[str]) -> int:
    version = os.environ.get("GPUREADY_SIM_VERSION", "").strip()
    if not version:
        sys.stderr.write(f"nvidia-smi ({SIMULATED}): GPUREADY_SIM_VERSION is not set\n")
        return RC_INVALID_ARG
    hw_dir = _hw_dir()
    faults = set(_load_json(hw_dir / "faults.json", {"faults": []}).get("faults", []))
    if "tool-hang" in faults:
        # A wedged driver: the real tool blocks in an ioctl and prints nothing.
        while True:
            time.sleep(3600)
    out, rc = respond(argv, version, faults, lambda: _load_json(hw_dir / "hardware.json", None),
                      _module_check, sys.stdout.isatty())
    sys.stdout.write(out)
    return rc


def respond(argv: list[str], version: str, faults: set[str],
            hardware: Callable[[], dict[str, Any] | None],
            module_check: Callable[[str], str | None], tty: bool = False,
            persistenced: bool | None = None) -> tuple[str, int]:
    """What the tool prints on stdout for ``argv``, and its exit status (tool-hang is the
    caller's: it never returns). ``hardware`` gives hardware.json (None: no devices);
    ``module_check`` the driver/library mismatch message, if any; ``persistenced`` whether
    nvidia-persistenced runs (None: look at this machine's processes). The lab's scale harness
    (lab/scale) answers its endpoints' commands through this too."""
    try:
        opts = _parse(argv)
    except Usage as err:
        return str(err), RC_INVALID_ARG
    branch = version.split(".", maxsplit=1)[0]
    if opts["mode"] == "help":
        return render_help(version), RC_OK
    if opts["mode"] == "version":
        return render_version(version, CUDA_BY_BRANCH.get(branch, "12.4")), RC_OK
    if "driver-not-loaded" in faults:
        return NO_DRIVER, RC_DRIVER_NOT_LOADED
    mismatch = module_check(version)
    if mismatch:
        return mismatch, RC_LIB_MISMATCH
    hw = hardware()
    if hw is None:
        return "No devices were found\n", RC_NOT_FOUND
    node = Node(hw, faults, version, persistenced)
    if not node.gpus:
        return "No devices were found\n", RC_NOT_FOUND
    try:
        gpus = node.select(opts["id"])
    except LookupError:
        return "No devices were found\n", RC_NOT_FOUND
    mode = opts["mode"]
    if mode in ("query-gpu", "query-compute-apps"):
        fmt = opts["format"]
        if not fmt or "csv" not in fmt:
            return ('"--format=" switch is missing. Please run \'nvidia-smi -h\' '
                    "for help.\n"), RC_INVALID_ARG
        known = QUERY_FIELDS if mode == "query-gpu" else APP_FIELDS
        for name in opts["fields"] or []:
            if name not in known:
                return f'Field "{name}" is not a valid field to query.\n\n', RC_INVALID_ARG
        if mode == "query-compute-apps":
            return render_compute_apps(node, opts["fields"] or [], fmt), RC_OK
        return render_query_gpu(node, gpus, opts["fields"] or [], fmt), RC_OK
    if mode == "query":
        return (render_xml(node, gpus) if opts["xml"] else render_query(node, gpus)), RC_OK
    if mode == "list":
        return render_list(node), RC_OK
    if mode == "topo":
        return render_topo(node, tty), RC_OK
    if mode == "nvlink":
        return render_nvlink_status(node, gpus), RC_OK
    return render_table(node), RC_OK


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        sys.exit(RC_OK)
