"""Run history: every run's ``results.parquet`` under a reports root, read as one dataset.

The per-run Parquet files *are* the history: each run writes its own directory and never
touches another's, so runs that overlap (two drift runs, a drift run and a validation) add rows
and lose none. Nothing here writes.

Reads are columnar: a pyarrow dataset over the run files, only the columns needed, strings
kept dictionary-encoded. A row filter is applied per record batch on the dictionary *indices*
(the node's or the checks' positions in the batch's dictionary) rather than on decoded strings,
and everything after the scan works on integer codes (pandas categoricals): 365 runs x 1,000
nodes x 40 checks answer in about a second (bench/drift.py), not with a loop over CSV files.

Vocabulary:

- a **figure** is one numeric metric of one check (``nccl.allreduce:busbw_gbps``); the report's
  key figures also have short names (``nccl_busbw_gbps``), see :data:`FIGURES`. Every figure
  here is higher-is-better.
- a **passing run** of a node's figure is a run whose row for it has status ``pass``.
- the **baseline** of a figure is the median of its last ``k`` passing values, taken before the
  run being judged; fewer than ``min_runs`` passing values give no baseline.
- the **last change** is the latest run whose value moved by more than ``margin`` (a fraction)
  from the run before it.

Validation runs and drift runs are both history here (a drift run's performance rows are
measurements like a validation run's); ``run_kind`` (validate/runinfo.py) tells them apart:
the series carries it per row and ``kinds`` reads one kind only. Whether a node was accepted or
out is read from validation runs alone (validate/cost.py).

Outputs (pandas DataFrames):

- :func:`node_series` -> ``run_id, run_kind, time, node, pool, check, metric, figure, value,
  status``, per figure sorted by run_id (run ids sort by time);
- :func:`summarise` / :func:`fleet_table` -> per node and figure: ``node, pool, figure, runs,
  latest_run, latest, baseline, baseline_runs, ratio, below, last_change_run,
  last_change_from, last_change_to`` (the latest run against the baseline of the runs
  before it);
- :func:`baselines` -> ``node, check, metric, baseline, baseline_runs``: the baseline of every
  run in history, for judging a new run (drift).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from validate import runinfo
from validate.errors import InputError
from validate.model import DEFAULT_K, DEFAULT_MARGIN, DEFAULT_MIN_RUNS, Status
from validate.results import KEY_FIGURES

RESULTS_FILE = "results.parquet"

# (check, metric) -> short name. The report's key figures plus the PCIe link, which a
# drift run judges against history too (a link that trains narrower is a performance loss).
FIGURES: dict[tuple[str, str], str] = {
    **KEY_FIGURES,
    ("gpu.pcie", "pcie_width"): "pcie_width_lanes",
    ("gpu.pcie", "pcie_gen"): "pcie_gen",
}
_BY_NAME = {name: key for key, name in FIGURES.items()}
_DICT_COLUMNS = ["run_id", "time", "node", "pool", "check", "metric", "status"]
SERIES_COLUMNS = ["run_id", "run_kind", "time", "node", "pool", "check", "metric", "figure",
                  "value", "status"]
SUMMARY_COLUMNS = [
    "node",
    "pool",
    "figure",
    "runs",
    "latest_run",
    "latest",
    "baseline",
    "baseline_runs",
    "ratio",
    "below",
    "last_change_run",
    "last_change_from",
    "last_change_to",
]
BASELINE_COLUMNS = ["node", "check", "metric", "baseline", "baseline_runs"]
_BATCH_ROWS = 1 << 17


class HistoryError(InputError, ValueError):
    """A reports root that cannot be read as history, or a figure name that is unknown."""


@dataclass(frozen=True, slots=True)
class BaselineSettings:
    """How a baseline is formed and when a value counts as below it."""

    k: int = DEFAULT_K
    min_runs: int = DEFAULT_MIN_RUNS
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.k < 1 or not 1 <= self.min_runs <= self.k:
            raise HistoryError(f"need 1 <= min_runs <= k (got k={self.k}, min={self.min_runs})")
        if not 0 <= self.margin < 1:
            raise HistoryError(f"margin is a fraction in [0, 1), not {self.margin}")


def figure_name(check: str, metric: str) -> str:
    """Short name of a known figure, else ``check:metric``."""
    return FIGURES.get((check, metric), f"{check}:{metric}")


def parse_figure(text: str) -> tuple[str, str]:
    """``nccl_busbw_gbps`` or ``nccl.allreduce:busbw_gbps`` -> (check, metric)."""
    if text in _BY_NAME:
        return _BY_NAME[text]
    check, sep, metric = text.partition(":")
    if not sep or not check or not metric:
        known = ", ".join(sorted(_BY_NAME))
        raise HistoryError(f"unknown figure {text!r}: use one of {known} or CHECK:METRIC")
    return check, metric


def run_files(roots: Path | Sequence[Path], *, exclude: Iterable[str] = (),
              kinds: Collection[str] | None = None) -> list[Path]:
    """``results.parquet`` of every run directory directly under the root(s), by run id; with
    ``kinds``, only runs of those kinds (``validation``, ``drift``).

    Symlinks (``latest``) and dot-directories (a drift run still being written) are skipped,
    so no run is read twice or half; a run id found under two roots is read once."""
    if kinds is not None:
        wanted = set(kinds)
        return [f for f in run_files(roots, exclude=exclude)
                if runinfo.run_kind(f.parent) in wanted]
    skip = set(exclude)
    found: dict[str, Path] = {}
    for root in [roots] if isinstance(roots, Path) else roots:
        if not root.is_dir():
            raise HistoryError(f"reports root {root} is not a directory")
        with os.scandir(root) as entries:
            for entry in entries:
                if (entry.name in skip or entry.name in found or entry.name.startswith(".")
                        or entry.is_symlink() or not entry.is_dir(follow_symlinks=False)):
                    continue
                path = Path(entry.path) / RESULTS_FILE
                if path.is_file():
                    found[entry.name] = path
    return [found[name] for name in sorted(found)]


def _scan(files: Sequence[Path], column: str, values: Sequence[str] | None,
          columns: Sequence[str]) -> pa.Table:
    """Rows whose ``column`` is one of ``values`` (all rows when None) and whose value is
    set, with ``columns``; strings stay dictionary-encoded."""
    fmt = ds.ParquetFileFormat(read_options={"dictionary_columns": _DICT_COLUMNS})
    wanted = list(dict.fromkeys([*columns, column, "value"]))
    schema = pa.schema([(c, pa.float64() if c == "value" else
                         pa.dictionary(pa.int32(), pa.string())) for c in wanted])
    if not files:
        return schema.empty_table()
    # The schema is given, not taken from the first file: a run with no rows written before
    # the results had an explicit schema says its text columns are doubles.
    dataset = ds.dataset([str(f) for f in files], format=fmt, schema=schema)
    want = pa.array(list(values)) if values is not None else None
    kept = []
    for batch in dataset.to_batches(columns=wanted, batch_size=_BATCH_ROWS):
        mask = pc.is_valid(batch.column("value"))
        if want is not None:
            col = batch.column(column)
            # The positions of the wanted strings in this batch's dictionary, then a compare
            # of the integer indices: no string is decoded for the rows that are dropped.
            hits = pc.indices_nonzero(pc.is_valid(pc.index_in(col.dictionary, value_set=want)))
            if len(hits) == 0:
                continue
            mask = pc.and_(mask, pc.is_in(col.indices, value_set=hits.cast(col.indices.type)))
        part = batch.filter(mask)
        if part.num_rows:
            kept.append(part.select(wanted))
    if not kept:
        return schema.empty_table()
    return pa.Table.from_batches(kept).unify_dictionaries()


@dataclass(frozen=True)
class _Rows:
    """Scanned rows as integer codes, one per node, figure and run, sorted by group (node and
    figure) then run. ``starts`` holds the first row of each group."""

    node: np.ndarray  # codes into node_names
    node_names: np.ndarray
    pool: np.ndarray  # codes into pool_names
    pool_names: np.ndarray
    figure: np.ndarray  # codes into figures: (check, metric)
    figures: list[tuple[str, str]]
    run: np.ndarray  # codes into run_names, which are sorted: the code is the run's order
    run_names: np.ndarray
    status: np.ndarray  # codes into status_names
    status_names: np.ndarray
    time: np.ndarray | None  # the rows' time strings, when scanned
    value: np.ndarray
    starts: np.ndarray

    def __len__(self) -> int:
        return len(self.value)

    @property
    def passing(self) -> np.ndarray:
        passed = np.asarray(self.status_names == Status.PASS.value, dtype=bool)
        return np.asarray(passed[self.status])

    @property
    def ends(self) -> np.ndarray:
        """One past the last row of each group."""
        return np.append(self.starts[1:], len(self)).astype(np.int64)

    def group_of(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.starts)), self.ends - self.starts)


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, dictionary) of a dictionary-encoded column, unified across its chunks."""
    arr = col.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    return (np.asarray(arr.indices.to_numpy(zero_copy_only=False), dtype=np.int64),
            np.asarray(arr.dictionary.to_pylist(), dtype=object))


def _rows(table: pa.Table, figures: Sequence[tuple[str, str]] | None) -> _Rows:
    """Codes, the figure of each row (only ``figures``; all when None), runs in order, one row
    per node, figure and run (the lower value, should a run hold two), sorted by group."""
    node, node_names = _codes(table.column("node"))
    if "pool" in table.column_names:
        pool, pool_names = _codes(table.column("pool"))
    else:
        pool, pool_names = np.zeros(len(node), np.int64), np.asarray([""], dtype=object)
    check, check_names = _codes(table.column("check"))
    metric, metric_names = _codes(table.column("metric"))
    run, run_raw = _codes(table.column("run_id"))
    status, status_names = _codes(table.column("status"))
    value = np.asarray(table.column("value").to_numpy(), dtype=np.float64)
    # Name every (check, metric) pair present once and keep the wanted ones.
    width = max(len(metric_names), 1)
    pair = check * width + metric
    # The pair codes are small (checks x metrics): a lookup table, not np.unique's sort.
    present = np.zeros(max(len(check_names), 1) * width, dtype=bool)
    present[pair] = True
    pairs = np.flatnonzero(present)
    lookup = np.zeros(len(present), dtype=np.int64)
    lookup[pairs] = np.arange(len(pairs))
    slot = lookup[pair]
    named = [(str(check_names[c // width]), str(metric_names[c % width])) for c in pairs]
    wanted = set(figures) if figures else None
    keep = np.array([wanted is None or p in wanted for p in named], dtype=bool)[slot] \
        if len(slot) else np.zeros(0, dtype=bool)
    order = np.argsort(run_raw.astype(str), kind="stable")
    rank = np.empty(len(run_raw), dtype=np.int64)
    rank[order] = np.arange(len(run_raw))
    cols: dict[str, np.ndarray] = {
        "node": node[keep], "pool": pool[keep], "figure": slot[keep], "run": rank[run[keep]],
        "status": status[keep], "value": value[keep]}
    if "time" in table.column_names:
        tcode, tnames = _codes(table.column("time"))
        cols["time"] = tnames[tcode[keep]]
    # One int64 key (node, figure, run) and a stable radix-friendly argsort: several times
    # faster than np.lexsort over the columns at millions of rows.
    key = (cols["node"] << 40) | (cols["figure"] << 24) | cols["run"]
    idx = np.argsort(key, kind="stable")
    if len(idx) > 1 and bool((np.diff(key[idx]) == 0).any()):
        # A run with two rows for one figure: order by value first so the lower one leads.
        by_value = np.argsort(cols["value"], kind="stable")
        idx = by_value[np.argsort(key[by_value], kind="stable")]
    cols = {k: v[idx] for k, v in cols.items()}
    n = len(idx)
    new_group = np.ones(n, dtype=bool)
    repeat = np.zeros(n, dtype=bool)
    if n > 1:
        new_group[1:] = (np.diff(cols["node"]) != 0) | (np.diff(cols["figure"]) != 0)
        repeat[1:] = ~new_group[1:] & (np.diff(cols["run"]) == 0)
    first = ~repeat  # the sort put a run's lower value first
    cols = {k: v[first] for k, v in cols.items()}
    return _Rows(cols["node"], node_names, cols["pool"], pool_names, cols["figure"], named,
                 cols["run"], run_raw[order], cols["status"], status_names, cols.get("time"),
                 cols["value"], np.flatnonzero(new_group[first]))


def _lastk_median(r: _Rows, use: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group: median of the last ``k`` rows where ``use`` is true, and how many there
    were (NaN and 0 for a group without any)."""
    groups = len(r.starts)
    group = r.group_of()
    # Rank from the end among the used rows of the group: 1 = the latest used row.
    used_before = np.cumsum(use)  # used rows up to and including this one
    at_end = np.zeros(groups, dtype=np.int64)
    if len(r):
        at_end = used_before[r.ends - 1]
    rank = at_end[group] - used_before + 1
    pick = use & (rank <= k)
    grid = np.full((groups, k), np.nan)
    grid[group[pick], rank[pick] - 1] = r.value[pick]
    count = np.minimum(at_end - np.concatenate(([0], at_end[:-1])), k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: no baseline
        median = np.nanmedian(grid, axis=1) if groups else np.zeros(0)
    return median, count


def _summary(r: _Rows, settings: BaselineSettings) -> pd.DataFrame:
    """The latest run of each node and figure against the baseline of the runs before it."""
    if not len(r):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    last = r.ends - 1
    not_latest = np.ones(len(r), dtype=bool)
    not_latest[last] = False
    median, used = _lastk_median(r, r.passing & not_latest, settings.k)
    base = np.where(used >= settings.min_runs, median, np.nan)
    latest = r.value[last]
    with np.errstate(all="ignore"):
        ratio = np.round(latest / np.where(base == 0, np.nan, base), 4)
    # Last change: the latest row that moved by more than the margin from the row before it.
    prev = np.concatenate(([np.nan], r.value[:-1]))
    prev[r.starts] = np.nan
    with np.errstate(all="ignore"):
        moved = np.abs(r.value - prev) > settings.margin * np.maximum(np.abs(prev), 1e-12)
    where = np.where(moved, np.arange(len(r)), -1)
    change = np.maximum.reduceat(where, r.starts)
    has = change >= 0
    pick = np.where(has, change, 0)
    runs_names = r.run_names.astype(str)
    return pd.DataFrame({
        "node": r.node_names[r.node[last]].astype(str),
        "pool": r.pool_names[r.pool[last]].astype(str),
        "figure": [figure_name(*r.figures[f]) for f in r.figure[last]],
        "runs": (r.ends - r.starts).astype(int),
        "latest_run": runs_names[r.run[last]],
        "latest": latest,
        "baseline": base,
        "baseline_runs": used.astype(int),
        "ratio": ratio,
        "below": np.nan_to_num(ratio, nan=1.0) < 1 - settings.margin,
        "last_change_run": np.where(has, runs_names[r.run[pick]], None),
        "last_change_from": np.where(has, prev[pick], np.nan),
        "last_change_to": np.where(has, r.value[pick], np.nan),
    }, columns=SUMMARY_COLUMNS)


def node_series(
    roots: Path | Sequence[Path],
    node: str,
    figures: Sequence[tuple[str, str]] | None = None,
    *,
    exclude_runs: Iterable[str] = (),
    kinds: Collection[str] | None = None,
) -> pd.DataFrame:
    """Every value of ``node``'s figures (all numeric metrics when ``figures`` is None), from
    runs of ``kinds`` (all when None), each row with its run's kind."""
    by_kind: dict[str, list[Path]] = {}
    for f in run_files(roots, exclude=exclude_runs, kinds=kinds):
        by_kind.setdefault(runinfo.run_kind(f.parent), []).append(f)
    frames = [_series(_rows(_scan(files, "node", [node], _DICT_COLUMNS), figures), kind)
              for kind, files in sorted(by_kind.items())]
    frames = [f for f in frames if not f.empty]
    if len(frames) == 1:
        return frames[0]
    if not frames:
        return pd.DataFrame(columns=SERIES_COLUMNS)
    # Several kinds: one series again, each figure's rows in run order.
    out = pd.concat(frames, ignore_index=True)
    order = {fig: i for i, fig in enumerate(dict.fromkeys(out["figure"]))}
    return out.assign(_fig=out["figure"].map(order)).sort_values(
        ["_fig", "run_id"], kind="stable").drop(columns="_fig").reset_index(drop=True)


def _series(r: _Rows, kind: str) -> pd.DataFrame:
    pairs = [r.figures[f] for f in r.figure]
    return pd.DataFrame({
        "run_id": r.run_names[r.run].astype(str),
        "run_kind": np.full(len(r), kind, dtype=object),
        "time": r.time.astype(str) if r.time is not None else np.full(len(r), ""),
        "node": r.node_names[r.node].astype(str),
        "pool": r.pool_names[r.pool].astype(str),
        "check": [c for c, _ in pairs],
        "metric": [m for _, m in pairs],
        "figure": [figure_name(c, m) for c, m in pairs],
        "value": r.value,
        "status": r.status_names[r.status].astype(str),
    }, columns=SERIES_COLUMNS)


def summarise(series: pd.DataFrame, settings: BaselineSettings) -> pd.DataFrame:
    """Per node and figure of a :func:`node_series` frame: the latest value against the
    baseline of the runs before it."""
    if series.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    table = pa.Table.from_pandas(
        series[["run_id", "node", "pool", "check", "metric", "status", "value"]],
        preserve_index=False)
    return _summary(_rows(table, None), settings).sort_values(["node", "figure"]).reset_index(
        drop=True)


def fleet_table(
    roots: Path | Sequence[Path],
    settings: BaselineSettings,
    figures: Sequence[tuple[str, str]] | None = None,
    kinds: Collection[str] | None = None,
) -> pd.DataFrame:
    """Every node's latest value of each figure against its own baseline, worst first (from
    runs of ``kinds``; all when None)."""
    figs = list(figures or FIGURES)
    table = _scan(run_files(roots, kinds=kinds), "check", sorted({c for c, _ in figs}),
                  ["run_id", "node", "pool", "check", "metric", "status"])
    out = _summary(_rows(table, figs), settings)
    return out.sort_values(["below", "ratio", "node", "figure"],
                           ascending=[False, True, True, True],
                           na_position="last").reset_index(drop=True)


def baselines(
    roots: Path | Sequence[Path],
    nodes: Sequence[str],
    figures: Sequence[tuple[str, str]],
    settings: BaselineSettings,
    *,
    exclude_runs: Iterable[str] = (),
) -> pd.DataFrame:
    """For judging a new run: each node's and figure's baseline over *all* its runs in
    history (``baseline`` is NaN where fewer than ``min_runs`` passed)."""
    files = run_files(roots, exclude=exclude_runs)
    if not nodes or not figures or not files:
        return pd.DataFrame(columns=BASELINE_COLUMNS)
    r = _rows(_scan(files, "node", sorted(set(nodes)),
                    ["run_id", "node", "check", "metric", "status"]), figures)
    if not len(r):
        return pd.DataFrame(columns=BASELINE_COLUMNS)
    median, used = _lastk_median(r, r.passing, settings.k)
    first = r.starts
    pairs = [r.figures[f] for f in r.figure[first]]
    return pd.DataFrame({
        "node": r.node_names[r.node[first]].astype(str),
        "check": [c for c, _ in pairs],
        "metric": [m for _, m in pairs],
        "baseline": np.where(used >= settings.min_runs, median, np.nan),
        "baseline_runs": used.astype(int),
    }, columns=BASELINE_COLUMNS)


def last_values(roots: Path | Sequence[Path], checks: Collection[str],
                nodes: Collection[str] | None = None
                ) -> dict[str, dict[tuple[str, str], tuple[float, str]]]:
    """Each node's latest value of every metric of ``checks`` in the runs under ``roots`` (a
    root that does not exist yet holds none), with the time of its row: what a check that
    judges a counter's growth since the node's previous run compares with. ``{node: {(check,
    metric): (value, time)}}``; ``nodes`` limits the nodes read."""
    existing = [r for r in ([roots] if isinstance(roots, Path) else roots) if r.is_dir()]
    if not checks or not existing:
        return {}
    table = _scan(run_files(existing), "check", sorted(checks),
                  ["run_id", "time", "node", "check", "metric"])
    out: dict[str, dict[tuple[str, str], tuple[float, str]]] = {}
    if not table.num_rows:
        return out
    frame = table.to_pandas().astype({"run_id": str, "time": str, "node": str, "check": str,
                                      "metric": str})
    if nodes is not None:
        frame = frame[frame["node"].isin(list(nodes))]
    for time, node, check, metric, value in frame.sort_values(
            "run_id", kind="stable")[["time", "node", "check", "metric",
                                      "value"]].itertuples(index=False):
        out.setdefault(node, {})[(check, metric)] = (float(value), time)
    return out
