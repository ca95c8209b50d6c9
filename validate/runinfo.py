"""``run.json``: what a run was asked to do and judged against, so its report can be rendered
again exactly (``python -m validate report <run-dir>``) and read by someone who was not there.

Schema (``RUN_INFO_SCHEMA`` 1), one JSON object:

- ``schema``: 1; ``run_id``; ``environment``: the inventory's ``gpuready_environment`` label(s)
  or null; ``inventory``: absolute path; ``limit``: the host pattern or null;
  ``checks_requested``: the ``--checks`` text or null; ``checks``: the check ids run, in order;
  ``nodes``: how many nodes were selected.
- ``profiles``: one entry per distinct profile as the checks used it: ``name``, ``source`` (the
  profile file), ``overrides`` (the inventory's ``gpu_thresholds`` merged over it, or null),
  ``hardware``, ``storage`` (scratch/checkpoint path, drive class), ``thresholds`` (merged, as
  judged), ``pools`` and ``nodes`` using it, and ``error`` (why it could not be loaded: those
  nodes have ``profile.invalid`` rows) or null.
- ``suite_version`` (pyproject.toml), ``git_commit`` and ``git_dirty`` (null outside a git
  checkout), ``started`` and ``finished`` (ISO 8601 UTC), ``exit_code`` (the one table in
  :mod:`validate.model`).
- ``run_kind``: ``validation`` (``validate run``/``fabric``) or ``drift`` (``validate drift``,
  whose performance rows are history too). Optional when read: a run.json written before the
  field is a validation run's.

Which kind a run directory holds (:func:`run_kind`): its run.json's ``run_kind``; without one
(a run from before the field, or a run without run.json), a directory laid out as a drift run
(``drift.json`` beside its results, validate/drift/report.py) is a drift run and any other a
validation run. Readers that count a node's accepted/out streak (the cost view, the gate's
history) read validation runs only: a drift run measures performance, it does not judge a node.

The file is written by :func:`validate.report.write_report` and read back by
:func:`read_run_info`; writing what was read gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from validate import desired
from validate.inventory import Node, profile_for
from validate.model import DRIFT, RUN_KINDS, VALIDATION
from validate.profiles import ProfileError

RUN_INFO_FILE = "run.json"
RUN_INFO_SCHEMA = 1
# What a drift run writes beside its results (validate/drift/report.py's META).
DRIFT_LAYOUT_FILE = "drift.json"
SUITE_ROOT = Path(__file__).resolve().parent.parent
# The inventory vars load_profile reads besides gpu_thresholds: nodes that agree on these and on
# their profile name were judged against the same thresholds.
_PROFILE_VARS = tuple(v for v in desired.PROFILE_VARS if v != desired.THRESHOLDS)


class RunInfoError(ValueError):
    """run.json is missing a field, has a field of the wrong type, or is not JSON."""


@dataclass(frozen=True, slots=True)
class ProfileUse:
    """One profile as the checks used it, and the nodes judged against it."""

    name: str
    source: str
    overrides: Mapping[str, Any] | None
    hardware: Mapping[str, Any]
    storage: Mapping[str, str]
    thresholds: Mapping[str, Any]
    pools: tuple[str, ...]
    nodes: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run's metadata (schema in the module docstring)."""

    run_id: str
    environment: str | None
    inventory: str
    limit: str | None
    checks_requested: str | None
    checks: tuple[str, ...]
    nodes: int
    profiles: tuple[ProfileUse, ...]
    suite_version: str
    git_commit: str | None
    git_dirty: bool | None
    started: str
    finished: str | None = None
    exit_code: int | None = None
    schema: int = RUN_INFO_SCHEMA
    run_kind: str = VALIDATION

    def to_json(self) -> str:
        """The run.json text (stable: the same record gives the same bytes)."""
        data = dataclasses.asdict(self)
        order = ["schema", *(k for k in data if k != "schema")]
        return json.dumps({k: data[k] for k in order}, indent=2, default=str) + "\n"


def now_utc() -> str:
    """The time now, as run.json writes it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def suite_version(root: Path = SUITE_ROOT) -> str:
    """``project.version`` from the checkout's pyproject.toml, or ``unknown``."""
    try:
        with (root / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_state(root: Path = SUITE_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the suite's own checkout; (None, None) when it is not one (an
    enclosing repository of something else does not count)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None, None
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else status != "")


def profiles_used(nodes: Sequence[Node]) -> tuple[ProfileUse, ...]:
    """Each distinct profile the nodes are judged against, loaded once per distinct input with
    the runner's own :func:`~validate.inventory.profile_for`."""
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        key = json.dumps(
            [
                node.profile,
                node.desired.thresholds,
                [node.desired.profile_overrides.get(v) for v in _PROFILE_VARS],
            ],
            sort_keys=True,
            default=str,
        )
        groups.setdefault(key, []).append(node)
    out: list[ProfileUse] = []
    for members in groups.values():
        first = members[0]
        overrides = first.desired.thresholds
        common: dict[str, Any] = {
            "overrides": dict(overrides) if isinstance(overrides, Mapping) else overrides,
            "pools": tuple(sorted({n.pool for n in members})),
            "nodes": tuple(n.name for n in members),
        }
        try:
            p = profile_for(first)
        except ProfileError as exc:
            out.append(
                ProfileUse(first.profile, exc.source, hardware={}, storage={}, thresholds={},
                           error=str(exc), **common)
            )
            continue
        out.append(
            ProfileUse(
                p.name,
                p.source,
                hardware=dataclasses.asdict(p.hardware),
                storage={
                    "scratch_path": p.scratch_path,
                    "checkpoint_path": p.checkpoint_path,
                    "drive_class": p.drive_class,
                },
                thresholds=p.thresholds,
                **common,
            )
        )
    return tuple(sorted(out, key=lambda u: (u.name, u.pools, u.nodes)))


def start(
    *,
    run_id: str,
    environment: str | None,
    inventory: Path,
    limit: str | None,
    checks_requested: str | None,
    checks: Sequence[str],
    nodes: Sequence[Node],
    run_kind: str = VALIDATION,
) -> RunInfo:
    """The record of a run about to start (``finished`` and ``exit_code`` come later);
    ``run_kind`` is :data:`VALIDATION` or :data:`DRIFT`."""
    if run_kind not in RUN_KINDS:
        raise ValueError(f"run_kind {run_kind!r} is not one of {', '.join(RUN_KINDS)}")
    commit, dirty = git_state()
    return RunInfo(
        run_id=run_id,
        environment=environment,
        inventory=str(inventory.resolve()),
        limit=limit,
        checks_requested=checks_requested,
        checks=tuple(checks),
        nodes=len(nodes),
        profiles=profiles_used(nodes),
        suite_version=suite_version(),
        git_commit=commit,
        git_dirty=dirty,
        started=now_utc(),
        run_kind=run_kind,
    )


# Field -> accepted JSON types; a tuple field is a JSON list.
_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "run_id": (str,),
    "environment": (str, type(None)),
    "inventory": (str,),
    "limit": (str, type(None)),
    "checks_requested": (str, type(None)),
    "checks": (list,),
    "nodes": (int,),
    "profiles": (list,),
    "suite_version": (str,),
    "git_commit": (str, type(None)),
    "git_dirty": (bool, type(None)),
    "started": (str,),
    "finished": (str, type(None)),
    "exit_code": (int, type(None)),
}
_PROFILE_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "source": (str,),
    "overrides": (dict, type(None)),
    "hardware": (dict,),
    "storage": (dict,),
    "thresholds": (dict,),
    "pools": (list,),
    "nodes": (list,),
    "error": (str, type(None)),
}


def _checked(data: Any, fields: Mapping[str, tuple[type, ...]], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RunInfoError(f"{where}: expected an object, got {type(data).__name__}")
    for name, types in fields.items():
        if name not in data:
            raise RunInfoError(f"{where}: field {name!r} is missing")
        value = data[name]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunInfoError(f"{where}: field {name!r}: expected {want}, got {value!r:.80}")
    return {name: data[name] for name in fields}


def from_json(text: str, where: str = RUN_INFO_FILE) -> RunInfo:
    """Parse run.json text; every problem names the field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunInfoError(f"{where}: not JSON: {exc}") from exc
    data = _checked(raw, _FIELDS, where)
    kind = raw.get("run_kind", VALIDATION)
    if kind not in RUN_KINDS:
        raise RunInfoError(f"{where}: field 'run_kind': expected one of "
                           f"{', '.join(RUN_KINDS)}, got {kind!r:.80}")
    data["run_kind"] = kind
    if data["schema"] != RUN_INFO_SCHEMA:
        raise RunInfoError(f"{where}: schema {data['schema']} is not {RUN_INFO_SCHEMA}")
    profiles = []
    for i, entry in enumerate(data["profiles"]):
        p = _checked(entry, _PROFILE_FIELDS, f"{where}: profiles[{i}]")
        profiles.append(
            ProfileUse(**{**p, "pools": tuple(p["pools"]), "nodes": tuple(p["nodes"])})
        )
    return RunInfo(**{**data, "checks": tuple(data["checks"]), "profiles": tuple(profiles)})


def read_run_info(run_dir: Path) -> RunInfo | None:
    """``<run_dir>/run.json``, or None when the run has none (written before run.json)."""
    path = run_dir / RUN_INFO_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return from_json(text, str(path))


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    """Write ``<run_dir>/run.json``."""
    (run_dir / RUN_INFO_FILE).write_text(info.to_json(), encoding="utf-8")


def run_kind(run_dir: Path) -> str:
    """``validation`` or ``drift``: what the run in ``run_dir`` is (module docstring). A kind
    this suite does not know is returned as it is written, so that no reader takes it for a
    validation run."""
    try:
        doc = json.loads((run_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and "run_kind" in doc:
        return str(doc["run_kind"])
    return DRIFT if (run_dir / DRIFT_LAYOUT_FILE).is_file() else VALIDATION
