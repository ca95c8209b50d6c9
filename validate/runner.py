"""Fan-out: run the selected checks on every node, bounded concurrency, one connection per
node, and turn every way a node can fail into rows, never a traceback.

Output: ``list[CheckResult]`` ordered by node then check run order; every node has at least
one row per selected check.

The calling thread is the supervisor: it starts a worker thread per node (at most
``concurrency`` at a time), and no wait of a worker can hold it. Each node has an overall
deadline: when it passes, the supervisor aborts the node's transport (which ends every blocked
wait on that node) and the node's remaining checks become ``host.deadline`` rows. A
:class:`RunControl` interrupt (SIGINT/SIGTERM in the CLI) aborts every running node
(``run.interrupted`` rows) and starts no queued node (their rows say "not started"). A worker
that still does not return :data:`ABORT_GRACE_S` after its abort (stuck where an abort cannot
reach, such as a name lookup) is reported without it. ``on_node_done`` receives each node's
rows as the node finishes, in the supervisor's thread (the CLI appends them to disk there).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import secrets
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType

from validate.checks import Check, NodeContext, ToolFailure, Verdict
from validate.checks.base import DEFAULT_PROBE_TIMEOUT_S
from validate.inventory import Node, profile_for
from validate.model import (
    CODE_DEADLINE,
    CODE_INTERNAL,
    CODE_INTERRUPTED,
    DEFAULT_NODE_DEADLINE_S,
    CheckResult,
    Status,
    worst,
)
from validate.profiles import Profile, ProfileError
from validate.transport import DEFAULT_MAX_OUTPUT_BYTES, Transport, TransportError
from validate.transport.local import LocalTransport
from validate.transport.ssh import SSHConfig, SSHTransport

LOG = logging.getLogger(__name__)
CODE_PROFILE = "profile.invalid"
# How long a worker may take to return after its transport was aborted.
ABORT_GRACE_S = 5.0
# How often the supervisor looks at deadlines and interrupts.
_TICK_S = 0.1
# The cyclic garbage collector's first threshold during a fan-out (Python's default is 700
# allocations). Parsing one node's ``nvidia-smi -q -x`` (135 KB for 8 GPUs) allocates ~10,000
# elements, so the default ran the collector ~14 times per node, and often over the whole heap
# (the Ansible inventory of every node included): a fifth of the validator's CPU at 1,000
# nodes (perf: gc_collect_main, visit_decref, visit_reachable). The parsed trees are freed by
# reference counting; the collector still runs, only less often. Measured, bench/scale.py.
_GC_THRESHOLD0 = 20_000


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """Progress event: one node finished."""

    node: str
    status: Status
    failed_checks: tuple[str, ...]
    duration_s: float
    done: int
    total: int


class RunControl:
    """Asks a running :func:`run` to stop. :meth:`interrupt` only sets attributes (no locks),
    so a signal handler may call it; the supervisor notices within :data:`_TICK_S`."""

    def __init__(self) -> None:
        self.reason = ""
        self.interrupted = False

    def interrupt(self, reason: str) -> None:
        if not self.interrupted:
            self.reason = reason
            self.interrupted = True


@contextlib.contextmanager
def on_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM while this is active (the previous ones after).
    Outside the main thread (where Python delivers no signal) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_on_signals(control: RunControl, *, second_stops_at_once: bool = True
                    ) -> contextlib.AbstractContextManager[None]:
    """SIGINT/SIGTERM ask the run to stop (``control.interrupt``); with
    ``second_stops_at_once`` a second one stops at once (KeyboardInterrupt)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if control.interrupted and second_stops_at_once:
            raise KeyboardInterrupt
        control.interrupt(signal.Signals(signum).name)

    return on_signals(handler)


def new_run_id(now: datetime | None = None) -> str:
    """Sortable, filesystem-safe run id: ``20261202T123456Z-3f9a``. The random suffix keeps two
    runs started in the same second apart (the report reserves the directory as well)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(2)}"


def default_transport(
    node: Node,
    accept_unknown_host_keys: bool = False,
    *,
    step_timeout_s: float = 10.0,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> Transport:
    """SSH from the inventory's connection settings, or local for ansible_connection=local.
    ``step_timeout_s`` bounds each step of the SSH conversation (connect, banner, key exchange,
    authentication, channel open, exec request, keepalive answer)."""
    if node.connection == "local":
        return LocalTransport(node.name, max_output_bytes=max_output_bytes)
    return SSHTransport(
        SSHConfig.with_step_timeout(
            step_timeout_s,
            host=node.name,
            address=node.address,
            port=node.port,
            user=node.user,
            key_file=node.key_file,
            known_hosts=node.known_hosts,
            accept_unknown_host_keys=accept_unknown_host_keys or node.accept_unknown_host_keys,
            max_output_bytes=max_output_bytes,
            **_route_settings(node),
        )
    )


def _route_settings(node: Node) -> dict[str, object]:
    """Jump hosts, proxy command and every known_hosts file of the node's route."""
    if node.route is None:
        return {}
    return {"jumps": node.route.jumps, "proxy_command": node.route.proxy_command,
            "more_known_hosts": node.route.known_hosts[1:]}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _row(
    run_id: str, node: Node, profile: str, check: str, v: Verdict, duration_s: float
) -> CheckResult:
    return CheckResult(
        run_id=run_id,
        time=_now(),
        node=node.name,
        pool=node.pool,
        profile=profile,
        check=check,
        metric=v.metric,
        value=v.value,
        unit=v.unit,
        warn=v.warn,
        fail=v.fail,
        status=v.status,
        code=v.code,
        detail=v.detail,
        duration_s=round(duration_s, 3),
    )


def run_node(
    node: Node,
    checks: Sequence[Check],
    run_id: str,
    transport: Transport,
    default_timeout_s: float = 60.0,
    profile: Profile | None = None,
    probe_timeout_s: float | None = DEFAULT_PROBE_TIMEOUT_S,
    previous: Mapping[tuple[str, str], tuple[float, str]] | None = None,
) -> list[CheckResult]:
    """All selected checks on one node, as rows. Never raises for node or tool trouble.
    ``previous``: the node's earlier values for checks that judge against history.
    ``probe_timeout_s``: after a command times out, how long ``true`` may take to show that
    the node still answers (NodeContext)."""
    if profile is None:
        try:
            profile = profile_for(node)
        except ProfileError as exc:
            return [
                _row(
                    run_id,
                    node,
                    node.profile,
                    c.id,
                    Verdict("", Status.ERROR, CODE_PROFILE, str(exc)),
                    0.0,
                )
                for c in checks
            ]
    ctx = NodeContext(run_id, node, profile, transport, default_timeout_s,
                      probe_timeout_s=probe_timeout_s, previous=previous or {})
    for check in checks:
        try:
            if check.skip_reason(ctx) is None:
                check.prefetch(ctx)
        except Exception:  # only a head start: the check runs its command itself
            LOG.exception("prefetch of %s failed on %s", check.id, node.name)
    try:
        return _run_checks(ctx, checks, run_id, node, profile)
    finally:
        ctx.settle()


def _run_checks(ctx: NodeContext, checks: Sequence[Check], run_id: str, node: Node,
                profile: Profile) -> list[CheckResult]:
    rows: list[CheckResult] = []
    for check in checks:
        start = time.monotonic()
        try:
            reason = check.skip_reason(ctx)
            gone = ctx.gone_error
            if reason and gone is not None:
                raise gone
            verdicts = [Verdict("", Status.SKIP, "ok", reason)] if reason else check.evaluate(ctx)
        except TransportError as exc:
            # The node is gone: every check not yet run gets the same row, so the node stays
            # visible in the report with one row per selected check. The later checks still
            # run, but every command they ask for raises this error at once (NodeContext.gone),
            # except one prefetched beside the failed command: its answer is its own.
            ctx.gone(exc)
            verdicts = [Verdict("", Status.ERROR, exc.code, exc.reason)]
        except ToolFailure as exc:
            verdicts = [Verdict("", exc.status, exc.code, exc.detail)]
        except ProfileError as exc:  # a key the check needs and the profile lacks
            verdicts = [Verdict("", Status.ERROR, CODE_PROFILE, str(exc))]
        except Exception as exc:  # a bug in a check must not hide the other checks
            LOG.exception("check %s crashed on %s", check.id, node.name)
            verdicts = [Verdict("", Status.ERROR, CODE_INTERNAL, f"{type(exc).__name__}: {exc}")]
        took = time.monotonic() - start
        rows.extend(_row(run_id, node, profile.name, check.id, v, took) for v in verdicts)
    return rows


def rows_for(
    run_id: str, node: Node, checks: Sequence[Check], code: str, detail: str
) -> list[CheckResult]:
    """One ``error`` row per check for a node none of ``checks`` ran on."""
    return [
        _row(run_id, node, node.profile, c.id, Verdict("", Status.ERROR, code, detail), 0.0)
        for c in checks
    ]


@dataclass
class _Running:
    node: Node
    transport: Transport
    started: float
    deadline: float
    aborted_at: float | None = None
    abort_code: str = ""
    abort_reason: str = ""

    def abort(self, code: str, reason: str) -> None:
        self.aborted_at, self.abort_code, self.abort_reason = time.monotonic(), code, reason
        try:
            self.transport.abort(code, reason)
        except Exception:  # a transport that fails to abort must not stop the supervisor
            LOG.exception("aborting %s failed", self.node.name)


@dataclass
class _Supervisor:
    nodes: Sequence[Node]
    checks: Sequence[Check]
    run_id: str
    transport_for: Callable[[Node], Transport]
    concurrency: int
    default_timeout_s: float
    node_deadline_s: float
    probe_timeout_s: float | None
    progress: Callable[[NodeOutcome], None] | None
    on_node_done: Callable[[Node, list[CheckResult]], None] | None
    control: RunControl
    results: dict[str, list[CheckResult]] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    finished: queue.SimpleQueue[tuple[str, list[CheckResult], float]] = field(
        default_factory=queue.SimpleQueue
    )
    previous: Mapping[str, Mapping[tuple[str, str], tuple[float, str]]] = field(
        default_factory=dict)

    def finish(self, node: Node, rows: list[CheckResult], took: float, notify: bool) -> None:
        self.results[node.name] = rows
        if self.on_node_done is not None:
            self.on_node_done(node, rows)
        if notify and self.progress is not None:
            failed = tuple(
                sorted({r.check for r in rows if r.status in (Status.FAIL, Status.ERROR)})
            )
            self.progress(
                NodeOutcome(node.name, worst([r.status for r in rows]), failed, took,
                            len(self.results), len(self.nodes))
            )

    def start(self, node: Node) -> None:
        try:
            transport = self.transport_for(node)
        except Exception as exc:  # a bad connection setting is this node's problem only
            LOG.exception("no transport for %s", node.name)
            self.finish(node, rows_for(self.run_id, node, self.checks, CODE_INTERNAL,
                                       f"cannot set up the connection: {exc}"), 0.0, True)
            return
        now = time.monotonic()
        self.running[node.name] = _Running(node, transport, now, now + self.node_deadline_s)
        threading.Thread(
            target=self.work, args=(node, transport), name=f"validate-{node.name}", daemon=True
        ).start()

    def work(self, node: Node, transport: Transport) -> None:
        start = time.monotonic()
        try:
            rows = run_node(node, self.checks, self.run_id, transport, self.default_timeout_s,
                            probe_timeout_s=self.probe_timeout_s,
                            previous=self.previous.get(node.name))
        except BaseException as exc:  # run_node turns failures into rows; this is a backstop
            LOG.exception("node %s crashed", node.name)
            rows = rows_for(self.run_id, node, self.checks, CODE_INTERNAL,
                            f"{type(exc).__name__}: {exc}")
        finally:
            try:
                transport.close()
            except Exception:
                LOG.exception("closing the connection to %s failed", node.name)
        self.finished.put((node.name, rows, time.monotonic() - start))

    def supervise(self) -> None:
        pending = deque(self.nodes)
        interrupted = False
        while pending or self.running:
            if self.control.interrupted and not interrupted:
                interrupted = True
                why = f"run interrupted ({self.control.reason})"
                for r in self.running.values():
                    r.abort(CODE_INTERRUPTED, why)
                while pending:
                    node = pending.popleft()
                    self.finish(node, rows_for(self.run_id, node, self.checks, CODE_INTERRUPTED,
                                               f"not started: {why}"), 0.0, False)
            while pending and len(self.running) < self.concurrency:
                self.start(pending.popleft())
            now = time.monotonic()
            for name, r in list(self.running.items()):
                if r.aborted_at is None and now >= r.deadline:
                    r.abort(CODE_DEADLINE, f"node deadline of {self.node_deadline_s:g} s passed")
                elif r.aborted_at is not None and now >= r.aborted_at + ABORT_GRACE_S:
                    LOG.warning("%s: worker did not stop %g s after its abort; reporting the "
                                "node without it", name, ABORT_GRACE_S)
                    del self.running[name]
                    self.finish(r.node, rows_for(self.run_id, r.node, self.checks, r.abort_code,
                                                 f"{r.abort_reason} (checks did not stop)"),
                                now - r.started, True)
            try:
                name, rows, took = self.finished.get(timeout=_TICK_S)
            except queue.Empty:
                continue
            done = self.running.pop(name, None)
            if done is not None:  # else: already reported without its worker
                self.finish(done.node, rows, took, True)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the collector's first threshold to :data:`_GC_THRESHOLD0` for the fan-out, and
    put back what was there after it (an embedding program keeps its own settings). A first
    threshold of 0 means automatic collection is off, and stays off."""
    before = gc.get_threshold()
    if before[0]:
        gc.set_threshold(max(before[0], _GC_THRESHOLD0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def run(
    nodes: Sequence[Node],
    checks: Sequence[Check],
    *,
    run_id: str,
    transport_for: Callable[[Node], Transport] = default_transport,
    concurrency: int = 16,
    default_timeout_s: float = 60.0,
    node_deadline_s: float = DEFAULT_NODE_DEADLINE_S,
    probe_timeout_s: float | None = DEFAULT_PROBE_TIMEOUT_S,
    progress: Callable[[NodeOutcome], None] | None = None,
    on_node_done: Callable[[Node, list[CheckResult]], None] | None = None,
    control: RunControl | None = None,
    previous: Mapping[str, Mapping[tuple[str, str], tuple[float, str]]] | None = None,
) -> list[CheckResult]:
    """Run ``checks`` on ``nodes`` with at most ``concurrency`` nodes at a time, each within
    ``node_deadline_s`` (see the module docstring for deadlines and interrupts); a node that
    stops answering (a command timed out, then ``true`` within ``probe_timeout_s`` did too) is
    reported ``host.unresponsive`` for the rest of its checks at once."""
    supervisor = _Supervisor(
        nodes, checks, run_id, transport_for, max(1, concurrency), default_timeout_s,
        node_deadline_s, probe_timeout_s, progress, on_node_done, control or RunControl(),
        previous=previous or {},
    )
    with _fewer_collections():
        supervisor.supervise()
    return [row for n in nodes for row in supervisor.results.get(n.name, [])]
