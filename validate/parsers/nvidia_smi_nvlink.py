"""Parser for ``nvidia-smi nvlink -s`` / ``nvidia-smi nvlink --status`` (optionally ``-i N``).

``parse(text) -> tuple[GpuNvlinks, ...]``, one entry per ``GPU N: ...`` block.

Schema::

    GpuNvlinks
      index: int                      nvidia-smi GPU index
      name: str                       "NVIDIA H100 80GB HBM3"
      uuid: str                       "GPU-..."
      links: tuple[NvlinkState, ...]  in link order; empty when the GPU reported none
      status: str                     "ok"            links listed (some may be inactive)
                                      "all-inactive"  NVML: all links are inactive (FAULT)
                                      "mig"           NVLink queries refused in MIG mode
                                      "unsupported"   the device has no NVLink (PCIe card)
      message: str | None             the tool's message for the non-"ok" statuses
      .active_links -> int            links with a speed
    NvlinkState
      link: int
      speed_gbps: float | None        per-link speed in GB/s; None when "<inactive>"
      .active -> bool

Empty output is a valid answer, not an error: drivers print nothing at all for GPUs without
NVLink (real capture from an A10), so it parses to ``()``. Anything else that is not this
format raises ParseError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "nvidia-smi-nvlink"

_GPU = re.compile(r"^GPU (?P<index>[0-9]+): (?P<name>.+) \(UUID: (?P<uuid>[^)]+)\)$")
_LINK = re.compile(
    r"^Link (?P<link>[0-9]+): (?:(?P<speed>[0-9]+(?:\.[0-9]+)?) GB/s|(?P<inactive><inactive>))$"
)
_MESSAGES: tuple[tuple[str, str], ...] = (
    ("all links are inactive", "all-inactive"),
    ("not supported for Devices in MIG mode", "mig"),
    ("does not have or support Nvlink", "unsupported"),
)


@dataclass(frozen=True)
class NvlinkState:
    """One link of one GPU; ``speed_gbps`` is None when the link is inactive."""

    link: int
    speed_gbps: float | None

    @property
    def active(self) -> bool:
        return self.speed_gbps is not None


@dataclass(frozen=True)
class GpuNvlinks:
    """NVLink state of one GPU (schema in module docstring)."""

    index: int
    name: str
    uuid: str
    links: tuple[NvlinkState, ...]
    status: str
    message: str | None

    @property
    def active_links(self) -> int:
        return sum(1 for link in self.links if link.active)


def _status(message: str) -> str | None:
    for needle, status in _MESSAGES:
        if needle.lower() in message.lower():
            return status
    return None


def parse(text: str) -> tuple[GpuNvlinks, ...]:
    """Parse ``nvidia-smi nvlink -s`` output (schema in module docstring)."""
    if not isinstance(text, str):
        raise ParseError(FORMAT, "input is not text")
    if not text.strip():
        return ()
    gpus: list[GpuNvlinks] = []
    current: dict[str, str] | None = None
    links: list[NvlinkState] = []
    message: str | None = None

    def close() -> None:
        if current is None:
            return
        if message is not None:
            status = _status(message) or "error"
        elif links:
            status = "ok"
        else:
            raise ParseError(FORMAT, f"GPU {current['index']} has no links and no message")
        gpus.append(
            GpuNvlinks(
                index=int(current["index"]),
                name=current["name"],
                uuid=current["uuid"],
                links=tuple(links),
                status=status,
                message=message,
            )
        )

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if gpu := _GPU.match(line):
            close()
            current, links, message = gpu.groupdict(), [], None
            continue
        if current is None:
            raise ParseError(FORMAT, f"line {number}: expected 'GPU N: ...', got {line[:60]!r}")
        if link := _LINK.match(line):
            if message is not None:
                raise ParseError(FORMAT, f"line {number}: link after a message")
            speed = None if link["inactive"] else float(link["speed"])
            if int(link["link"]) != len(links):
                raise ParseError(FORMAT, f"line {number}: link {link['link']} out of order")
            links.append(NvlinkState(int(link["link"]), speed))
        elif not links and message is None and _status(line) is not None:
            message = line
        else:
            raise ParseError(FORMAT, f"line {number}: unexpected {line[:60]!r}")
    close()
    return tuple(gpus)
