"""The capacity and cost view: per pool, what the fleet declares, what validation accepted,
what is out and why, how long it has been out, and what an accepted GPU-hour costs.

Per pool, from one run's results (and the runs before it in the same reports directory):

- GPUs declared: the run's nodes of the pool x their profile's GPU count, read from the
  profiles the run recorded in its run.json (validate/runinfo.py's ``profiles``): the profile
  the checks judged each node against, not the shipped file as it reads today. A node the run
  recorded no loaded profile for is listed, its GPUs not counted.
- GPUs accepted: GPUs of nodes whose rows all pass (warnings and skips allowed), the rule of
  the exit code (the gate's rule); every GPU of a node with a fail or error row is out.
- GPUs out, per node with its fault codes (the codes of its fail/error rows).
- GPU-hours lost to failed validation: for each node out, its GPUs x the hours from the first
  run of its current failing streak (the earliest run after the last one that accepted it; runs
  that did not include the node do not break the streak) to this run. Only validation runs
  count (validate/runinfo.py's ``run_kind``): a drift run's performance rows neither accept a
  node nor break its streak.
- Effective cost per accepted GPU-hour, the seed's formula per hour::

      (compute + network + storage + support + idle + failed_runs + operations) / accepted GPUs

  Each component comes from the inventory, per pool (``gpuready_cost``), either per GPU-hour
  (times the GPUs declared: the pool pays for every GPU it has, accepted or not) or per month
  (over 730 hours)::

      gpuready_cost:
        currency: USD
        compute: {per_gpu_hour: 2.10}
        network: {monthly: 12000}
        ...                         # storage, support, idle, failed_runs, operations

  Nothing is invented: a missing component (or currency) is listed, and the effective cost is
  then not computed for that pool; a malformed input is named the same way.

Output: :class:`PoolCapacity` per pool, rendered by :func:`markdown` (a report section) and
:func:`prometheus` (metrics per pool); the inputs travel with the run (``capacity_inputs.json``)
so that ``validate report`` renders the same view again.
"""

from __future__ import annotations

import html as html_lib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import runinfo
from validate.inventory import Node
from validate.model import VALIDATION, Status
from validate.results import ReportExtras
from validate.runinfo import ProfileUse

VAR = "gpuready_cost"
COMPONENTS = ("compute", "network", "storage", "support", "idle", "failed_runs", "operations")
BASES = ("per_gpu_hour", "monthly")
HOURS_PER_MONTH = 730.0  # 8760 / 12
INPUTS_FILE = "capacity_inputs.json"
_OUT = (Status.FAIL.value, Status.ERROR.value)


@dataclass(frozen=True, slots=True)
class CostComponent:
    """One cost component: ``amount`` per GPU-hour or per month (``basis``)."""

    name: str
    amount: float
    basis: str


@dataclass(frozen=True, slots=True)
class PoolCostInputs:
    """A pool's cost inputs as read, with what is missing or wrong."""

    pool: str
    currency: str | None
    components: tuple[CostComponent, ...]
    missing: tuple[str, ...]
    errors: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.missing and not self.errors


def parse_inputs(pool: str, raw: Any) -> PoolCostInputs:
    """``gpuready_cost`` of one pool (None: not set) -> inputs, every problem named."""
    if raw is None:
        return PoolCostInputs(pool, None, (), ("currency", *COMPONENTS), ())
    if not isinstance(raw, Mapping):
        return PoolCostInputs(pool, None, (), (), (f"{VAR} must be a mapping, got "
                                                   f"{type(raw).__name__}",))
    errors: list[str] = []
    components: list[CostComponent] = []
    unknown = sorted(str(k) for k in raw if k not in (*COMPONENTS, "currency"))
    if unknown:
        errors.append(f"{VAR}: unknown keys {unknown} (known: currency, {', '.join(COMPONENTS)})")
    currency = raw.get("currency")
    if currency is not None and (not isinstance(currency, str) or not currency.strip()):
        errors.append(f"{VAR}.currency must be a non-empty string, got {currency!r}")
    given = [name for name in COMPONENTS if raw.get(name) is not None]
    for name in given:
        spec, where = raw[name], f"{VAR}.{name}"
        if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in BASES:
            errors.append(f"{where} must be one of {{per_gpu_hour: N}} or {{monthly: N}}, "
                          f"got {spec!r}")
            continue
        basis, amount = next(iter(spec.items()))
        if isinstance(amount, bool) or not isinstance(amount, int | float) or (
                not math.isfinite(amount) or amount < 0):
            errors.append(f"{where}.{basis} must be a number >= 0, got {amount!r}")
            continue
        components.append(CostComponent(name, float(amount), str(basis)))
    missing = (() if currency is not None else ("currency",)) + tuple(
        n for n in COMPONENTS if n not in given)
    return PoolCostInputs(pool, currency if isinstance(currency, str) and currency.strip()
                          else None, tuple(components), missing, tuple(errors))


def inputs_from_nodes(nodes: Sequence[Node]) -> dict[str, PoolCostInputs]:
    """Each pool's inputs; hosts of one pool that disagree are an error of that pool."""
    seen: dict[str, tuple[str, Any]] = {}
    out: dict[str, PoolCostInputs] = {}
    for node in nodes:
        raw = node.desired.cost
        if node.pool not in seen:
            seen[node.pool] = (node.name, raw)
            out[node.pool] = parse_inputs(node.pool, raw)
        elif seen[node.pool][1] != raw:
            first = seen[node.pool][0]
            out[node.pool] = PoolCostInputs(node.pool, None, (), (), (
                f"hosts of pool {node.pool} disagree on {VAR} ({first} vs {node.name}): set it "
                "on the pool's group",))
    return out


def write_inputs(run_dir: Path, inputs: Mapping[str, PoolCostInputs]) -> Path:
    """The inputs as used, next to the run's results (for ``validate report``)."""
    path = run_dir / INPUTS_FILE
    path.write_text(json.dumps({p: asdict(i) for p, i in sorted(inputs.items())}, indent=1,
                               sort_keys=True) + "\n")
    return path


def read_inputs(run_dir: Path) -> dict[str, PoolCostInputs] | None:
    """The inputs a run recorded, or None (a run from before this view, or a bench)."""
    path = run_dir / INPUTS_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {
        pool: PoolCostInputs(
            pool, item["currency"],
            tuple(CostComponent(**c) for c in item["components"]),
            tuple(item["missing"]), tuple(item["errors"]))
        for pool, item in data.items()
    }


@dataclass(frozen=True, slots=True)
class NodeOut:
    """A node whose GPUs are out: why, and since when."""

    node: str
    pool: str
    gpus: int
    codes: tuple[str, ...]
    since: str
    gpu_hours_lost: float


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """One pool's line of the view (module docstring)."""

    pool: str
    nodes: int
    gpus_declared: int
    gpus_accepted: int
    gpus_out: int
    out: tuple[NodeOut, ...]
    gpu_hours_lost: float
    currency: str | None
    cost_per_hour: float | None
    cost_per_accepted_gpu_hour: float | None
    missing: tuple[str, ...]
    errors: tuple[str, ...]
    notes: tuple[str, ...]


def gpus_per_node(profiles: Sequence[ProfileUse]) -> dict[str, int | str]:
    """Each node's GPU count from the profiles a run recorded (``RunInfo.profiles``), or why
    there is none: the error of a profile that could not be loaded, or a hardware record
    without a GPU count."""
    out: dict[str, int | str] = {}
    for use in profiles:
        count = use.hardware.get("gpu_count")
        if use.error is not None:
            why: int | str = f"profile {use.name} could not be loaded ({use.error})"
        elif isinstance(count, bool) or not isinstance(count, int):
            why = f"profile {use.name} as recorded has no GPU count"
        else:
            why = count
        out.update(dict.fromkeys(use.nodes, why))
    return out


def _node_status(df: pd.DataFrame) -> pd.DataFrame:
    """One row per node: pool, profile, out (a fail/error row), codes, run time."""
    bad = df["status"].astype(str).isin(_OUT)
    per = df.assign(_bad=bad).groupby("node", sort=True, observed=True).agg(
        pool=("pool", "first"), profile=("profile", "first"), out=("_bad", "any"),
        time=("time", "max"))
    codes = (df.loc[bad, ["node", "code"]].drop_duplicates().groupby("node")["code"]
             .agg(lambda s: tuple(sorted(s))))
    per["codes"] = codes.reindex(per.index)
    per["codes"] = per["codes"].apply(lambda c: c if isinstance(c, tuple) else ())
    return per


def history(out_root: Path, run_time: str, exclude: Path | None = None) -> pd.DataFrame:
    """``node, out, time`` per node of every earlier validation run in ``out_root`` (a run's
    time is its last row's), runs after ``run_time`` and drift runs left out."""
    frames = []
    for results in sorted(out_root.glob("*/results.parquet")):
        if exclude is not None and results.parent.resolve() == exclude.resolve():
            continue
        if results.parent.is_symlink():  # reports/latest
            continue
        if runinfo.run_kind(results.parent) != VALIDATION:
            continue
        try:
            df = pd.read_parquet(results, columns=["node", "status", "time"])
        except (OSError, ValueError):
            continue
        if df.empty:
            continue
        when = str(df["time"].max())
        if when > run_time:
            continue
        out = df["status"].astype(str).isin(_OUT).groupby(df["node"]).any()
        frames.append(pd.DataFrame({"node": out.index, "out": out.to_numpy(), "time": when}))
    if not frames:
        return pd.DataFrame(columns=["node", "out", "time"])
    return pd.concat(frames, ignore_index=True)


def _hours(since: str, until: str) -> float:
    delta = pd.Timestamp(until) - pd.Timestamp(since)
    return max(0.0, float(delta.total_seconds()) / 3600.0)


def _first_failure(node: str, now: str, past: pd.DataFrame) -> str:
    """The first run of the node's current failing streak (``now`` if it starts now)."""
    mine = past[past["node"] == node].sort_values("time", ascending=False)
    since = now
    for row in mine.itertuples(index=False):
        if not row.out:
            break
        since = str(row.time)
    return since


def capacity(
    df: pd.DataFrame,
    inputs: Mapping[str, PoolCostInputs] | None,
    past: pd.DataFrame | None = None,
    profiles: Sequence[ProfileUse] = (),
) -> list[PoolCapacity]:
    """The view for one run's results ``df`` (the report's long table), each node's GPUs
    counted by the profile the run recorded for it (``profiles``, run.json's)."""
    if df.empty:
        return []
    counts = gpus_per_node(profiles)
    nodes = _node_status(df)
    now = str(df["time"].max())
    past = past if past is not None else pd.DataFrame(columns=["node", "out", "time"])
    out: list[PoolCapacity] = []
    for pool, group in nodes.groupby("pool", sort=True):
        notes: list[str] = []
        declared = accepted = 0
        down: list[NodeOut] = []
        for name, row in group.iterrows():
            gpus = counts.get(str(name), f"the run recorded no profile for it (profile "
                                         f"{row['profile']} in its rows)")
            if isinstance(gpus, str):
                notes.append(f"{name}: {gpus}, its GPUs not counted")
                continue
            declared += gpus
            if not row["out"]:
                accepted += gpus
                continue
            since = _first_failure(str(name), now, past)
            down.append(NodeOut(str(name), str(pool), gpus, row["codes"], since,
                                round(gpus * _hours(since, now), 3)))
        given = (inputs or {}).get(str(pool))
        if inputs is None:
            given = PoolCostInputs(str(pool), None, (), (), (
                "no cost inputs were recorded with this run",))
        elif given is None:
            given = parse_inputs(str(pool), None)
        per_hour = per_gpu_hour = None
        if given.complete:
            per_hour = sum(c.amount * declared if c.basis == "per_gpu_hour"
                           else c.amount / HOURS_PER_MONTH for c in given.components)
            if accepted:
                per_gpu_hour = per_hour / accepted
            else:
                notes.append("no GPU accepted: the cost per accepted GPU-hour is not defined")
        out.append(PoolCapacity(
            str(pool), len(group), declared, accepted, sum(n.gpus for n in down), tuple(down),
            round(sum(n.gpu_hours_lost for n in down), 3), given.currency, per_hour, per_gpu_hour,
            given.missing, given.errors, tuple(notes)))
    return out


def for_run(
    df: pd.DataFrame, inputs: Mapping[str, PoolCostInputs] | None, reports_root: Path,
    run_dir: Path, profiles: Sequence[ProfileUse],
) -> list[PoolCapacity]:
    """The view of the run in ``run_dir`` (which may not exist yet), with the history of the
    other runs in ``reports_root`` and the profiles the run recorded."""
    if df.empty:
        return []
    past = history(reports_root, str(df["time"].max()), exclude=run_dir)
    return capacity(df, inputs, past, profiles)


def write_files(run_dir: Path, inputs: Mapping[str, PoolCostInputs] | None,
                pools: Sequence[PoolCapacity]) -> None:
    """``capacity.csv`` and the inputs as used (``capacity_inputs.json``)."""
    capacity_table(pools).to_csv(run_dir / "capacity.csv", index=False)
    if inputs is not None:
        write_inputs(run_dir, inputs)


def _money(currency: str | None, value: float | None) -> str:
    return "-" if value is None else f"{currency} {value:,.2f}"


def markdown(pools: Sequence[PoolCapacity]) -> str:
    """The report's "Capacity and cost" section."""
    if not pools:
        return ""
    lines = [
        "## Capacity and cost",
        "",
        "Accepted: nodes whose rows all pass (warnings allowed); every GPU of a node with a "
        "failed or errored check is out. GPU-hours lost: GPUs out x hours since the node's first "
        "failure in this reports directory's run history. Effective cost per accepted GPU-hour = "
        "(compute + network + storage + support + idle + failed_runs + operations) per hour / "
        "accepted GPUs; inputs from the inventory's gpuready_cost.",
        "",
        "| pool | nodes | GPUs declared | GPUs accepted | GPUs out | GPU-hours lost | "
        "cost per hour | cost per accepted GPU-hour |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pools:
        lines.append(f"| {p.pool} | {p.nodes} | {p.gpus_declared} | {p.gpus_accepted} | "
                     f"{p.gpus_out} | {p.gpu_hours_lost:g} | {_money(p.currency, p.cost_per_hour)} "
                     f"| {_money(p.currency, p.cost_per_accepted_gpu_hour)} |")
    down = [n for p in pools for n in p.out]
    if down:
        lines += ["", "GPUs out:", "", "| pool | node | GPUs | out since | GPU-hours lost | "
                  "fault codes |", "|---|---|---|---|---|---|"]
        lines += [f"| {n.pool} | {n.node} | {n.gpus} | {n.since} | {n.gpu_hours_lost:g} | "
                  f"{' '.join(n.codes)} |" for n in down]
    problems = [p for p in pools if p.missing or p.errors or p.notes]
    if problems:
        lines += ["", "Not computed, and why:", ""]
        for p in problems:
            if p.missing == ("currency", *COMPONENTS):
                lines.append(f"- {p.pool}: no cost inputs ({VAR} is not set for this pool): "
                             "the effective cost is not computed")
            elif p.missing:
                lines.append(f"- {p.pool}: {VAR} lacks {', '.join(p.missing)}: the effective "
                             "cost is not computed")
            lines += [f"- {p.pool}: {e}" for e in p.errors]
            lines += [f"- {p.pool}: {n}" for n in p.notes]
    lines.append("")
    return "\n".join(lines)


def html(pools: Sequence[PoolCapacity]) -> str:
    """The same section for the report page (``index.html``): tables, everything escaped."""
    if not pools:
        return ""
    e = html_lib.escape
    head = ("pool", "nodes", "GPUs declared", "GPUs accepted", "GPUs out", "GPU-hours lost",
            "cost per hour", "cost per accepted GPU-hour")
    rows = [(p.pool, p.nodes, p.gpus_declared, p.gpus_accepted, p.gpus_out,
             f"{p.gpu_hours_lost:g}", _money(p.currency, p.cost_per_hour),
             _money(p.currency, p.cost_per_accepted_gpu_hour)) for p in pools]

    def table(header: Sequence[str], body: Sequence[Sequence[object]]) -> str:
        cells = "".join(f"<th>{e(h)}</th>" for h in header)
        lines = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
                        for r in body)
        return f"<table><thead><tr>{cells}</tr></thead><tbody>{lines}</tbody></table>"

    parts = ['<section id="capacity"><h2>Capacity and cost</h2>',
             "<p>Accepted: nodes whose rows all pass (warnings allowed); every GPU of a node "
             "with a failed or errored check is out. Effective cost per accepted GPU-hour = "
             f"the pool's cost components per hour / accepted GPUs ({e(VAR)}).</p>",
             table(head, rows)]
    down = [n for p in pools for n in p.out]
    if down:
        parts += ["<h3>GPUs out</h3>", table(
            ("pool", "node", "GPUs", "out since", "GPU-hours lost", "fault codes"),
            [(n.pool, n.node, n.gpus, n.since, f"{n.gpu_hours_lost:g}", " ".join(n.codes))
             for n in down])]
    problems = [(p.pool, "; ".join((*((f"{VAR} lacks " + ", ".join(p.missing),)
                                      if p.missing else ()), *p.errors, *p.notes)))
                for p in pools if p.missing or p.errors or p.notes]
    if problems:
        parts += ["<h3>Not computed, and why</h3><ul>"]
        parts += [f"<li>{e(pool)}: {e(why)}</li>" for pool, why in problems]
        parts += ["</ul>"]
    parts.append("</section>")
    return "".join(parts)


def report_extras(df: pd.DataFrame, inputs: Mapping[str, PoolCostInputs] | None,
                  reports_root: Path, run_dir: Path,
                  profiles: Sequence[ProfileUse]) -> ReportExtras:
    """The view of one run as report sections and files (summary.md, index.html, metrics.prom,
    capacity.csv, capacity_inputs.json); ``profiles``: those the run recorded (run.json)."""
    pools = for_run(df, inputs, reports_root, run_dir, profiles)
    return ReportExtras(markdown=markdown(pools), html=html(pools), metrics=prometheus(pools),
                        write_files=lambda target: write_files(target, inputs, pools))


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(pools: Sequence[PoolCapacity]) -> str:
    """Prometheus textfile lines per pool (appended to the run's metrics.prom)."""
    if not pools:
        return ""
    metrics: list[tuple[str, str, list[str]]] = [
        ("gpuready_pool_gpus_declared", "GPUs of the pool's nodes in this run.", []),
        ("gpuready_pool_gpus_accepted", "GPUs of nodes whose checks all pass (warnings "
         "allowed).", []),
        ("gpuready_pool_gpus_out", "GPUs of nodes with a failed or errored check.", []),
        ("gpuready_pool_gpus_out_by_code", "GPUs out, per fault code of their node (a node "
         "with two codes counts under both).", []),
        ("gpuready_pool_gpu_hours_lost", "GPU-hours lost to failed validation since each out "
         "node's first failure in the run history.", []),
        ("gpuready_pool_cost_per_hour", "Sum of the pool's cost components per hour.", []),
        ("gpuready_pool_cost_per_accepted_gpu_hour", "Effective cost per accepted GPU-hour.",
         []),
        ("gpuready_pool_cost_input_missing", "1 for each cost input the inventory lacks "
         "(nothing is computed from a partial set).", []),
    ]
    rows = {name: samples for name, _, samples in metrics}
    for p in pools:
        pool = f'pool="{_label(p.pool)}"'
        rows["gpuready_pool_gpus_declared"].append(f"{{{pool}}} {p.gpus_declared}")
        rows["gpuready_pool_gpus_accepted"].append(f"{{{pool}}} {p.gpus_accepted}")
        rows["gpuready_pool_gpus_out"].append(f"{{{pool}}} {p.gpus_out}")
        by_code: dict[str, int] = {}
        for n in p.out:
            for code in n.codes:
                by_code[code] = by_code.get(code, 0) + n.gpus
        rows["gpuready_pool_gpus_out_by_code"] += [
            f'{{{pool},code="{_label(c)}"}} {g}' for c, g in sorted(by_code.items())]
        rows["gpuready_pool_gpu_hours_lost"].append(f"{{{pool}}} {p.gpu_hours_lost!r}")
        money = f'{pool},currency="{_label(p.currency or "")}"'
        if p.cost_per_hour is not None:
            rows["gpuready_pool_cost_per_hour"].append(f"{{{money}}} {p.cost_per_hour!r}")
        if p.cost_per_accepted_gpu_hour is not None:
            rows["gpuready_pool_cost_per_accepted_gpu_hour"].append(
                f"{{{money}}} {p.cost_per_accepted_gpu_hour!r}")
        rows["gpuready_pool_cost_input_missing"] += [
            f'{{{pool},input="{_label(m)}"}} 1' for m in p.missing]
    lines: list[str] = []
    for name, help_text, samples in metrics:
        if samples:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f"{name}{s}" for s in samples]
    return "\n".join(lines) + "\n"


def capacity_table(pools: Sequence[PoolCapacity]) -> pd.DataFrame:
    """``capacity.csv``: one row per pool."""
    return pd.DataFrame([{
        "pool": p.pool, "nodes": p.nodes, "gpus_declared": p.gpus_declared,
        "gpus_accepted": p.gpus_accepted, "gpus_out": p.gpus_out,
        "gpu_hours_lost": p.gpu_hours_lost, "currency": p.currency or "",
        "cost_per_hour": p.cost_per_hour, "cost_per_accepted_gpu_hour":
            p.cost_per_accepted_gpu_hour,
        "missing_inputs": " ".join(p.missing), "problems": "; ".join((*p.errors, *p.notes)),
    } for p in pools])
