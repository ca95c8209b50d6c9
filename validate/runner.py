"""Fan-out: run the selected checks on every node, bounded concurrency, one connection per
node, and turn every way a node can fail into rows, never a traceback.

Output: ``list[CheckResult]`` ordered by node then check run order; every node has at least
one row per selected check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime

from validate.checks import Check, NodeContext, ToolFailure, Verdict
from validate.inventory import Node
from validate.model import CODE_INTERNAL, CheckResult, Status, worst
from validate.profiles import Profile, ProfileError, load_profile
from validate.transport import Transport, TransportError
from validate.transport.local import LocalTransport
from validate.transport.ssh import SSHConfig, SSHTransport

LOG = logging.getLogger(__name__)
CODE_PROFILE = "profile.invalid"


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """Progress event: one node finished."""

    node: str
    status: Status
    failed_checks: tuple[str, ...]
    duration_s: float
    done: int
    total: int


def new_run_id(now: datetime | None = None) -> str:
    """Sortable, filesystem-safe run id: ``20261202T123456Z``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def default_transport(node: Node, accept_unknown_host_keys: bool = False) -> Transport:
    """SSH from the inventory's connection settings, or local for ansible_connection=local."""
    if node.connection == "local":
        return LocalTransport(node.name)
    return SSHTransport(
        SSHConfig(
            host=node.name,
            address=node.address,
            port=node.port,
            user=node.user,
            key_file=node.key_file,
            known_hosts=node.known_hosts,
            accept_unknown_host_keys=accept_unknown_host_keys or node.accept_unknown_host_keys,
        )
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _row(
    run_id: str, node: Node, profile: str, check: str, v: Verdict, duration_s: float
) -> CheckResult:
    return CheckResult(
        run_id,
        _now(),
        node.name,
        node.pool,
        profile,
        check,
        v.metric,
        v.value,
        v.unit,
        v.warn,
        v.fail,
        v.status,
        v.code,
        v.detail,
        round(duration_s, 3),
    )


def profile_for(node: Node) -> Profile:
    """The node's profile with its inventory overrides, as its checks judge against it (and as
    run.json records it). Raises ProfileError."""
    return load_profile(
        node.profile,
        node.vars.get("gpu_thresholds"),
        inventory_vars=node.vars,
        override_source=f"inventory gpu_thresholds ({node.name})",
    )


def run_node(
    node: Node,
    checks: Sequence[Check],
    run_id: str,
    transport: Transport,
    default_timeout_s: float = 60.0,
    profile: Profile | None = None,
) -> list[CheckResult]:
    """All selected checks on one node, as rows. Never raises for node or tool trouble."""
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
    ctx = NodeContext(run_id, node, profile, transport, default_timeout_s)
    rows: list[CheckResult] = []
    for i, check in enumerate(checks):
        start = time.monotonic()
        try:
            reason = check.skip_reason(ctx)
            verdicts = [Verdict("", Status.SKIP, "ok", reason)] if reason else check.evaluate(ctx)
        except TransportError as exc:
            # The node is gone: every check not yet run gets the same row, so the node stays
            # visible in the report with one row per selected check.
            for rest in checks[i:]:
                rows.append(
                    _row(
                        run_id,
                        node,
                        profile.name,
                        rest.id,
                        Verdict("", Status.ERROR, exc.code, exc.reason),
                        time.monotonic() - start,
                    )
                )
            break
        except ToolFailure as exc:
            verdicts = [Verdict("", exc.status, exc.code, exc.detail)]
        except Exception as exc:  # a bug in a check must not hide the other checks
            LOG.exception("check %s crashed on %s", check.id, node.name)
            verdicts = [Verdict("", Status.ERROR, CODE_INTERNAL, f"{type(exc).__name__}: {exc}")]
        took = time.monotonic() - start
        rows.extend(_row(run_id, node, profile.name, check.id, v, took) for v in verdicts)
    return rows


def run(
    nodes: Sequence[Node],
    checks: Sequence[Check],
    *,
    run_id: str,
    transport_for: Callable[[Node], Transport] = default_transport,
    concurrency: int = 16,
    default_timeout_s: float = 60.0,
    progress: Callable[[NodeOutcome], None] | None = None,
) -> list[CheckResult]:
    """Run ``checks`` on ``nodes`` with at most ``concurrency`` nodes at a time."""
    results: dict[str, list[CheckResult]] = {}
    lock = threading.Lock()
    done = 0

    def one(node: Node) -> tuple[Node, list[CheckResult], float]:
        start = time.monotonic()
        transport = transport_for(node)
        try:
            return (
                node,
                run_node(node, checks, run_id, transport, default_timeout_s),
                (time.monotonic() - start),
            )
        finally:
            transport.close()

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="validate") as pool:
        futures = [pool.submit(one, n) for n in nodes]
        for fut in as_completed(futures):
            node, rows, took = fut.result()
            with lock:
                results[node.name] = rows
                done += 1
                count = done
            if progress is not None:
                failed = tuple(
                    sorted({r.check for r in rows if r.status in (Status.FAIL, Status.ERROR)})
                )
                progress(
                    NodeOutcome(
                        node.name, worst([r.status for r in rows]), failed, took, count, len(nodes)
                    )
                )
    return [row for n in nodes for row in results.get(n.name, [])]
