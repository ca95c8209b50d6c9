"""One drift run: every layer of every selected node in one pass, read-only.

The check-mode run (configuration layer, and the declared packages, holds and services) runs
in a thread while the nodes are probed over SSH, at most ``concurrency`` at a time, one
connection per node: probes first (versions, runtime, the GPU-busy test), then the performance
checks. Afterwards the declared packages are compared with each node's dpkg database, the
labels and taints with the gate's decision, the performance figures with history, and the
findings of all sources are merged per item.

A node that fails (unreachable, a probe that errors) is one node's findings; it never stops the
others and never drops out of the table.

Bounds (a silent node, one that takes commands and never answers, costs at most these):

- probes: the first probe's ``timeout_s`` (the node is then given up, validate/drift/probes.py),
  and ``node_deadline_s`` for all of a node's probes and performance checks together (its
  connection is then aborted: ``host.deadline``);
- check mode: ``check_task_timeout_s`` per task and node (Ansible's task timeout: the node is
  given up, the others go on), ``check_timeout_s`` for the whole pass.

Interrupted (``control``, SIGINT/SIGTERM in the CLI): no queued node is started, running
probes are aborted, check mode is cancelled (ansible-playbook's process group killed, the run's
ssh masters told to exit), and the findings so far are written as a run marked interrupted
(``drift.json``/``run.json`` exit code 130; ``latest-drift`` is not moved to it).

The run id is checked as the validators check theirs and its directory reserved before any
node is asked; ``run.json`` records ``run_kind: drift``.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import checks as check_registry
from validate import gate, runinfo, runner
from validate.checks import NodeContext
from validate.drift import config, labels, performance, probes
from validate.drift import report as drift_report
from validate.drift.model import (
    DEFAULT_CHECKS,
    DEFAULT_NODE_DEADLINE_S,
    DEFAULT_TASK_TIMEOUT_S,
    Finding,
    FindingStatus,
    Layer,
    exit_code,
    merged,
)
from validate.history import BASELINE_COLUMNS, FIGURES, BaselineSettings, baselines
from validate.inventory import Node, load, profile_for
from validate.model import CODE_DEADLINE, CODE_INTERRUPTED, DRIFT, CheckResult, ExitCode
from validate.profiles import ProfileError
from validate.transport import Transport

LOG = logging.getLogger(__name__)
ALL_LAYERS = tuple(Layer)
# How long a worker may take to return after its connection was aborted.
ABORT_GRACE_S = 5.0
_TICK_S = 0.1


@dataclass(frozen=True)
class DriftOptions:
    inventory: Path
    out: Path
    limit: str | None = None
    history: tuple[Path, ...] = ()
    layers: tuple[Layer, ...] = ALL_LAYERS
    perf_checks: str = DEFAULT_CHECKS
    baseline: BaselineSettings = field(default_factory=BaselineSettings)
    concurrency: int = 16
    timeout_s: float = 60.0
    node_deadline_s: float = DEFAULT_NODE_DEADLINE_S
    check_timeout_s: int = 3600
    check_task_timeout_s: int = DEFAULT_TASK_TIMEOUT_S
    forks: int | None = None
    textfile: Path | None = None
    keep_days: float | None = None
    run_id: str | None = None
    accept_unknown_host_keys: bool = False
    kubeconfig: Path | None = None


@dataclass(frozen=True)
class DriftResult:
    run_dir: Path
    run_id: str
    table: pd.DataFrame
    findings: tuple[Finding, ...]
    exit_code: ExitCode
    timings: dict[str, float]
    pruned: tuple[str, ...] = ()
    interrupted: bool = False
    labels_unavailable: str = ""


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
              transport: Transport, control: runner.RunControl) -> _NodeOutcome:
    try:
        profile = profile_for(node)
    except ProfileError as exc:
        return _NodeOutcome([Finding(node.name, node.pool, Layer.CONFIGURATION, "gpu_profile",
                                     node.profile, "unreadable", FindingStatus.ERROR, str(exc),
                                     "profile")], [], None)
    ctx = NodeContext(run_id, node, profile, transport, opts.timeout_s)
    probe = probes.probe(ctx)
    rows: list[CheckResult] = []
    if (Layer.PERFORMANCE in opts.layers and perf and not probe.unreachable
            and not control.interrupted):
        rows = performance.measure(node, profile, perf, probe, run_id, transport,
                                   opts.timeout_s)
    return _NodeOutcome(probe.findings, rows, probe)


def run_drift(
    opts: DriftOptions,
    *,
    transport_for: Callable[[Node], Transport] | None = None,
    progress: Callable[[str], None] | None = None,
    control: runner.RunControl | None = None,
    api_factory: Callable[[Path | None], gate.NodeApi] = gate.KubeNodeApi,
    on_reserved: Callable[[Path], None] | None = None,
) -> DriftResult:
    """Run drift on the inventory's GPU nodes and write the run directory (module docstring).
    ``on_reserved`` is given the run's directory once it is reserved, before any node is
    asked (the CLI opens the run's log there). Raises InventoryError, RunDirError or
    ValueError before any node is asked."""
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    control = control or runner.RunControl()
    nodes = load(opts.inventory, opts.limit)
    if not nodes:
        raise ValueError(f"no GPU nodes in {opts.inventory} match {opts.limit!r}")
    perf = check_registry.select(opts.perf_checks) if opts.perf_checks else ()
    # Before the first connection: a bad or used run id, an unusable --out.
    reserved = drift_report.reserve(opts.out, opts.run_id, lambda: new_run_id(started_at))
    run_id = reserved.name.removeprefix(".").removesuffix(drift_report.PARTIAL)
    try:
        if on_reserved is not None:
            on_reserved(reserved)
        return _run(opts, nodes, perf, run_id, reserved, started_at, t0, say, control,
                    transport_for, api_factory)
    except BaseException:
        drift_report.release(reserved)
        raise


def _run(opts: DriftOptions, nodes: Sequence[Node], perf: Sequence[check_registry.Check],
         run_id: str, reserved: Path, started_at: datetime, t0: float,
         say: Callable[[str], None], control: runner.RunControl,
         transport_for: Callable[[Node], Transport] | None,
         api_factory: Callable[[Path | None], gate.NodeApi]) -> DriftResult:
    """The layers of one reserved run, then its files: check mode in a thread beside the node
    probes, the labels from the API server, the performance figures against their history."""
    info = runinfo.start(run_id=run_id, environment=None, inventory=opts.inventory,
                         limit=opts.limit, checks_requested=opts.perf_checks or None,
                         checks=[c.id for c in perf], nodes=nodes,
                         run_kind=DRIFT)
    pools = {n.name: n.pool for n in nodes}
    figures = [f for f in FIGURES if f[0] in {c.id for c in perf}]
    history = _baselines(opts, nodes, figures) if perf else pd.DataFrame(
        columns=BASELINE_COLUMNS)
    timings: dict[str, float] = {}

    # Check mode also declares packages, holds and services for the versions/runtime layers.
    check_mode = None
    if {Layer.CONFIGURATION, Layer.VERSIONS, Layer.RUNTIME} & set(opts.layers):
        check_mode = _CheckModeRun.start(opts, pools, control)
        say(f"check mode: {len(nodes)} nodes")

    # The probes serve the versions and runtime layers and guard the performance checks; the
    # labels layer asks the API server, not the nodes.
    if {Layer.VERSIONS, Layer.RUNTIME} & set(opts.layers) or (
            Layer.PERFORMANCE in opts.layers and perf):
        probe_start = time.monotonic()
        outcomes = _probe_all(nodes, opts, run_id, perf, control, say, transport_for)
        timings["probes_s"] = round(time.monotonic() - probe_start, 1)
    else:
        outcomes = {n.name: _NodeOutcome([], [], None) for n in nodes}

    findings: list[Finding] = []
    rows: list[CheckResult] = []
    for node in nodes:
        findings += outcomes[node.name].findings
        rows += outcomes[node.name].rows
    if check_mode is not None:
        findings += check_mode.findings(nodes, outcomes, say, timings)
    unavailable = ""
    if Layer.LABELS in opts.layers:
        label_findings, unavailable = _labels_layer(opts, nodes, control, say, timings,
                                                    api_factory)
        findings += label_findings
    if perf:
        rows, perf_findings = performance.judge(rows, {n.name: n for n in nodes}, history,
                                                opts.baseline)
        findings += perf_findings

    findings = [f for f in merged(findings) if f.layer in opts.layers
                or f.status in (FindingStatus.UNREACHABLE, FindingStatus.ERROR)]
    interrupted = control.interrupted
    code = ExitCode.INTERRUPTED if interrupted else exit_code(findings)
    finished_at = datetime.now(UTC)
    duration = time.monotonic() - t0
    timings["total_s"] = round(duration, 1)
    since = drift_report.since_times(opts.out, findings,
                                     started_at.isoformat(timespec="seconds"), exclude=run_id)
    table = drift_report.findings_frame(findings, since)
    labels_env = sorted({n.desired.environment for n in nodes if n.desired.environment})
    environment = "; ".join(labels_env) or None
    meta = drift_report.RunMeta(
        run_id=run_id,
        started=started_at.isoformat(timespec="seconds"),
        finished=finished_at.isoformat(timespec="seconds"),
        exit_code=code,
        nodes=tuple(n.name for n in nodes),
        layers=tuple(layer.value for layer in opts.layers),
        environment=environment,
        settings=_settings_recorded(opts),
        timings=timings,
        interrupted=interrupted,
        interrupted_by=control.reason if interrupted else None,
    )
    info = dataclasses.replace(info, environment=environment,
                               finished=finished_at.isoformat(timespec="seconds"),
                               exit_code=int(code))
    run_dir = drift_report.write_run(opts.out, meta, table, rows, pools, duration,
                                     opts.textfile, reserved=reserved, run_info=info)
    pruned: tuple[str, ...] = ()
    if opts.keep_days is not None and not interrupted:
        pruned = tuple(drift_report.prune(opts.out, opts.keep_days, keep=run_id))
    return DriftResult(run_dir, run_id, table, tuple(findings), code, timings, pruned,
                       interrupted, unavailable)


@dataclass
class _CheckModeRun:
    """The roles in check mode (validate.drift.config), run in a thread beside the probes."""

    thread: threading.Thread
    result: list[config.CheckModeResult]
    error: list[BaseException]

    @classmethod
    def start(cls, opts: DriftOptions, pools: Mapping[str, str],
              control: runner.RunControl) -> _CheckModeRun:
        result: list[config.CheckModeResult] = []
        error: list[BaseException] = []

        def check_mode() -> None:
            try:
                result.append(config.run_check_mode(
                    opts.inventory, pools, limit=",".join(sorted(pools)),
                    timeout_s=opts.check_timeout_s, task_timeout_s=opts.check_task_timeout_s,
                    forks=opts.forks, accept_unknown_host_keys=opts.accept_unknown_host_keys,
                    cancel=lambda: control.interrupted))
            except Exception as exc:  # the other layers still report
                LOG.exception("check mode failed")
                error.append(exc)

        thread = threading.Thread(target=check_mode, name="drift-check-mode", daemon=True)
        thread.start()
        return cls(thread, result, error)

    def findings(self, nodes: Sequence[Node], outcomes: Mapping[str, _NodeOutcome],
                 say: Callable[[str], None], timings: dict[str, float]) -> list[Finding]:
        """Wait for check mode; its findings, and the packages it declared against what each
        node's probe found installed (or one error per node when check mode failed)."""
        while self.thread.is_alive():  # a signal handler runs between the joins
            self.thread.join(_TICK_S)
        if self.error:
            exc = self.error[0]
            return [Finding(n.name, n.pool, Layer.CONFIGURATION, config.CHECK_MODE_ITEM,
                            "run on the node", "failed", FindingStatus.ERROR,
                            f"{type(exc).__name__}: {exc}", "check mode") for n in nodes]
        result = self.result[0]
        timings["check_mode_s"] = round(result.elapsed_s, 1)
        say(f"check mode: {result.status} in {result.elapsed_s:.0f} s")
        if result.left_running:
            say(f"warning: {len(result.left_running)} ssh master(s) of check mode did not "
                "exit when asked")
        found: list[Finding] = []
        for node in nodes:
            probe = outcomes[node.name].probe
            found += probes.package_findings(
                node.name, node.pool, result.package_tasks.get(node.name, []),
                probe.packages if probe else None)
        return found + list(result.findings)


def _labels_layer(opts: DriftOptions, nodes: Sequence[Node], control: runner.RunControl,
                  say: Callable[[str], None], timings: dict[str, float],
                  api_factory: Callable[[Path | None], gate.NodeApi]
                  ) -> tuple[list[Finding], str]:
    """The labels layer's findings, and why it could not compare ("" when it did)."""
    if control.interrupted:
        unavailable = "interrupted before the labels layer"
        return list(labels.unavailable_findings(nodes, unavailable)), unavailable
    label_start = time.monotonic()
    layer = labels.layer(nodes, opts.history or (opts.out,), kubeconfig=opts.kubeconfig,
                         api_factory=api_factory)
    timings["labels_s"] = round(time.monotonic() - label_start, 1)
    if layer.unavailable:
        say(f"labels and taints: NOT COMPARED ({layer.unavailable}); the run is incomplete "
            "(exit 2) unless --layers leaves the labels layer out")
    return list(layer.findings), layer.unavailable


def _settings_recorded(opts: DriftOptions) -> dict[str, Any]:
    """The run's settings as its run.json records them."""
    return {"inventory": str(opts.inventory), "limit": opts.limit,
            "perf_checks": opts.perf_checks, "baseline_runs": opts.baseline.k,
            "min_runs": opts.baseline.min_runs, "margin": opts.baseline.margin,
            "history": [str(h) for h in (opts.history or (opts.out,))],
            "timeout_s": opts.timeout_s, "node_deadline_s": opts.node_deadline_s,
            "check_timeout_s": opts.check_timeout_s,
            "check_task_timeout_s": opts.check_task_timeout_s}


def _probe_all(nodes: Sequence[Node], opts: DriftOptions, run_id: str,
               perf: Sequence[check_registry.Check], control: runner.RunControl,
               say: Callable[[str], None],
               transport_for: Callable[[Node], Transport] | None) -> dict[str, _NodeOutcome]:
    """Probe every node, at most ``opts.concurrency`` at a time. The calling thread watches
    the per-node deadline and ``control``: it aborts the connection of a node past its
    deadline, and on an interrupt every running one (queued nodes are never started)."""
    make = transport_for or (lambda n: runner.default_transport(n, opts.accept_unknown_host_keys))
    outcomes: dict[str, _NodeOutcome] = {}
    running: dict[str, tuple[Transport, float]] = {}
    lock = threading.Lock()

    def one(node: Node) -> None:
        if control.interrupted:
            return  # reported below as not started
        start = time.monotonic()
        try:
            transport = make(node)
        except Exception as exc:  # a bad connection setting is this node's problem only
            outcome = _NodeOutcome([Finding(node.name, node.pool, Layer.CONFIGURATION, "ssh",
                                            "reachable", "no connection", FindingStatus.ERROR,
                                            f"cannot set up the connection: {exc}", "probe")],
                                   [], None)
            with lock:
                outcomes[node.name] = outcome
            return
        with lock:
            running[node.name] = (transport, start + opts.node_deadline_s)
        try:
            outcome = _one_node(node, opts, run_id, perf, transport, control)
        except Exception as exc:  # a bug must cost one node, not the run
            LOG.exception("drift probe crashed on %s", node.name)
            outcome = _NodeOutcome([Finding(node.name, node.pool, Layer.CONFIGURATION,
                                            "probes", "run", "crashed", FindingStatus.ERROR,
                                            f"{type(exc).__name__}: {exc}", "probe")], [], None)
        finally:
            with lock:
                running.pop(node.name, None)
            transport.close()
        with lock:
            outcomes.setdefault(node.name, outcome)
            done = len(outcomes)
        drifted = len({f.item for f in outcome.findings if f.status is FindingStatus.DRIFT})
        say(f"[{done}/{len(nodes)}] {node.name}: probed, {drifted} live findings "
            f"{time.monotonic() - start:.1f}s")

    pool = ThreadPoolExecutor(max_workers=max(1, opts.concurrency),
                              thread_name_prefix="drift")
    futures: list[Future[None]] = [pool.submit(one, n) for n in nodes]
    aborted: dict[str, float] = {}
    said = False
    while True:
        _, pending = wait(futures, timeout=_TICK_S, return_when=FIRST_COMPLETED)
        if control.interrupted and not said:
            said = True
            say(f"interrupted by {control.reason}: stopping the probes and check mode, "
                "writing what was found")
        if not pending:
            break
        now = time.monotonic()
        with lock:
            live = list(running.items())
        for name, (transport, deadline) in live:
            if name in aborted:
                if now >= aborted[name] + ABORT_GRACE_S:
                    LOG.warning("%s: probes did not stop %g s after the abort", name,
                                ABORT_GRACE_S)
                continue
            if control.interrupted:
                aborted[name] = now
                transport.abort(CODE_INTERRUPTED, f"interrupted ({control.reason})")
            elif now >= deadline:
                aborted[name] = now
                transport.abort(CODE_DEADLINE, f"the node deadline of {opts.node_deadline_s:g} "
                                "s passed (all of its probes and performance checks)")
        if control.interrupted and live and all(
                n in aborted and now >= aborted[n] + ABORT_GRACE_S for n, _ in live):
            break  # workers stuck where an abort cannot reach: report without them
    pool.shutdown(wait=False, cancel_futures=True)
    with lock:
        for node in nodes:
            if node.name not in outcomes:
                why = (f"interrupted ({control.reason}): not probed" if control.interrupted
                       else "probes did not finish")
                outcomes[node.name] = _NodeOutcome([Finding(
                    node.name, node.pool, Layer.CONFIGURATION, "probes", "run",
                    "interrupted" if control.interrupted else "no result", FindingStatus.ERROR,
                    why, "probe")], [], None)
        return dict(outcomes)
