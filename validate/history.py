"""Run history: every run's ``results.parquet`` under a reports root, read as one dataset.

The per-run Parquet files *are* the history: each run writes its own directory and never
touches another's, so runs that overlap (two drift runs, a drift run and a validation) add rows
and lose none. Nothing here writes. Reads go through a pyarrow dataset with column projection
and a filter pushed into the scan (dictionary-decoded strings, multi-threaded), not a loop over
CSV files: 365 runs x 1,000 nodes x 40 checks answer in about a second (bench/drift.py).

Vocabulary:

- a **figure** is one numeric metric of one check (``nccl.allreduce:busbw_gbps``); the report's
  key figures also have short names (``nccl_busbw_gbps``), see :data:`FIGURES`. Every figure
  here is higher-is-better.
- a **passing run** of a node's figure is a run whose row for it has status ``pass``.
- the **baseline** of a figure is the median of its last ``k`` passing values, taken before the
  run being judged; fewer than ``min_runs`` passing values give no baseline.
- the **last change** is the latest run whose value moved by more than ``margin`` (a fraction)
  from the run before it.

Outputs (pandas DataFrames):

- :func:`node_series` -> ``run_id, time, node, pool, check, metric, figure, value, status``
  sorted by run_id (run ids sort by time).
- :func:`summarise` -> per figure ``node, figure, runs, latest_run, latest, baseline,
  baseline_runs, ratio, below, last_change_run, last_change_from, last_change_to``.
- :func:`fleet_table` -> the same columns for every node (latest run of each node vs the
  baseline before it), plus ``pool``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from validate.report import KEY_FIGURES

RESULTS_FILE = "results.parquet"
DEFAULT_K = 5
DEFAULT_MIN_RUNS = 3
DEFAULT_MARGIN = 0.10

# (check, metric) -> short name. The report's key figures plus the PCIe link, which a
# drift run judges against history too (a link that trains narrower is a performance loss).
FIGURES: dict[tuple[str, str], str] = {
    **KEY_FIGURES,
    ("gpu.pcie", "pcie_width"): "pcie_width_lanes",
    ("gpu.pcie", "pcie_gen"): "pcie_gen",
}
_BY_NAME = {name: key for key, name in FIGURES.items()}
_COLUMNS = ["run_id", "time", "node", "pool", "check", "metric", "value", "status"]
_DICT_COLUMNS = ["run_id", "time", "node", "pool", "check", "metric", "status"]
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


class HistoryError(ValueError):
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


def run_files(root: Path, *, exclude: Iterable[str] = ()) -> list[Path]:
    """``results.parquet`` of every run directory directly under ``root``, by run id.

    Symlinks (``latest``) are skipped so that no run is read twice; a run directory still
    being written has no results.parquet yet (it is renamed into place) and is not listed."""
    if not root.is_dir():
        raise HistoryError(f"reports root {root} is not a directory")
    skip = set(exclude)
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name in skip or entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                path = Path(entry.path) / RESULTS_FILE
                if path.is_file():
                    found.append(path)
    return sorted(found)


def _dataset(files: Sequence[Path]) -> ds.Dataset:
    fmt = ds.ParquetFileFormat(read_options={"dictionary_columns": _DICT_COLUMNS})
    return ds.dataset([str(f) for f in files], format=fmt)


def _read(files: Sequence[Path], condition: pc.Expression) -> pd.DataFrame:
    """Rows matching ``condition`` with a numeric value, as a DataFrame of :data:`_COLUMNS`."""
    if not files:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in _COLUMNS}).astype(
            {"value": "float64"}
        )
    table = _dataset(files).to_table(
        columns=_COLUMNS, filter=condition & pc.field("value").is_valid()
    )
    # Dictionary columns come back as pandas categoricals: cheap to group and compare.
    return table.to_pandas()


def node_series(
    root: Path,
    node: str,
    figures: Sequence[tuple[str, str]] | None = None,
    *,
    exclude_runs: Iterable[str] = (),
) -> pd.DataFrame:
    """Every value of ``node``'s figures (all numeric metrics when ``figures`` is None)."""
    files = run_files(root, exclude=exclude_runs)
    cond = pc.field("node") == node
    if figures:
        cond = cond & pc.field("check").isin(sorted({c for c, _ in figures}))
    df = _read(files, cond)
    return _with_figures(df, figures)


def nodes_series(
    root: Path,
    nodes: Sequence[str],
    figures: Sequence[tuple[str, str]],
    *,
    exclude_runs: Iterable[str] = (),
) -> pd.DataFrame:
    """Like :func:`node_series` for several nodes at once (one scan)."""
    files = run_files(root, exclude=exclude_runs)
    if not nodes or not figures:
        return _with_figures(_read([], pc.scalar(True)), figures)
    cond = pc.field("node").isin(sorted(set(nodes))) & pc.field("check").isin(
        sorted({c for c, _ in figures})
    )
    return _with_figures(_read(files, cond), figures)


def _with_figures(df: pd.DataFrame, figures: Sequence[tuple[str, str]] | None) -> pd.DataFrame:
    for col in ("run_id", "time", "node", "pool", "check", "metric", "status"):
        df[col] = df[col].astype(str)
    if figures:
        wanted = pd.MultiIndex.from_tuples(list(figures))
        keep = pd.MultiIndex.from_frame(df[["check", "metric"]]).isin(wanted)
        df = df.loc[keep]
    names = [figure_name(c, m) for c, m in zip(df["check"], df["metric"], strict=True)]
    df = df.assign(figure=names)
    # One value per run and figure: a check that judges several GPUs still writes one row per
    # metric; should a run hold two, the lower (worse) one speaks for it.
    df = (
        df.sort_values(["figure", "run_id", "value"])
        .drop_duplicates(["node", "figure", "run_id"], keep="first")
        .sort_values(["node", "figure", "run_id"])
        .reset_index(drop=True)
    )
    return df[["run_id", "time", "node", "pool", "check", "metric", "figure", "value", "status"]]


def baseline(values: pd.Series, statuses: pd.Series, settings: BaselineSettings
             ) -> tuple[float | None, int]:
    """Median of the last ``k`` passing values (in run order) and how many went into it;
    ``None`` when fewer than ``min_runs`` passed."""
    passing = values[statuses.to_numpy() == "pass"].tail(settings.k)
    if len(passing) < settings.min_runs:
        return None, len(passing)
    return float(np.median(passing.to_numpy())), len(passing)


def last_change(values: pd.Series, runs: pd.Series, margin: float
                ) -> tuple[str, float, float] | None:
    """(run_id, previous value, value) of the latest run that moved by more than ``margin``
    from the run before it; None when the series never moved that much."""
    v = values.to_numpy(dtype=float)
    if len(v) < 2:
        return None
    prev = v[:-1]
    moved = np.abs(v[1:] - prev) > margin * np.maximum(np.abs(prev), 1e-12)
    idx = np.flatnonzero(moved)
    if not len(idx):
        return None
    i = int(idx[-1]) + 1
    return str(runs.iloc[i]), float(v[i - 1]), float(v[i])


def summarise(series: pd.DataFrame, settings: BaselineSettings) -> pd.DataFrame:
    """Per node and figure: the latest value against the baseline of the runs before it."""
    rows = []
    for (node, figure), grp in series.groupby(["node", "figure"], sort=True):
        latest = grp.iloc[-1]
        base, used = baseline(grp["value"].iloc[:-1], grp["status"].iloc[:-1], settings)
        change = last_change(grp["value"], grp["run_id"], settings.margin)
        ratio = None if base in (None, 0) else round(float(latest["value"]) / base, 4)
        rows.append(
            {
                "node": node,
                "pool": latest["pool"],
                "figure": figure,
                "runs": len(grp),
                "latest_run": latest["run_id"],
                "latest": float(latest["value"]),
                "baseline": base,
                "baseline_runs": used,
                "ratio": ratio,
                "below": ratio is not None and ratio < 1 - settings.margin,
                "last_change_run": change[0] if change else None,
                "last_change_from": change[1] if change else None,
                "last_change_to": change[2] if change else None,
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def fleet_table(
    root: Path,
    settings: BaselineSettings,
    figures: Sequence[tuple[str, str]] | None = None,
) -> pd.DataFrame:
    """Every node's latest value of each figure against its own baseline (vectorised)."""
    figs = list(figures or FIGURES)
    files = run_files(root)
    df = _with_figures(_read(files, pc.field("check").isin(sorted({c for c, _ in figs}))), figs)
    if df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    keys = ["node", "figure"]
    # Position from the end within each node's series of a figure: 0 is the latest run.
    df["_from_end"] = df.groupby(keys, sort=False).cumcount(ascending=False)
    latest = df[df["_from_end"] == 0].set_index(keys)
    runs = df.groupby(keys, sort=False).size()
    earlier = df[(df["_from_end"] > 0) & (df["status"] == "pass")]
    lastk = earlier[earlier.groupby(keys, sort=False).cumcount(ascending=False) < settings.k]
    base = lastk.groupby(keys, sort=False)["value"].agg(["median", "size"])
    # Last change: consecutive values of one series that moved by more than the margin.
    prev = df.groupby(keys, sort=False)["value"].shift(1)
    moved = (df["value"] - prev).abs() > settings.margin * prev.abs().clip(lower=1e-12)
    changes = df.assign(_prev=prev)[moved.fillna(False)]
    change = changes.groupby(keys, sort=False).tail(1).set_index(keys)
    out = latest[["pool", "run_id", "value"]].rename(
        columns={"run_id": "latest_run", "value": "latest"}
    )
    out["runs"] = runs.reindex(out.index).to_numpy()
    used = base["size"].reindex(out.index).fillna(0).astype(int)
    out["baseline_runs"] = used.to_numpy()
    out["baseline"] = base["median"].reindex(out.index).where(used >= settings.min_runs)
    out["ratio"] = (out["latest"] / out["baseline"].replace(0, np.nan)).round(4)
    out["below"] = (out["ratio"] < 1 - settings.margin).fillna(False).astype(bool)
    out["last_change_run"] = change["run_id"].reindex(out.index)
    out["last_change_from"] = change["_prev"].reindex(out.index)
    out["last_change_to"] = change["value"].reindex(out.index)
    out = out.reset_index()
    return out[SUMMARY_COLUMNS].sort_values(["below", "ratio", "node", "figure"],
                                            ascending=[False, True, True, True],
                                            na_position="last").reset_index(drop=True)


def empty_table() -> pa.Table:
    """An empty results table with the columns history reads (for tests and tools)."""
    return pa.table({c: pa.array([], pa.float64() if c == "value" else pa.string())
                     for c in _COLUMNS})
