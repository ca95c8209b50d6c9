"""NVIDIA dcgm-exporter's ``/metrics`` (the Prometheus text format) -> one record per GPU.

parse(text) -> ExporterScrape

The text is read by the Prometheus project's own parser
(``prometheus_client.parser.text_string_to_metric_families``): ``# HELP``/``# TYPE`` lines,
escaped label values, spaces after commas (NVIDIA's README writes ``{gpu="0", UUID="..."}``),
families whose samples are not next to their HELP line. This module then groups the
``DCGM_FI_*`` samples by GPU, as dcgm-exporter labels them (real captures in
tests/fixtures/dcgm-exporter/):

- ``gpu`` (the index), ``UUID``, ``device`` (``nvidia0``), ``modelName``, ``Hostname``,
  ``DCGM_FI_DRIVER_VERSION`` (exporter 2.x and later; absent in older or trimmed outputs),
  ``pci_bus_id`` (exporter 3.3 and later), the Kubernetes ``container``/``namespace``/``pod``;
- a sample of a MIG instance carries ``GPU_I_ID``/``GPU_I_PROFILE`` too: it counts for its GPU's
  identity, not for the GPU's own values (each instance has its own reading);
- a sample without ``gpu`` and ``UUID`` (a node-wide or hand-written one) is not a GPU's.

Values are kept per field name (``DCGM_FI_DEV_XID_ERRORS`` -> 0.0). DCGM's blank-value sentinels
(``9223372036854775794`` and its neighbours: no reading for that field) are dropped, so a missing
reading is never a number. Garbage (an HTML page, a truncated line) or a text without one GPU
sample is a :class:`ParseError` naming the line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from validate.parsers import ParseError

FMT = "dcgm-exporter /metrics"
PREFIX = "DCGM_FI_"
# DCGM's blank values (dcgm_structs.h DCGM_INT64_BLANK and the NOT_FOUND/NOT_SUPPORTED/
# NOT_PERMISSIONED values beside it): 0x7ffffffffffffff0 to 0x7fffffffffffffff. As a float
# they all round to 2**63.
_BLANK_MIN = float(0x7FFFFFFFFFFFFFF0)


@dataclass(frozen=True, slots=True)
class ExporterGpu:
    """One GPU as the exporter labels it, with its own (non-MIG) readings."""

    index: int
    uuid: str
    device: str = ""
    model: str = ""
    hostname: str = ""
    driver_version: str | None = None
    pci_bus_id: str = ""
    values: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExporterScrape:
    """A whole scrape: the GPUs by index order, and every DCGM family's HELP and TYPE."""

    gpus: tuple[ExporterGpu, ...]
    help: Mapping[str, str]
    types: Mapping[str, str]

    @property
    def driver_versions(self) -> frozenset[str]:
        return frozenset(g.driver_version for g in self.gpus if g.driver_version)


@dataclass
class _Seen:
    index: int
    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def _bad_line(text: str) -> str:
    """The first line the Prometheus parser refuses, with its number (for the error)."""
    for number, line in enumerate(text.splitlines(), 1):
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            return f"line {number}: {line[:120]!r}"
    return "the text as a whole"


def parse(text: str) -> ExporterScrape:
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ParseError(FMT, f"not the Prometheus text format at {_bad_line(text)} "
                              f"({exc})") from None
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    found: dict[str, _Seen] = {}
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        if family.documentation:
            helps[family.name] = family.documentation
        if family.type != "unknown":
            types[family.name] = family.type
        for sample in family.samples:
            labels = sample.labels
            uuid = labels.get("UUID", "")
            if "gpu" not in labels or not uuid:
                continue
            try:
                index = int(labels["gpu"])
            except ValueError:
                raise ParseError(FMT, f"{family.name}: gpu label {labels['gpu']!r} is not an "
                                      f"index") from None
            gpu = found.setdefault(uuid, _Seen(index))
            if gpu.index != index:
                raise ParseError(FMT, f"{uuid} is labelled gpu {gpu.index} and gpu {index}")
            for name in ("device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
                         "pci_bus_id"):
                if labels.get(name):
                    gpu.labels.setdefault(name, labels[name])
            if "GPU_I_ID" in labels:
                continue
            value = float(sample.value)
            if math.isfinite(value) and abs(value) < _BLANK_MIN:
                # By family: the parser names a counter's samples <name>_total (OpenMetrics).
                gpu.values.setdefault(family.name, value)
    if not found:
        raise ParseError(FMT, "no DCGM_FI_* sample labelled with a gpu and a UUID "
                              f"({len(families)} metric families)")
    gpus = []
    for uuid, gpu in found.items():
        seen = gpu.labels
        gpus.append(ExporterGpu(
            index=gpu.index, uuid=uuid, device=seen.get("device", ""),
            model=seen.get("modelName", ""), hostname=seen.get("Hostname", ""),
            driver_version=seen.get("DCGM_FI_DRIVER_VERSION"),
            pci_bus_id=seen.get("pci_bus_id", ""), values=dict(gpu.values)))
    gpus.sort(key=lambda g: (g.index, g.uuid))
    return ExporterScrape(tuple(gpus), helps, types)
