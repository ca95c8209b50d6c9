"""Parser for ``nvidia-smi --query-*=... --format=csv[,noheader][,nounits]``.

Schema::

    parse_query_gpu(text, fields=None) -> list[GpuQueryRow]     one row per output line
    GpuQueryRow
      cells: tuple[CsvCell, ...]       in column order
      .fields -> tuple[str, ...]       field names, units stripped ("memory.total")
      .value(field) -> int | float | str | None    converted value, None for N/A markers
      .raw(field) -> str               the cell as printed ("81559 MiB", "[N/A]")
      .marker(field) -> str | None     the N/A marker as printed ("[Not Supported]"), else None
      .number(field) -> float | None   numeric value or None; ParseError if the cell is text
      .integer(field) -> int | None    as above, for whole numbers
      .text(field) -> str | None       value as text, None for N/A markers
    CsvCell(field, raw, value, unit, marker)
      unit: str | None                 unit from the header ("MiB") or stripped from the value

    parse_query_compute_apps(text, fields=None) -> list[ComputeApp]
    ComputeApp(gpu_uuid, gpu_bus_id, pid: int | None, process_name, used_memory_mib: int | None)

    parse_query_retired_pages(text, fields=None) -> list[RetiredPage]
    RetiredPage(gpu_uuid, gpu_bus_id, address: str | None, timestamp: str | None, cause)

With a header line the field names come from it; with ``noheader`` the caller passes the
``fields`` it asked for (a header that matches ``fields`` is also accepted and skipped).
Numbers convert when the value is numeric after its unit is stripped, except for fields whose
values are identifiers or versions (serial, uuid, vbios_version, compute_cap, ...), which stay
text so that "0000000000000" or "2.1" keep their meaning.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "nvidia-smi-csv"

CsvValue = int | float | str | None

# Units nvidia-smi appends to values (and puts in brackets in the header).
_UNITS: tuple[str, ...] = ("MiB", "GB/s", "KB/s", "MHz", "mV", "W", "%", "us", "ms", "C")
_HEADER_UNIT = re.compile(r"^(?P<name>\S+?)\s*\[(?P<unit>[^\]]+)\]$")
_INT = re.compile(r"^-?(0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^-?[0-9]+\.[0-9]+$")
# N/A style markers: bracketed ones ("[N/A]", "[Not Supported]", "[Unknown Error]",
# "[Requested functionality has been deprecated]") and the bare "N/A" the fabric fields print.
_BRACKET_MARKER = re.compile(r"^\[[^\]]*\]$")
_BARE_MARKERS = frozenset({"N/A", "Not Supported", "Unknown Error"})

# Fields that hold identifiers or version strings: never converted to numbers.
_TEXT_FIELDS = frozenset(
    {
        "name",
        "serial",
        "uuid",
        "driver_version",
        "kmd_version",
        "vbios_version",
        "compute_cap",
        "timestamp",
        "gpu_name",
        "gpu_serial",
        "gpu_uuid",
        "gpu_bus_id",
        "process_name",
        "hostname",
        "platform.chassis_serial_number",
        "platform.gpu_fabric_guid",
        "fabric.clusterUuid",
        "retired_pages.address",
        "retired_pages.timestamp",
    }
)
_TEXT_PREFIXES: tuple[str, ...] = ("inforom.", "pci.")


@dataclass(frozen=True)
class CsvCell:
    """One cell: field name, the text as printed, converted value, unit, N/A marker."""

    field: str
    raw: str
    value: CsvValue
    unit: str | None
    marker: str | None


@dataclass(frozen=True)
class GpuQueryRow:
    """One output line of a ``--query-*`` CSV (schema in module docstring)."""

    cells: tuple[CsvCell, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(cell.field for cell in self.cells)

    def cell(self, field: str) -> CsvCell:
        for cell in self.cells:
            if cell.field == field:
                return cell
        raise KeyError(field)

    def __contains__(self, field: object) -> bool:
        return any(cell.field == field for cell in self.cells)

    def value(self, field: str) -> CsvValue:
        return self.cell(field).value

    def raw(self, field: str) -> str:
        return self.cell(field).raw

    def marker(self, field: str) -> str | None:
        return self.cell(field).marker

    def text(self, field: str) -> str | None:
        cell = self.cell(field)
        if cell.marker is not None:
            return None
        return cell.value if isinstance(cell.value, str) else _strip_unit(cell.raw, cell.unit)

    def number(self, field: str) -> float | None:
        value = self.cell(field).value
        if value is None:
            return None
        if isinstance(value, str):
            raise ParseError(FORMAT, f"field {field!r} is not numeric: {value!r}")
        return float(value)

    def integer(self, field: str) -> int | None:
        value = self.cell(field).value
        if value is None:
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ParseError(FORMAT, f"field {field!r} is not an integer: {value!r}")


@dataclass(frozen=True)
class ComputeApp:
    """One ``--query-compute-apps`` row."""

    gpu_uuid: str | None
    gpu_bus_id: str | None
    pid: int | None
    process_name: str | None
    used_memory_mib: int | None


@dataclass(frozen=True)
class RetiredPage:
    """One ``--query-retired-pages`` row; address/timestamp are None when N/A (Hopper)."""

    gpu_uuid: str | None
    gpu_bus_id: str | None
    address: str | None
    timestamp: str | None
    cause: str | None


def _split_header_name(name: str) -> tuple[str, str | None]:
    match = _HEADER_UNIT.match(name.strip())
    if match:
        return match["name"], match["unit"]
    return name.strip(), None


def _strip_unit(raw: str, unit: str | None) -> str:
    text = raw.strip()
    candidates = (unit,) if unit else _UNITS
    for suffix in candidates:
        if suffix and text.endswith(" " + suffix):
            return text[: -len(suffix) - 1].strip()
    return text


def _is_text_field(field: str) -> bool:
    return field in _TEXT_FIELDS or field.startswith(_TEXT_PREFIXES)


def _convert(field: str, raw: str, header_unit: str | None) -> CsvCell:
    text = raw.strip()
    if _BRACKET_MARKER.match(text) or text in _BARE_MARKERS:
        return CsvCell(field, raw, None, header_unit, text)
    if _is_text_field(field):
        return CsvCell(field, raw, text, header_unit, None)
    unit = header_unit
    bare = text
    for suffix in (header_unit,) if header_unit else _UNITS:
        if suffix and text.endswith(" " + suffix):
            bare = text[: -len(suffix) - 1].strip()
            unit = suffix
            break
    if _INT.match(bare):
        return CsvCell(field, raw, int(bare), unit, None)
    if _FLOAT.match(bare):
        return CsvCell(field, raw, float(bare), unit, None)
    if header_unit is not None:
        # The header promises a unit, so the cell must be a number or an N/A marker.
        raise ParseError(FORMAT, f"field {field!r}: expected a number in {header_unit}: {text!r}")
    return CsvCell(field, raw, text, unit, None)


def _split_line(line: str) -> list[str]:
    # nvidia-smi never quotes; it joins cells with ", ". Splitting on "," and stripping also
    # copes with the "csv,noheader" variants that drop the space.
    return [cell.strip() for cell in line.split(",")]


def _rows(
    text: str, fields: Sequence[str] | None
) -> tuple[list[str], list[str | None], list[list[str]]]:
    if not isinstance(text, str):
        raise ParseError(FORMAT, "input is not text")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError(FORMAT, "empty output")
    header_cells = [_split_header_name(c) for c in _split_line(lines[0])]
    header_names = [name for name, _ in header_cells]
    if fields is None:
        names = header_names
        units: list[str | None] = [unit for _, unit in header_cells]
        body = lines[1:]
        if any(not _looks_like_field(n) for n in names):
            raise ParseError(FORMAT, f"first line is not a field header: {lines[0][:80]!r}")
        if not body:
            raise ParseError(FORMAT, "header but no rows")
    else:
        names = [_split_header_name(f)[0] for f in fields]
        if not names:
            raise ParseError(FORMAT, "no fields given")
        units = [None] * len(names)
        if header_names == names:
            units = [unit for _, unit in header_cells]
            body = lines[1:]
        else:
            body = lines
        if not body:
            raise ParseError(FORMAT, "no rows")
    rows: list[list[str]] = []
    for number, line in enumerate(body, start=1):
        cells = _split_line(line)
        if len(cells) != len(names):
            raise ParseError(
                FORMAT,
                f"row {number} has {len(cells)} cells, expected {len(names)} (truncated or"
                " a value containing a comma)",
            )
        rows.append(cells)
    return names, units, rows


_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def _looks_like_field(name: str) -> bool:
    return bool(_FIELD_NAME.match(name))


def parse_query_gpu(text: str, fields: Sequence[str] | None = None) -> list[GpuQueryRow]:
    """Parse ``--query-gpu`` CSV output (schema in module docstring)."""
    names, units, rows = _rows(text, fields)
    return [
        GpuQueryRow(
            tuple(
                _convert(name, raw, unit) for name, unit, raw in zip(names, units, row, strict=True)
            )
        )
        for row in rows
    ]


def _first(row: GpuQueryRow, *names: str) -> CsvCell | None:
    for name in names:
        if name in row:
            return row.cell(name)
    return None


def _cell_text(row: GpuQueryRow, *names: str) -> str | None:
    cell = _first(row, *names)
    if cell is None or cell.marker is not None:
        return None
    return cell.raw.strip()


def _cell_int(row: GpuQueryRow, *names: str) -> int | None:
    cell = _first(row, *names)
    if cell is None:
        return None
    return row.integer(cell.field)


def parse_query_compute_apps(text: str, fields: Sequence[str] | None = None) -> list[ComputeApp]:
    """Parse ``--query-compute-apps`` CSV output; an empty result is a valid "no processes"."""
    if isinstance(text, str) and not text.strip() and fields is not None:
        return []
    rows = parse_query_gpu(text, fields) if _has_rows(text) else []
    return [
        ComputeApp(
            gpu_uuid=_cell_text(row, "gpu_uuid"),
            gpu_bus_id=_cell_text(row, "gpu_bus_id"),
            pid=_cell_int(row, "pid"),
            process_name=_cell_text(row, "process_name", "name"),
            used_memory_mib=_cell_int(row, "used_gpu_memory", "used_memory"),
        )
        for row in rows
    ]


def parse_query_retired_pages(text: str, fields: Sequence[str] | None = None) -> list[RetiredPage]:
    """Parse ``--query-retired-pages`` CSV output (one row per retired page and cause)."""
    rows = parse_query_gpu(text, fields) if _has_rows(text) else []
    return [
        RetiredPage(
            gpu_uuid=_cell_text(row, "gpu_uuid"),
            gpu_bus_id=_cell_text(row, "gpu_bus_id"),
            address=_cell_text(row, "retired_pages.address"),
            timestamp=_cell_text(row, "retired_pages.timestamp"),
            cause=_cell_text(row, "retired_pages.cause"),
        )
        for row in rows
    ]


def _has_rows(text: str) -> bool:
    """A header-only compute-apps/retired-pages output means "none"; empty text is an error."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError(FORMAT, "empty output")
    lines = [line for line in text.splitlines() if line.strip()]
    header_only = len(lines) == 1 and all(
        _looks_like_field(_split_header_name(cell)[0]) for cell in _split_line(lines[0])
    )
    return not header_only
