"""What a validation run holds about each node, and what keeps the gate from acting on it.

The gate admits a node only on evidence it can stand behind. :func:`node_evidence` reads one
node's rows of a run (the report's long table, validate/model.py's columns) into a
:class:`~validate.labels.NodeEvidence`: the run's figures the gate labels with
(:class:`~validate.labels.NodeResults`) and every problem, each a stable code:

- ``gate.stale_run``: the node was measured longer ago than the pool's window
  (``gpuready_gate_max_run_age``, default 24h), or its rows carry no readable time, or a time
  in the future (a clock is wrong);
- ``gate.incomplete_run``: the node has no row for some check its profile requires. Every
  per-node check of the registry is required (what ``validate run`` runs by default): a check
  that does not apply to the profile writes a ``skip`` row, which counts. A run with narrower
  ``--checks``, or a results file cut short, can keep a node out but never admit it;
- ``gate.non_finite_value``: a row holds infinity, or a passing or warning row of a numeric
  figure (one with a unit or a threshold, and the GPU count and memory the gate labels) has no
  finite value (the validators write ``check.non_finite_value`` error rows instead: a NaN in a
  passing row is a damaged or forged file);
- ``gate.node_not_in_run``: the run has no row for the node.

:func:`read_run` reads a run directory's results through validate/report.py, which names a
missing column or an unknown status with the file it was read from; a run without a single row
is ``gate.empty_run`` (:class:`EmptyRun`). Nothing here talks to the cluster; only ``read_run``
reads files.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import checks as check_registry
from validate.labels import (
    CODE_EMPTY_RUN,
    CODE_INCOMPLETE,
    CODE_NON_FINITE,
    CODE_STALE,
    EvidenceProblem,
    NodeEvidence,
    NodeResults,
    not_in_run,
    parse_time,
)
from validate.model import CODE_OK, Status, worst
from validate.results import load_results

# The figures the gate turns into labels: they must be numbers wherever a row passes.
GATE_FIGURES = (("gpu.count", "gpu_count"), ("gpu.memory", "memory_total_mib"))
# How far ahead of this machine's clock a run's time may be before it reads as a wrong clock.
CLOCK_SKEW = timedelta(minutes=5)
_JUDGED = (Status.PASS.value, Status.WARN.value)


class EmptyRun(ValueError):
    """The run holds no result rows at all (``gate.empty_run``)."""

    code = CODE_EMPTY_RUN


@dataclass(frozen=True)
class RunRows:
    """A run directory's rows, as read."""

    run_dir: Path
    run_id: str
    rows: pd.DataFrame


def required_checks() -> tuple[str, ...]:
    """The checks a node must have rows for to be admitted: every per-node check."""
    return tuple(check_registry.REGISTRY)


def read_run(run_dir: Path) -> RunRows:
    """The rows of a run directory (``results.parquet``, else a killed run's ``rows.jsonl``,
    else ``results.csv``). FileNotFoundError when it holds none of them; ResultsError (from
    validate/report.py) for a missing column or a bad status; EmptyRun for no rows."""
    if not any((run_dir / name).exists()
                for name in ("results.parquet", "results.csv", "rows.jsonl")):
        raise FileNotFoundError(f"{run_dir} holds no validation results (results.parquet or "
                                "results.csv); run `python -m validate run` first")
    rows = load_results(run_dir)
    if rows.empty:
        raise EmptyRun(f"{run_dir}: the results hold no rows ({CODE_EMPTY_RUN}): there is "
                       "nothing to judge any node on")
    ids = rows["run_id"].astype(str).unique()
    return RunRows(run_dir, str(ids[0]) if len(ids) == 1 else run_dir.name, rows)


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds")


def _age_text(seconds: float) -> str:
    hours = seconds / 3600
    if hours < 1:
        return f"{seconds / 60:.0f} min"
    return f"{round(hours / 24, 1):g} days" if hours >= 48 else f"{round(hours, 1):g} h"


def _measured_at(rows: pd.DataFrame) -> tuple[datetime | None, str]:
    """The node's first row time, or None and the unreadable text."""
    texts = [str(t) for t in rows["time"].tolist()]
    try:
        times = [parse_time(t) for t in texts]
    except ValueError:
        bad = next(t for t in texts if not _readable(t))
        return None, bad
    return (min(times), "") if times else (None, "")


def _readable(text: str) -> bool:
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


def _freshness(measured: datetime | None, unreadable: str, now: datetime,
               max_age_s: float) -> EvidenceProblem | None:
    window = _age_text(max_age_s)
    if measured is None:
        return EvidenceProblem(CODE_STALE, f"the node's rows carry no readable time "
                               f"({unreadable!r}): its age cannot be shown to be within "
                               f"{window}")
    if measured > now + CLOCK_SKEW:
        return EvidenceProblem(CODE_STALE, f"the node was measured at {_iso(measured)}, after "
                               f"this machine's time {_iso(now)}: a clock is wrong")
    age = (now - measured).total_seconds()
    if age > max_age_s:
        return EvidenceProblem(CODE_STALE, f"the node was measured at {_iso(measured)}, "
                               f"{_age_text(age)} ago; its pool admits on runs no older than "
                               f"{window} (gpuready_gate_max_run_age): validate it again")
    return None


def _coverage(rows: pd.DataFrame, required: Sequence[str]) -> EvidenceProblem | None:
    present = set(rows["check"].astype(str))
    missing = [c for c in required if c not in present]
    if not missing:
        return None
    return EvidenceProblem(CODE_INCOMPLETE, (
        f"the run has no rows of {len(missing)} of the {len(required)} checks the node needs "
        f"({', '.join(missing)}): a run of fewer checks can keep a node out, never admit it"))


def _non_finite(rows: pd.DataFrame) -> EvidenceProblem | None:
    values = pd.to_numeric(rows["value"], errors="coerce").astype("float64")
    infinite = pd.Series(np.isinf(values.to_numpy()), index=rows.index)
    judged = rows["status"].astype(str).isin(_JUDGED)
    numeric = (rows["unit"].astype(str) != "") | rows["warn"].notna() | rows["fail"].notna()
    for check, metric in GATE_FIGURES:
        numeric |= (rows["check"] == check) & (rows["metric"] == metric)
    bad = infinite | (judged & numeric & values.isna())
    if not bad.any():
        return None
    shown = [f"{r.check} {r.metric or '(no metric)'} = {r.value} ({r.status})"
             for r in rows[bad].head(3).itertuples(index=False)]
    more = f" and {int(bad.sum()) - 3} more" if bad.sum() > 3 else ""
    return EvidenceProblem(CODE_NON_FINITE, (
        f"the run holds values that are not finite numbers: {'; '.join(shown)}{more} (the "
        "validators write such a figure as an error row): the file is damaged or was edited"))


def _row(rows: pd.DataFrame, check: str, metric: str | None = None) -> pd.Series | None:
    sub = rows[rows["check"] == check]
    if metric is not None:
        sub = sub[sub["metric"] == metric]
    return None if sub.empty else sub.iloc[0]


def _value(rows: pd.DataFrame, check: str, metric: str) -> int | None:
    row = _row(rows, check, metric)
    if row is None or str(row["status"]) == Status.ERROR.value:
        return None
    value = float(row["value"])
    return int(value) if math.isfinite(value) else None


def results_of(rows: pd.DataFrame, run_id: str) -> NodeResults:
    """What one node's rows say (the figures the gate labels with, its failing codes)."""
    statuses = [Status(str(s)) for s in rows["status"]]
    bad = rows[rows["status"].astype(str).isin([Status.FAIL.value, Status.ERROR.value])]
    codes = tuple(sorted({str(c) for c in bad["code"] if c and c != CODE_OK}))
    model = _row(rows, "gpu.model")
    return NodeResults(
        run_id=run_id, status=worst(statuses), codes=codes,
        gpu_count=_value(rows, "gpu.count", "gpu_count"),
        gpu_memory_mib=_value(rows, "gpu.memory", "memory_total_mib"),
        gpu_model_status=None if model is None else Status(str(model["status"])),
        gpu_model_detail="" if model is None else str(model["detail"]))


def node_evidence(rows: pd.DataFrame | None, *, run_id: str, now: datetime, max_age_s: float,
                  required: Collection[str] | None = None) -> NodeEvidence:
    """One node's evidence from its rows of a run (None or empty: the node is not in it),
    judged at ``now`` against a window of ``max_age_s`` seconds and the ``required`` checks
    (default :func:`required_checks`). Pure."""
    if rows is None or rows.empty:
        return not_in_run(run_id)
    measured, unreadable = _measured_at(rows)
    problems = [p for p in (
        _freshness(measured, unreadable, now, max_age_s),
        _coverage(rows, tuple(required) if required is not None else required_checks()),
        _non_finite(rows),
    ) if p is not None]
    return NodeEvidence(run_id, _iso(measured) if measured else None, results_of(rows, run_id),
                        tuple(problems))


def by_node(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A run's rows, per node."""
    return {str(node): group for node, group in rows.groupby("node", sort=True)}
