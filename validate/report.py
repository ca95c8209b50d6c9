"""The per-run report, built with pandas from the long results table.

``reports/<run-id>/`` holds:

- ``results.parquet`` / ``results.csv``: the long rows (model.COLUMNS), one per check metric.
- ``nodes.csv``: one row per node: ``node, pool, profile, status, failed_checks, error_checks,
  warn_checks, rows`` plus one column per key figure (``nccl_busbw_gbps``, ``fio_seq_read_mibps``,
  ``fio_seq_write_mibps``, ``fio_randread_4k_iops``, ``checkpoint_write_gbps``, ...).
- ``fleet.csv``: per node and key figure: ``node, pool, figure, value, pool_median, ratio,
  outlier`` where ``outlier`` flags a node below ``(1 - OUTLIER_FRACTION)`` x its pool's median,
  even when it passed its fixed threshold.
- ``summary.md`` and ``index.html`` (plots: bus bandwidth per node against its threshold; a
  node x check status grid), ``junit.xml`` (a testsuite per node, a testcase per check),
  ``metrics.prom`` (Prometheus textfile), and ``<out>/latest`` -> the newest run.

Everything is vectorised: 10,000 nodes x 40 checks render in seconds.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from validate.model import COLUMNS, SEVERITY, CheckResult, ExitCode, Status, exit_code_for

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


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` produced."""

    run_dir: Path
    nodes: pd.DataFrame
    fleet: pd.DataFrame
    exit_code: ExitCode


def to_frame(rows: Sequence[CheckResult]) -> pd.DataFrame:
    """The long results as a DataFrame with ``status`` as an ordered categorical."""
    # attrgetter + zip transposes in C: a per-column getattr loop is 3x slower at 400k rows.
    columns = (
        list(zip(*map(attrgetter(*COLUMNS), rows), strict=True)) if rows else [() for _ in COLUMNS]
    )
    data = dict(zip(COLUMNS, columns, strict=True))
    data["status"] = tuple(s.value for s in data["status"])
    return _typed(pd.DataFrame(data, columns=list(COLUMNS)))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("value", "warn", "fail", "duration_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("node", "pool", "profile", "check", "metric", "unit", "code", "detail"):
        df[col] = df[col].fillna("").astype(str)
    df["status"] = df["status"].astype(str).astype(_STATUS_DTYPE)
    return df


def load_results(run_dir: Path) -> pd.DataFrame:
    """Read back ``results.parquet`` (or ``results.csv``) of a run directory."""
    parquet = run_dir / "results.parquet"
    if parquet.exists():
        return _typed(pd.read_parquet(parquet))
    return _typed(
        pd.read_csv(
            run_dir / "results.csv",
            keep_default_na=False,
            na_values={"value": [""], "warn": [""], "fail": [""]},
        )
    )


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


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(df: pd.DataFrame, nodes: pd.DataFrame) -> dict[str, str]:
    """Base64 PNGs: ``busbw`` (per node vs its fail threshold) and ``grid`` (node x check)."""
    out: dict[str, str] = {}
    bus = df.loc[
        (df["check"] == "nccl.allreduce") & (df["metric"] == "busbw_gbps") & df["value"].notna(),
        ["node", "pool", "value", "fail"],
    ].sort_values(["pool", "node"])
    if not bus.empty:
        # Figure without pyplot: no global backend state, safe outside the main thread.
        fig = Figure(figsize=(10, 4))
        ax = fig.subplots()
        x = np.arange(len(bus))
        for pool, grp in bus.groupby("pool", sort=False):
            pos = x[(bus["pool"] == pool).to_numpy()]
            ax.scatter(pos, grp["value"], s=8 if len(bus) > 200 else 24, label=str(pool))
        ax.step(
            x, bus["fail"].to_numpy(), where="mid", color="red", linewidth=1, label="fail threshold"
        )
        ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
        ax.set_xlabel("node")
        if len(bus) <= 40:
            ax.set_xticks(x, bus["node"], rotation=90, fontsize=7)
        ax.legend(fontsize=7)
        out["busbw"] = _png(fig)
    sev = df.assign(_sev=df["status"].cat.codes).pivot_table(
        index="node", columns="check", values="_sev", aggfunc="max", observed=True
    )
    sev = sev.reindex(nodes["node"])
    fig = Figure(figsize=(10, min(12.0, 1.5 + 0.25 * len(sev))))
    ax = fig.subplots()
    cmap = ListedColormap(["#bbbbbb", "#2ca02c", "#ffbf00", "#d62728", "#7f3fbf"])
    ax.imshow(
        sev.to_numpy(dtype=float),
        aspect="auto",
        cmap=cmap,
        vmin=-0.5,
        vmax=4.5,
        interpolation="nearest",
    )
    ax.set_xticks(np.arange(len(sev.columns)), sev.columns, rotation=60, ha="right", fontsize=7)
    if len(sev) <= 60:
        ax.set_yticks(np.arange(len(sev)), sev.index, fontsize=7)
    ax.set_title(
        "node x check (grey skip, green pass, amber warn, red fail, purple error)", fontsize=8
    )
    out["grid"] = _png(fig)
    return out


def summary_markdown(
    df: pd.DataFrame,
    nodes: pd.DataFrame,
    fleet: pd.DataFrame,
    run_id: str,
    code: ExitCode,
    environment: str | None = None,
) -> str:
    """The human summary (Markdown). ``environment`` is the inventory's own label for where
    the nodes are (``gpuready_environment``: "staging", or the lab's "SIMULATED" notice)."""
    counts = nodes["status"].astype(str).value_counts()
    lines = [
        f"# gpuready validation run {run_id}",
        "",
        *([f"**Environment: {environment}**", ""] if environment else []),
        f"Exit code: {int(code)} ({code.name}). Nodes: {len(nodes)}; "
        + ", ".join(f"{s} {int(counts.get(s, 0))}" for s in reversed(_STATUS_ORDER)),
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
        lines += ["## Fault codes", "", "| code | status | rows |", "|---|---|---|"]
        lines += [f"| {c} | {s} | {int(n)} |" for (c, s), n in codes.head(50).items()]
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


def html_page(markdown: str, images: dict[str, str], nodes: pd.DataFrame, run_id: str) -> str:
    """A self-contained HTML page: the summary text, the plots, the non-passing nodes."""
    bad = nodes[nodes["status"].astype(str) != "pass"].head(500)
    imgs = "".join(
        f'<h2>{html.escape(k)}</h2><img alt="{html.escape(k)}" src="data:image/png;base64,{v}">'
        for k, v in images.items()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gpuready {html.escape(run_id)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}</style></head><body>"
        f"<pre>{html.escape(markdown)}</pre>{imgs}<h2>Nodes not passing</h2>"
        f"{bad.to_html(index=False, na_rep='')}</body></html>\n"
    )


def write_report(
    results: Sequence[CheckResult] | pd.DataFrame,
    out_root: Path,
    run_id: str,
    *,
    run_dir: Path | None = None,
    update_latest: bool = True,
    environment: str | None = None,
    extra_markdown: str = "",
    extra_metrics: str = "",
) -> Report:
    """Write every report file for a run into ``out_root/run_id`` (or ``run_dir``).

    ``extra_markdown`` (a section such as validate.cost's) ends the human pages;
    ``extra_metrics`` (Prometheus lines) ends metrics.prom."""
    df = results if isinstance(results, pd.DataFrame) else to_frame(results)
    target = run_dir or out_root / run_id
    target.mkdir(parents=True, exist_ok=True)
    code = exit_code_for(
        [Status(s) for s in df["status"].astype(str).unique()],
        list(df["code"].unique()),
    )
    nodes = node_summary(df)
    fleet = fleet_view(df)
    table = pa.Table.from_pandas(df.assign(status=df["status"].astype(str)), preserve_index=False)
    pq.write_table(table, target / "results.parquet")
    pa_csv.write_csv(table, target / "results.csv")
    nodes.to_csv(target / "nodes.csv", index=False)
    fleet.to_csv(target / "fleet.csv", index=False)
    md = summary_markdown(df, nodes, fleet, run_id, code, environment)
    if extra_markdown:
        md = md.rstrip("\n") + "\n\n" + extra_markdown
    (target / "summary.md").write_text(md)
    (target / "index.html").write_text(html_page(md, plots(df, nodes), nodes, run_id))
    (target / "junit.xml").write_text(junit_xml(df))
    (target / "metrics.prom").write_text(prometheus(df, nodes, run_id) + extra_metrics)
    if update_latest and target.parent == out_root:
        tmp = out_root / f".latest.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target.name)
        os.replace(tmp, out_root / "latest")
    return Report(target, nodes, fleet, code)
