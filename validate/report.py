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

The run's store (its directory, rows, frames, ``latest``) is :mod:`validate.results`; this
module renders it. :func:`finish_run` and :func:`write_report` build every file in a temporary
directory (the reserved ``.partial`` one) and rename it into place; ``latest`` is switched
(atomically) only to a complete run. A run stopped by SIGINT/SIGTERM is still placed, marked
"interrupted" (its rows carry ``run.interrupted``), and ``latest`` stays where it was.
"""

from __future__ import annotations

import dataclasses
import html
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from validate.actions import action_for
from validate.model import (
    CODE_INTERRUPTED,
    EXIT_MEANING,
    CheckResult,
    ExitCode,
    Status,
    exit_code_for,
)
from validate.results import (
    LATEST,
    OUTLIER_FRACTION,
    ROWS_FILE,
    STATUS_ORDER,
    PendingRun,
    ReportExtras,
    fleet_view,
    node_summary,
    point_link,
    results_table,
    to_frame,
)
from validate.runinfo import RunInfo, write_run_info

_PROM_STATUS = {"pass": 0, "warn": 1, "fail": 2, "error": 3, "skip": -1}


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` produced."""

    run_dir: Path
    nodes: pd.DataFrame
    fleet: pd.DataFrame
    exit_code: ExitCode
    interrupted: bool = False


INTERRUPTED_NOTE = (
    "**INTERRUPTED: this run was stopped (SIGINT/SIGTERM) before every check finished; rows "
    "with code run.interrupted were cut short or never started.**"
)


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
        + ", ".join(f"{s} {int(counts.get(s, 0))}" for s in reversed(STATUS_ORDER)),
        "",
    ]
    if run_info is not None:
        lines += _run_info_lines(run_info)
    lines += _attention_table(nodes)
    lines += _fault_code_table(df)
    lines += _outlier_table(fleet)
    return "\n".join(lines)


def _run_info_lines(run_info: RunInfo) -> list[str]:
    """What the run was asked to do and the suite that did it."""
    commit = (run_info.git_commit or "not a git checkout") + (
        " (with local changes)" if run_info.git_dirty else ""
    )
    return [
        f"Inventory {run_info.inventory}, limit {run_info.limit or 'none'}, "
        f"{len(run_info.checks)} checks, profiles "
        + (", ".join(sorted({p.name for p in run_info.profiles})) or "none")
        + f". Started {run_info.started}, finished {run_info.finished or 'not recorded'}. "
        f"gpuready {run_info.suite_version}, commit {commit}.",
        "",
    ]


def _attention_table(nodes: pd.DataFrame) -> list[str]:
    """The nodes that failed, errored or warned (the first 200)."""
    bad = nodes[nodes["status"].astype(str).isin(["fail", "error", "warn"])]
    if bad.empty:
        return []
    lines = [
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
    return [*lines, ""]


def _fault_code_table(df: pd.DataFrame) -> list[str]:
    """Each fault code with its rows and the catalogued action (the 50 most frequent)."""
    codes = (
        df.loc[df["status"].isin(["fail", "error", "warn"])]
        .groupby(["code", "status"], observed=True)
        .size()
        .sort_values(ascending=False)
    )
    if codes.empty:
        return []
    lines = [
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
    return [*lines, ""]


def _outlier_table(fleet: pd.DataFrame) -> list[str]:
    """Nodes whose figure is below the outlier fraction of their pool's median (first 100)."""
    out = fleet[fleet["outlier"]] if not fleet.empty else fleet
    if out.empty:
        return []
    return [
        f"## Outliers (below {1 - OUTLIER_FRACTION:.0%} of pool median)",
        "",
        "| node | pool | figure | value | pool median | ratio |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.node} | {r.pool} | {r.figure} | {r.value:g} | {r.pool_median:g} | "
            f"{r.ratio:.2f} |"
            for r in out.head(100).itertuples(index=False)
        ),
        "",
    ]


def finish_run(
    pending: PendingRun,
    rows: Sequence[CheckResult],
    *,
    environment: str | None = None,
    interrupted: bool = False,
    run_info: RunInfo | None = None,
    extras: ReportExtras | None = None,
) -> Report:
    """Render the report from ``rows`` in ``pending``'s reserved directory and place it."""
    pending.close()
    return write_report(
        rows, pending.out_root, pending.run_id, environment=environment,
        build_dir=pending.partial_dir, interrupted=interrupted, run_info=run_info,
        extras=extras,
    )


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
    # The page draws its plots with matplotlib: loaded when a report is rendered, not by every
    # command that imports this module (`validate gate --help` stays light).
    from validate.report_page import html_page  # noqa: PLC0415

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
