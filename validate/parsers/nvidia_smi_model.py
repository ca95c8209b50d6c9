"""Shared per-GPU records for ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text).

Both formats describe the same NVML facts, so both parsers return the same records and a check
does not care which one the node produced.

Schema::

    NvidiaSmiLog
      driver_version: str | None     "550.90.07"; None in excerpts without the log header
      cuda_version:   str | None     "12.4"
      attached_gpus:  int | None     what the tool says is attached; may exceed len(gpus)
                                     when the log was filtered (-i N) or excerpted
      gpus: tuple[GpuInfo, ...]      in output order

    GpuInfo
      index: int                     position in this log (= nvidia-smi index for a full log)
      pci_bus_id: str | None         "00000000:18:00.0" (upper-case hex as printed)
      name, uuid, serial, vbios_version: str | None
      pci_device_id: str | None      "0x233010DE"
      minor_number, module_id: int | None
      persistence_mode: str | None   "Enabled" | "Disabled"
      mig_mode: str | None           current MIG mode "Enabled" | "Disabled"; None when N/A
      mig_pending: str | None        pending MIG mode (what the GPU turns to at its next
                                     reset); None when N/A
      mig_devices: tuple[MigDevice, ...]  the MIG devices (one per compute instance), in
                                     output order; () when MIG is off or N/A
      memory_total_mib: int | None   FB memory total
      pcie_gen_max, pcie_gen_current, pcie_width_max, pcie_width_current: int | None
      ecc_mode: str | None           current ECC mode "Enabled" | "Disabled"
      ecc: EccErrors | None          None when the section is absent
      retired_pages: RetiredPages | None    None when absent or the whole section is N/A
      remapped_rows: RemappedRows | None    None when absent or the whole section is N/A
      clock_event_reasons_active: tuple[str, ...]  canonical names of the reasons that are
                                     "Active", e.g. ("gpu_idle",), ("hw_slowdown", ...)
      temperature_c: int | None      GPU current temperature
      power_draw_w: float | None     board power draw (average where the driver splits it)
      power_limit_w: float | None    current (enforced) power limit

    MigDevice
      index: int                     MIG device index on its GPU
      gpu_instance_id, compute_instance_id: int | None
      multiprocessor_count: int | None    SMs of the compute instance
      memory_total_mib: int | None   the GPU instance's (shared) framebuffer

nvidia-smi names no MIG profile in either format (``nvidia-smi -L`` does:
validate.parsers.nvidia_smi_list).

Every numeric field is None when the tool printed N/A, [Not Supported] etc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Canonical clock event (throttle) reason names: the XML tag suffixes, which the text form's
# labels map onto. Drivers before 535 call them "throttle" reasons, 535+ "event" reasons.
CLOCK_EVENT_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)

NA_MARKERS: frozenset[str] = frozenset(
    {
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Unknown Error",
        "[Unknown Error]",
        "Requested functionality has been deprecated",
        "[Requested functionality has been deprecated]",
        "Insufficient Permissions",
        "[Insufficient Permissions]",
        "GPU requires reset",
        "[GPU requires reset]",
        "Unknown",
        "",
    }
)


@dataclass(frozen=True)
class EccErrors:
    """ECC error totals. DRAM and SRAM are summed; a total is None only if all parts are N/A.

    ``*_sram_uncorrectable`` are kept apart because an SRAM uncorrectable error needs a GPU
    reset (and counts toward SRAM threshold RMA) where DRAM errors are handled by row remapping.
    """

    volatile_correctable: int | None
    volatile_uncorrectable: int | None
    aggregate_correctable: int | None
    aggregate_uncorrectable: int | None
    volatile_sram_uncorrectable: int | None = None
    aggregate_sram_uncorrectable: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere; N/A on A100/H100, which remap rows instead)."""

    sbe: int | None
    dbe: int | None
    pending: bool | None


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping (Ampere+). ``pending`` means a reset is needed to apply a remap."""

    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance in a GPU instance) of a GPU in MIG mode."""

    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_total_mib: int | None


@dataclass(frozen=True)
class GpuInfo:
    """Per-GPU facts from one ``nvidia-smi -q`` / ``-q -x`` log (schema in module docstring)."""

    index: int
    pci_bus_id: str | None
    name: str | None
    uuid: str | None
    serial: str | None
    persistence_mode: str | None
    memory_total_mib: int | None
    pcie_gen_max: int | None
    pcie_gen_current: int | None
    pcie_width_max: int | None
    pcie_width_current: int | None
    ecc_mode: str | None
    ecc: EccErrors | None
    retired_pages: RetiredPages | None
    remapped_rows: RemappedRows | None
    clock_event_reasons_active: tuple[str, ...]
    temperature_c: int | None
    power_draw_w: float | None
    mig_mode: str | None
    power_limit_w: float | None = None
    vbios_version: str | None = None
    pci_device_id: str | None = None
    minor_number: int | None = None
    module_id: int | None = None
    mig_pending: str | None = None
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class NvidiaSmiLog:
    """One ``nvidia-smi -q`` log (schema in module docstring)."""

    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[GpuInfo, ...]


def clean(value: str | None) -> str | None:
    """The printed value, or None for N/A-style markers."""
    if value is None:
        return None
    stripped = value.strip()
    if stripped in NA_MARKERS:
        return None
    return stripped


def to_int(value: str | None, *suffixes: str) -> int | None:
    """Integer from a printed value such as ``"81559 MiB"`` or ``"16x"``; None for N/A.

    Raises ValueError on a value that is neither N/A nor a number with one of ``suffixes``,
    which the callers turn into ParseError.
    """
    text = clean(value)
    if text is None:
        return None
    for suffix in suffixes:
        if text.endswith(suffix):
            text = text[: -len(suffix)].strip()
            break
    return int(text)


def to_float(value: str | None, *suffixes: str) -> float | None:
    """Float from a printed value such as ``"67.03 W"``; None for N/A (ValueError otherwise,
    also for ``nan``/``inf``)."""
    text = clean(value)
    if text is None:
        return None
    for suffix in suffixes:
        if text.endswith(suffix):
            text = text[: -len(suffix)].strip()
            break
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a finite number")
    return number


def to_bool(value: str | None) -> bool | None:
    """``Yes``/``No`` to bool; None for N/A (ValueError for anything else)."""
    text = clean(value)
    if text is None:
        return None
    if text == "Yes":
        return True
    if text == "No":
        return False
    raise ValueError(f"expected Yes/No, got {text!r}")


def sum_known(*values: int | None) -> int | None:
    """Sum of the values that are known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
