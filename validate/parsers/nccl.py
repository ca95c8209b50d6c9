"""nccl-tests output (``all_reduce_perf`` and the other ``*_perf``) -> :class:`NcclRun`.

Two entry points:

* :func:`parse_text` reads what the tests print on stdout: the ``# nThread ...`` header, the
  ``#  Rank  N ...`` device lines, the result table and the ``# Out of bounds values`` /
  ``# Avg bus bandwidth`` summary. It accepts the old table (no ``redop``/``root`` columns, or
  ``redop`` without ``root``), the current one, multi-node runs, lines prefixed by ``srun
  --label`` (``0: ``) or Open MPI ``--tag-output`` (``[1,0]<stdout>:``), and interleaved
  ``NCCL INFO``/``NCCL WARN`` lines.
* :func:`parse_json` reads the file written by ``-J <file>`` (newer nccl-tests). The structure
  follows the writer in NVIDIA/nccl-tests ``src/util.cu`` (commit
  0fdb00a3f4339efc1176771a9c97db5438bd3f7f, ``JSON_FILE_VERSION 2``): top-level ``version``,
  ``start_time``, ``args``, ``env``, ``nccl_version`` (int), ``config`` {``nthreads``,
  ``ngpus``, ``minimum_bytes``, ``maximum_bytes``, ``step_factor`` | ``step_bytes``,
  ``warmup_iters``, ``iterations``, ``aggregated_iterations``, ``validation``, ``graph``,
  ``blocking_collectives``..., ``devices`` [{``rank``, ``group``, ``pid``, ``hostname``,
  ``device``, ``device_hex``, ``device_info``}]}, ``results`` [{``size``, ``count``, ``type``,
  ``redop``, ``root`` (a ``%6i`` string), ``out_of_place`` / ``in_place`` ({``time`` |
  ``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong``: number or null} or null),
  ``actual_iterations``, ``experiment_name``}], ``out_of_bounds`` {``count``, ``okay``},
  ``average_bus_bandwidth`` {``bandwidth``, ``okay``}, ``errors`` [str], ``end_time``.
  Booleans are written as the strings ``"true"``/``"false"`` and NaN as ``"nan"``, which is
  rejected like any non-finite number (:func:`validate.parsers.finite`).

Failures are errors, not results: output without a result table raises :class:`ParseError`
whose ``reason`` quotes the tool's own error line (``Test CUDA failure ...``, Open MPI's
``There are not enough slots ...``, the first ``NCCL WARN`` line). A table without the
``# Avg bus bandwidth`` summary is a truncated run and raises too, unless the caller passes
``allow_partial=True`` (for excerpts such as log tails); the result then has
``complete=False``.

Output schema (all bandwidths GB/s as nccl-tests prints them, times in microseconds)::

    NcclRun(
      header: NcclHeader | None   # nthreads, ngpus, min_bytes, max_bytes, step, step_kind
                                  # ("factor"|"bytes"), warmup_iters, iters, agg_iters|None,
                                  # validation, graph|None
      nccl_version: str | None    # "2.16.2+cuda11.6" (text) or "22304" (JSON's int code)
      devices: tuple[NcclDevice]  # rank, group|None, pid, hostname, device, bus_id, name
      rows: tuple[NcclRow]        # size_bytes, count, dtype, redop|None, root|None,
                                  # out_of_place: NcclResult|None, in_place: NcclResult|None
                                  #   NcclResult(time_us, algbw_gbps, busbw_gbps,
                                  #              wrong: int|None  # None = "N/A")
      out_of_bounds: int | None   # "# Out of bounds values : N"
      avg_busbw_gbps: float | None
      warnings: tuple[NcclWarning]  # NCCL WARN lines seen in the output
      complete: bool              # summary present
    )

Helpers: ``NcclRun.largest_row`` (row at the largest message size), ``NcclRow.busbw_gbps``
(out-of-place bus bandwidth, in-place when there is no out-of-place), ``NcclRow.wrong``
(wrong elements over both placements, None when validation was off), ``NcclRun.hosts``.
:func:`parse_warnings` extracts ``NCCL WARN`` lines from any NCCL debug log.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from validate.parsers import ParseError, finite

FORMAT = "nccl"
JSON_FORMAT = "nccl-json"

# srun --label ("0: ") and Open MPI --tag-output ("[1,0]<stdout>:") prefixes; both may appear.
_PREFIX_RE = re.compile(r"^(?:\s*\d+:\s?|\[\d+,\d+\]<std(?:out|err)>:)")
_HEADER_RE = re.compile(
    r"^#\s*nThread\s+(?P<nthreads>\d+)\s+nGpus\s+(?P<ngpus>\d+)\s+minBytes\s+(?P<min>\d+)\s+"
    r"maxBytes\s+(?P<max>\d+)\s+step:\s*(?P<step>\d+)\((?P<kind>factor|bytes)\)\s+"
    r"warmup iters:\s*(?P<warmup>\d+)\s+iters:\s*(?P<iters>\d+)"
    r"(?:\s+agg iters:\s*(?P<agg>\d+))?\s+validation:\s*(?P<validation>\d+)"
    r"(?:\s+graph:\s*(?P<graph>\d+))?"
)
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+"
    r"(?P<host>\S+)\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s+(?P<name>.*?)\s*$"
)
_VERSION_RE = re.compile(r"NCCL version (?P<version>\S+)")
_ROW_START_RE = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z_]\w*\s")
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<count>\d+)")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>\S+)")
_WARN_RE = re.compile(
    r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<source>\S+:\d+) )?NCCL WARN (?P<message>.*?)\s*$"
)
# The tool's own failure lines, most specific first: they become the ParseError reason.
_FAILURE_RES = (
    re.compile(r"Test (?:CUDA |NCCL )?failure.*"),
    re.compile(r"There are not enough slots available.*"),
    re.compile(r"^#\s*error:.*"),
    re.compile(r"NCCL WARN .*"),
    re.compile(r"(?:Invalid number of GPUs|mpirun noticed|ORTE was unable|PMIx?_?\w* failed).*"),
)
_TIMESTAMP_TOKENS = re.compile(r"^\d{4}-\d{2}-\d{2}$|^\d{2}:\d{2}:\d{2}$")


@dataclass(frozen=True)
class NcclHeader:
    """The ``# nThread ...`` line: how the test was run."""

    nthreads: int
    ngpus: int
    min_bytes: int
    max_bytes: int
    step: int
    step_kind: str  # "factor" (-f) or "bytes" (-i)
    warmup_iters: int
    iters: int
    agg_iters: int | None
    validation: int
    graph: int | None


@dataclass(frozen=True)
class NcclDevice:
    """One ``#  Rank N ...`` line: which GPU on which host a rank ran on."""

    rank: int
    group: int | None
    pid: int
    hostname: str
    device: int
    bus_id: str  # as printed: "0x18" (old) or "0000:18:00" (new)
    name: str


@dataclass(frozen=True)
class NcclResult:
    """One placement (out-of-place or in-place) of one table row."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when nccl-tests printed N/A (validation off or not reported)


@dataclass(frozen=True)
class NcclRow:
    """One table row: one message size."""

    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: NcclResult | None
    in_place: NcclResult | None

    @property
    def busbw_gbps(self) -> float:
        """Out-of-place bus bandwidth; in-place when the row has no out-of-place part."""
        result = self.out_of_place or self.in_place
        assert result is not None  # the parser never builds a row without either
        return result.busbw_gbps

    @property
    def wrong(self) -> int | None:
        """Wrong elements over both placements; None when neither was validated."""
        counts = [r.wrong for r in (self.out_of_place, self.in_place) if r and r.wrong is not None]
        return sum(counts) if counts else None


@dataclass(frozen=True)
class NcclWarning:
    """One ``host:pid:tid [dev] [file:line] NCCL WARN message`` line."""

    host: str
    pid: int
    tid: int
    cuda_device: int
    source: str | None
    message: str


@dataclass(frozen=True)
class NcclRun:
    """A parsed nccl-tests run (see the module docstring for the schema)."""

    header: NcclHeader | None
    nccl_version: str | None
    devices: tuple[NcclDevice, ...]
    rows: tuple[NcclRow, ...]
    out_of_bounds: int | None
    avg_busbw_gbps: float | None
    warnings: tuple[NcclWarning, ...]
    complete: bool

    @property
    def largest_row(self) -> NcclRow:
        """The row at the largest message size (the one bandwidth thresholds are set at)."""
        # max() keeps the first of equal sizes; the last repeat is the one measured warm.
        return max(reversed(self.rows), key=lambda row: row.size_bytes)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Distinct hostnames from the device lines, in rank order."""
        return tuple(dict.fromkeys(d.hostname for d in self.devices))


def parse_warnings(text: str) -> tuple[NcclWarning, ...]:
    """Every ``NCCL WARN`` line in ``text`` (NCCL_DEBUG=WARN/INFO logs); never raises."""
    warnings = []
    for raw in text.splitlines():
        match = _WARN_RE.match(_strip_prefix(raw))
        if match:
            warnings.append(
                NcclWarning(
                    host=match["host"],
                    pid=int(match["pid"]),
                    tid=int(match["tid"]),
                    cuda_device=int(match["dev"]),
                    source=match["source"],
                    message=match["message"],
                )
            )
    return tuple(warnings)


def parse_text(text: str, *, allow_partial: bool = False) -> NcclRun:
    """Parse nccl-tests stdout. Raises :class:`ParseError` on failures and truncation."""
    if not text.strip():
        raise ParseError(FORMAT, "empty output")
    header: NcclHeader | None = None
    version: str | None = None
    devices: list[NcclDevice] = []
    rows: list[NcclRow] = []
    oob: int | None = None
    avg: float | None = None
    for raw in text.splitlines():
        line = _strip_prefix(raw)
        if match := _HEADER_RE.match(line):
            header = _header(match)
        elif match := _RANK_RE.match(line):
            devices.append(_device(match))
        elif match := _OOB_RE.match(line):
            oob = int(match["count"])
        elif match := _AVG_RE.match(line):
            avg = _float(match["bw"], line)
        elif _ROW_START_RE.match(line):
            rows.append(_row(line))
        elif version is None and (match := _VERSION_RE.search(line)):
            version = match["version"]
    warnings = parse_warnings(text)
    if not rows:
        raise ParseError(FORMAT, _failure_reason(text, "no result table"))
    complete = avg is not None and oob is not None
    if not complete and not allow_partial:
        raise ParseError(
            FORMAT,
            _failure_reason(text, "result table without '# Avg bus bandwidth' summary (truncated)"),
        )
    return NcclRun(
        header=header,
        nccl_version=version,
        devices=tuple(devices),
        rows=tuple(rows),
        out_of_bounds=oob,
        avg_busbw_gbps=avg,
        warnings=warnings,
        complete=complete,
    )


def parse_json(text: str, *, allow_partial: bool = False) -> NcclRun:
    """Parse the ``-J`` JSON file of newer nccl-tests (structure: module docstring)."""
    if not text.strip():
        raise ParseError(JSON_FORMAT, "empty output")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(JSON_FORMAT, f"invalid JSON: {exc}") from None
    except RecursionError:  # json recurses per nesting level
        raise ParseError(JSON_FORMAT, "JSON nested too deeply to be an nccl-tests report"
                         ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ParseError(JSON_FORMAT, "not an nccl-tests JSON report (no 'results' list)")
    errors_obj = doc.get("errors")
    errors = (
        [e for e in errors_obj if isinstance(e, str) and e] if isinstance(errors_obj, list) else []
    )
    try:
        config = doc.get("config")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config is not an object: {config!r}")
        header = _json_header(config) if isinstance(config, dict) else None
        devices_obj = config.get("devices") if isinstance(config, dict) else None
        devices = tuple(_json_device(d) for d in devices_obj or [])
        rows = tuple(_json_row(r) for r in doc["results"])
        oob_obj = doc.get("out_of_bounds")
        avg_obj = doc.get("average_bus_bandwidth")
        oob = int(oob_obj["count"]) if isinstance(oob_obj, dict) else None
        avg = _json_float(avg_obj["bandwidth"]) if isinstance(avg_obj, dict) else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(JSON_FORMAT, f"unexpected structure: {exc!r}") from None
    if not rows:
        reason = f"no results; tool error: {errors[0]}" if errors else "no results"
        raise ParseError(JSON_FORMAT, reason)
    complete = oob is not None and avg is not None
    if not complete and not allow_partial:
        reason = "results without 'average_bus_bandwidth' summary (run ended early)"
        raise ParseError(JSON_FORMAT, f"{reason}; tool error: {errors[0]}" if errors else reason)
    version = doc.get("nccl_version")
    return NcclRun(
        header=header,
        nccl_version=str(version) if version is not None else None,
        devices=devices,
        rows=rows,
        out_of_bounds=oob,
        avg_busbw_gbps=avg,
        warnings=(),
        complete=complete,
    )


def _strip_prefix(line: str) -> str:
    # Labels can stack (srun around mpirun), so strip until none is left.
    while True:
        match = _PREFIX_RE.match(line)
        if not match or not match.group(0):
            return line
        # A table row is spaces and digits but never "digits:", so rows are not eaten.
        line = line[match.end() :]


def _failure_reason(text: str, what: str) -> str:
    lines = [_strip_prefix(raw).strip() for raw in text.splitlines()]
    for pattern in _FAILURE_RES:
        for line in lines:
            match = pattern.search(line)
            if match:
                return f"{what}; tool error: {match.group(0).strip()}"
    return what


def _float(token: str, line: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ParseError(FORMAT, f"not a number {token!r} in line {line.strip()!r}") from None
    return finite(value, FORMAT, f"{token!r} in line {line.strip()!r}")


def _int(token: str, line: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise ParseError(FORMAT, f"not an integer {token!r} in line {line.strip()!r}") from None


def _wrong(token: str, line: str) -> int | None:
    if token == "N/A":
        return None
    # "%6g" turns large counts into "1e+06".
    return int(_float(token, line))


def _header(match: re.Match[str]) -> NcclHeader:
    return NcclHeader(
        nthreads=int(match["nthreads"]),
        ngpus=int(match["ngpus"]),
        min_bytes=int(match["min"]),
        max_bytes=int(match["max"]),
        step=int(match["step"]),
        step_kind=match["kind"],
        warmup_iters=int(match["warmup"]),
        iters=int(match["iters"]),
        agg_iters=int(match["agg"]) if match["agg"] else None,
        validation=int(match["validation"]),
        graph=int(match["graph"]) if match["graph"] else None,
    )


def _device(match: re.Match[str]) -> NcclDevice:
    return NcclDevice(
        rank=int(match["rank"]),
        group=int(match["group"]) if match["group"] else None,
        pid=int(match["pid"]),
        hostname=match["host"],
        device=int(match["device"]),
        bus_id=match["bus"],
        name=match["name"],
    )


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _row(line: str) -> NcclRow:
    tokens = line.split()
    # -T adds a "YYYY-MM-DD HH:MM:SS" timestamp at the end of each row.
    while tokens and _TIMESTAMP_TOKENS.match(tokens[-1]):
        tokens.pop()
    size, count, dtype = _int(tokens[0], line), _int(tokens[1], line), tokens[2]
    rest = tokens[3:]
    redop = None
    if rest and not _is_number(rest[0]) and rest[0] != "N/A":
        redop = rest.pop(0)
    root = None
    # Each placement is 4 columns (time algbw busbw #wrong), or 8 with per-iteration stats,
    # so an odd count means a leading root column.
    if len(rest) % 2 == 1:
        root = _int(rest.pop(0), line)
    if len(rest) not in (4, 8, 16):
        raise ParseError(FORMAT, f"unexpected column count in row {line.strip()!r}")
    if len(rest) == 4:  # trace replay prints only the in-place half
        return NcclRow(size, count, dtype, redop, root, None, _result(rest, line))
    half = len(rest) // 2
    return NcclRow(
        size, count, dtype, redop, root, _result(rest[:half], line), _result(rest[half:], line)
    )


def _result(cols: list[str], line: str) -> NcclResult:
    return NcclResult(
        time_us=_float(cols[0], line),
        algbw_gbps=_float(cols[1], line),
        busbw_gbps=_float(cols[2], line),
        wrong=_wrong(cols[3], line),
    )


def _json_float(value: object) -> float:
    # util.cu writes NaN as the string "nan"; a NaN bandwidth is not a measurement.
    if value == "nan":
        raise ParseError(JSON_FORMAT, 'value "nan" is not a finite number')
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return finite(float(value), JSON_FORMAT, "value")


def _json_header(config: dict[str, object]) -> NcclHeader:
    def num(key: str) -> int:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} is not an integer: {value!r}")
        return value

    step_kind = "factor" if "step_factor" in config else "bytes"
    return NcclHeader(
        nthreads=num("nthreads"),
        ngpus=num("ngpus"),
        min_bytes=num("minimum_bytes"),
        max_bytes=num("maximum_bytes"),
        step=num("step_factor" if step_kind == "factor" else "step_bytes"),
        step_kind=step_kind,
        warmup_iters=num("warmup_iters"),
        iters=num("iterations"),
        agg_iters=num("aggregated_iterations") if "aggregated_iterations" in config else None,
        validation=num("validation"),
        graph=num("graph") if "graph" in config else None,
    )


def _json_device(dev: object) -> NcclDevice:
    if not isinstance(dev, dict):
        raise TypeError(f"device is not an object: {dev!r}")
    group = dev.get("group")
    return NcclDevice(
        rank=int(str(dev["rank"])),
        group=int(str(group)) if group is not None else None,
        pid=int(str(dev["pid"])),
        hostname=str(dev["hostname"]),
        device=int(str(dev["device"])),
        bus_id=str(dev["device_hex"]),
        name=str(dev["device_info"]),
    )


def _json_result(obj: object) -> NcclResult | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError(f"placement is not an object: {obj!r}")
    time_key = "time" if "time" in obj else "cpu_time"
    nwrong = obj.get("nwrong")
    return NcclResult(
        time_us=_json_float(obj[time_key]),
        algbw_gbps=_json_float(obj["alg_bw"]),
        busbw_gbps=_json_float(obj["bus_bw"]),
        wrong=None if nwrong is None else int(_json_float(nwrong)),
    )


def _json_row(row: object) -> NcclRow:
    if not isinstance(row, dict):
        raise TypeError(f"result is not an object: {row!r}")
    out_of_place = _json_result(row.get("out_of_place"))
    in_place = _json_result(row.get("in_place"))
    if out_of_place is None and in_place is None:
        raise ValueError(f"row without results: {row!r}")
    root = str(row.get("root", "")).strip()
    redop = row.get("redop")
    return NcclRow(
        size_bytes=int(str(row["size"])),
        count=int(str(row["count"])),
        dtype=str(row["type"]),
        redop=str(redop) if redop is not None else None,
        root=int(root) if root else None,
        out_of_place=out_of_place,
        in_place=in_place,
    )
