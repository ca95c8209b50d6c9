"""Performance layer: a few validator checks, judged against the node's own history.

The checks are the validators' own (same commands, parsers and profile settings), so their
figures line up with every earlier validation of the node. ``gpu.pcie`` is light (one
``nvidia-smi -q -x``); ``nccl.allreduce`` and the storage checks are heavy: they use the GPUs
or write to scratch, so they never run on a node with GPU work in progress (any process in
``nvidia-smi --query-compute-apps``), nor when that cannot be told; they are ``skip`` rows
with the reason, and ``skipped`` findings.

A figure drifts when its value is below ``(1 - margin)`` x its baseline, the median of its
last K passing runs (validate.history). The run's rows are written to the drift run's
``results.parquet``, so drift runs are history too; a drifted row is written as ``warn`` with
code ``drift.performance.below_baseline``, so it never becomes part of a later baseline (a
validation run that passes is what declares a new normal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import runner
from validate.checks import Check
from validate.drift.model import Finding, FindingStatus, Layer
from validate.drift.probes import NodeProbe
from validate.history import FIGURES, BaselineSettings, figure_name
from validate.inventory import Node
from validate.model import CheckResult, Status
from validate.profiles import Profile
from validate.transport import Transport

HEAVY = frozenset({"nccl.allreduce", "storage.fio", "storage.checkpoint"})
CODE_BELOW = "drift.performance.below_baseline"
CODE_BUSY = "drift.gpu_busy"
CODE_NO_DRIVER = "drift.driver_unusable"


def _skip_row(run_id: str, node: Node, profile: str, check: str, code: str,
              reason: str) -> CheckResult:
    return CheckResult(run_id=run_id, time=datetime.now(UTC).isoformat(timespec="seconds"),
                       node=node.name, pool=node.pool, profile=profile, check=check, metric="",
                       value=None, unit="", warn=None, fail=None, status=Status.SKIP, code=code,
                       detail=reason, duration_s=0.0)


def busy_reason(probe: NodeProbe) -> str:
    """Why heavy checks must not run on this node ("" when they may)."""
    if probe.busy is None:
        return probe.busy_problem or "cannot tell whether the GPUs are busy"
    if probe.busy:
        apps = ", ".join(f"pid {a.pid} {a.process_name or '?'} on {a.gpu_bus_id or '?'}"
                         for a in probe.busy[:5])
        more = f" (+{len(probe.busy) - 5} more)" if len(probe.busy) > 5 else ""
        return f"GPU work in progress: {apps}{more}"
    return ""


def measure(node: Node, profile: Profile, checks: Sequence[Check], probe: NodeProbe,
            run_id: str, transport: Transport, timeout_s: float) -> list[CheckResult]:
    """Rows of the performance checks on one node (skip rows where they must not run)."""
    if probe.smi is None:
        reason = f"the GPU driver does not answer ({probe.smi_problem}); see versions/runtime"
        return [_skip_row(run_id, node, profile.name, c.id, CODE_NO_DRIVER, reason)
                for c in checks]
    busy = busy_reason(probe)
    runnable = [c for c in checks if not (busy and c.id in HEAVY)]
    rows = runner.run_node(node, runnable, run_id, transport, timeout_s, profile)
    skipped = [_skip_row(run_id, node, profile.name, c.id, CODE_BUSY, busy)
               for c in checks if busy and c.id in HEAVY]
    return rows + skipped


def margin_for(node: Node, figure: str, default: float) -> float:
    """The node's declared margin for ``figure`` (gpuready_drift_margins), else ``default``."""
    return node.desired.drift.margins.get(figure, default)


def judge(rows: Sequence[CheckResult], nodes: Mapping[str, Node], bases: pd.DataFrame,
          settings: BaselineSettings
          ) -> tuple[list[CheckResult], list[Finding]]:
    """Each figure row against the node's baseline (``bases``: validate.history.baselines);
    returns the rows (drifted ones as warn) and the findings (drift, or skipped with the
    reason)."""
    out_rows: list[CheckResult] = []
    findings: list[Finding] = []
    known = {(r.node, r.check, r.metric): (r.baseline, int(r.baseline_runs))
             for r in bases.itertuples(index=False)}
    for row in rows:
        node = nodes[row.node]
        item = f"{row.check} {row.metric}".strip()
        if row.status is Status.SKIP and row.code != "ok":
            findings.append(Finding(row.node, row.pool, Layer.PERFORMANCE, row.check,
                                    "measured", "skipped", FindingStatus.SKIPPED, row.detail,
                                    "performance"))
            out_rows.append(row)
            continue
        if (row.check, row.metric) not in FIGURES or row.value is None:
            if row.status is Status.ERROR:
                findings.append(Finding(row.node, row.pool, Layer.PERFORMANCE, item,
                                        "measured", row.code, FindingStatus.ERROR, row.detail,
                                        "performance"))
            out_rows.append(row)
            continue
        figure = figure_name(row.check, row.metric)
        margin = margin_for(node, figure, settings.margin)
        base, used = known.get((row.node, row.check, row.metric), (None, 0))
        if base is None or pd.isna(base):
            findings.append(Finding(
                row.node, row.pool, Layer.PERFORMANCE, item, "a baseline", f"{row.value:g}",
                FindingStatus.SKIPPED,
                f"no baseline yet: {used} passing run(s) in history, {settings.min_runs} "
                "needed", "performance"))
            out_rows.append(row)
            continue
        floor = base * (1 - margin)
        if row.value < floor:
            detail = (f"{row.value:g} {row.unit} is {1 - row.value / base:.0%} below the "
                      f"median {base:g} of the last {used} passing runs (margin {margin:.0%})")
            findings.append(Finding(row.node, row.pool, Layer.PERFORMANCE, item,
                                    f">= {floor:g} {row.unit} (baseline {base:g})".strip(),
                                    f"{row.value:g} {row.unit}".strip(), FindingStatus.DRIFT,
                                    detail, f"performance: {row.check}"))
            out_rows.append(dataclasses.replace(
                row,
                status=Status.WARN if row.status is Status.PASS else row.status,
                code=CODE_BELOW if row.status is Status.PASS else row.code,
                detail=f"{row.detail}; {detail}" if row.detail else detail,
            ))
            continue
        out_rows.append(row)
    return out_rows, findings
