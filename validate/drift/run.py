"""One drift run: every layer of every selected node in one pass, read-only.

The check-mode run (configuration layer, and the declared packages, holds and services) runs
in a thread while the nodes are probed over SSH, at most ``concurrency`` at a time, one
connection per node: probes first (versions, runtime, the GPU-busy test), then the performance
checks. Afterwards the declared packages are compared with each node's dpkg database, the
performance figures with history, and the findings of all sources are merged per item.

A node that fails (unreachable, a probe that errors) is one node's findings; it never stops the
others and never drops out of the table.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import checks as check_registry
from validate import runner
from validate.checks import NodeContext
from validate.drift import config, labels, performance, probes
from validate.drift import report as drift_report
from validate.drift.model import Finding, FindingStatus, Layer, exit_code, merged
from validate.history import BASELINE_COLUMNS, FIGURES, BaselineSettings, baselines
from validate.inventory import Node, load, profile_for
from validate.model import CheckResult, ExitCode
from validate.profiles import ProfileError
from validate.transport import Transport

LOG = logging.getLogger(__name__)
ALL_LAYERS = tuple(Layer)


@dataclass(frozen=True)
class DriftOptions:
    inventory: Path
    out: Path
    limit: str | None = None
    history: tuple[Path, ...] = ()
    layers: tuple[Layer, ...] = ALL_LAYERS
    perf_checks: str = performance.DEFAULT_CHECKS
    baseline: BaselineSettings = field(default_factory=BaselineSettings)
    concurrency: int = 16
    timeout_s: float = 60.0
    check_timeout_s: int = 3600
    forks: int | None = None
    textfile: Path | None = None
    keep_days: float | None = None
    run_id: str | None = None
    accept_unknown_host_keys: bool = False


@dataclass(frozen=True)
class DriftResult:
    run_dir: Path
    run_id: str
    table: pd.DataFrame
    findings: tuple[Finding, ...]
    exit_code: ExitCode
    timings: dict[str, float]
    pruned: tuple[str, ...] = ()


@dataclass
class _NodeOutcome:
    findings: list[Finding]
    rows: list[CheckResult]
    probe: probes.NodeProbe | None


def new_run_id(now: datetime | None = None) -> str:
    """``20261202T123456Z-drift-1a2b``: sorts by time with the validators' run ids, and two
    runs started in the same second still get their own directories."""
    return f"{runner.new_run_id(now)}-drift-{secrets.token_hex(2)}"


def _baselines(opts: DriftOptions, nodes: Sequence[Node], figures: list[tuple[str, str]]
               ) -> pd.DataFrame:
    roots = [root for root in dict.fromkeys(opts.history or (opts.out,)) if root.is_dir()]
    if not roots:
        return pd.DataFrame(columns=BASELINE_COLUMNS)
    return baselines(roots, [n.name for n in nodes], figures, opts.baseline)


def _one_node(node: Node, opts: DriftOptions, run_id: str, perf: Sequence[check_registry.Check],
              transport: Transport) -> _NodeOutcome:
    try:
        profile = profile_for(node)
    except ProfileError as exc:
        return _NodeOutcome([Finding(node.name, node.pool, Layer.CONFIGURATION, "gpu_profile",
                                     node.profile, "unreadable", FindingStatus.ERROR, str(exc),
                                     "profile")], [], None)
    ctx = NodeContext(run_id, node, profile, transport, opts.timeout_s)
    probe = probes.probe(ctx)
    rows: list[CheckResult] = []
    if Layer.PERFORMANCE in opts.layers and perf and not probe.unreachable:
        rows = performance.measure(node, profile, perf, probe, run_id, transport,
                                   opts.timeout_s)
    return _NodeOutcome(probe.findings, rows, probe)


def run_drift(
    opts: DriftOptions,
    *,
    transport_for: Callable[[Node], Transport] | None = None,
    progress: Callable[[str], None] | None = None,
    desired_labels: labels.DesiredMetadata | None = None,
) -> DriftResult:
    """Run drift on the inventory's GPU nodes and write the run directory."""
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    nodes = load(opts.inventory, opts.limit)
    if not nodes:
        raise ValueError(f"no GPU nodes in {opts.inventory} match {opts.limit!r}")
    perf = check_registry.select(opts.perf_checks) if opts.perf_checks else ()
    run_id = opts.run_id or new_run_id(started_at)
    pools = {n.name: n.pool for n in nodes}
    by_name = {n.name: n for n in nodes}
    figures = [f for f in FIGURES if f[0] in {c.id for c in perf}]
    history = _baselines(opts, nodes, figures) if perf else pd.DataFrame(
        columns=BASELINE_COLUMNS)
    timings: dict[str, float] = {}

    check_result: list[config.CheckModeResult] = []
    check_error: list[BaseException] = []

    def check_mode() -> None:
        try:
            check_result.append(config.run_check_mode(
                opts.inventory, pools, limit=",".join(sorted(pools)),
                timeout_s=opts.check_timeout_s, forks=opts.forks))
        except Exception as exc:  # the other layers still report
            LOG.exception("check mode failed")
            check_error.append(exc)

    thread = None
    # Check mode also declares packages, holds and services for the versions/runtime layers.
    if {Layer.CONFIGURATION, Layer.VERSIONS, Layer.RUNTIME} & set(opts.layers):
        thread = threading.Thread(target=check_mode, name="drift-check-mode", daemon=True)
        thread.start()
        say(f"check mode: {len(nodes)} nodes")

    make = transport_for or (lambda n: runner.default_transport(n, opts.accept_unknown_host_keys))
    outcomes: dict[str, _NodeOutcome] = {}
    lock = threading.Lock()

    def one(node: Node) -> None:
        start = time.monotonic()
        transport = make(node)
        try:
            outcome = _one_node(node, opts, run_id, perf, transport)
        except Exception as exc:  # a bug must cost one node, not the run
            LOG.exception("drift probe crashed on %s", node.name)
            outcome = _NodeOutcome([Finding(node.name, node.pool, Layer.CONFIGURATION,
                                            "probes", "run", "crashed", FindingStatus.ERROR,
                                            f"{type(exc).__name__}: {exc}", "probe")], [], None)
        finally:
            transport.close()
        with lock:
            outcomes[node.name] = outcome
            done = len(outcomes)
        drifted = len({f.item for f in outcome.findings if f.status is FindingStatus.DRIFT})
        say(f"[{done}/{len(nodes)}] {node.name}: probed, {drifted} live findings "
            f"{time.monotonic() - start:.1f}s")

    probe_start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, opts.concurrency),
                            thread_name_prefix="drift") as pool:
        list(pool.map(one, nodes))
    timings["probes_s"] = round(time.monotonic() - probe_start, 1)

    findings: list[Finding] = []
    rows: list[CheckResult] = []
    for node in nodes:
        outcome = outcomes[node.name]
        findings += outcome.findings
        rows += outcome.rows

    if thread is not None:
        thread.join()
        if check_error:
            findings += [Finding(n.name, n.pool, Layer.CONFIGURATION, "check mode",
                                 "run on the node", "failed", FindingStatus.ERROR,
                                 f"{type(check_error[0]).__name__}: {check_error[0]}",
                                 "check mode") for n in nodes]
        else:
            result = check_result[0]
            timings["check_mode_s"] = round(result.elapsed_s, 1)
            say(f"check mode: {result.status} in {result.elapsed_s:.0f} s")
            for node in nodes:
                outcome = outcomes[node.name]
                installed = outcome.probe.packages if outcome.probe else None
                findings += probes.package_findings(
                    node.name, node.pool, result.package_tasks.get(node.name, []), installed)
            findings += result.findings

    if Layer.LABELS in opts.layers:
        findings += labels.layer(nodes, desired_labels)
    if perf:
        rows, perf_findings = performance.judge(rows, by_name, history, opts.baseline)
        findings += perf_findings

    findings = [f for f in merged(findings) if f.layer in opts.layers
                or f.status in (FindingStatus.UNREACHABLE, FindingStatus.ERROR)]
    code = exit_code(findings)
    finished_at = datetime.now(UTC)
    duration = time.monotonic() - t0
    timings["total_s"] = round(duration, 1)
    since = drift_report.since_times(opts.out, findings,
                                     started_at.isoformat(timespec="seconds"), exclude=run_id)
    table = drift_report.findings_frame(findings, since)
    labels_env = sorted({n.desired.environment for n in nodes if n.desired.environment})
    meta = drift_report.RunMeta(
        run_id=run_id,
        started=started_at.isoformat(timespec="seconds"),
        finished=finished_at.isoformat(timespec="seconds"),
        exit_code=code,
        nodes=tuple(n.name for n in nodes),
        layers=tuple(layer.value for layer in opts.layers),
        environment="; ".join(labels_env) or None,
        settings={"inventory": str(opts.inventory), "limit": opts.limit,
                  "perf_checks": opts.perf_checks, "baseline_runs": opts.baseline.k,
                  "min_runs": opts.baseline.min_runs, "margin": opts.baseline.margin,
                  "history": [str(h) for h in (opts.history or (opts.out,))]},
        timings=timings,
    )
    run_dir = drift_report.write_run(opts.out, meta, table, rows, pools, duration,
                                     opts.textfile)
    pruned: tuple[str, ...] = ()
    if opts.keep_days is not None:
        pruned = tuple(drift_report.prune(opts.out, opts.keep_days, keep=run_id))
    return DriftResult(run_dir, run_id, table, tuple(findings), code, timings, pruned)
