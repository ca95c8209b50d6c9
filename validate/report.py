"""The per-run report, built with pandas from the long results table.

``reports/<run-id>/`` holds:

- ``results.parquet`` / ``results.csv``: the long rows (model.COLUMNS), one per check metric.
- ``nodes.csv``: one row per node: ``node, pool, profile, status, failed_checks, error_checks,
  warn_checks, rows`` plus one column per key figure (``nccl_busbw_gbps``, ``fio_seq_read_mibps``,
  ``fio_seq_write_mibps``, ``fio_randread_4k_iops``, ``checkpoint_write_gbps``, ...).
- ``fleet.csv``: per node and key figure: ``node, pool, figure, value, pool_median, ratio,
  outlier`` where ``outlier`` flags a node below ``(1 - OUTLIER_FRACTION)`` x its pool's median,
  even when it passed its fixed threshold.
- ``summary.md`` and ``index.html`` (the page: :mod:`validate.report_page`), ``junit.xml`` (a
  testsuite per node, a testcase per check), ``metrics.prom`` (Prometheus textfile), ``run.json``
  (the run's metadata, :mod:`validate.runinfo`, when the caller gives it), and
  ``<out>/latest`` -> the newest complete run.

Everything is vectorised: 10,000 nodes x 40 checks render in seconds.

Placement (nothing a reader sees is ever half written):

- :func:`start_run` is called before the first connection: it checks ``--out`` (created if
  missing, must be a writable directory), validates or makes the run id, and reserves it by
  creating ``<out>/<run-id>.partial/`` (a run directory is never reused: a second run with the
  same id fails, an automatic id is drawn again).
- :meth:`PendingRun.append` writes each node's rows to ``<run-id>.partial/rows.jsonl`` as the
  node finishes (flushed and fsynced): a killed validator leaves every finished node's rows,
  and ``python -m validate report <out>/<run-id>.partial`` renders them.
- :func:`write_report` builds every file in a temporary directory and renames it into place;
  ``latest`` is switched (atomically) only to a complete run. A run stopped by SIGINT/SIGTERM
  is still placed, marked "interrupted" (its rows carry ``run.interrupted``), and ``latest``
  stays where it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
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
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from validate.actions import action_for
from validate.model import (
    CODE_INTERRUPTED,
    COLUMNS,
    EXIT_MEANING,
    SEVERITY,
    CheckResult,
    ExitCode,
    Status,
    exit_code_for,
)
from validate.report_page import html_page
from validate.runinfo import RunInfo, write_run_info

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
_STATUS_ORDER = [s.value for s in sorted(SEVERITY, key=SEVERITY.__getitem__)]
_STATUS_DTYPE = pd.CategoricalDtype(_STATUS_ORDER, ordered=True)
_PROM_STATUS = {"pass": 0, "warn": 1, "fail": 2, "error": 3, "skip": -1}


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


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` produced."""

    run_dir: Path
    nodes: pd.DataFrame
    fleet: pd.DataFrame
    exit_code: ExitCode
    interrupted: bool = False


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
INTERRUPTED_NOTE = (
    "**INTERRUPTED: this run was stopped (SIGINT/SIGTERM) before every check finished; rows "
    "with code run.interrupted were cut short or never started.**"
)


class RunDirError(Exception):
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

    def finish(
        self,
        rows: Sequence[CheckResult],
        *,
        environment: str | None = None,
        interrupted: bool = False,
        run_info: RunInfo | None = None,
        extras: ReportExtras | None = None,
    ) -> Report:
        """Render the report from ``rows`` in the reserved directory and place it."""
        self.close()
        return write_report(
            rows, self.out_root, self.run_id, environment=environment,
            build_dir=self.partial_dir, interrupted=interrupted, run_info=run_info,
            extras=extras,
        )


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
    bad = ~statuses.astype(str).isin(_STATUS_ORDER) | statuses.isna()
    if bad.any():
        at = int(bad.to_numpy().nonzero()[0][0])
        row = df.iloc[at]
        where = f"line {first_line + at}" if first_line else f"row {at + 1}"
        raise ResultsError(
            f"{source}: {where} (node {row['node']!s}, check {row['check']!s}): status "
            f"{row['status']!r} is not a status (one of {', '.join(_STATUS_ORDER)})"
            + (f"; {int(bad.sum()) - 1} more rows like it" if bad.sum() > 1 else ""))
    return df


def load_results(run_dir: Path) -> pd.DataFrame:
    """Read back ``results.parquet`` (or ``results.csv``, or the ``rows.jsonl`` a killed run
    left in its ``.partial`` directory) of a run directory. ResultsError names a missing
    column or a bad status and the file."""
    parquet = run_dir / "results.parquet"
    if parquet.exists():
        return _typed(_checked(pd.read_parquet(parquet), parquet, 0))
    jsonl = run_dir / ROWS_FILE
    if jsonl.exists() and not (run_dir / "results.csv").exists():
        records = []
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line being written when the validator was killed
        return _typed(_checked(pd.DataFrame.from_records(records, columns=list(COLUMNS)),
                               jsonl, 0))
    csv = run_dir / "results.csv"
    return _typed(_checked(
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


def _escaped(s: pd.Series, escape: Callable[[str], str]) -> list[str]:
    """``escape`` applied once per distinct value (node, check and code columns repeat)."""
    codes, uniques = pd.factorize(s.astype(str), use_na_sentinel=False)
    table = [escape(str(u)) for u in uniques]
    return [table[c] for c in codes.tolist()]


def _xml(text: str) -> str:
    return html.escape(text, quote=True)


def junit_xml(df: pd.DataFrame) -> str:
    """JUnit XML: a testsuite per node, a testcase per row (``check[metric]``)."""
    # One pass over plain lists (rows sorted by node): string building in pandas' Arrow
    # columns costs more than this loop at 400k rows.
    d = df.sort_values("node", kind="stable")
    nodes = d["node"].astype(str).tolist()
    node_x = _escaped(d["node"], _xml)
    name_x = _escaped(d["check"] + np.where(d["metric"] != "", "[" + d["metric"] + "]", ""), _xml)
    msg_x = _escaped(d["code"] + ": " + d["detail"], _xml)
    statuses = d["status"].astype(str).tolist()
    times = d["duration_s"].fillna(0).round(3).tolist()
    tag = {"fail": "failure", "error": "error", "skip": "skipped"}
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    start = 0
    total = len(nodes)
    while start < total:
        end = start
        while end < total and nodes[end] == nodes[start]:
            end += 1
        group = statuses[start:end]
        out.append(
            f'  <testsuite name="{node_x[start]}" tests="{end - start}" '
            f'failures="{group.count("fail")}" errors="{group.count("error")}" '
            f'skipped="{group.count("skip")}">'
        )
        for k in range(start, end):
            t = tag.get(statuses[k])
            inner = f'<{t} message="{msg_x[k]}"/>' if t else ""
            out.append(
                f'    <testcase classname="{node_x[k]}" name="{name_x[k]}" '
                f'time="{times[k]}">{inner}</testcase>'
            )
        out.append("  </testsuite>")
        start = end
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(df: pd.DataFrame, nodes: pd.DataFrame, run_id: str) -> str:
    """Prometheus textfile: per-row status and value, per-node status, run info."""
    labels = [
        f'node="{n}",pool="{p}",check="{c}",metric="{m}"'
        for n, p, c, m in zip(
            _escaped(df["node"], _label),
            _escaped(df["pool"], _label),
            _escaped(df["check"], _label),
            _escaped(df["metric"], _label),
            strict=True,
        )
    ]
    status_num = [_PROM_STATUS[s] for s in df["status"].astype(str).tolist()]
    units = _escaped(df["unit"], _label)
    values = df["value"].tolist()
    has_value = df["value"].notna().tolist()
    out = [
        "# HELP gpuready_check_status Check row status: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
        "# TYPE gpuready_check_status gauge",
    ]
    out += [
        f"gpuready_check_status{{{lab}}} {st}" for lab, st in zip(labels, status_num, strict=True)
    ]
    out += [
        "# HELP gpuready_check_value Measured value of a check row (unit in the unit label).",
        "# TYPE gpuready_check_value gauge",
    ]
    out += [
        f'gpuready_check_value{{{lab},unit="{u}"}} {v!r}'
        for lab, u, v, ok in zip(labels, units, values, has_value, strict=True)
        if ok
    ]
    out += [
        "# HELP gpuready_node_status Worst status of the node's rows (same scale).",
        "# TYPE gpuready_node_status gauge",
    ]
    out += [
        f'gpuready_node_status{{node="{n}",pool="{p}"}} {_PROM_STATUS[s]}'
        for n, p, s in zip(
            _escaped(nodes["node"], _label),
            _escaped(nodes["pool"], _label),
            nodes["status"].astype(str).tolist(),
            strict=True,
        )
    ]
    out += [
        "# HELP gpuready_run_info The run these metrics come from.",
        "# TYPE gpuready_run_info gauge",
        f'gpuready_run_info{{run_id="{_label(run_id)}"}} 1',
    ]
    return "\n".join(out) + "\n"


def summary_markdown(
    df: pd.DataFrame,
    nodes: pd.DataFrame,
    fleet: pd.DataFrame,
    run_id: str,
    code: ExitCode,
    environment: str | None = None,
    *,
    run_info: RunInfo | None = None,
) -> str:
    """The human summary (Markdown). ``environment`` is the inventory's own label for where
    the nodes are (``gpuready_environment``: "staging", or the lab's "SIMULATED" notice);
    ``run_info`` adds what the run was asked to do and the suite that did it."""
    counts = nodes["status"].astype(str).value_counts()
    lines = [
        f"# gpuready validation run {run_id}",
        "",
        *([f"**Environment: {environment}**", ""] if environment else []),
        f"Exit code: {int(code)} ({code.name}: {EXIT_MEANING[code]}). Nodes: {len(nodes)}; "
        + ", ".join(f"{s} {int(counts.get(s, 0))}" for s in reversed(_STATUS_ORDER)),
        "",
    ]
    if run_info is not None:
        commit = (run_info.git_commit or "not a git checkout") + (
            " (with local changes)" if run_info.git_dirty else ""
        )
        lines += [
            f"Inventory {run_info.inventory}, limit {run_info.limit or 'none'}, "
            f"{len(run_info.checks)} checks, profiles "
            + (", ".join(sorted({p.name for p in run_info.profiles})) or "none")
            + f". Started {run_info.started}, finished {run_info.finished or 'not recorded'}. "
            f"gpuready {run_info.suite_version}, commit {commit}.",
            "",
        ]
    bad = nodes[nodes["status"].astype(str).isin(["fail", "error", "warn"])]
    if not bad.empty:
        lines += [
            "## Nodes needing attention",
            "",
            "| node | pool | status | failed | errors | warnings |",
            "|---|---|---|---|---|---|",
        ]
        for r in bad.head(200).itertuples(index=False):
            lines.append(
                f"| {r.node} | {r.pool} | {r.status} | {r.failed_checks} | "
                f"{r.error_checks} | {r.warn_checks} |"
            )
        if len(bad) > 200:
            lines.append(f"| ... {len(bad) - 200} more | | | | | |")
        lines.append("")
    codes = (
        df.loc[df["status"].isin(["fail", "error", "warn"])]
        .groupby(["code", "status"], observed=True)
        .size()
        .sort_values(ascending=False)
    )
    if not codes.empty:
        lines += [
            "## Fault codes",
            "",
            "| code | status | rows | what to do (source) |",
            "|---|---|---|---|",
        ]
        for (c, s), n in codes.head(50).items():
            action = action_for(str(c))
            todo = (
                f"{action.action} ({action.source.title})"
                if action
                else "no catalogued action: read the detail"
            )
            lines.append(f"| {c} | {s} | {int(n)} | {todo.replace('|', '/')} |")
        lines.append("")
    out = fleet[fleet["outlier"]] if not fleet.empty else fleet
    if not out.empty:
        lines += [
            f"## Outliers (below {1 - OUTLIER_FRACTION:.0%} of pool median)",
            "",
            "| node | pool | figure | value | pool median | ratio |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.node} | {r.pool} | {r.figure} | {r.value:g} | {r.pool_median:g} | "
            f"{r.ratio:.2f} |"
            for r in out.head(100).itertuples(index=False)
        ]
        lines.append("")
    return "\n".join(lines)


def write_report(
    results: Sequence[CheckResult] | pd.DataFrame,
    out_root: Path,
    run_id: str,
    *,
    run_dir: Path | None = None,
    update_latest: bool = True,
    environment: str | None = None,
    run_info: RunInfo | None = None,
    build_dir: Path | None = None,
    interrupted: bool = False,
    extras: ReportExtras | None = None,
) -> Report:
    """Write every report file for a run into ``out_root/run_id`` (or ``run_dir``).

    ``run_info`` (the run's metadata) is written as run.json with the exit code and heads the
    human pages; its environment label is used when ``environment`` is not given. ``extras``:
    sections other modules add (the capacity and cost view, the fabric pair table).

    Files are built in ``build_dir`` (default: a fresh hidden directory beside the target) and
    then placed: a new run directory by one rename, an existing one (``report`` rendering a run
    again) file by file with ``os.replace``. ``latest`` moves only to a complete run; a run
    with ``run.interrupted`` rows (or ``interrupted=True``) is marked so in its summary."""
    extras = extras or ReportExtras()
    df = results if isinstance(results, pd.DataFrame) else to_frame(results)
    final = run_dir or out_root / run_id
    interrupted = interrupted or bool((df["code"] == CODE_INTERRUPTED).any())
    target = build_dir or final.parent / f".{final.name}.build-{secrets.token_hex(4)}"
    target.mkdir(parents=True, exist_ok=True)
    # An interrupted run exits 130 whatever its rows say, and its run.json, summary and
    # Report say the same code.
    code = ExitCode.INTERRUPTED if interrupted else exit_code_for(
        [Status(s) for s in df["status"].astype(str).unique()],
        list(df["code"].unique()),
    )
    env = environment if environment is not None or run_info is None else run_info.environment
    info = dataclasses.replace(run_info, exit_code=int(code)) if run_info else None
    nodes = node_summary(df)
    fleet = fleet_view(df)
    table = results_table(df)
    pq.write_table(table, target / "results.parquet")
    pa_csv.write_csv(table, target / "results.csv")
    nodes.to_csv(target / "nodes.csv", index=False)
    fleet.to_csv(target / "fleet.csv", index=False)
    md = summary_markdown(df, nodes, fleet, run_id, code, env, run_info=info)
    if interrupted:
        title, _, rest = md.partition("\n")
        md = f"{title}\n\n{INTERRUPTED_NOTE}\n{rest}"
    if extras.markdown:
        md = md.rstrip("\n") + "\n\n" + extras.markdown
    (target / "summary.md").write_text(md)
    page = html_page(df, nodes, fleet, run_id, code, environment=env, info=info,
                     outlier_fraction=OUTLIER_FRACTION, interrupted=interrupted,
                     extra_html=extras.html)
    (target / "index.html").write_text(page)
    if info is not None:
        write_run_info(target, info)
    (target / "junit.xml").write_text(junit_xml(df))
    (target / "metrics.prom").write_text(prometheus(df, nodes, run_id) + extras.metrics)
    if extras.write_files is not None:
        extras.write_files(target)
    _place(target, final)
    if update_latest and not interrupted and final.parent == out_root:
        point_link(out_root / LATEST, final.name)
    return Report(final, nodes, fleet, code, interrupted)


def point_link(link: Path, target: str) -> None:
    """Point the symlink ``link`` at ``target`` in one step: a temporary link renamed over it.

    A reader never finds ``link`` missing or half-made, and writers at the same moment (other
    processes, or threads of one process) never share the temporary name.
    """
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _place(built: Path, final: Path) -> None:
    """Move the files built in ``built`` to ``final`` without a reader ever seeing half."""
    if built == final:
        return
    # The durable per-node rows are in results.* now.
    (built / ROWS_FILE).unlink(missing_ok=True)
    if not final.exists():
        built.rename(final)
        return
    for item in built.iterdir():
        os.replace(item, final / item.name)
    built.rmdir()
