"""Parser for ``nvidia-smi -q -x`` (XML, DTD nvsmi_device_v11, v12 and v13).

``parse(text) -> NvidiaSmiLog``; the record schema is in :mod:`validate.parsers.nvidia_smi_model`.

Differences across DTD versions that this parser absorbs:

- clock reasons: ``clocks_throttle_reasons/clocks_throttle_reason_*`` (v11) vs
  ``clocks_event_reasons/clocks_event_reason_*`` (v12+);
- ECC errors: ``single_bit``/``double_bit`` blocks with per-unit counters and ``total`` (old
  GPUs) vs ``sram_correctable``/``sram_uncorrectable``/``dram_*`` (Ampere+), and v13's split
  ``sram_uncorrectable_parity`` + ``sram_uncorrectable_secded``;
- power: ``power_readings/power_draw`` (v11) vs ``gpu_power_readings/power_draw`` (v12) vs
  ``gpu_power_readings/average_power_draw`` (v13), limits likewise.

The document must not declare entities or an internal DTD subset: nvidia-smi never writes one,
and refusing it keeps entity-expansion tricks out of the parser.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

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

FORMAT = "nvidia-smi-xml"

_DOCTYPE = re.compile(r"<!DOCTYPE[^>\[]*>", re.IGNORECASE)
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


def _text(elem: ET.Element | None, path: str) -> str | None:
    if elem is None:
        return None
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    return found.text


def _ecc(gpu: ET.Element) -> EccErrors | None:
    errors = gpu.find("ecc_errors")
    if errors is None:
        return None

    def scope(name: str) -> tuple[int | None, int | None, int | None]:
        block = errors.find(name)
        if block is None:
            return None, None, None
        if block.find("single_bit") is not None or block.find("double_bit") is not None:
            # Pre-Ampere layout: per-unit counters with a total; no SRAM/DRAM split.
            return (
                to_int(_text(block, "single_bit/total")),
                to_int(_text(block, "double_bit/total")),
                None,
            )
        sram_unc = sum_known(
            to_int(_text(block, "sram_uncorrectable")),
            to_int(_text(block, "sram_uncorrectable_parity")),
            to_int(_text(block, "sram_uncorrectable_secded")),
        )
        correctable = sum_known(
            to_int(_text(block, "sram_correctable")), to_int(_text(block, "dram_correctable"))
        )
        uncorrectable = sum_known(sram_unc, to_int(_text(block, "dram_uncorrectable")))
        return correctable, uncorrectable, sram_unc

    v_corr, v_unc, v_sram = scope("volatile")
    a_corr, a_unc, a_sram = scope("aggregate")
    return EccErrors(v_corr, v_unc, a_corr, a_unc, v_sram, a_sram)


def _retired(gpu: ET.Element) -> RetiredPages | None:
    block = gpu.find("retired_pages")
    if block is None or len(block) == 0:
        return None
    pages = RetiredPages(
        sbe=to_int(_text(block, "multiple_single_bit_retirement/retired_count")),
        dbe=to_int(_text(block, "double_bit_retirement/retired_count")),
        pending=to_bool(_text(block, "pending_retirement") or _text(block, "pending_blacklist")),
    )
    return None if pages == RetiredPages(None, None, None) else pages


def _remapped(gpu: ET.Element) -> RemappedRows | None:
    block = gpu.find("remapped_rows")
    if block is None or len(block) == 0:
        return None  # "N/A" text on GPUs without row remapping
    return RemappedRows(
        correctable=to_int(_text(block, "remapped_row_corr")),
        uncorrectable=to_int(_text(block, "remapped_row_unc")),
        pending=to_bool(_text(block, "remapped_row_pending")),
        failure=to_bool(_text(block, "remapped_row_failure")),
    )


def _index(printed: int | None, position: int) -> int:
    return position if printed is None else printed


def _mig_devices(gpu: ET.Element) -> tuple[MigDevice, ...]:
    # <mig_devices> holds the text "None" when MIG is off, <mig_device> elements when on.
    return tuple(
        MigDevice(
            index=_index(to_int(_text(dev, "index")), i),
            gpu_instance_id=to_int(_text(dev, "gpu_instance_id")),
            compute_instance_id=to_int(_text(dev, "compute_instance_id")),
            multiprocessor_count=to_int(
                _text(dev, "device_attributes/shared/multiprocessor_count")),
            memory_total_mib=to_int(_text(dev, "fb_memory_usage/total"), "MiB"),
        )
        for i, dev in enumerate(gpu.findall("mig_devices/mig_device"))
    )


def _reasons(gpu: ET.Element) -> tuple[str, ...]:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return ()
    active: list[str] = []
    for child in block:
        name = child.tag
        for prefix in _REASON_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        if (child.text or "").strip() == "Active":
            active.append(name)
    return tuple(active)


def _power(gpu: ET.Element) -> tuple[float | None, float | None]:
    readings = gpu.find("gpu_power_readings")
    if readings is None:
        readings = gpu.find("power_readings")
    if readings is None:
        return None, None
    draw = to_float(_text(readings, "power_draw"), "W")
    if draw is None:
        draw = to_float(_text(readings, "average_power_draw"), "W")
    if draw is None:
        draw = to_float(_text(readings, "instant_power_draw"), "W")
    limit = to_float(_text(readings, "current_power_limit"), "W")
    if limit is None:
        limit = to_float(_text(readings, "enforced_power_limit"), "W")
    if limit is None:
        limit = to_float(_text(readings, "power_limit"), "W")
    return draw, limit


def _pci_device_id(raw: str | None) -> str | None:
    text = clean(raw)
    if text is None:
        return None
    return text if text.lower().startswith("0x") else "0x" + text


def _gpu(index: int, gpu: ET.Element) -> GpuInfo:
    draw, limit = _power(gpu)
    link = gpu.find("pci/pci_gpu_link_info")
    return GpuInfo(
        index=index,
        pci_bus_id=clean(_text(gpu, "pci/pci_bus_id")) or clean(gpu.get("id")),
        name=clean(_text(gpu, "product_name")),
        uuid=clean(_text(gpu, "uuid")),
        serial=clean(_text(gpu, "serial")),
        persistence_mode=clean(_text(gpu, "persistence_mode")),
        memory_total_mib=to_int(_text(gpu, "fb_memory_usage/total"), "MiB"),
        pcie_gen_max=to_int(_text(link, "pcie_gen/max_link_gen")),
        pcie_gen_current=to_int(_text(link, "pcie_gen/current_link_gen")),
        pcie_width_max=to_int(_text(link, "link_widths/max_link_width"), "x"),
        pcie_width_current=to_int(_text(link, "link_widths/current_link_width"), "x"),
        ecc_mode=clean(_text(gpu, "ecc_mode/current_ecc")),
        ecc=_ecc(gpu),
        retired_pages=_retired(gpu),
        remapped_rows=_remapped(gpu),
        clock_event_reasons_active=_reasons(gpu),
        temperature_c=to_int(_text(gpu, "temperature/gpu_temp"), "C"),
        power_draw_w=draw,
        mig_mode=clean(_text(gpu, "mig_mode/current_mig")),
        power_limit_w=limit,
        vbios_version=clean(_text(gpu, "vbios_version")),
        pci_device_id=_pci_device_id(_text(gpu, "pci/pci_device_id")),
        minor_number=to_int(_text(gpu, "minor_number")),
        module_id=to_int(_text(gpu, "module_id")),
        mig_pending=clean(_text(gpu, "mig_mode/pending_mig")),
        mig_devices=_mig_devices(gpu),
    )


def parse(text: str) -> NvidiaSmiLog:
    """Parse ``nvidia-smi -q -x`` output (schema in nvidia_smi_model)."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError(FORMAT, "empty output")
    if "<!ENTITY" in text.upper() or re.search(r"<!DOCTYPE[^>]*\[", text, re.IGNORECASE):
        raise ParseError(FORMAT, "document declares entities or an internal DTD subset")
    body = _DOCTYPE.sub("", text, count=1)
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise ParseError(FORMAT, f"not well-formed XML (truncated?): {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(FORMAT, f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    try:
        gpus = tuple(_gpu(i, g) for i, g in enumerate(root.findall("gpu")))
        attached = to_int(_text(root, "attached_gpus"))
    except ValueError as exc:
        raise ParseError(FORMAT, f"unexpected value: {exc}") from exc
    if not gpus and not attached:
        raise ParseError(FORMAT, "no <gpu> elements")
    return NvidiaSmiLog(
        driver_version=clean(_text(root, "driver_version")),
        cuda_version=clean(_text(root, "cuda_version")),
        attached_gpus=attached,
        gpus=gpus,
    )
