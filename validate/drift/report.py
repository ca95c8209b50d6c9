"""The drift run directory: drift table, summary, Prometheus textfile, and the run's rows.

``<out>/<run-id>/`` (run ids ``<UTC time>-drift-<4 hex>``, so overlapping runs never share a
directory) holds:

- ``drift.parquet`` / ``drift.csv``: one row per finding: ``node, pool, layer, item,
  declared, actual, since, status, detail, source`` (``since``: ISO time of the first drift
  run of the unbroken streak in which this node's item drifted; this run's time when new);
- ``results.parquet`` / ``results.csv``: the performance checks' rows (validate/model.py's
  columns): the history later runs judge against;
- ``summary.md`` and ``index.html``; ``metrics.prom``; ``drift.json`` (run metadata: nodes,
  layers, exit code, timings, settings, ``interrupted``);
- ``run.json`` (validate/runinfo.py) with ``run_kind: drift``, so readers of a reports root
  tell drift runs from validation runs;
- ``run.log``: warnings and paramiko's log, written there by the CLI (validate/cli.py) from the
  moment the directory is reserved.

Both tables are written with an explicit schema (text columns stay text in a run with no rows:
one inferred from nothing made later reads of the root fail).

The run id is checked as the validators check theirs (no path, no ``..``) and
``<out>/.<run-id>.partial/`` is reserved before any node is asked (:func:`reserve`);
everything is written there and renamed into place at the end, so a reader (history, a second
drift run) sees a run whole or not at all. ``<out>/latest-drift`` points at the newest complete
run (an interrupted one is written, marked, and not pointed at). The Prometheus file, when
asked for, is written beside its target and renamed over it (node_exporter's textfile
collector never reads half a file).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from validate.drift.model import COLUMNS, Finding, FindingStatus
from validate.model import CheckResult, ExitCode
from validate.results import point_link, results_table, start_run, to_frame
from validate.runinfo import RunInfo, write_run_info

TABLE = "drift.parquet"
META = "drift.json"
LATEST = "latest-drift"
TABLE_COLUMNS = ["node", "pool", "layer", "item", "declared", "actual", "since", "status",
                 "detail", "source"]
# Written explicitly, as the results' schema is (validate/report.py): a run with no findings
# still says its columns are text.
TABLE_SCHEMA = pa.schema([(c, pa.large_string()) for c in TABLE_COLUMNS])
# How far back `since` looks (drift runs, newest first).
SINCE_RUNS = 2000
PARTIAL = ".partial"
INTERRUPTED_NOTE = ("**INTERRUPTED (SIGINT/SIGTERM): this drift run was stopped before every "
                    "layer of every node was compared; rows with status error say what was "
                    "not.**")


@dataclass(frozen=True, slots=True)
class RunMeta:
    run_id: str
    started: str  # ISO 8601 UTC
    finished: str
    exit_code: ExitCode
    nodes: tuple[str, ...]
    layers: tuple[str, ...]
    environment: str | None
    settings: dict[str, Any]
    timings: dict[str, float]
    interrupted: bool = False
    interrupted_by: str | None = None


def reserve(out_root: Path, run_id: str | None, new_id: Callable[[], str]) -> Path:
    """Check the run id (``run_id``, else ``new_id()``) as the validators check theirs and
    reserve ``<out>/.<id>.partial`` (a dot-directory: history never reads a run being
    written); returns it. Raises RunDirError naming what is wrong."""
    return start_run(out_root, run_id, new_id, lambda rid: f".{rid}{PARTIAL}").partial_dir


def release(partial: Path) -> None:
    """Give a reserved run directory back (the run failed before writing anything)."""
    shutil.rmtree(partial, ignore_errors=True)


def drift_runs(root: Path, exclude: str = "") -> list[tuple[str, dict[str, Any], Path]]:
    """(run_id, meta, dir) of the finished drift runs under ``root``, newest first."""
    out: list[tuple[str, dict[str, Any], Path]] = []
    if not root.is_dir():
        return out
    for entry in os.scandir(root):
        if entry.is_symlink() or entry.name.startswith(".") or entry.name == exclude:
            continue
        meta_path = Path(entry.path) / META
        if not meta_path.is_file():
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue  # a damaged run is not history
        out.append((entry.name, meta, Path(entry.path)))
    return sorted(out, key=lambda r: r[0], reverse=True)


def since_times(root: Path, findings: Sequence[Finding], now: str, exclude: str = ""
                ) -> dict[tuple[str, str, str], str]:
    """For each drifted (node, layer, item): when its current streak began (module doc)."""
    wanted = {(f.node, f.layer.value, f.item) for f in findings
              if f.status is FindingStatus.DRIFT}
    since = dict.fromkeys(wanted, now)
    if not wanted:
        return since
    open_keys = set(wanted)
    for _run_id, meta, path in drift_runs(root, exclude)[:SINCE_RUNS]:
        if not open_keys:
            break
        if meta.get("interrupted"):
            continue  # it may have stopped before looking: it neither starts nor ends a streak
        checked = set(meta.get("nodes", []))
        try:
            prev = pq.read_table(path / TABLE, columns=["node", "layer", "item", "status"])
        except (OSError, pa.ArrowInvalid):
            continue
        df = prev.to_pandas()
        drifted = set(zip(df.loc[df["status"] == FindingStatus.DRIFT.value, "node"],
                          df.loc[df["status"] == FindingStatus.DRIFT.value, "layer"],
                          df.loc[df["status"] == FindingStatus.DRIFT.value, "item"], strict=True))
        for key in list(open_keys):
            if key[0] not in checked:
                continue  # that run did not look at this node: the streak goes on
            if key in drifted:
                since[key] = str(meta.get("started", since[key]))
            else:
                open_keys.discard(key)
    return since


def findings_frame(findings: Sequence[Finding], since: dict[tuple[str, str, str], str]
                   ) -> pd.DataFrame:
    rows = [f.as_dict() for f in findings]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["since"] = [since.get((f.node, f.layer.value, f.item), "") for f in findings]
    return df[TABLE_COLUMNS].astype(str)


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(table: pd.DataFrame, meta: RunMeta, pools: dict[str, str],
               duration_s: float) -> str:
    """``gpuready_drift_items{node,pool,layer}`` for every node and layer checked (zeros
    included, so an alert can tell "clean" from "not measured"), ``gpuready_drift_layer_
    checked`` (0 where a layer was unavailable, skipped entirely or failed), the run time,
    status and duration."""
    drift = table[table["status"] == FindingStatus.DRIFT.value]
    counts = drift.groupby(["node", "layer"]).size().to_dict()
    blocked = table[table["status"].isin(["unavailable", "error", "unreachable"])]
    not_checked = set(zip(blocked["node"], blocked["layer"], strict=True))
    unreachable = set(table.loc[table["status"] == FindingStatus.UNREACHABLE.value, "node"])
    out = [
        "# HELP gpuready_drift_items Items that drifted from the inventory, per node and layer "
        "(last drift run).",
        "# TYPE gpuready_drift_items gauge",
    ]
    checked_lines = [
        "# HELP gpuready_drift_layer_checked 1 when the layer was compared on the node, 0 "
        "when it was not available, failed or the node was unreachable.",
        "# TYPE gpuready_drift_layer_checked gauge",
    ]
    for node in meta.nodes:
        for layer in meta.layers:
            lab = f'node="{_label(node)}",pool="{_label(pools.get(node, ""))}",layer="{layer}"'
            out.append(f"gpuready_drift_items{{{lab}}} {int(counts.get((node, layer), 0))}")
            ok = node not in unreachable and (node, layer) not in not_checked
            checked_lines.append(f"gpuready_drift_layer_checked{{{lab}}} {int(ok)}")
    finished = datetime.fromisoformat(meta.finished).timestamp()
    out += checked_lines
    out += [
        "# HELP gpuready_drift_last_run_timestamp_seconds When the last drift run finished.",
        "# TYPE gpuready_drift_last_run_timestamp_seconds gauge",
        f"gpuready_drift_last_run_timestamp_seconds {finished:.0f}",
        "# HELP gpuready_drift_run_status Exit code of the last drift run: 0 no drift, 1 drift, "
        "2 usage or tool error or a layer not compared, 3 unreachable hosts, 130 interrupted.",
        "# TYPE gpuready_drift_run_status gauge",
        f"gpuready_drift_run_status {int(meta.exit_code)}",
        "# HELP gpuready_drift_run_duration_seconds Wall time of the last drift run.",
        "# TYPE gpuready_drift_run_duration_seconds gauge",
        f"gpuready_drift_run_duration_seconds {duration_s:.1f}",
        "# HELP gpuready_drift_run_info The last drift run.",
        "# TYPE gpuready_drift_run_info gauge",
        f'gpuready_drift_run_info{{run_id="{_label(meta.run_id)}"}} 1',
    ]
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_md_cell(str(c)) for c in row) + " |" for row in rows), ""]


def summary_markdown(table: pd.DataFrame, meta: RunMeta) -> str:
    drift = table[table["status"] == FindingStatus.DRIFT.value]
    lines = [f"# gpuready drift run {meta.run_id}", ""]
    if meta.interrupted:
        lines += [INTERRUPTED_NOTE, ""]
    if meta.environment:
        lines += [f"**Environment: {meta.environment}**", ""]
    nodes_drifted = drift["node"].nunique()
    lines += [
        f"Exit code: {int(meta.exit_code)} ({meta.exit_code.name}). Nodes: {len(meta.nodes)}, "
        f"drifted: {nodes_drifted}; drifted items: {len(drift)}.",
        "",
    ]
    lines += _md_table(("layer", "drifted items", "nodes"),
                       ((layer, str(len(sub)), str(sub["node"].nunique()))
                        for layer in meta.layers
                        for sub in [drift[drift["layer"] == layer]]))
    if not drift.empty:
        lines += ["## Drift", ""]
        lines += _md_table(("node", "layer", "item", "declared", "actual", "since"),
                           drift.head(500)[["node", "layer", "item", "declared", "actual",
                                            "since"]].itertuples(index=False))
        diffs = drift[drift["detail"].str.contains("\n", regex=False)]
        if not diffs.empty:
            lines += ["## Diffs (- on the node, + declared)", ""]
            for r in diffs.head(100).itertuples(index=False):
                lines += [f"### {r.node}: {r.item}", "", "```diff", r.detail, "```", ""]
    notes = table[table["status"] == FindingStatus.NOTE.value]
    if not notes.empty:
        lines += ["## Notes", ""]
        lines += _md_table(("node", "layer", "item", "note"),
                           ((r.node, r.layer, r.item, f"{r.actual}: {r.detail}"[:300])
                            for r in notes.head(500).itertuples(index=False)))
    other = table[~table["status"].isin([FindingStatus.DRIFT.value, FindingStatus.NOTE.value])]
    if not other.empty:
        lines += ["## Not compared", ""]
        lines += _md_table(("node", "layer", "item", "status", "reason"),
                           ((r.node, r.layer, r.item, r.status, r.detail[:300])
                            for r in other.head(500).itertuples(index=False)))
    return "\n".join(lines)


def html_page(markdown: str, table: pd.DataFrame, meta: RunMeta) -> str:
    drift = table[table["status"] == FindingStatus.DRIFT.value]
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in
                         (r.node, r.layer, r.item, r.declared, r.actual, r.since))
        + (f"<td><details><summary>diff</summary><pre>{html.escape(r.detail)}</pre></details>"
           f"</td>" if "\n" in r.detail else f"<td>{html.escape(r.detail)}</td>") + "</tr>"
        for r in drift.head(2000).itertuples(index=False)
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gpuready drift {html.escape(meta.run_id)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;vertical-align:top}"
        "</style></head><body>"
        f"<pre>{html.escape(markdown.split('## Drift', maxsplit=1)[0])}</pre>"
        "<h2>Drift</h2><table><tr><th>node</th><th>layer</th><th>item</th><th>declared</th>"
        f"<th>actual</th><th>since</th><th>detail</th></tr>{rows}</table>"
        f"<h2>Not compared</h2>"
        f"{table[table['status'] != 'drift'].drop(columns=['since']).to_html(index=False)}"
        "</body></html>\n"
    )


def write_textfile(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_run(out_root: Path, meta: RunMeta, table: pd.DataFrame,
              rows: Sequence[CheckResult], pools: dict[str, str], duration_s: float,
              textfile: Path | None = None, *, reserved: Path | None = None,
              run_info: RunInfo | None = None) -> Path:
    """Write the run directory (module docstring) into ``reserved`` (see :func:`reserve`;
    reserved here when not given); returns its final path."""
    partial = reserved or reserve(out_root, meta.run_id, lambda: meta.run_id)
    final = out_root / meta.run_id
    try:
        arrow = pa.Table.from_pandas(table, schema=TABLE_SCHEMA, preserve_index=False)
        pq.write_table(arrow, partial / TABLE)
        pa_csv.write_csv(arrow, partial / "drift.csv")
        res_table = results_table(to_frame(list(rows)))
        pq.write_table(res_table, partial / "results.parquet")
        pa_csv.write_csv(res_table, partial / "results.csv")
        md = summary_markdown(table, meta)
        (partial / "summary.md").write_text(md)
        (partial / "index.html").write_text(html_page(md, table, meta))
        prom = prometheus(table, meta, pools, duration_s)
        (partial / "metrics.prom").write_text(prom)
        if run_info is not None:
            write_run_info(partial, run_info)
        meta_doc = dataclasses.asdict(meta)
        meta_doc["exit_code"] = int(meta.exit_code)
        (partial / META).write_text(json.dumps(meta_doc, indent=1, sort_keys=True) + "\n")
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not meta.interrupted:
        point_link(out_root / LATEST, final.name)
    if textfile is not None:
        write_textfile(textfile, prom)
    return final


def prune(out_root: Path, keep_days: float, now: datetime | None = None,
          keep: str = "") -> list[str]:
    """Remove drift run directories (those with ``drift.json``) that finished more than
    ``keep_days`` ago; never anything else. Returns the run ids removed."""
    limit = (now or datetime.now(UTC)) - timedelta(days=keep_days)
    removed = []
    for run_id, meta, path in drift_runs(out_root, exclude=keep):
        try:
            finished = datetime.fromisoformat(str(meta.get("finished")))
        except ValueError:
            continue
        if finished < limit:
            shutil.rmtree(path)
            removed.append(run_id)
    return removed
