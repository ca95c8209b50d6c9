"""SKU profiles: per-SKU hardware expectations and thresholds, as YAML data.

A profile file ``validate/profiles/<name>.yml`` has::

    name: <str, equals the file stem>
    hardware: {gpu_count: int, gpu_model: str, gpu_memory_mib: int, pcie_gen: int,
               pcie_width: int, nvlinks_per_gpu: int, nvswitch: bool, nic_count: int,
               nic_rate_gbps: number}
    storage: {scratch_path: str, checkpoint_path: str, drive_class: str}   (optional)
    thresholds: nested mapping; any mapping with a ``fail`` or ``warn`` key is a band
                {warn: number|null, fail: number|null, better: higher|lower}

``_drive_classes.yml`` holds fio bands per drive class; the selected class is merged into
``thresholds.fio``. The inventory var ``gpu_thresholds`` (pool or host) is deep-merged over
``thresholds`` last, and ``storage`` values come from ``gpuready_*`` vars when set.
Every loading error names the file (or the inventory) and the dotted key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from validate.model import Status

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DRIVE_CLASSES_FILE = "_drive_classes.yml"


class ProfileError(Exception):
    """A profile (or an inventory override) is missing, unreadable or malformed."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}" if key else f"{source}: {reason}")
        self.source = source
        self.key = key
        self.reason = reason


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


_HARDWARE_TYPES: dict[str, tuple[type[Any], ...]] = {
    "gpu_count": (int,),
    "gpu_model": (str,),
    "gpu_memory_mib": (int,),
    "pcie_gen": (int,),
    "pcie_width": (int,),
    "nvlinks_per_gpu": (int,),
    "nvswitch": (bool,),
    "nic_count": (int,),
    "nic_rate_gbps": (int, float),
}


def _band(raw: Any, source: str, key: str) -> Band:
    if not isinstance(raw, Mapping):
        raise ProfileError(source, key, f"expected a band mapping, got {type(raw).__name__}")
    unknown = set(raw) - {"warn", "fail", "better"}
    if unknown:
        raise ProfileError(source, key, f"unknown band keys {sorted(unknown)}")
    limits: dict[str, float | None] = {}
    for limit in ("warn", "fail"):
        val = raw.get(limit)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int | float)):
            raise ProfileError(source, f"{key}.{limit}", f"expected a number, got {val!r}")
        limits[limit] = None if val is None else float(val)
    better = raw.get("better", "higher")
    if better not in ("higher", "lower"):
        raise ProfileError(source, f"{key}.better", f"expected higher|lower, got {better!r}")
    band = Band(limits["warn"], limits["fail"], better)
    if band.warn is not None and band.fail is not None:
        inverted = band.warn < band.fail if better == "higher" else band.warn > band.fail
        if inverted:
            raise ProfileError(source, key, f"warn {band.warn} is beyond fail {band.fail}")
    return band


def _check_bands(node: Any, source: str, prefix: str) -> None:
    """Validate every band in a thresholds tree (a mapping holding warn/fail is a band)."""
    if not isinstance(node, Mapping):
        return
    if "warn" in node or "fail" in node:
        _band(node, source, prefix)
        return
    for k, v in node.items():
        _check_bands(v, source, f"{prefix}.{k}")


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


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ProfileError(str(path), "", "no such profile file") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(str(path), "", f"invalid YAML: {exc}") from exc


def load_profile(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    inventory_vars: Mapping[str, Any] | None = None,
    override_source: str = "inventory gpu_thresholds",
    profiles_dir: Path = PROFILES_DIR,
) -> Profile:
    """Load ``<profiles_dir>/<name>.yml`` and apply ``overrides`` (the node's
    ``gpu_thresholds``) and storage vars from ``inventory_vars``."""
    if not name or "/" in name or name.startswith((".", "_")):
        raise ProfileError(str(profiles_dir), "gpu_profile", f"invalid profile name {name!r}")
    path = profiles_dir / f"{name}.yml"
    src = str(path)
    data = _read_yaml(path)
    if not isinstance(data, Mapping):
        raise ProfileError(src, "", "top level must be a mapping")
    if data.get("name") != name:
        raise ProfileError(src, "name", f"must equal the file name {name!r}")
    hw_raw = data.get("hardware")
    if not isinstance(hw_raw, Mapping):
        raise ProfileError(src, "hardware", "missing or not a mapping")
    hw: dict[str, Any] = {}
    for key, types in _HARDWARE_TYPES.items():
        if key not in hw_raw:
            raise ProfileError(src, f"hardware.{key}", "missing")
        val = hw_raw[key]
        if not isinstance(val, types) or (bool not in types and isinstance(val, bool)):
            raise ProfileError(
                src,
                f"hardware.{key}",
                f"expected {'/'.join(t.__name__ for t in types)}, got {val!r}",
            )
        hw[key] = val
    storage = data.get("storage") or {}
    if not isinstance(storage, Mapping):
        raise ProfileError(src, "storage", "not a mapping")
    thresholds = data.get("thresholds")
    if not isinstance(thresholds, Mapping):
        raise ProfileError(src, "thresholds", "missing or not a mapping")
    _check_bands(thresholds, src, "thresholds")

    ivars = inventory_vars or {}
    drive_class = str(ivars.get("gpuready_drive_class", storage.get("drive_class", "virtual")))
    classes = _read_yaml(profiles_dir / DRIVE_CLASSES_FILE)
    if not isinstance(classes, Mapping) or drive_class not in classes:
        raise ProfileError(
            str(profiles_dir / DRIVE_CLASSES_FILE), drive_class, "unknown drive class"
        )
    merged = deep_merge(thresholds, {"fio": classes[drive_class]})
    if overrides:
        if not isinstance(overrides, Mapping):
            raise ProfileError(override_source, "", "gpu_thresholds must be a mapping")
        merged = deep_merge(merged, overrides)
        _check_bands(merged, f"{src} + {override_source}", "thresholds")
    return Profile(
        name=name,
        source=src,
        hardware=Hardware(**hw),
        scratch_path=str(
            ivars.get("gpuready_scratch_path", storage.get("scratch_path", "/var/tmp"))
        ),
        checkpoint_path=str(
            ivars.get(
                "gpuready_checkpoint_path", storage.get("checkpoint_path", "/var/tmp")
            )
        ),
        drive_class=drive_class,
        thresholds=merged,
    )


def available() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yml") if not p.stem.startswith("_"))
