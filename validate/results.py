"""A run's results: reserving its directory, storing its rows, reading them back, and the
frames computed from them (per node, per key figure, against the pool).

This is the store the gate, history, cost, evidence and drift read; the renderers
(:mod:`validate.report`: summary, page, JUnit, Prometheus) import it, never the other way round,
so reading a run loads neither the page nor its plotting library.

Placement (nothing a reader sees is ever half written):

- :func:`start_run` is called before the first connection: it checks ``--out`` (created if
  missing, must be a writable directory), validates or makes the run id, and reserves it by
  creating ``<out>/<run-id>.partial/`` (a run directory is never reused: a second run with the
  same id fails, an automatic id is drawn again).
- :meth:`PendingRun.append` writes each node's rows to ``<run-id>.partial/rows.jsonl`` as the
  node finishes (flushed and fsynced): a killed validator leaves every finished node's rows,
  and ``python -m validate report <out>/<run-id>.partial`` renders them.
- :func:`validate.report.finish_run` renders the report in the reserved directory and places
  it (:func:`validate.report.write_report`); ``latest`` (:func:`point_link`) is switched
  atomically, and only to a complete run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow as pa

from validate.errors import InputError
from validate.model import COLUMNS, SEVERITY, CheckResult

OUTLIER_FRACTION = 0.10
# (check, metric) -> column name in nodes.csv / figure name in fleet.csv (all higher = better).
KEY_FIGURES: dict[tuple[str, str], str] = {
    ("nccl.allreduce", "busbw_gbps"): "nccl_busbw_gbps",
    ("storage.fio", "seq_read_mibps"): "fio_seq_read_mibps",
    ("storage.fio", "seq_write_mibps"): "fio_seq_write_mibps",
    ("storage.fio", "randread_4k_iops"): "fio_randread_4k_iops",
    ("storage.checkpoint", "write_gbps"): "checkpoint_write_gbps",
    ("storage.checkpoint", "read_gbps"): "checkpoint_read_gbps",
}
STATUS_ORDER = [s.value for s in sorted(SEVERITY, key=SEVERITY.__getitem__)]
_STATUS_DTYPE = pd.CategoricalDtype(STATUS_ORDER, ordered=True)


@dataclass(frozen=True)
class ReportExtras:
    """What other modules add to a run's report (validate.cost's capacity and cost view,
    validate.fabric's pair table): Markdown appended to summary.md, an HTML section for
    index.html, Prometheus lines appended to metrics.prom, and ``write_files(build_dir)`` for
    files of their own, written before the run directory is placed."""

    markdown: str = ""
    html: str = ""
    metrics: str = ""
    write_files: Callable[[Path], object] | None = None


# The results files' columns and types, given explicitly: inferred from a run with no rows,
# the text columns came out as doubles, and every later read of the reports root as one
# dataset (history, drift baselines) failed on the first real run id.
_FLOAT_COLUMNS = ("value", "warn", "fail", "duration_s")
RESULTS_SCHEMA = pa.schema([(c, pa.float64() if c in _FLOAT_COLUMNS else pa.large_string())
                            for c in COLUMNS])
PARTIAL_SUFFIX = ".partial"
ROWS_FILE = "rows.jsonl"
LATEST = "latest"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


class RunDirError(InputError):
    """The output directory or the run id cannot be used."""


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is safe as one directory name under ``--out``: letters, digits,
    ``.``, ``_``, ``-``, at most 80 characters, not starting with ``.`` or ``-``; not
    ``latest`` and not ending in ``.partial``."""
    if (
        not _RUN_ID.fullmatch(run_id)
        or run_id == LATEST
        or run_id.endswith(PARTIAL_SUFFIX)
    ):
        raise RunDirError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 80, "
            f"starting with a letter or digit), not {LATEST!r} or a name ending in "
            f"{PARTIAL_SUFFIX!r}"
        )
    return run_id


@dataclass
class PendingRun:
    """A reserved run directory being filled (see the module docstring)."""

    out_root: Path
    run_id: str
    partial_dir: Path
    _rows: IO[str] | None = field(default=None, repr=False)

    @property
    def rows_file(self) -> Path:
        return self.partial_dir / ROWS_FILE

    def append(self, rows: Sequence[CheckResult]) -> None:
        """Append rows durably (one JSON object per line, flushed and fsynced)."""
        if self._rows is None:
            self._rows = self.rows_file.open("a", encoding="utf-8")
        self._rows.write("".join(json.dumps(r.as_dict()) + "\n" for r in rows))
        self._rows.flush()
        os.fsync(self._rows.fileno())

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()
            self._rows = None



def start_run(out_root: Path, run_id: str | None, new_id: Callable[[], str],
              partial_name: Callable[[str], str] = lambda run_id: f"{run_id}{PARTIAL_SUFFIX}"
              ) -> PendingRun:
    """Check ``out_root`` and the run id, and reserve the run's directory
    (``partial_name(run_id)``) before any node is asked."""
    try:
        out_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create the output directory {out_root}: {exc}") from exc
    if not out_root.is_dir():
        raise RunDirError(f"output directory {out_root} is not a directory")
    for _ in range(20):
        candidate = check_run_id(run_id if run_id is not None else new_id())
        partial = out_root / partial_name(candidate)
        try:
            partial.mkdir()
        except FileExistsError:
            if run_id is not None:
                raise RunDirError(
                    f"run id {candidate!r} is in use: {partial} exists (another run in "
                    "progress, or the rows of one that was killed)"
                ) from None
            continue
        except OSError as exc:
            raise RunDirError(f"cannot write in the output directory {out_root}: {exc}") from exc
        # Only a renamed .partial directory creates <id>, so after our mkdir succeeded <id>
        # either existed before (a finished run: never reuse it) or never will by anyone else.
        if (out_root / candidate).exists() or (out_root / candidate).is_symlink():
            partial.rmdir()
            if run_id is not None:
                raise RunDirError(
                    f"run directory {out_root / candidate} exists; run ids are never reused"
                )
            continue
        try:
            probe = partial / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.rmdir()
            raise RunDirError(f"cannot write in the output directory {out_root}: {exc}") from exc
        return PendingRun(out_root, candidate, partial)
    raise RunDirError(f"could not reserve a fresh run id under {out_root}")


def to_frame(rows: Sequence[CheckResult]) -> pd.DataFrame:
    """The long results as a DataFrame with ``status`` as an ordered categorical."""
    # attrgetter + zip transposes in C: a per-column getattr loop is 3x slower at 400k rows.
    columns = (
        list(zip(*map(attrgetter(*COLUMNS), rows), strict=True)) if rows else [() for _ in COLUMNS]
    )
    data = dict(zip(COLUMNS, columns, strict=True))
    data["status"] = tuple(s.value for s in data["status"])
    return _typed(pd.DataFrame(data, columns=list(COLUMNS)))


def results_table(df: pd.DataFrame) -> pa.Table:
    """The long results (:func:`to_frame`) as the Arrow table both result files are written
    from, with :data:`RESULTS_SCHEMA` whatever the rows."""
    return pa.Table.from_pandas(df.assign(status=df["status"].astype(str)),
                                schema=RESULTS_SCHEMA, preserve_index=False)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for col in _FLOAT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("node", "pool", "profile", "check", "metric", "unit", "code", "detail"):
        df[col] = df[col].fillna("").astype(str)
    df["status"] = df["status"].astype(str).astype(_STATUS_DTYPE)
    return df


class ResultsError(ValueError):
    """A results file the report cannot be built from: a column is missing or a status is not
    one of the table's (the message names the file, and the row)."""


def _where(first_line: int, at: int) -> str:
    return f"line {first_line + at}" if first_line else f"row {at + 1}"


# The numeric columns a report renders; NaN there is "no value", infinity no value at all.
_FINITE_COLUMNS = ("value", "warn", "fail", "duration_s")


def _finite(df: pd.DataFrame, source: Path, first_line: int) -> pd.DataFrame:
    """``df`` when no numeric column holds infinity (or text where a number belongs): a
    report cannot render one (JSON has no infinity) and no check writes one (a non-finite
    measurement is a ``check.non_finite_value`` error row without a value)."""
    for column in _FINITE_COLUMNS:
        raw = df[column]
        values = pd.to_numeric(raw, errors="coerce")
        bad = np.isinf(values.to_numpy(dtype=float)) | (values.isna() & raw.notna()).to_numpy()
        if bad.any():
            at = int(bad.nonzero()[0][0])
            row = df.iloc[at]
            raise ResultsError(
                f"{source}: {_where(first_line, at)} (node {row['node']!s}, check "
                f"{row['check']!s}): {column} is {row[column]!s}, not a finite number; a "
                "report cannot show it (the validators never write one: the file was edited "
                "or damaged)" + (f"; {int(bad.sum()) - 1} more rows like it"
                                 if bad.sum() > 1 else ""))
    return df


def _checked(df: pd.DataFrame, source: Path, first_line: int) -> pd.DataFrame:
    """``df`` when it has every column and every status is known; ``first_line`` is the line
    of the first row in ``source`` (0 for a file without lines, where rows are counted)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ResultsError(
            f"{source}: no column {', '.join(repr(c) for c in missing)} (a results file has "
            f"the columns {', '.join(COLUMNS)}): it was not written by `validate run`, or it "
            "was cut or edited")
    statuses = df["status"]
    bad = ~statuses.astype(str).isin(STATUS_ORDER) | statuses.isna()
    if bad.any():
        at = int(bad.to_numpy().nonzero()[0][0])
        row = df.iloc[at]
        raise ResultsError(
            f"{source}: {_where(first_line, at)} (node {row['node']!s}, check "
            f"{row['check']!s}): status {row['status']!r} is not a status (one of "
            f"{', '.join(STATUS_ORDER)})"
            + (f"; {int(bad.sum()) - 1} more rows like it" if bad.sum() > 1 else ""))
    return df


def load_results(run_dir: Path, *, renderable: bool = False) -> pd.DataFrame:
    """Read back ``results.parquet`` (or ``results.csv``, or the ``rows.jsonl`` a killed run
    left in its ``.partial`` directory) of a run directory. ResultsError names a missing
    column or a bad status and the file; with ``renderable`` (the report), also a value that
    is not finite, with its file and row (the gate reads such a row as its own verdict,
    ``gate.non_finite_value``)."""
    check = ((lambda df, src, line: _finite(_checked(df, src, line), src, line)) if renderable
             else _checked)
    parquet = run_dir / "results.parquet"
    if parquet.exists():
        return _typed(check(pd.read_parquet(parquet), parquet, 0))
    jsonl = run_dir / ROWS_FILE
    if jsonl.exists() and not (run_dir / "results.csv").exists():
        records = []
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line being written when the validator was killed
        return _typed(check(pd.DataFrame.from_records(records, columns=list(COLUMNS)),
                            jsonl, 0))
    csv = run_dir / "results.csv"
    return _typed(check(
        pd.read_csv(
            csv,
            keep_default_na=False,
            na_values={"value": [""], "warn": [""], "fail": [""]},
        ),
        csv, 2,
    ))


def node_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per node (schema in the module docstring), worst first."""
    sev = df["status"].cat.codes
    base = df.assign(_sev=sev)
    per_node = base.groupby("node", sort=True, observed=True).agg(
        pool=("pool", "first"),
        profile=("profile", "first"),
        _sev=("_sev", "max"),
        rows=("check", "size"),
    )
    per_node["status"] = pd.Categorical.from_codes(per_node["_sev"].to_numpy(), dtype=_STATUS_DTYPE)
    for label, statuses in (
        ("failed_checks", ["fail"]),
        ("error_checks", ["error"]),
        ("warn_checks", ["warn"]),
    ):
        hit = base.loc[base["status"].isin(statuses), ["node", "check"]].drop_duplicates()
        joined = hit.groupby("node", observed=True)["check"].agg(lambda s: " ".join(sorted(s)))
        per_node[label] = joined.reindex(per_node.index).fillna("")
    figures = figure_values(df)
    if not figures.empty:
        wide = figures.pivot_table(index="node", columns="figure", values="value", aggfunc="first")
        per_node = per_node.join(wide)
    for col in KEY_FIGURES.values():
        if col not in per_node.columns:
            per_node[col] = np.nan
    out = per_node.drop(columns="_sev").reset_index()
    out = out.assign(_sev=per_node["_sev"].to_numpy())
    out = out.sort_values(["_sev", "node"], ascending=[False, True]).drop(columns="_sev")
    cols = [
        "node",
        "pool",
        "profile",
        "status",
        "failed_checks",
        "error_checks",
        "warn_checks",
        "rows",
        *KEY_FIGURES.values(),
    ]
    return out[cols].reset_index(drop=True)


def figure_values(df: pd.DataFrame) -> pd.DataFrame:
    """Long table ``node, pool, figure, value, fail`` of the key figures present."""
    keys = pd.Series(
        list(KEY_FIGURES.values()),
        index=pd.MultiIndex.from_tuples(list(KEY_FIGURES), names=["check", "metric"]),
    )
    sub = df.loc[
        df["check"].isin({c for c, _ in KEY_FIGURES}) & df["value"].notna(),
        ["node", "pool", "check", "metric", "value", "fail"],
    ]
    if sub.empty:
        return pd.DataFrame(columns=["node", "pool", "figure", "value", "fail"])
    idx = pd.MultiIndex.from_frame(sub[["check", "metric"]])
    sub = sub.assign(figure=keys.reindex(idx).to_numpy()).dropna(subset=["figure"])
    return sub[["node", "pool", "figure", "value", "fail"]].reset_index(drop=True)


def fleet_view(df: pd.DataFrame, fraction: float = OUTLIER_FRACTION) -> pd.DataFrame:
    """Each key figure against its pool's median; ``outlier`` below (1-fraction) x median."""
    fig = figure_values(df)
    if fig.empty:
        return pd.DataFrame(
            columns=["node", "pool", "figure", "value", "pool_median", "ratio", "outlier"]
        )
    median = fig.groupby(["pool", "figure"])["value"].transform("median")
    out = fig.drop(columns="fail").assign(pool_median=median)
    out["ratio"] = (out["value"] / out["pool_median"].replace(0, np.nan)).round(4)
    out["outlier"] = out["ratio"] < (1 - fraction)
    return out.sort_values(["outlier", "ratio"], ascending=[False, True]).reset_index(drop=True)


def point_link(link: Path, target: str) -> None:
    """Point the symlink ``link`` at ``target`` in one step: a temporary link renamed over it.

    A reader never finds ``link`` missing or half-made, and writers at the same moment (other
    processes, or threads of one process) never share the temporary name.
    """
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.symlink_to(target)
    os.replace(tmp, link)
