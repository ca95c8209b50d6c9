"""SKU profiles: per-SKU hardware expectations and thresholds, as YAML data.

A profile file ``validate/profiles/<name>.yml`` has::

    name: <str, equals the file stem>
    hardware: {gpu_count: int, gpu_model: str, gpu_memory_mib: int, pcie_gen: int,
               pcie_width: int, nvlinks_per_gpu: int, nvswitch: bool, nic_count: int,
               nic_rate_gbps: number}
    storage: {scratch_path: str, checkpoint_path: str, drive_class: str}   (optional)
    thresholds: {<section>: {<key>: <value>}}, sections and keys as in THRESHOLDS_SCHEMA;
                a band is {warn: number|null, fail: number|null, better: higher|lower}

``_drive_classes.yml`` holds fio bands per drive class; the selected class is merged into
``thresholds.fio``. The inventory var ``gpu_thresholds`` (pool or host) is deep-merged over
``thresholds`` last, and ``storage`` values come from ``gpuready_*`` vars when set.

Everything is checked when it is loaded, and every problem is reported, not the first: a
section or key that does not exist (a misspelling names the closest known name), a value of
the wrong type, a number that is NaN, infinite or outside its range (each metric has one: a
bus bandwidth above :data:`CEILING_BUSBW_GBPS` can never be measured, a timeout of a billion
seconds is a typo), a band whose warn lies beyond its fail or that has neither. A NaN limit
compares false with every figure, so it would pass anything; an infinite one made the report
unwritable (JSON has no Infinity). The inventory's overrides are checked on their own (so a
problem is named as theirs) and the merged thresholds again. :class:`ProfileError` carries
every problem as (dotted key, reason); its message names the file (or the inventory) too.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from validate import desired
from validate.errors import InputError
from validate.model import Status
from validate.parsers.ib_counters import ERROR_COUNTERS
from validate.parsers.nvidia_smi_model import CLOCK_EVENT_REASONS

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DRIVE_CLASSES_FILE = "_drive_classes.yml"

# Physical ceilings: no real node measures more, so a threshold above one can never be met and
# a figure above one is not a measurement (the checks refuse it as well). Each is several times
# the fastest hardware shipped, to catch nonsense (1e29 GB/s), not a fast node.
# All-reduce bus bandwidth: NVLink 5 moves 900 GB/s each way per GPU.
CEILING_BUSBW_GBPS = 5000.0
# One dd process copies through one CPU core (tens of GB/s at most from memory; a drive array
# behind O_DIRECT and fsync far less).
CEILING_DD_GBPS = 100.0
# One fio job: a PCIe 5.0 x16 link carries ~63 GB/s; io_uring's record is ~13M IOPS per core.
CEILING_FIO_MIBPS = 200_000.0
CEILING_FIO_IOPS = 50_000_000.0
# An InfiniBand/Ethernet port: XDR is 800 Gb/s.
CEILING_NIC_GBPS = 3200.0
# The longest a validation tool may be given: a day.
MAX_TIMEOUT_S = 86_400.0


class ProfileError(InputError):
    """A profile (or an inventory override) is missing, unreadable or malformed.

    ``problems`` lists every (dotted key, reason) found; ``key``/``reason`` are the first."""

    def __init__(self, source: str, key: str, reason: str,
                 problems: Sequence[tuple[str, str]] = ()) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems) or ((key, reason),)
        text = "; ".join(f"{k}: {r}" if k else r for k, r in self.problems)
        super().__init__(f"{source}: {text}")
        self.source = source
        self.key, self.reason = self.problems[0]


@dataclass(frozen=True, slots=True)
class Band:
    """Warn/fail limits for one metric. ``better='higher'``: below fail fails, below warn warns;
    ``better='lower'``: above fail fails, above warn warns. A ``None`` limit is not checked."""

    warn: float | None
    fail: float | None
    better: str = "higher"

    def judge(self, value: float) -> Status:
        """Status of ``value`` against this band."""
        if self.better == "higher":
            if self.fail is not None and value < self.fail:
                return Status.FAIL
            if self.warn is not None and value < self.warn:
                return Status.WARN
        else:
            if self.fail is not None and value > self.fail:
                return Status.FAIL
            if self.warn is not None and value > self.warn:
                return Status.WARN
        return Status.PASS


@dataclass(frozen=True, slots=True)
class Hardware:
    """Hardware expectations of a SKU (see module docstring)."""

    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int
    pcie_gen: int
    pcie_width: int
    nvlinks_per_gpu: int
    nvswitch: bool
    nic_count: int
    nic_rate_gbps: float


@dataclass(frozen=True, slots=True)
class Profile:
    """A loaded profile with overrides applied. ``thresholds`` is the merged nested mapping;
    read it through :meth:`band` and :meth:`value`, which name the key on error."""

    name: str
    source: str
    hardware: Hardware
    scratch_path: str
    checkpoint_path: str
    drive_class: str
    thresholds: Mapping[str, Any]

    def _lookup(self, dotted: str) -> Any:
        node: Any = self.thresholds
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ProfileError(self.source, f"thresholds.{dotted}", "missing")
            node = node[part]
        return node

    def band(self, dotted: str) -> Band:
        """The band at ``thresholds.<dotted>``."""
        raw = self._lookup(dotted)
        return _band(raw, self.source, f"thresholds.{dotted}")

    def value(self, dotted: str, kind: type[Any], default: Any = None) -> Any:
        """The scalar/list at ``thresholds.<dotted>`` checked against ``kind``."""
        try:
            raw = self._lookup(dotted)
        except ProfileError:
            if default is not None:
                return default
            raise
        if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
            raise ProfileError(
                self.source,
                f"thresholds.{dotted}",
                f"expected {kind.__name__}, got {type(raw).__name__}",
            )
        return raw


# -- what a profile may hold -----------------------------------------------------------------


def _shown(value: Any) -> str:
    """A value as a person wrote it, with its YAML kind when that is the problem."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (str, "a string"), (int, "an integer"),
                       (float, "a number"), (Mapping, "a mapping"), (list, "a list")):
        if isinstance(value, kind):
            return f"{name} ({value!r})"
    return f"{type(value).__name__} ({value!r})"


def _unknown(what: str, name: object, known: Iterable[str]) -> str:
    """"unknown <what> 'x'; did you mean 'y'? (known: ...)": a misspelling names the closest
    known name (difflib's ratio, as Python's own "Did you mean" suggestions)."""
    names = sorted(known)
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {name!r}{hint} (known: {', '.join(names)})"


@dataclass(frozen=True, slots=True)
class _Num:
    """A finite number from ``low`` to ``high`` (an integer when ``integer``)."""

    low: float
    high: float
    integer: bool = False
    unit: str = ""

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        unit = f" {self.unit}" if self.unit else ""
        want = (f"{'an integer' if self.integer else 'a finite number'} from {self.low:g} to "
                f"{self.high:g}{unit}")
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                self.integer and not isinstance(value, int)):
            return [(key, f"expected {want}, got {_shown(value)}")]
        if not math.isfinite(value):
            return [(key, f"{value!r} is not a finite number (expected {want})")]
        if not self.low <= value <= self.high:
            return [(key, f"{value!r} is out of range (expected {want})")]
        return []


@dataclass(frozen=True, slots=True)
class _Text:
    """One line of text: one of ``choices`` when given, else matching ``pattern``."""

    choices: tuple[str, ...] = ()
    pattern: str = r"[^\n]*\S[^\n]*"
    what: str = "one non-empty line"

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        if not isinstance(value, str):
            return [(key, f"expected a string ({self.what}), got {_shown(value)}")]
        if self.choices and value not in self.choices:
            return [(key, _unknown("value", value, self.choices))]
        if not self.choices and not re.fullmatch(self.pattern, value):
            return [(key, f"{value!r} is not {self.what}")]
        return []


@dataclass(frozen=True, slots=True)
class _Flag:
    """A YAML boolean."""

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        if not isinstance(value, bool):
            return [(key, f"expected a boolean (true/false), got {_shown(value)}")]
        return []


@dataclass(frozen=True, slots=True)
class _List:
    """A list of items, each checked by ``item``."""

    item: _Num | _Text

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        if not isinstance(value, list | tuple):
            return [(key, f"expected a list, got {_shown(value)}")]
        return [p for i, v in enumerate(value) for p in self.item.problems(v, f"{key}[{i}]")]


@dataclass(frozen=True, slots=True)
class _Map:
    """A mapping whose keys are among ``keys`` and whose values are among ``values``."""

    keys: tuple[str, ...]
    values: tuple[str, ...]

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        if not isinstance(value, Mapping):
            return [(key, f"expected a mapping, got {_shown(value)}")]
        out = [(f"{key}.{k}", _unknown("key", k, self.keys)) for k in value if k not in self.keys]
        out += [p for k, v in value.items() if k in self.keys
                for p in _Text(self.values).problems(v, f"{key}.{k}")]
        return out


@dataclass(frozen=True, slots=True)
class _BandSpec:
    """A band {warn, fail, better}: each limit a finite number from ``low`` to ``high``, or
    null; at least one limit; warn not beyond fail."""

    low: float
    high: float
    unit: str

    def problems(self, value: Any, key: str) -> list[tuple[str, str]]:
        if not isinstance(value, Mapping):
            return [(key, f"expected a band {{warn, fail, better}}, got {_shown(value)}")]
        out = [(f"{key}.{k}", _unknown("band key", k, _BAND_KEYS))
               for k in value if k not in _BAND_KEYS]
        limit = _Num(self.low, self.high, unit=self.unit)
        for name in ("warn", "fail"):
            if value.get(name) is not None:
                out += limit.problems(value[name], f"{key}.{name}")
        if "better" in value:
            out += _Text(("higher", "lower")).problems(value["better"], f"{key}.better")
        return out

    def complete_problems(self, value: Mapping[str, Any], key: str) -> list[tuple[str, str]]:
        """What only the whole (merged) band can show."""
        if value.get("warn") is None and value.get("fail") is None:
            return [(key, "sets neither warn nor fail, so it would pass any figure (set a "
                          "limit, or leave the check out with --checks)")]
        band = _band(value, "", key)
        if band.warn is not None and band.fail is not None:
            inverted = band.warn < band.fail if band.better == "higher" else band.warn > band.fail
            if inverted:
                return [(key, f"warn {band.warn} is beyond fail {band.fail}")]
        return []


_BAND_KEYS = ("warn", "fail", "better")
_Spec = _Num | _Text | _Flag | _List | _Map | _BandSpec


@dataclass(frozen=True, slots=True)
class _Section:
    keys: Mapping[str, _Spec]
    required: tuple[str, ...] = ()


_COUNT = _BandSpec(0, 1e12, "errors")
_TIMEOUT = _Num(0.001, MAX_TIMEOUT_S, unit="s")
_SIZE_MIB = _Num(1, desired.MAX_SIZE_MIB, integer=True, unit="MiB")
_ITERS = _Num(1, 100_000, integer=True)
_XID_CODES = _List(_Num(1, 9999, integer=True))
_REASONS = _List(_Text(CLOCK_EVENT_REASONS))
_MESSAGE_BYTES = _Num(1, 2**40, integer=True, unit="bytes")

# Every section and key a profile's thresholds (or the inventory's gpu_thresholds) may set,
# and what each must be. Sections a per-node check reads must be in every profile; nccl_pair
# (multi-node, opt-in) and timeouts may be left out, and are complete once they hold any of
# their required keys.
THRESHOLDS_SCHEMA: dict[str, _Section] = {
    "ecc": _Section(
        {"expect_mode": _Text(("enabled", "disabled", "any")),
         "uncorrectable_volatile": _COUNT, "correctable_volatile": _COUNT,
         "remapped_rows_pending": _COUNT, "remapped_rows_failure": _COUNT,
         "retired_pages_pending": _COUNT},
        ("uncorrectable_volatile", "correctable_volatile", "remapped_rows_pending",
         "remapped_rows_failure", "retired_pages_pending")),
    "xid": _Section(
        {"window": _Text(what="a journalctl --since value on one line"),
         "fail_codes": _XID_CODES, "warn_codes": _XID_CODES, "ignore_codes": _XID_CODES,
         "severity_status": _Map(("critical", "warning", "info"), ("pass", "warn", "fail"))},
        ("window", "fail_codes", "warn_codes", "ignore_codes", "severity_status")),
    "throttle": _Section({"fail_reasons": _REASONS, "warn_reasons": _REASONS},
                         ("fail_reasons", "warn_reasons")),
    "nccl": _Section(
        {"allreduce_busbw_gbps": _BandSpec(0, CEILING_BUSBW_GBPS, "GB/s"),
         "size_bytes": _MESSAGE_BYTES, "repeats": _Num(1, 100, integer=True),
         "iters": _ITERS, "warmup_iters": _Num(0, 100_000, integer=True), "timeout_s": _TIMEOUT},
        ("allreduce_busbw_gbps", "size_bytes")),
    "nccl_pair": _Section(
        {"busbw_gbps": _BandSpec(0, CEILING_BUSBW_GBPS, "GB/s"), "size_bytes": _MESSAGE_BYTES,
         "iters": _ITERS, "warmup_iters": _Num(0, 100_000, integer=True), "timeout_s": _TIMEOUT},
        ("busbw_gbps", "size_bytes")),
    "fio": _Section(
        {"size_mib": _SIZE_MIB, "runtime_s": _Num(1, MAX_TIMEOUT_S, integer=True, unit="s"),
         "timeout_s": _TIMEOUT,
         "ioengine": _Text(pattern=r"[a-z0-9_]+", what="a fio ioengine name (libaio, ...)"),
         "direct": _Num(0, 1, integer=True),
         "seq_read_mibps": _BandSpec(0, CEILING_FIO_MIBPS, "MiB/s"),
         "seq_write_mibps": _BandSpec(0, CEILING_FIO_MIBPS, "MiB/s"),
         "randread_4k_iops": _BandSpec(0, CEILING_FIO_IOPS, "IOPS")},
        ("size_mib", "seq_read_mibps", "seq_write_mibps", "randread_4k_iops")),
    "checkpoint": _Section(
        {"size_mib": _SIZE_MIB, "timeout_s": _TIMEOUT,
         "write_gbps": _BandSpec(0, CEILING_DD_GBPS, "GB/s"),
         "read_gbps": _BandSpec(0, CEILING_DD_GBPS, "GB/s")},
        ("size_mib", "write_gbps", "read_gbps")),
    "timeouts": _Section({"default_s": _TIMEOUT}),
    # fabric.ib_counters: per port, each error counter's growth per hour since the node's
    # previous run (a band), and the count past which a counter that did not grow still warns.
    "ib_counters": _Section(
        {**{f"{c}_per_h": _BandSpec(0, 1e12, "errors/h") for c in ERROR_COUNTERS},
         **{f"{c}_high": _Num(0, 2**64, integer=True, unit="errors") for c in ERROR_COUNTERS}},
        tuple(f"{c}_per_h" for c in ERROR_COUNTERS)),
    # dcgm.diag: the levels run without --checks naming them (1 always runs), and each
    # level's timeout (validate/checks/dcgm.py).
    "dcgm": _Section({"levels": _List(_Num(1, 3, integer=True)), "r1_timeout_s": _TIMEOUT,
                      "r2_timeout_s": _TIMEOUT, "r3_timeout_s": _TIMEOUT}),
}
_OPTIONAL_SECTIONS = ("nccl_pair", "timeouts", "ib_counters", "dcgm")
_FIO_BANDS = ("seq_read_mibps", "seq_write_mibps", "randread_4k_iops")

_HARDWARE: dict[str, _Num | _Text | _Flag] = {
    "gpu_count": _Num(1, 256, integer=True),
    "gpu_model": _Text(what="the product name nvidia-smi prints"),
    "gpu_memory_mib": _Num(1, 2**24, integer=True, unit="MiB"),
    "pcie_gen": _Num(1, 7, integer=True),
    "pcie_width": _Num(1, 32, integer=True, unit="lanes"),
    "nvlinks_per_gpu": _Num(0, 64, integer=True),
    "nvswitch": _Flag(),
    "nic_count": _Num(0, 64, integer=True),
    "nic_rate_gbps": _Num(0, CEILING_NIC_GBPS, unit="Gb/s"),
}


def threshold_problems(tree: Any, *, complete: bool) -> list[tuple[str, str]]:
    """Every problem of a thresholds tree, as (dotted key, reason). ``complete``: the tree is
    what the checks judge with (a profile's merged thresholds), so required sections and keys
    must be there and each band must be whole; else it is a partial override."""
    if not isinstance(tree, Mapping):
        return [("thresholds", f"expected a mapping, got {_shown(tree)}")]
    out: list[tuple[str, str]] = []
    for section, body in tree.items():
        key = f"thresholds.{section}"
        spec = THRESHOLDS_SCHEMA.get(section) if isinstance(section, str) else None
        if spec is None:
            out.append((key, _unknown("section", section, THRESHOLDS_SCHEMA)))
            continue
        if not isinstance(body, Mapping):
            out.append((key, f"expected a mapping, got {_shown(body)}"))
            continue
        for name, value in body.items():
            item = spec.keys.get(name) if isinstance(name, str) else None
            if item is None:
                out.append((f"{key}.{name}", _unknown(f"key of {section}", name, spec.keys)))
                continue
            found = item.problems(value, f"{key}.{name}")
            out += found
            if complete and not found and isinstance(item, _BandSpec):
                out += item.complete_problems(value, f"{key}.{name}")
        if complete and (section not in _OPTIONAL_SECTIONS
                         or any(name in body for name in spec.required)):
            # An optional section holding none of its required keys only tunes a test the
            # profile does not define (the lab sets nccl_pair.timeout_s for every pool).
            out += [(f"{key}.{name}", "missing") for name in spec.required if name not in body]
    if complete:
        out += [(f"thresholds.{s}", "missing") for s in THRESHOLDS_SCHEMA
                if s not in tree and s not in _OPTIONAL_SECTIONS]
    return out


def _band(raw: Any, source: str, key: str) -> Band:
    """The Band of a band mapping (checked when the profile was loaded; checked again here, so
    that a Band never holds a limit that cannot judge)."""
    if not isinstance(raw, Mapping):
        raise ProfileError(source, key, f"expected a band mapping, got {type(raw).__name__}")
    unknown = set(raw) - set(_BAND_KEYS)
    if unknown:
        raise ProfileError(source, key, f"unknown band keys {sorted(unknown)}")
    limits: dict[str, float | None] = {}
    for limit in ("warn", "fail"):
        val = raw.get(limit)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int | float)
                                or not math.isfinite(val)):
            raise ProfileError(source, f"{key}.{limit}", f"expected a finite number, got {val!r}")
        limits[limit] = None if val is None else float(val)
    better = raw.get("better", "higher")
    if better not in ("higher", "lower"):
        raise ProfileError(source, f"{key}.better", f"expected higher|lower, got {better!r}")
    return Band(limits["warn"], limits["fail"], better)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: mappings merge key by key, anything else
    (lists included) replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _read_yaml(path: Path, missing: str = "no such profile file") -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ProfileError(str(path), "", missing) from exc
    except yaml.YAMLError as exc:
        raise ProfileError(str(path), "", f"invalid YAML: {exc}") from exc


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_STORAGE: dict[str, _Text] = {
    "scratch_path": _Text(pattern=r"/\S*", what="an absolute path"),
    "checkpoint_path": _Text(pattern=r"/\S*", what="an absolute path"),
    "drive_class": _Text(pattern=r"\S+", what="a drive class name"),
}


def _file_problems(data: Mapping[str, Any], name: str) -> list[tuple[str, str]]:
    """Every problem of a profile file's own content (its thresholds as they stand alone)."""
    out: list[tuple[str, str]] = []
    if data.get("name") != name:
        out.append(("name", f"must equal the file name {name!r}, got {data.get('name')!r}"))
    out += [(str(k), _unknown("top-level key", k, _TOP_KEYS)) for k in data
            if k not in _TOP_KEYS]
    hw_raw = data.get("hardware")
    if not isinstance(hw_raw, Mapping):
        out.append(("hardware", f"missing or not a mapping ({_shown(hw_raw)})"))
    else:
        out += [(f"hardware.{k}", _unknown("hardware key", k, _HARDWARE)) for k in hw_raw
                if k not in _HARDWARE]
        for key, spec in _HARDWARE.items():
            if key not in hw_raw:
                out.append((f"hardware.{key}", "missing"))
            else:
                out += spec.problems(hw_raw[key], f"hardware.{key}")
    storage = data.get("storage") or {}
    if not isinstance(storage, Mapping):
        out.append(("storage", f"expected a mapping, got {_shown(storage)}"))
    else:
        for key, value in storage.items():
            path_spec = _STORAGE.get(key)
            out += (path_spec.problems(value, f"storage.{key}") if path_spec is not None
                    else [(f"storage.{key}", _unknown("storage key", key, _STORAGE))])
    thresholds = data.get("thresholds")
    if not isinstance(thresholds, Mapping):
        out.append(("thresholds", f"missing or not a mapping ({_shown(thresholds)})"))
    else:
        out += threshold_problems(thresholds, complete=False)
    return out


_TOP_KEYS = ("name", "hardware", "storage", "thresholds")


def _drive_classes(profiles_dir: Path) -> tuple[str, Mapping[str, Any]]:
    path = profiles_dir / DRIVE_CLASSES_FILE
    classes = _read_yaml(path, "no drive classes file")
    if not isinstance(classes, Mapping):
        raise ProfileError(str(path), "", f"expected a mapping of drive classes, got "
                                          f"{_shown(classes)}")
    fio = THRESHOLDS_SCHEMA["fio"]
    problems: list[tuple[str, str]] = []
    for cls, bands in classes.items():
        if not isinstance(bands, Mapping):
            problems.append((str(cls), f"expected a mapping of fio bands, got {_shown(bands)}"))
            continue
        for metric in _FIO_BANDS:
            if metric not in bands:
                problems.append((f"{cls}.{metric}", "missing"))
        for metric, value in bands.items():
            spec = fio.keys.get(metric) if metric in _FIO_BANDS else None
            if not isinstance(spec, _BandSpec):
                problems.append((f"{cls}.{metric}", _unknown("fio band", metric, _FIO_BANDS)))
                continue
            found = spec.problems(value, f"{cls}.{metric}")
            problems += found or spec.complete_problems(value, f"{cls}.{metric}")
    if problems:
        raise ProfileError(str(path), "", "", problems)
    return str(path), classes


def load_profile(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    inventory_vars: Mapping[str, Any] | None = None,
    override_source: str = "inventory gpu_thresholds",
    profiles_dir: Path = PROFILES_DIR,
) -> Profile:
    """Load ``<profiles_dir>/<name>.yml`` and apply ``overrides`` (the node's
    ``gpu_thresholds``) and storage vars from ``inventory_vars`` (keyed by their inventory
    names, validate.desired's). Raises :class:`ProfileError` with every problem found, naming
    the file, the drive classes file or ``override_source``."""
    if not isinstance(name, str) or not _PROFILE_NAME.fullmatch(name):
        raise ProfileError(str(profiles_dir), desired.PROFILE,
                           f"invalid profile name {name!r} (letters, digits, '.', '_', '-')")
    path = profiles_dir / f"{name}.yml"
    src = str(path)
    if not path.is_file():
        known = available(profiles_dir)
        raise ProfileError(src, "", f"no such profile file; {_unknown('profile', name, known)}")
    data = _read_yaml(path)
    if not isinstance(data, Mapping):
        raise ProfileError(src, "", f"top level must be a mapping, got {_shown(data)}")
    problems = _file_problems(data, name)
    if problems:
        raise ProfileError(src, "", "", problems)
    storage: Mapping[str, Any] = data.get("storage") or {}
    thresholds: Mapping[str, Any] = data["thresholds"]

    ivars = inventory_vars or {}
    classes_src, classes = _drive_classes(profiles_dir)
    drive_class = str(ivars.get(desired.DRIVE_CLASS, storage.get("drive_class", "virtual")))
    if drive_class not in classes:
        where = (f"inventory {desired.DRIVE_CLASS}" if desired.DRIVE_CLASS in ivars
                 else f"{src} storage.drive_class")
        raise ProfileError(where, "", f"{_unknown('drive class', drive_class, classes)}, "
                                      f"defined in {classes_src}")
    merged = deep_merge(thresholds, {"fio": classes[drive_class]})
    merged_src = src
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            raise ProfileError(override_source, "", f"gpu_thresholds must be a mapping, got "
                                                    f"{_shown(overrides)}")
        problems = threshold_problems(overrides, complete=False)
        if problems:
            raise ProfileError(override_source, "", "", problems)
        merged = deep_merge(merged, overrides)
        merged_src = f"{src} + {override_source}"
    problems = threshold_problems(merged, complete=True)
    if problems:
        raise ProfileError(merged_src, "", "", problems)
    hw = {key: data["hardware"][key] for key in _HARDWARE}
    return Profile(
        name=name,
        source=src,
        hardware=Hardware(**hw),
        scratch_path=str(ivars.get(desired.SCRATCH_PATH, storage.get("scratch_path", "/var/tmp"))),
        checkpoint_path=str(
            ivars.get(desired.CHECKPOINT_PATH, storage.get("checkpoint_path", "/var/tmp"))
        ),
        drive_class=drive_class,
        thresholds=merged,
    )


def available(profiles_dir: Path = PROFILES_DIR) -> list[str]:
    """Names of the shipped profiles (or those in ``profiles_dir``)."""
    return sorted(p.stem for p in profiles_dir.glob("*.yml") if not p.stem.startswith("_"))
