"""Parser for ``nvidia-smi topo -m`` (and ``topo -mp``, ``topo -p2p <r|w|n|a|p>``).

``parse(text) -> TopoMatrix``.

Schema::

    TopoMatrix
      kind: "link" | "p2p"             link-type matrix (-m/-mp) or P2P capability (-p2p)
      devices: tuple[TopoDevice, ...]  in column order
      links: tuple[tuple[str, ...], ...]  links[i][j] between devices i and j, as printed:
                                     X, NV<n>, PIX, PXB, PHB, NODE, SYS (SOC on old drivers);
                                     for p2p: X, OK, CNS, GNS, TNS, NS, U
      legend: tuple[tuple[str, str], ...]      ("PIX", "Connection traversing ...") as printed
      nic_legend: tuple[tuple[str, str], ...]  ("NIC0", "mlx5_0")
    TopoDevice
      name: str                        column name: "GPU0", "NIC3", "mlx5_0"
      kind: "gpu" | "nic"
      index: int                       the number in the name (GPU3 -> 3, mlx5_10 -> 10)
      nic_name: str | None             RDMA device: NIC legend entry, or the mlx5_* name itself
      cpu_affinity: str | None         "0-51,104-155"; None when empty (nvidia-smi prints
                                       nothing for some NUMA-0 GPUs) or for NIC rows
      numa_affinity: str | None        "0", "N/A" as printed; None when absent
      gpu_numa_id: str | None          the newer "GPU NUMA ID" column, as printed ("N/A")
    TopoMatrix.link(a, b) -> str, .nvlink_count(a, b) -> int, .device(name), .gpus, .nics

Devices may be named "GPU3", "NIC0" or their RDMA name "mlx5_0"; an int means a GPU index.
Cells may be separated by tabs (what the tool prints) or runs of spaces (copies in documents);
ANSI colour/underline codes are stripped. With tabs, rows carry one more (empty) cell than
the header before "GPU NUMA ID": that quirk is real and absorbed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "nvidia-smi-topo"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(
    r"^(?:(?P<gpu>GPU)|(?P<nic>NIC|mlx5_|mlx4_|bnxt_re|irdma|hfi1_|qedr|efa_))(?P<n>[0-9]+)$"
)
_LINK_VALUE = re.compile(r"^(X|NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_P2P_VALUE = re.compile(r"^(X|OK|CNS|GNS|TNS|NS|U)$")
_P2P_ONLY = frozenset({"OK", "CNS", "GNS", "TNS", "NS", "U"})
_ATTRIBUTE_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_LEGEND_ENTRY = re.compile(r"^\s*(?P<code>\S+)\s*=\s*(?P<text>.+?)\s*$")
_NIC_LEGEND_ENTRY = re.compile(r"^\s*(?P<nic>NIC[0-9]+)\s*:\s*(?P<name>\S+)\s*$")


@dataclass(frozen=True)
class TopoDevice:
    """One device row/column of the matrix (schema in module docstring)."""

    name: str
    kind: str
    index: int
    nic_name: str | None
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: str | None


@dataclass(frozen=True)
class TopoMatrix:
    """The parsed matrix (schema in module docstring)."""

    kind: str
    devices: tuple[TopoDevice, ...]
    links: tuple[tuple[str, ...], ...]
    legend: tuple[tuple[str, str], ...]
    nic_legend: tuple[tuple[str, str], ...]

    @property
    def gpus(self) -> tuple[TopoDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "gpu")

    @property
    def nics(self) -> tuple[TopoDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "nic")

    def _position(self, ref: str | int) -> int:
        name = f"GPU{ref}" if isinstance(ref, int) else ref
        for i, device in enumerate(self.devices):
            if name in (device.name, device.nic_name):
                return i
        raise KeyError(ref)

    def device(self, ref: str | int) -> TopoDevice:
        return self.devices[self._position(ref)]

    def link(self, a: str | int, b: str | int) -> str:
        return self.links[self._position(a)][self._position(b)]

    def nvlink_count(self, a: str | int, b: str | int) -> int:
        """Bonded NVLinks between a and b (NV18 -> 18); 0 for any PCIe path or self.

        Raises ValueError on a ``-p2p`` matrix, which says nothing about link types.
        """
        if self.kind != "link":
            raise ValueError("a topo -p2p matrix has no link types")
        value = self.link(a, b)
        return int(value[2:]) if value.startswith("NV") else 0


def _cells(line: str, tabbed: bool) -> list[str]:
    if tabbed:
        return [cell.strip() for cell in line.split("\t")]
    return line.split()


def _header_cells(line: str, tabbed: bool) -> list[str]:
    if tabbed:
        return [cell.strip() for cell in line.split("\t") if cell.strip()]
    # Column titles contain single spaces ("CPU Affinity"); columns are 2+ spaces apart.
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def _device(name: str) -> tuple[str, int]:
    match = _DEVICE.match(name)
    if not match:
        raise ParseError(FORMAT, f"unknown device column {name!r}")
    return ("gpu" if match["gpu"] else "nic"), int(match["n"])


def _legends(lines: list[str]) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    legend: list[tuple[str, str]] = []
    nic_legend: list[tuple[str, str]] = []
    section = ""
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "Legend:":
            section = "legend"
        elif stripped == "NIC Legend:":
            section = "nic"
        elif section == "legend" and (entry := _LEGEND_ENTRY.match(line)):
            legend.append((entry["code"], entry["text"]))
        elif section == "nic" and (nic := _NIC_LEGEND_ENTRY.match(line)):
            nic_legend.append((nic["nic"], nic["name"]))
        else:
            raise ParseError(FORMAT, f"unexpected line after the matrix: {stripped[:60]!r}")
    return tuple(legend), tuple(nic_legend)


def _blank_to_none(value: str | None) -> str | None:
    return value if value else None


def parse(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m``/``-mp``/``-p2p`` output (schema in module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError(FORMAT, "empty output")
    lines = [_ANSI.sub("", line).rstrip("\n\r") for line in text.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    header_line = lines[0]
    tabbed = "\t" in header_line
    columns = _header_cells(header_line, tabbed)
    device_names = [c for c in columns if c not in _ATTRIBUTE_COLUMNS]
    attributes = [c for c in columns if c in _ATTRIBUTE_COLUMNS]
    if not device_names or columns[: len(device_names)] != device_names:
        raise ParseError(FORMAT, f"not a topology header: {header_line.strip()[:80]!r}")
    kinds = [_device(name) for name in device_names]

    rows, extras, end = _matrix_rows(lines, device_names, tabbed)
    legend, nic_legend = _legends(lines[end:])
    kind = _matrix_kind(device_names, rows, attributes, legend)
    nic_names = dict(nic_legend)
    devices: list[TopoDevice] = []
    for name, (device_kind, index) in zip(device_names, kinds, strict=True):
        attrs = _attributes(attributes, extras[name])
        nic_name = None
        if device_kind == "nic":
            nic_name = nic_names.get(name) if name.startswith("NIC") else name
        devices.append(
            TopoDevice(
                name=name,
                kind=device_kind,
                index=index,
                nic_name=nic_name,
                cpu_affinity=_blank_to_none(attrs.get("CPU Affinity")),
                numa_affinity=_blank_to_none(attrs.get("NUMA Affinity")),
                gpu_numa_id=_blank_to_none(attrs.get("GPU NUMA ID")),
            )
        )
    return TopoMatrix(
        kind=kind,
        devices=tuple(devices),
        links=tuple(tuple(rows[name]) for name in device_names),
        legend=legend,
        nic_legend=nic_legend,
    )


def _matrix_rows(lines: list[str], device_names: list[str], tabbed: bool
                 ) -> tuple[dict[str, list[str]], dict[str, list[str]], int]:
    """Each device's link cells and the cells after them (affinities), by device; and the index
    of the line that ends the matrix (its first blank line, else the end)."""
    rows: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    end = len(lines)
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            end = number - 1
            break
        cells = _cells(line.strip("\n") if tabbed else line.strip(), tabbed)
        if tabbed:
            cells = [cells[0].strip(), *cells[1:]]
        name = cells[0]
        if name not in device_names:
            raise ParseError(FORMAT, f"line {number}: row for unknown device {name!r}")
        if name in rows:
            raise ParseError(FORMAT, f"line {number}: second row for {name}")
        values = cells[1 : 1 + len(device_names)]
        if len(values) != len(device_names):
            raise ParseError(
                FORMAT, f"line {number}: {name} has {len(values)} link cells (truncated?)"
            )
        rows[name] = values
        extras[name] = cells[1 + len(device_names) :]
    missing = [name for name in device_names if name not in rows]
    if missing:
        raise ParseError(FORMAT, f"no rows for {', '.join(missing)} (truncated?)")

    return rows, extras, end


def _matrix_kind(device_names: list[str], rows: dict[str, list[str]], attributes: list[str],
                 legend: tuple[tuple[str, str], ...]) -> str:
    """The matrix kind, "link" (``topo -m``) or "p2p" (``topo -p2p``), each cell checked."""
    all_values = {v for name in device_names for v in rows[name]}
    # A lone GPU's matrix is just "X": the legend (or the affinity columns) tell the kinds apart.
    if all_values & _P2P_ONLY or (not attributes and any(code == "OK" for code, _ in legend)):
        kind, valid = "p2p", _P2P_VALUE
    else:
        kind, valid = "link", _LINK_VALUE
    for i, name in enumerate(device_names):
        for j, value in enumerate(rows[name]):
            if not valid.match(value):
                raise ParseError(FORMAT, f"{name}/{device_names[j]}: unknown link {value!r}")
            if (i == j) != (value == "X"):
                raise ParseError(FORMAT, f"{name}/{device_names[j]}: 'X' must be on the diagonal")
    return kind


def _attributes(columns: list[str], cells: list[str]) -> dict[str, str]:
    """Affinity cells by column; NIC rows have none (or only empty ones)."""
    if not any(cells):
        return {}
    if len(cells) > len(columns) and columns and columns[-1] == "GPU NUMA ID":
        # nvidia-smi prints an extra empty cell before GPU NUMA ID.
        cells = [*cells[: len(columns) - 1], cells[-1]]
    if len(cells) != len(columns):
        raise ParseError(FORMAT, f"affinity cells {cells!r} do not match columns {columns!r}")
    return dict(zip(columns, cells, strict=True))
