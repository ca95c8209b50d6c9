"""Parser for ``nvidia-smi -q`` text (also ``-q -i N``, ``-q -d SECTION`` and ``-a``).

``parse(text) -> NvidiaSmiLog``; the record schema is in :mod:`validate.parsers.nvidia_smi_model`.

The text is a tree by indentation: ``Label : value`` leaves, ``Label`` section headers, and
lines like ``HW Slowdown : Active`` that carry a value *and* children. Only a GPU's own
sections are read, never those nested in its ``MIG Device`` blocks. Accepted besides full logs:

- ``-d`` subsets (a GPU block holding only ``Retired Pages``, say);
- excerpts as people paste them: ``[...]`` elision lines are skipped, and sections with no
  ``GPU <bus id>`` line above them become one GPU with ``pci_bus_id=None``.

A section header with nothing under it is how a cut-off capture ends, so it raises ParseError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from validate.parsers import ParseError
from validate.parsers.nvidia_smi_model import (
    EccErrors,
    GpuInfo,
    MigDevice,
    NvidiaSmiLog,
    RemappedRows,
    RetiredPages,
    clean,
    sum_known,
    to_bool,
    to_float,
    to_int,
)

FORMAT = "nvidia-smi-q"

_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s+(?P<value>.*?))?\s*$")
_GPU_HEADER = re.compile(
    r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$"
)
_BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
_ELISION = "[...]"
_LOG_HEADER_KEYS = frozenset({"Timestamp", "Driver Version", "CUDA Version", "Attached GPUs"})
# Sections and leaves that make an un-headed excerpt recognisably a GPU block.
_GPU_KEYS = frozenset(
    {
        "Product Name",
        "GPU UUID",
        "Serial Number",
        "PCI",
        "FB Memory Usage",
        "ECC Mode",
        "ECC Errors",
        "Retired Pages",
        "Remapped Rows",
        "Temperature",
        "Clocks Event Reasons",
        "Clocks Throttle Reasons",
    }
)
_REASON_ALIASES = {"idle": "gpu_idle", "display_clock_setting": "display_clocks_setting"}


@dataclass
class _Node:
    key: str
    value: str | None
    indent: int
    line: int
    children: list[_Node] = field(default_factory=list)

    def child(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.child(*path)
        return None if node is None else node.value


def _tree(text: str) -> _Node:
    root = _Node("", None, -1, 0)
    stack = [root]
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped == _ELISION or _BANNER.match(stripped):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise ParseError(FORMAT, f"line {number}: tab indentation is not nvidia-smi -q text")
        indent = len(line) - len(line.lstrip(" "))
        match = _KEY_VALUE.match(stripped)
        if match:
            node = _Node(match["key"], match["value"] or "", indent, number)
        else:
            node = _Node(stripped, None, indent, number)
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root


def _check_complete(node: _Node) -> None:
    for child in node.children:
        if child.value is None and not child.children:
            raise ParseError(
                FORMAT,
                f"line {child.line}: {child.key!r} has no value and nothing under it (truncated?)",
            )
        _check_complete(child)


def _reasons(gpu: _Node) -> tuple[str, ...]:
    block = gpu.child("Clocks Event Reasons") or gpu.child("Clocks Throttle Reasons")
    if block is None:
        return ()
    active: list[str] = []

    def walk(node: _Node) -> None:
        for child in node.children:
            if child.value == "Active":
                name = child.key.lower().replace(" ", "_")
                active.append(_REASON_ALIASES.get(name, name))
            walk(child)

    walk(block)
    return tuple(active)


def _ecc_scope(block: _Node | None) -> tuple[int | None, int | None, int | None]:
    if block is None:
        return None, None, None
    if block.child("Single Bit") is not None or block.child("Double Bit") is not None:
        single = to_int(block.get("Single Bit", "Total"))
        return single, to_int(block.get("Double Bit", "Total")), None
    sram_unc = sum_known(
        to_int(block.get("SRAM Uncorrectable")),
        to_int(block.get("SRAM Uncorrectable Parity")),
        to_int(block.get("SRAM Uncorrectable SEC-DED")),
    )
    correctable = sum_known(
        to_int(block.get("SRAM Correctable")), to_int(block.get("DRAM Correctable"))
    )
    uncorrectable = sum_known(sram_unc, to_int(block.get("DRAM Uncorrectable")))
    return correctable, uncorrectable, sram_unc


def _ecc(gpu: _Node) -> EccErrors | None:
    block = gpu.child("ECC Errors")
    if block is None:
        return None
    v_corr, v_unc, v_sram = _ecc_scope(block.child("Volatile"))
    a_corr, a_unc, a_sram = _ecc_scope(block.child("Aggregate"))
    return EccErrors(v_corr, v_unc, a_corr, a_unc, v_sram, a_sram)


def _retired(gpu: _Node) -> RetiredPages | None:
    block = gpu.child("Retired Pages")
    if block is None or not block.children:
        return None
    pending = block.get("Pending Page Blacklist")
    if pending is None:
        pending = block.get("Pending Page Retirement")
    pages = RetiredPages(
        sbe=to_int(block.get("Single Bit ECC")),
        dbe=to_int(block.get("Double Bit ECC")),
        pending=to_bool(pending),
    )
    return None if pages == RetiredPages(None, None, None) else pages


def _remapped(gpu: _Node) -> RemappedRows | None:
    block = gpu.child("Remapped Rows")
    if block is None or not block.children:
        return None  # "Remapped Rows : N/A" on GPUs without row remapping
    return RemappedRows(
        correctable=to_int(block.get("Correctable Error")),
        uncorrectable=to_int(block.get("Uncorrectable Error")),
        pending=to_bool(block.get("Pending")),
        failure=to_bool(block.get("Remapping Failure Occurred")),
    )


def _first_float(block: _Node | None, *keys: str) -> float | None:
    if block is None:
        return None
    for key in keys:
        value = to_float(block.get(key), "W")
        if value is not None:
            return value
    return None


def _mig_devices(gpu: _Node) -> tuple[MigDevice, ...]:
    out = []
    for position, dev in enumerate(c for c in gpu.children if c.key == "MIG Device"):
        printed = to_int(dev.get("Index"))
        out.append(MigDevice(
            index=position if printed is None else printed,
            gpu_instance_id=to_int(dev.get("GPU Instance ID")),
            compute_instance_id=to_int(dev.get("Compute Instance ID")),
            multiprocessor_count=to_int(
                dev.get("Device Attributes", "Shared", "Multiprocessor count")),
            memory_total_mib=to_int(dev.get("Shared FB Memory Usage", "Total"), "MiB"),
        ))
    return tuple(out)


def _gpu(index: int, bus_id: str | None, gpu: _Node) -> GpuInfo:
    power = gpu.child("GPU Power Readings") or gpu.child("Power Readings")
    link = gpu.child("PCI", "GPU Link Info")
    return GpuInfo(
        index=index,
        pci_bus_id=clean(gpu.get("PCI", "Bus Id")) or bus_id,
        name=clean(gpu.get("Product Name")),
        uuid=clean(gpu.get("GPU UUID")),
        serial=clean(gpu.get("Serial Number")),
        persistence_mode=clean(gpu.get("Persistence Mode")),
        memory_total_mib=to_int(gpu.get("FB Memory Usage", "Total"), "MiB"),
        pcie_gen_max=to_int(link.get("PCIe Generation", "Max")) if link else None,
        pcie_gen_current=to_int(link.get("PCIe Generation", "Current")) if link else None,
        pcie_width_max=to_int(link.get("Link Width", "Max"), "x") if link else None,
        pcie_width_current=to_int(link.get("Link Width", "Current"), "x") if link else None,
        ecc_mode=clean(gpu.get("ECC Mode", "Current")),
        ecc=_ecc(gpu),
        retired_pages=_retired(gpu),
        remapped_rows=_remapped(gpu),
        clock_event_reasons_active=_reasons(gpu),
        temperature_c=to_int(gpu.get("Temperature", "GPU Current Temp"), "C"),
        power_draw_w=_first_float(
            power, "Power Draw", "Average Power Draw", "Instantaneous Power Draw"
        ),
        mig_mode=clean(gpu.get("MIG Mode", "Current")),
        power_limit_w=_first_float(
            power, "Current Power Limit", "Enforced Power Limit", "Power Limit"
        ),
        vbios_version=clean(gpu.get("VBIOS Version")),
        pci_device_id=clean(gpu.get("PCI", "Device Id")),
        minor_number=to_int(gpu.get("Minor Number")),
        module_id=to_int(gpu.get("Module ID")),
        mig_pending=clean(gpu.get("MIG Mode", "Pending")),
        mig_devices=_mig_devices(gpu),
    )


def parse(text: str) -> NvidiaSmiLog:
    """Parse ``nvidia-smi -q`` text (schema in nvidia_smi_model)."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError(FORMAT, "empty output")
    root = _tree(text)
    try:
        _check_complete(root)
    except RecursionError:  # the walk recurses per indentation level
        raise ParseError(FORMAT, "indentation nested too deeply to be nvidia-smi -q") from None
    header = {c.key: c.value for c in root.children if c.key in _LOG_HEADER_KEYS}
    gpu_nodes: list[tuple[str | None, _Node]] = []
    loose = _Node("", None, -1, 0)
    for child in root.children:
        match = _GPU_HEADER.match(child.key) if child.value is None else None
        if match:
            gpu_nodes.append((match["bus"], child))
        elif child.key not in _LOG_HEADER_KEYS:
            loose.children.append(child)
    if loose.children:
        # An excerpt: sections pasted without their "GPU <bus id>" line.
        if gpu_nodes or not any(c.key in _GPU_KEYS and c.indent > 0 for c in loose.children):
            first = loose.children[0]
            raise ParseError(FORMAT, f"line {first.line}: unexpected {first.key!r}")
        gpu_nodes.append((None, loose))
    if not gpu_nodes and not header:
        raise ParseError(FORMAT, "no NVSMI log header and no GPU sections")
    try:
        gpus = tuple(_gpu(i, bus, node) for i, (bus, node) in enumerate(gpu_nodes))
        attached = to_int(header.get("Attached GPUs"))
    except ValueError as exc:
        raise ParseError(FORMAT, f"unexpected value: {exc}") from exc
    if not gpus and not attached:
        raise ParseError(FORMAT, "no GPU sections")
    return NvidiaSmiLog(
        driver_version=clean(header.get("Driver Version")),
        cuda_version=clean(header.get("CUDA Version")),
        attached_gpus=attached,
        gpus=gpus,
    )
