"""``fio --output-format=json`` (fio 2.x and 3.x) -> :class:`FioRun`.

Units are normalised, because fio changed them between major versions:

* bandwidth: fio 3.x writes ``bw_bytes`` (bytes/s) next to ``bw`` (KiB/s); fio 2.x only ``bw``
  (KiB/s). Output is always bytes/s.
* transferred bytes: fio 3.x writes ``io_bytes`` in bytes plus ``io_kbytes``; fio 2.x writes
  ``io_bytes`` in KiB (no ``io_kbytes``). Output is always bytes.
* latency: fio 3.x writes ``slat_ns``/``clat_ns``/``lat_ns`` in ns; fio 2.x ``slat``/``clat``/
  ``lat`` in microseconds. Output is always ns. Percentiles sit under ``clat`` by default and
  under ``lat`` with ``lat_percentiles=1``; fio 2.x pads the table with ``"0.00": 0`` entries
  (sometimes several with the same key), which are dropped.

NaN and infinite numbers (``NaN``, ``Infinity``, ``1e999``) raise :class:`ParseError`, and so
does a document nested deeper than Python's recursion limit.

fio may print warnings before the JSON document (``fio: ...`` lines); they are skipped and kept
in ``FioRun.noise``. Anything after the document is ignored.

Output schema::

    FioRun(
      version: str                      # "fio-3.33"
      jobs: tuple[FioJob]               # one per job, or per group with group_reporting
        FioJob(name, groupid, error: int (0 = ok), options: tuple[(key, value)],
               read: FioIo, write: FioIo, trim: FioIo | None,
               usr_cpu_pct, sys_cpu_pct)
          FioIo(io_bytes, bw_bytes_per_s, iops, runtime_ms, total_ios | None,
                slat, clat, lat: FioLatency | None)
            FioLatency(min_ns, max_ns, mean_ns, stddev_ns,
                       percentiles_ns: tuple[(percent, ns)])   # ascending percent
      global_options: tuple[(key, value)]
      disk_util: tuple[FioDiskUtil(name, read_ios, write_ios, util_pct)]
      noise: tuple[str]                 # non-JSON lines before the document
    )
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from validate.parsers import ParseError, finite

FORMAT = "fio-json"

_KIB = 1024


@dataclass(frozen=True)
class FioLatency:
    """A latency distribution, in nanoseconds whatever fio version wrote it."""

    min_ns: float
    max_ns: float
    mean_ns: float
    stddev_ns: float
    percentiles_ns: tuple[tuple[float, float], ...]

    def percentile(self, percent: float) -> float | None:
        """The value at ``percent`` (e.g. 99.0) when fio reported it, else None."""
        for pct, value in self.percentiles_ns:
            if abs(pct - percent) < 1e-9:
                return value
        return None


@dataclass(frozen=True)
class FioIo:
    """One direction (read, write or trim) of one job."""

    io_bytes: int
    bw_bytes_per_s: float
    iops: float
    runtime_ms: int
    total_ios: int | None
    slat: FioLatency | None
    clat: FioLatency | None
    lat: FioLatency | None


@dataclass(frozen=True)
class FioJob:
    """One job entry (one group when group_reporting is on)."""

    name: str
    groupid: int
    error: int
    options: tuple[tuple[str, str], ...]
    read: FioIo
    write: FioIo
    trim: FioIo | None
    usr_cpu_pct: float
    sys_cpu_pct: float

    def option(self, key: str) -> str | None:
        """A job option as fio echoed it (``"job options"``), or None."""
        return dict(self.options).get(key)


@dataclass(frozen=True)
class FioDiskUtil:
    """One ``disk_util`` entry (absent in some environments, e.g. containers)."""

    name: str
    read_ios: int
    write_ios: int
    util_pct: float


@dataclass(frozen=True)
class FioRun:
    """A parsed fio JSON report (see the module docstring for the schema)."""

    version: str
    jobs: tuple[FioJob, ...]
    global_options: tuple[tuple[str, str], ...]
    disk_util: tuple[FioDiskUtil, ...]
    noise: tuple[str, ...]

    def job(self, name: str) -> FioJob:
        """The job called ``name``; KeyError when there is none."""
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)

    @property
    def failed_jobs(self) -> tuple[FioJob, ...]:
        """Jobs whose ``error`` is non-zero (an errno from fio)."""
        return tuple(job for job in self.jobs if job.error)


def parse_json(text: str) -> FioRun:
    """Parse ``fio --output-format=json`` output. Raises :class:`ParseError` on bad input."""
    if not text.strip():
        raise ParseError(FORMAT, "empty output")
    doc, noise = _decode(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise ParseError(FORMAT, "not a fio JSON report (no 'jobs' list)")
    if not doc["jobs"]:
        raise ParseError(FORMAT, "fio report without jobs")
    try:
        jobs = tuple(_job(job) for job in doc["jobs"])
        disks = tuple(_disk(d) for d in doc.get("disk_util") or [])
        global_options = _options(doc.get("global options"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(FORMAT, f"unexpected structure: {exc!r}") from None
    return FioRun(
        version=str(doc.get("fio version", "")),
        jobs=jobs,
        global_options=global_options,
        disk_util=disks,
        noise=noise,
    )


def _reject_constant(name: str) -> float:
    raise ParseError(FORMAT, f"non-finite number {name} in fio JSON")


def _finite_float(token: str) -> float:
    return finite(float(token), FORMAT, f"number {token}")


# Python's json reads NaN, Infinity and -Infinity (and turns 1e999 into inf); fio JSON with any
# of them is not a measurement.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _decode(text: str) -> tuple[object, tuple[str, ...]]:
    lines = text.splitlines(keepends=True)
    offset = 0
    for index, line in enumerate(lines):
        if line.lstrip().startswith("{"):
            noise = tuple(raw.rstrip("\n") for raw in lines[:index] if raw.strip())
            start = offset + (len(line) - len(line.lstrip()))
            try:
                doc, _end = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError as exc:
                raise ParseError(FORMAT, f"invalid or truncated JSON: {exc}") from None
            except RecursionError:  # json recurses per nesting level
                raise ParseError(FORMAT, "JSON nested too deeply to be a fio report") from None
            return doc, noise
        offset += len(line)
    first = next((line.strip() for line in lines if line.strip()), "")
    raise ParseError(FORMAT, f"no JSON document in output (first line: {first[:120]!r})")


def _options(obj: object) -> tuple[tuple[str, str], ...]:
    if obj is None:
        return ()
    if not isinstance(obj, dict):
        raise TypeError(f"options are not an object: {obj!r}")
    return tuple((str(k), str(v)) for k, v in obj.items())


def _num(obj: dict[str, object], key: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is not a number: {value!r}")
    return float(value)


def _latency(io: dict[str, object], name: str) -> FioLatency | None:
    if f"{name}_ns" in io:
        raw, scale = io[f"{name}_ns"], 1.0
    elif name in io:
        raw, scale = io[name], 1000.0  # fio 2.x: microseconds
    else:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"{name} is not an object: {raw!r}")
    pcts = raw.get("percentile") or {}
    if not isinstance(pcts, dict):
        raise TypeError(f"{name} percentiles are not an object: {pcts!r}")
    percentiles = sorted(
        (float(pct), float(value) * scale)
        for pct, value in pcts.items()
        # fio 2.x pads the table with "0.00": 0 entries that are not measurements.
        if float(pct) > 0.0
    )
    return FioLatency(
        min_ns=_num(raw, "min") * scale,
        max_ns=_num(raw, "max") * scale,
        mean_ns=_num(raw, "mean") * scale,
        stddev_ns=_num(raw, "stddev") * scale,
        percentiles_ns=tuple(percentiles),
    )


def _io(io: object) -> FioIo:
    if not isinstance(io, dict):
        raise TypeError(f"io section is not an object: {io!r}")
    bw = _num(io, "bw_bytes") if "bw_bytes" in io else _num(io, "bw") * _KIB
    io_bytes = int(_num(io, "io_bytes"))
    if "io_kbytes" not in io:
        io_bytes *= _KIB  # fio 2.x wrote io_bytes in KiB
    total = io.get("total_ios")
    return FioIo(
        io_bytes=io_bytes,
        bw_bytes_per_s=bw,
        iops=_num(io, "iops"),
        runtime_ms=int(_num(io, "runtime")),
        total_ios=int(str(total)) if total is not None else None,
        slat=_latency(io, "slat"),
        clat=_latency(io, "clat"),
        lat=_latency(io, "lat"),
    )


def _job(job: object) -> FioJob:
    if not isinstance(job, dict):
        raise TypeError(f"job is not an object: {job!r}")
    return FioJob(
        name=str(job["jobname"]),
        groupid=int(_num(job, "groupid")),
        error=int(_num(job, "error")),
        options=_options(job.get("job options")),
        read=_io(job["read"]),
        write=_io(job["write"]),
        trim=_io(job["trim"]) if "trim" in job else None,
        usr_cpu_pct=_num(job, "usr_cpu"),
        sys_cpu_pct=_num(job, "sys_cpu"),
    )


def _disk(disk: object) -> FioDiskUtil:
    if not isinstance(disk, dict):
        raise TypeError(f"disk_util entry is not an object: {disk!r}")
    return FioDiskUtil(
        name=str(disk["name"]),
        read_ios=int(_num(disk, "read_ios")),
        write_ios=int(_num(disk, "write_ios")),
        util_pct=_num(disk, "util"),
    )
