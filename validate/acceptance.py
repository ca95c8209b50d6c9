"""``validate acceptance``: the cluster's acceptance test, run as Jobs through its queues.

For each pool some team has quota on, the pool's acceptance Job (validate.cluster.render:
single-node NCCL all-reduce over all the node's GPUs at the profile's ``nccl.size_bytes``, then a
checkpoint written, synced, read back and compared) is submitted through that team's
LocalQueue, under a name of this run's own (``acceptance-<pool>-<run suffix>``, labelled
``gpuready.io/acceptance-run=<run id>``). Kueue admits it (or does not), the scheduler places it
and the kubelet runs it: nothing here picks a node. The run waits, bounded by ``timeout_s`` for
all pools together, then reads what happened from the API server and writes a run directory
like every other (``<out>/<run id>``, run kind ``acceptance``; ``<out>/latest-acceptance``
points at the newest complete one; ``latest``, which the gate reads, is not moved).

Rows, per pool, under the node the Pod ran on (a Job that never ran: under ``pool:<name>``, a
name no Node can have, so a pool that took no work never disappears from the report):

====================  ============  =========================================================
check                 metric        pass when
====================  ============  =========================================================
acceptance.queue      queue_wait_s  Kueue admitted the Workload (the wait: Job created to
                                    Admitted, server times); not admitted: fail, with Kueue's
                                    reason (``QuotaReserved``/``Admitted`` condition message)
acceptance.placement  validated     the Pod's Node carries ``<prefix>/validation=passed``
acceptance.job        duration_s    the Job completed (its Pod's exit and log tail otherwise)
acceptance.gpus       gpus          nccl-tests saw as many GPUs as the Job requested
acceptance.nccl       busbw_gbps    against the pool profile's ``nccl.allreduce_busbw_gbps``;
                      wrong_results and no wrong values (validate.checks.nccl's judgement)
acceptance.checkpoint verified      ``sha256sum -c`` of the checkpoint read back said OK;
                      write_mbps,   the write (``conv=fsync``) and read rates ``dd`` printed
                      read_mbps
====================  ============  =========================================================

metrics.prom adds ``gpuready_acceptance_*`` series labelled with pool, team and queue.

What it does not do yet (issue 43 lists the rest of the seed's steps): the data and weights
pull, the multi-node benchmark in Pods (the SSH fabric path covers bare nodes), the fixed
training window, delete-and-resume, the cost against a declared baseline.

Errors: the API server unreachable or refusing the credentials stops the run (exit 3) with
nothing submitted after it; a pool whose Job the server refuses (403, a namespace missing) gets
an error row and the other pools go on.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from validate.checks.base import ToolFailure, Verdict
from validate.checks.nccl import judge_allreduce
from validate.cluster.apply import ApiUnavailable, ApplyError, ClusterApi, NotFound
from validate.cluster.render import (
    ACCEPTANCE_CHECKPOINT_MIB,
    ACCEPTANCE_MARK,
    ACCEPTANCE_NCCL_BYTES,
    acceptance_job,
    acceptance_team,
)
from validate.cluster.spec import COST_BASELINE, ClusterSpec, PoolSpec, TeamSpec
from validate.cost import PoolCapacity
from validate.inventory import Node, profile_for
from validate.model import CheckResult, Status
from validate.parsers import ParseError, nccl
from validate.profiles import Band, ProfileError

RUN_LABEL = "gpuready.io/acceptance-run"
LATEST = "latest-acceptance"
POLL_S = 1.0
NOT_RUN_PREFIX = "pool:"
CHECKS = ("acceptance.queue", "acceptance.placement", "acceptance.job", "acceptance.gpus",
          "acceptance.nccl", "acceptance.checkpoint", "acceptance.cost")
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
# dd's summary: GNU `... copied, 0.1 s, 340 MB/s`, busybox `... copied, 0.1 seconds, 325MB/s`.
_DD = re.compile(r"^(\d+) bytes .*copied, ([0-9.]+) s(?:econds)?", re.MULTILINE)
_UPTIME = re.compile(r"^checkpoint bytes (\d+) uptime ([0-9.]+) ([0-9.]+)$", re.MULTILINE)


@dataclass
class PoolRun:
    """One pool's Job and what the API server said of it."""

    pool: PoolSpec
    team: TeamSpec
    name: str
    profile: str
    band: Band | None
    band_problem: str = ""
    uid: str = ""
    created: str = ""
    refused: str = ""
    deleted: bool = False  # by someone else while the run waited
    workload: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    log: str = ""
    node_labels: dict[str, str] | None = None
    events: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.refused) or self.deleted or any(
            _condition(self.job, kind).get("status") == "True" for kind in ("Complete", "Failed"))


def _condition(obj: Mapping[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _seconds_between(start: str, end: str) -> float | None:
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None
    return max((b - a).total_seconds(), 0.0)


def sections(log: str) -> dict[str, str]:
    """The acceptance script's log split at its marker lines: step name -> its output."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in log.splitlines(keepends=True):
        if line.startswith(ACCEPTANCE_MARK):
            current = line[len(ACCEPTANCE_MARK):].strip()
            out[current] = ""
        elif current is not None:
            out[current] += line
    return out


def dd_rate_mbps(text: str) -> float | None:
    """MB/s (10^6 bytes per second) of a checkpoint step: from ``dd``'s summary line where it
    printed one (GNU ``... copied, 0.1 s, 340 MB/s``, busybox with its third status line
    ``... copied, 0.1 seconds, 325MB/s``), else from the script's ``checkpoint bytes N uptime T0
    T1`` line (/proc/uptime, 10 ms: a step under 10 ms counts as 10 ms)."""
    found = _DD.search(text)
    if found is not None:
        moved, seconds = int(found.group(1)), float(found.group(2))
        return moved / seconds / 1e6 if seconds > 0 else None
    timed = _UPTIME.search(text)
    if timed is None:
        return None
    moved = int(timed.group(1))
    seconds = max(float(timed.group(3)) - float(timed.group(2)), 0.01)
    return moved / seconds / 1e6


def judge_log(log: str, gpus: int, band: Band | None, band_problem: str = ""
              ) -> list[tuple[str, Verdict]]:
    """The Pod's log judged: (check, verdict) for the GPUs, NCCL and checkpoint steps."""
    steps = sections(log)
    out: list[tuple[str, Verdict]] = []
    text = steps.get("nccl")
    if text is None:
        tail = log.strip()[-300:]
        out.append(("acceptance.nccl", Verdict(
            "busbw_gbps", Status.ERROR, "acceptance.no_output",
            "the Pod's log has no NCCL step (the script did not start, or the image is not the "
            "acceptance image): " + (repr(tail) if tail else "the log is empty"))))
        return out
    try:
        run = nccl.parse_text(text)
    except ParseError as exc:
        out.append(("acceptance.nccl", Verdict("busbw_gbps", Status.ERROR, "tool.parse_error",
                                               f"all_reduce_perf: {exc.reason}: "
                                               f"{text.strip()[-300:]}")))
        return out
    seen = len(run.devices)
    out.append(("acceptance.gpus", Verdict(
        "gpus", Status.PASS if seen == gpus else Status.FAIL,
        "ok" if seen == gpus else "acceptance.gpu_count",
        f"nccl-tests saw {seen} GPU(s) on {', '.join(run.hosts) or '?'}; the Job requested "
        f"{gpus}", float(seen), "count", None, float(gpus))))
    if band is None:
        out.append(("acceptance.nccl", Verdict("busbw_gbps", Status.ERROR, "profile.invalid",
                                               band_problem)))
    else:
        try:
            out += [("acceptance.nccl", v) for v in judge_allreduce([run], band)]
        except ToolFailure as exc:
            out.append(("acceptance.nccl", Verdict("busbw_gbps", Status.ERROR, exc.code,
                                                   exc.detail)))
    if "checkpoint-write" not in steps:
        return out
    write = dd_rate_mbps(steps.get("checkpoint-write", ""))
    read = dd_rate_mbps(steps.get("checkpoint-read", ""))
    for metric, rate in (("write_mbps", write), ("read_mbps", read)):
        if rate is not None:
            out.append(("acceptance.checkpoint", Verdict(metric, Status.PASS, "ok", "", rate,
                                                         "MB/s")))
    verified = re.search(r": OK\s*$", steps.get("checkpoint-read", ""), re.MULTILINE)
    out.append(("acceptance.checkpoint", Verdict(
        "verified", Status.PASS if verified and "done" in steps else Status.FAIL,
        "ok" if verified and "done" in steps else "acceptance.checkpoint_mismatch",
        "" if verified else "the checkpoint read back did not match what was written: "
        + steps.get("checkpoint-read", "").strip()[-300:], 1.0 if verified else 0.0, "bool")))
    return out


class Acceptance:
    """One run: submit, wait, read back, judge (module docstring)."""

    def __init__(self, spec: ClusterSpec, api: ClusterApi, nodes: Sequence[Node], run_id: str,
                 *, checkpoint_mib: int = ACCEPTANCE_CHECKPOINT_MIB,
                 pools: Sequence[str] = (), out: TextIO,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec, self.api, self.run_id, self.out, self.clock = spec, api, run_id, out, clock
        self.checkpoint_mib = checkpoint_mib
        self.by_pool = {n.pool: n for n in nodes}
        # The cost view of the validation run the gate judged, by pool (the CLI sets it from
        # --validation-run), and how to name that run; None: no view, the note says why.
        self.capacity: Mapping[str, PoolCapacity] | None = None
        self.capacity_note = "no validation run was given"
        self.skipped: list[str] = []
        self.runs: list[PoolRun] = []
        # The run's id in each Job's name (a Job name is a DNS label: 63 characters at most).
        suffix = re.sub(r"[^a-z0-9-]", "-", run_id.lower())[-30:].strip("-")
        for pool in spec.pools:
            if pools and pool.group not in pools and pool.name not in pools:
                continue
            team = acceptance_team(spec, pool)
            if team is None:
                self.skipped.append(pool.group)
                continue
            node = self.by_pool.get(pool.group)
            band, problem = None, ""
            try:
                profile = profile_for(node) if node else None
                band = profile.band("nccl.allreduce_busbw_gbps") if profile else None
            except ProfileError as exc:
                problem = str(exc)
            name = f"acceptance-{pool.name}"[:62 - len(suffix)].rstrip("-") + f"-{suffix}"
            self.runs.append(PoolRun(pool, team, name, node.profile if node else "", band,
                                     problem))

    def _nccl_bytes(self, run: PoolRun) -> int:
        node = self.by_pool.get(run.pool.group)
        try:
            return int(profile_for(node).value("nccl.size_bytes", int)) if node else \
                ACCEPTANCE_NCCL_BYTES
        except ProfileError:
            return ACCEPTANCE_NCCL_BYTES

    def preflight(self) -> None:
        """Kueue's Workload API is served (else nothing is submitted: ApplyError)."""
        group = "kueue.x-k8s.io/v1beta2"
        try:
            served = {r.get("name") for r in
                      self.api.request("GET", f"/apis/{group}").get("resources") or []}
        except NotFound:
            served = set()
        if "workloads" not in served:
            raise ApplyError(f"Kueue is not installed on {self.api.server}: the API serves no "
                             f"workloads.{group} (Kueue's release installs it; `cluster apply` "
                             "needs only the queues' CRDs); nothing was submitted")

    def submit(self) -> None:
        for run in self.runs:
            job = acceptance_job(self.spec, run.pool, run.team, name=run.name,
                                 nccl_bytes=self._nccl_bytes(run),
                                 checkpoint_mib=self.checkpoint_mib,
                                 labels={RUN_LABEL: self.run_id})
            path = f"/apis/batch/v1/namespaces/{run.team.namespace}/jobs"
            try:
                created = self.api.request("POST", path, (("fieldManager", "gpuready"),), job)
            except ApiUnavailable:
                raise
            except ApplyError as exc:
                run.refused = str(exc)
                self.out.write(f"acceptance: {run.pool.group}: the API server refused the Job: "
                               f"{exc}\n")
                continue
            run.uid = str(created.get("metadata", {}).get("uid", ""))
            run.created = str(created.get("metadata", {}).get("creationTimestamp", ""))
            self.out.write(f"acceptance: {run.pool.group}: Job {run.team.namespace}/{run.name} "
                           f"submitted to LocalQueue {run.team.queue} "
                           f"({run.pool.gpus_per_node} GPU(s))\n")

    def _refresh(self, run: PoolRun) -> None:
        ns = run.team.namespace
        try:
            run.job = self.api.request("GET",
                                       f"/apis/batch/v1/namespaces/{ns}/jobs/{run.name}")
        except NotFound:
            run.deleted = True
            return
        if (run.job.get("metadata") or {}).get("deletionTimestamp"):
            run.deleted = True  # being deleted: nothing of it will run
            return
        if _admitted(run.workload):
            return
        listing = self.api.request("GET", WORKLOADS.format(ns=ns))
        for item in listing.get("items") or []:
            owners = item.get("metadata", {}).get("ownerReferences") or []
            if any(o.get("uid") == run.uid for o in owners):
                run.workload = item
                if _admitted(item):
                    self.out.write(f"acceptance: {run.pool.group}: admitted by Kueue "
                                   f"({_admission(item)})\n")

    def wait(self, timeout_s: float) -> bool:
        """Poll until every Job finished or ``timeout_s`` passed; True when all finished."""
        deadline = self.clock() + timeout_s
        active = [r for r in self.runs if not r.refused]
        while active:
            for run in active:
                self._refresh(run)
            active = [r for r in active if not r.finished]
            if not active or self.clock() >= deadline:
                break
            time.sleep(POLL_S)
        return not active

    def collect(self) -> None:
        """Each Job's Pods, the log of the one that ran, its Node's labels, its events."""
        for run in self.runs:
            if run.refused:
                continue
            ns = run.team.namespace
            pods = self.api.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                    (("labelSelector", f"job-name={run.name}"),))
            run.pods = sorted(pods.get("items") or [],
                              key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""))
            ran = [p for p in run.pods if p.get("spec", {}).get("nodeName")]
            if ran:
                pod = ran[-1]
                try:
                    run.log = self.api.text(f"/api/v1/namespaces/{ns}/pods/"
                                            f"{pod['metadata']['name']}/log")
                except ApplyError as exc:
                    run.log = ""
                    run.events.append(f"log not readable: {exc}")
                try:
                    node = self.api.request("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
                    run.node_labels = dict(node.get("metadata", {}).get("labels") or {})
                except NotFound:
                    run.node_labels = {}
            events = self.api.request("GET", f"/api/v1/namespaces/{ns}/events")
            wanted = {run.name, *(p["metadata"]["name"] for p in run.pods)}
            for event in events.get("items") or []:
                involved = event.get("involvedObject") or {}
                if involved.get("name") in wanted and event.get("type") == "Warning":
                    run.events.append(f"{involved.get('kind')} {involved.get('name')}: "
                                      f"{event.get('reason')}: {event.get('message')}")

    def rows(self) -> list[CheckResult]:
        out = []
        for run in self.runs:
            mine = self._rows(run)
            first = mine[0]
            v = cost_verdict(run.pool, self.capacity, self.capacity_note)
            out += [*mine, dataclasses.replace(
                first, check="acceptance.cost", metric=v.metric, value=v.value, unit=v.unit,
                warn=v.warn, fail=v.fail, status=v.status, code=v.code, detail=v.detail)]
        return out

    def _rows(self, run: PoolRun) -> list[CheckResult]:
        ran = [p for p in run.pods if p.get("spec", {}).get("nodeName")]
        node = ran[-1]["spec"]["nodeName"] if ran else f"{NOT_RUN_PREFIX}{run.pool.name}"
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

        def row(check: str, v: Verdict) -> CheckResult:
            return CheckResult(self.run_id, now, node, run.pool.group, run.profile, check,
                               v.metric, v.value, v.unit, v.warn, v.fail, v.status, v.code,
                               v.detail, 0.0)

        where = f"Job {run.team.namespace}/{run.name} (LocalQueue {run.team.queue})"
        if run.refused:
            return [row("acceptance.queue", Verdict("queue_wait_s", Status.ERROR,
                                                    "acceptance.refused",
                                                    f"{where}: {run.refused}"))]
        out: list[CheckResult] = []
        admitted = _condition(run.workload, "Admitted")
        if _admitted(run.workload):
            wait = _seconds_between(run.created, str(admitted.get("lastTransitionTime", "")))
            out.append(row("acceptance.queue", Verdict(
                "queue_wait_s", Status.PASS, "ok",
                f"{where}: admitted by Kueue ({_admission(run.workload)})", wait, "s")))
        else:
            out.append(row("acceptance.queue", Verdict(
                "queue_wait_s", Status.FAIL, "acceptance.not_admitted",
                f"{where}: not admitted: {_pending_reason(run)}"
                + ("; the Job was deleted while the run waited for it" if run.deleted else ""))))
            return out
        if run.deleted:
            out.append(row("acceptance.job", Verdict(
                "duration_s", Status.FAIL, "acceptance.job_deleted",
                f"{where}: the Job was deleted while the run waited for it")))
            return out
        if not ran:
            out.append(row("acceptance.job", Verdict(
                "duration_s", Status.FAIL, "acceptance.not_scheduled",
                f"{where}: admitted, but no Pod ran: "
                + ("; ".join(run.events[-3:]) or "no Pod was scheduled in time"))))
            return out
        validated = (run.node_labels or {}).get(f"{self.spec.label_prefix}/validation")
        out.append(row("acceptance.placement", Verdict(
            "validated", Status.PASS if validated == "passed" else Status.FAIL,
            "ok" if validated == "passed" else "acceptance.unvalidated_node",
            f"ran on {node}, {self.spec.label_prefix}/validation={validated or '(none)'}",
            1.0 if validated == "passed" else 0.0, "bool")))
        job_status = (run.job or {}).get("status") or {}
        duration = _seconds_between(str(job_status.get("startTime", "")),
                                    str(job_status.get("completionTime", "")))
        failed = _condition(run.job, "Failed")
        if _condition(run.job, "Complete").get("status") == "True":
            out.append(row("acceptance.job", Verdict("duration_s", Status.PASS, "ok",
                                                     f"{where}: Complete", duration, "s")))
        elif failed.get("status") == "True":
            out.append(row("acceptance.job", Verdict(
                "duration_s", Status.FAIL, "acceptance.job_failed",
                f"{where}: Failed ({failed.get('reason')}: {failed.get('message')}); "
                f"log: {run.log.strip()[-300:]}")))
        else:
            out.append(row("acceptance.job", Verdict(
                "duration_s", Status.FAIL, "acceptance.timeout",
                f"{where}: still running when the run's time was up")))
        judged = judge_log(run.log, run.pool.gpus_per_node, run.band, run.band_problem)
        if run.events:  # what the cluster said about the Job and its Pod (log unreadable, ...)
            judged = [(check, dataclasses.replace(v, detail=f"{v.detail}; "
                                                  + "; ".join(run.events[-3:])))
                      if v.status is not Status.PASS else (check, v) for check, v in judged]
        out += [row(check, v) for check, v in judged]
        return out

    def metrics(self) -> str:
        """Prometheus series per pool, labelled with its pool, team and queue."""
        lines = ["# HELP gpuready_acceptance_passed 1 when no acceptance row of the pool "
                 "failed (warnings and skips allowed)", "# TYPE gpuready_acceptance_passed gauge",
                 "# HELP gpuready_acceptance_queue_wait_seconds Job created to admitted by "
                 "Kueue", "# TYPE gpuready_acceptance_queue_wait_seconds gauge",
                 "# HELP gpuready_acceptance_cost_per_gpu_hour effective cost per accepted "
                 "GPU-hour (validate.cost)", "# TYPE gpuready_acceptance_cost_per_gpu_hour gauge",
                 "# HELP gpuready_acceptance_cost_baseline_per_gpu_hour the pool's declared "
                 "baseline", "# TYPE gpuready_acceptance_cost_baseline_per_gpu_hour gauge"]
        rows = self.rows()
        for run in self.runs:
            mine = [r for r in rows if r.pool == run.pool.group]
            labels = (f'pool="{run.pool.group}",team="{run.team.name}",'
                      f'queue="{run.team.queue}"')
            # Warnings (the cost above its baseline) and skips do not fail an acceptance.
            passed = bool(mine) and not any(r.status in (Status.FAIL, Status.ERROR)
                                            for r in mine)
            lines.append(f"gpuready_acceptance_passed{{{labels}}} {int(passed)}")
            wait = next((r.value for r in mine if r.check == "acceptance.queue"
                         and r.value is not None), None)
            if wait is not None:
                lines.append(f"gpuready_acceptance_queue_wait_seconds{{{labels}}} {wait:g}")
            cost = next((r for r in mine if r.check == "acceptance.cost"
                         and r.value is not None), None)
            if cost is not None and cost.warn is not None:
                lines.append(f"gpuready_acceptance_cost_per_gpu_hour{{{labels}}} {cost.value:g}")
                lines.append(f"gpuready_acceptance_cost_baseline_per_gpu_hour{{{labels}}} "
                             f"{cost.warn:g}")
        return "\n".join(lines) + "\n"


def cost_verdict(pool: PoolSpec, capacity: Mapping[str, PoolCapacity] | None,
                 note: str) -> Verdict:
    """The pool's effective cost per accepted GPU-hour (validate.cost's view of the validation
    run) against its declared baseline: above it is a warning (a finding, not a broken
    cluster); what cannot be compared is a skip saying why."""
    metric = "cost_per_gpu_hour"
    baseline = pool.cost_baseline
    if baseline is None:
        return Verdict(metric, Status.SKIP, "acceptance.no_cost_baseline",
                       f"no {COST_BASELINE} for pool {pool.group}")
    if capacity is None:
        return Verdict(metric, Status.SKIP, "acceptance.no_cost_view", note)
    view = capacity.get(pool.group)
    if view is None:
        return Verdict(metric, Status.SKIP, "acceptance.no_cost_view",
                       f"{note}: it has no rows of pool {pool.group}")
    effective = view.cost_per_accepted_gpu_hour
    if effective is None:
        why = "; ".join([*(f"missing {m}" for m in view.missing), *view.errors, *view.notes])
        return Verdict(metric, Status.SKIP, "acceptance.no_cost_view",
                       f"{note}: no effective cost for pool {pool.group} ({why or '?'})")
    above = effective > baseline.per_gpu_hour
    return Verdict(
        metric, Status.WARN if above else Status.PASS,
        "acceptance.cost_above_baseline" if above else "ok",
        f"{effective:.2f} {view.currency} per accepted GPU-hour ({view.gpus_accepted} of "
        f"{view.gpus_declared} GPUs accepted; {note}) against {baseline.per_gpu_hour:.2f} "
        f"({baseline.source})", round(effective, 4), f"{view.currency}/GPU-h",
        baseline.per_gpu_hour, None)


def _admitted(workload: Mapping[str, Any] | None) -> bool:
    return _condition(workload, "Admitted").get("status") == "True"


def _admission(workload: Mapping[str, Any] | None) -> str:
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    flavors = sorted({f for a in admission.get("podSetAssignments") or []
                      for f in (a.get("flavors") or {}).values()})
    return (f"ClusterQueue {admission.get('clusterQueue', '?')}, flavor "
            f"{', '.join(flavors) or '?'}")


def _pending_reason(run: PoolRun) -> str:
    """Kueue's own words for a Workload it has not admitted."""
    if run.workload is None:
        return "Kueue made no Workload for the Job (is Kueue running, and its webhooks?)"
    for kind in ("QuotaReserved", "Admitted", "Evicted"):
        cond = _condition(run.workload, kind)
        if cond.get("message"):
            return f"{kind}={cond.get('status')} ({cond.get('reason')}): {cond['message']}"
    return "pending, Kueue gave no reason yet"

