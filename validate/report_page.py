"""The run's human page, ``index.html``: one self-contained file, no network needed.

Sections: the run header (environment label, run id, exit code and its meaning, nodes and rows
per status, what was run against what: inventory, limit, checks, profiles with their
thresholds, suite version and commit, start and end), the fault codes with their operator
actions, the plots (PNG, inline), a node table that sorts by any column and filters by pool,
status, check, fault code and name, and a per-node view with every check row (value, unit,
warn/fail thresholds, status, code, detail) and the action for each of the node's fault codes.

The header, fault codes and plots are plain HTML. The table and the node view are drawn by
the inline script from the rows embedded as JSON (columnar, strings and row shapes stored once),
100 nodes a page, so a 10,000-node run stays quick to open. A Content-Security-Policy forbids
every fetch: the page cannot reach the network even by mistake. Links: ``#node=<name>`` opens a
node; ``#status=fail&pool=...&check=...&code=...&q=...`` filters the table.

Output is deterministic: the same results and run.json render the same bytes.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from validate.actions import action_for
from validate.model import EXIT_MEANING, SEVERITY, ExitCode
from validate.runinfo import RunInfo

ASSETS = Path(__file__).resolve().parent / "report_assets"
PAGE_SIZE = 100
# Key figures (results.KEY_FIGURES' column names) as the table heads them, with their units.
FIGURE_LABELS: dict[str, str] = {
    "nccl_busbw_gbps": "NCCL busbw (GB/s)",
    "fio_seq_read_mibps": "fio seq read (MiB/s)",
    "fio_seq_write_mibps": "fio seq write (MiB/s)",
    "fio_randread_4k_iops": "fio 4k rand read (IOPS)",
    "checkpoint_write_gbps": "ckpt write (GB/s)",
    "checkpoint_read_gbps": "ckpt read (GB/s)",
}
# Severity order (index = severity): what the status column's numbers mean in the JSON.
STATUSES = [s.value for s in sorted(SEVERITY, key=SEVERITY.__getitem__)]
_COLOURS = {"skip": "#bbbbbb", "pass": "#2ca02c", "warn": "#ffbf00", "fail": "#d62728",
            "error": "#7f3fbf"}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(df: pd.DataFrame, nodes: pd.DataFrame, fleet: pd.DataFrame,
          outlier_fraction: float) -> dict[str, tuple[str, str]]:
    """Inline PNGs: name -> (caption, base64). ``busbw`` (per node against its fail
    threshold), ``figures`` (key figures as a ratio of their pool's median) and ``grid``
    (node x check status)."""
    out: dict[str, tuple[str, str]] = {}
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
        ax.step(x, bus["fail"].to_numpy(), where="mid", color="red", linewidth=1,
                label="fail threshold")
        ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
        ax.set_xlabel("node (grouped by pool)")
        ax.set_title("NCCL all-reduce bus bandwidth per node", fontsize=9)
        if len(bus) <= 40:
            ax.set_xticks(x, bus["node"], rotation=90, fontsize=7)
        ax.legend(fontsize=7, title="pool", title_fontsize=7)
        out["busbw"] = ("NCCL all-reduce bus bandwidth per node (GB/s), by pool, against the "
                        "fail threshold", _png(fig))
    ratios = fleet.dropna(subset=["ratio"]) if not fleet.empty else fleet
    if not ratios.empty:
        names = sorted(ratios["figure"].unique())
        fig = Figure(figsize=(10, 4))
        ax = fig.subplots()
        groups = [ratios.loc[ratios["figure"] == f, "ratio"].to_numpy() for f in names]
        ax.boxplot(groups, showfliers=False)
        ax.set_xticks(np.arange(1, len(names) + 1),
                      [FIGURE_LABELS.get(f, f) for f in names], fontsize=7)
        low = ratios[ratios["outlier"]]
        if not low.empty:
            pos = {f: i + 1 for i, f in enumerate(names)}
            ax.scatter(low["figure"].map(pos), low["ratio"], color="red", s=14, zorder=3,
                       label="outlier node")
        ax.axhline(1 - outlier_fraction, color="red", linestyle="--", linewidth=1,
                   label=f"outlier line ({1 - outlier_fraction:.0%} of pool median)")
        ax.set_ylabel("value / pool median (ratio)")
        ax.set_title("Key figures relative to the node's pool median (box: middle half of "
                     "nodes)", fontsize=9)
        ax.legend(fontsize=7)
        out["figures"] = ("Key figures as a ratio of each node's pool median (1.0 = median); "
                          "red points are outliers", _png(fig))
    sev = df.assign(_sev=df["status"].cat.codes).pivot_table(
        index="node", columns="check", values="_sev", aggfunc="max", observed=True
    )
    sev = sev.reindex(nodes["node"])
    fig = Figure(figsize=(10, min(12.0, 1.5 + 0.25 * len(sev))))
    ax = fig.subplots()
    ax.imshow(sev.to_numpy(dtype=float), aspect="auto",
              cmap=ListedColormap([_COLOURS[s] for s in STATUSES]),
              vmin=-0.5, vmax=len(STATUSES) - 0.5, interpolation="nearest")
    ax.set_xticks(np.arange(len(sev.columns)), sev.columns, rotation=60, ha="right", fontsize=7)
    if len(sev) <= 60:
        ax.set_yticks(np.arange(len(sev)), sev.index, fontsize=7)
    else:
        ax.set_yticks([])
    ax.set_ylabel(f"node ({len(sev)}, worst first)")
    ax.set_title("Worst status per node and check (white: check not run)", fontsize=9)
    ax.legend(handles=[Patch(color=_COLOURS[s], label=s) for s in reversed(STATUSES)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="status",
              title_fontsize=7)
    out["grid"] = ("Worst status per node (rows, worst first) and check (columns)", _png(fig))
    return out


def _factorized(values: pd.Series) -> tuple[list[int], list[str]]:
    codes, uniques = pd.factorize(values.astype(str), use_na_sentinel=False)
    return codes.tolist(), [str(u) for u in uniques]


def _floats(values: pd.Series) -> list[float | None]:
    """Floats for JSON, NaN as null."""
    arr = values.astype("float64").to_numpy()
    out: list[float | None] = pd.Series(arr, dtype=object).where(~np.isnan(arr), None).tolist()
    return out


def page_data(df: pd.DataFrame, nodes: pd.DataFrame) -> dict[str, Any]:
    """The JSON the page's script draws from: rows columnar, sorted by node, each string and
    row shape (check, metric, unit, warn, fail) stored once."""
    d = df.sort_values("node", kind="stable").reset_index(drop=True)
    shape_cols = ["check", "metric", "unit", "warn", "fail"]
    shape_id = d.groupby(shape_cols, sort=False, dropna=False, observed=True).ngroup()
    shapes = d.assign(_shape=shape_id).drop_duplicates("_shape").sort_values("_shape")
    check_idx, checks = _factorized(shapes["check"])
    code_idx, codes = _factorized(d["code"])
    detail_idx, details = _factorized(d["detail"])
    names = sorted(nodes["node"].astype(str))
    per_node = nodes.set_index("node").reindex(names)
    counts = d["node"].value_counts().reindex(names).fillna(0).astype(int).to_numpy()
    start = np.concatenate([[0], np.cumsum(counts)]).tolist()
    pool_idx, pools = _factorized(per_node["pool"])
    profile_idx, profiles = _factorized(per_node["profile"])
    sev = {s: i for i, s in enumerate(STATUSES)}
    figures = [f for f in FIGURE_LABELS if f in per_node and per_node[f].notna().any()]
    return {
        "statuses": STATUSES,
        "checks": checks,
        "codes": codes,
        "details": details,
        "pools": pools,
        "profiles": profiles,
        "figures": [[f, FIGURE_LABELS[f]] for f in figures],
        "shapes": {
            "check": check_idx,
            "metric": shapes["metric"].astype(str).tolist(),
            "unit": shapes["unit"].astype(str).tolist(),
            "warn": _floats(shapes["warn"]),
            "fail": _floats(shapes["fail"]),
        },
        "nodes": {
            "name": names,
            "pool": pool_idx,
            "profile": profile_idx,
            "status": [sev[s] for s in per_node["status"].astype(str)],
            "failed": per_node["failed_checks"].astype(str).tolist(),
            "errors": per_node["error_checks"].astype(str).tolist(),
            "warnings": per_node["warn_checks"].astype(str).tolist(),
            "start": start,
            "fig": [_floats(per_node[f]) for f in figures],
        },
        "rows": {
            "shape": shape_id.tolist(),
            "value": _floats(d["value"]),
            "status": "".join(str(sev[s]) for s in d["status"].astype(str)),
            "code": code_idx,
            "detail": detail_idx,
        },
        "actions": {
            c: {"meaning": a.meaning, "action": a.action, "source": a.source.title,
                "url": a.source.url}
            for c in codes
            if c != "ok" and (a := action_for(c)) is not None
        },
    }


def _badge(status: str, text: str | None = None) -> str:
    return f'<span class="badge s-{_e(status)}">{_e(text if text is not None else status)}</span>'


def _header(run_id: str, code: ExitCode, environment: str | None, nodes: pd.DataFrame,
            df: pd.DataFrame, info: RunInfo | None, interrupted: bool = False) -> str:
    node_counts = nodes["status"].astype(str).value_counts()
    row_counts = df["status"].astype(str).value_counts()
    env = (f'<p class="env" id="environment">Environment: {_e(environment)}</p>' if environment
           else '<p class="env unlabelled" id="environment">Environment: not labelled (set '
                "<code>gpuready_environment</code> in the inventory)</p>")
    per_status = " ".join(
        f'<a href="#status={s}">{_badge(s, f"{s} {int(node_counts.get(s, 0))}")}</a>'
        for s in reversed(STATUSES)
    )
    rows = ", ".join(f"{s} {int(row_counts.get(s, 0))}" for s in reversed(STATUSES))
    parts = [
        f"<h1>gpuready validation run <span id=\"run-id\">{_e(run_id)}</span></h1>",
        env,
        *(['<p class="env" id="interrupted">INTERRUPTED: this run was stopped (SIGINT/SIGTERM) '
           "before every check finished; rows with code run.interrupted were cut short or never "
           "started.</p>"] if interrupted else []),
        f'<p id="exit">Exit code <strong>{int(code)}</strong> ({_e(code.name)}): '
        f"{_e(EXIT_MEANING[code])}.</p>",
        f'<p id="counts">Nodes: {len(nodes)} &nbsp; {per_status}</p>',
        f"<p>Check rows: {len(df)} ({_e(rows)})</p>",
    ]
    if info is None:
        parts.append('<p class="note">No run.json: the run\'s inventory, checks and profiles '
                     "are not known to this page.</p>")
        return "\n".join(parts)
    commit = info.git_commit or "not a git checkout"
    if info.git_dirty:
        commit += " (with local changes)"
    meta = [
        ("Inventory", info.inventory),
        ("Limit", info.limit or "none (every GPU node)"),
        ("Checks", f"{len(info.checks)}: {' '.join(info.checks)}"
         + (f" (asked: {info.checks_requested})" if info.checks_requested else "")),
        ("Started / finished", f"{info.started} / {info.finished or 'not recorded'}"),
        ("Suite", f"gpuready {info.suite_version}, commit {commit}"),
    ]
    parts.append('<table class="meta" id="run-info">' + "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in meta) + "</table>")
    for p in info.profiles:
        summary = (f"Profile {p.name}: {len(p.nodes)} node(s) in {', '.join(p.pools)}"
                   + (" + inventory gpu_thresholds" if p.overrides else "")
                   + (f" (not loaded: {p.error})" if p.error else ""))
        body = {"source": p.source, "overrides": p.overrides, "hardware": p.hardware,
                "storage": p.storage, "thresholds": p.thresholds}
        parts.append(f'<details class="profile"><summary>{_e(summary)}</summary><pre>'
                     f"{_e(json.dumps(body, indent=2, default=str))}</pre></details>")
    return "\n".join(parts)


def _fault_codes(df: pd.DataFrame) -> str:
    bad = df.loc[df["status"].astype(str).isin(["warn", "fail", "error"]), ["node", "code",
                                                                           "status"]]
    if bad.empty:
        return '<p id="no-faults">No fault codes: every check passed or was skipped.</p>'
    sev = {s: i for i, s in enumerate(STATUSES)}
    g = bad.assign(_sev=bad["status"].astype(str).map(sev)).groupby("code", observed=True).agg(
        worst=("_sev", "max"), nodes=("node", "nunique"), rows=("node", "size"))
    g = g.reset_index().sort_values(["worst", "nodes", "code"], ascending=[False, False, True])
    out = ['<table id="fault-codes"><thead><tr><th>code</th><th>worst</th><th>nodes</th>'
           "<th>rows</th><th>what it means</th><th>what to do</th><th>source</th></tr>"
           "</thead><tbody>"]
    for r in g.itertuples(index=False):
        a = action_for(str(r.code))
        if a is None:
            meaning, action, source = "", "No catalogued action: read the rows' detail.", ""
        else:
            meaning, action = a.meaning, a.action
            source = (f'<a href="{_e(a.source.url)}" rel="noreferrer">{_e(a.source.title)}</a>'
                      if a.source.url else _e(a.source.title))
        out.append(
            f'<tr><td><a href="#code={_e(r.code)}">{_e(r.code)}</a></td>'
            f"<td>{_badge(STATUSES[int(r.worst)])}</td><td>{int(r.nodes)}</td>"
            f"<td>{int(r.rows)}</td><td>{_e(meaning)}</td><td>{_e(action)}</td>"
            f"<td>{source}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _outliers(fleet: pd.DataFrame, fraction: float) -> str:
    low = fleet[fleet["outlier"]] if not fleet.empty else fleet
    if low.empty:
        return f"<p>No node is below {1 - fraction:.0%} of its pool's median.</p>"
    rows = "".join(
        f'<tr><td><a href="#node={_e(r.node)}">{_e(r.node)}</a></td><td>{_e(r.pool)}</td>'
        f"<td>{_e(FIGURE_LABELS.get(str(r.figure), r.figure))}</td><td>{r.value:g}</td>"
        f"<td>{r.pool_median:g}</td><td>{r.ratio:.2f}</td></tr>"
        for r in low.head(100).itertuples(index=False)
    )
    more = f"<p>... and {len(low) - 100} more in fleet.csv.</p>" if len(low) > 100 else ""
    return ('<table id="outliers"><thead><tr><th>node</th><th>pool</th><th>figure</th>'
            "<th>value</th><th>pool median</th><th>ratio</th></tr></thead><tbody>"
            f"{rows}</tbody></table>{more}")


def html_page(
    df: pd.DataFrame,
    nodes: pd.DataFrame,
    fleet: pd.DataFrame,
    run_id: str,
    code: ExitCode,
    *,
    environment: str | None,
    info: RunInfo | None,
    outlier_fraction: float,
    interrupted: bool = False,
    extra_html: str = "",
) -> str:
    """The whole ``index.html`` (see the module docstring). ``interrupted``: the run was
    stopped before every check finished, and the page says so at the top."""
    images = plots(df, nodes, fleet, outlier_fraction)
    figs = "".join(
        f'<figure id="plot-{_e(k)}"><img alt="{_e(caption)}" src="data:image/png;base64,{v}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
        for k, (caption, v) in images.items()
    )
    # "<" escaped so that no value can close the script element; JSON.parse reads \u003c back.
    data = json.dumps(page_data(df, nodes), separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).replace("<", "\\u003c")
    title = f"gpuready {run_id}" + (f" [{environment}]" if environment else "")
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           "script-src 'unsafe-inline'")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{(ASSETS / 'page.css').read_text()}</style>"
        "</head><body>\n<header>"
        f"{_header(run_id, code, environment, nodes, df, info, interrupted)}</header>\n"
        '<main><section id="table-view">'
        f"<h2>Fault codes</h2>{_fault_codes(df)}{extra_html}<h2>Nodes</h2>"
        "<noscript><p>The node table and node views need JavaScript; nodes.csv and "
        "results.csv in this directory hold the same rows.</p></noscript>"
        '<form id="filters" autocomplete="off">'
        '<label>Pool <select id="f-pool"></select></label>'
        '<label>Status <select id="f-status"></select></label>'
        '<label>Check <select id="f-check"></select></label>'
        '<label>Fault code <select id="f-code"></select></label>'
        '<label>Node <input id="f-q" type="search" placeholder="name contains"></label>'
        '<button type="button" id="f-clear">Clear filters</button></form>'
        '<p id="shown" aria-live="polite"></p>'
        '<table id="nodes"><thead></thead><tbody></tbody></table>'
        '<nav id="pager"><button type="button" id="prev">previous</button> '
        '<span id="page"></span> <button type="button" id="next">next</button></nav>'
        f"<h2>Outliers</h2>{_outliers(fleet, outlier_fraction)}"
        f"<h2>Plots</h2>{figs}</section>\n"
        '<section id="node-view" hidden></section></main>\n'
        f'<script type="application/json" id="gpuready-data">{data}</script>\n'
        f'<script data-page-size="{PAGE_SIZE}">{(ASSETS / "page.js").read_text()}</script>\n'
        "</body></html>\n"
    )

