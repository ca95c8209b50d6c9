"""What the gate sets on a Node, and what differs from what it has: pure functions.

:func:`decide` is the gate's decision, and the one drift compares against: from a node's
declared identity (its pool and SKU profile, from the inventory), the evidence a validation run
holds about it (:class:`NodeEvidence`, built by validate/evidence.py) and the Node as the API
server has it, it says which labels, taint and annotations the node should carry, or that the
gate leaves it as it is. :func:`plan_node` compares that with the Node object (the API's JSON)
and returns the changes and the one merge patch that makes them. Neither talks to anything.

Under the prefix ``P`` (a DNS subdomain the site owns; not ``kubernetes.io`` or ``k8s.io``
but for ``node-restriction.kubernetes.io``, which exists for labels a kubelet may not set):

==========================  ================================================================
``P/pool``                  inventory pool group (``pool_h100_sxm``)
``P/profile``               SKU profile (``h100-sxm5-80gb-8x``)
``P/accelerator``           ``gpu_pool.accelerator`` (``h100-80gb``)
``P/gpu-count``             GPUs the run counted (the profile's count when not measured)
``P/gpu-memory-gib``        per-GPU framebuffer the run measured, GiB rounded (``80``)
``P/form-factor``           ``sxm`` | ``pcie`` | ``other``, from ``gpu_pool.topology``
``P/topology``              ``gpu_pool.topology`` (``8gpu-sxm-nvlink``)
``P/nvlink``                ``nvswitch`` | ``nvlink`` | ``none``, from the profile
``P/fabric``, ``P/workload``, ``P/sharing``   ``gpu_pool``'s fields
``P/validation``            ``passed`` | ``failed`` | ``quarantined``
``P/last-run``              the last run that judged the node (``20261202T101500Z``)
``P/validated-at``          the last run that admitted it (kept through later failures)
==========================  ================================================================

Annotations under ``P``: ``failed-checks`` (comma-separated codes, while the node is out),
``last-run-time`` (when the last judging run measured the node, ISO 8601: a run older than that
never judges the node again), ``quarantine`` (JSON: the hardware-fault codes, the run and time
that found them) and ``released`` (JSON: who released the last quarantine, when and why).

The taint ``P/validation``: ``pending:NoSchedule`` from the join (never validated; the gate
leaves it to a node it does not judge), ``failed:<effect>`` while the node fails or is
quarantined (``NoSchedule`` or, per pool, ``NoExecute``), none once it passes.

What the gate accepts as evidence (validate/evidence.py names the problems): a run no older
than the pool's window that covers every check and holds finite values, for a node that is in
it, and no older than the run that last judged the node. Evidence that is stale, from a run
without the node, or older than the Node's last judgement leaves the node as it is
(``held``); evidence that is incomplete or holds a non-finite value keeps a failing node out
but never admits a passing one (``held`` too). Only a fresh, complete, finite pass admits.

Hardware faults (validate/actions.py marks them: Xid 79, a failed row remap, a missing GPU,
...) quarantine the node: it stays out through clean runs until an operator releases it
(``validate gate --release``, :func:`release_patch`); other failures clear on the next pass.
A release covers the evidence measured before it (the faults the operator saw and had
repaired): judged again on such a run, the node fails with its codes but is not quarantined
again, and the decision names the release (:attr:`Desired.released`). A run measured after
the release that finds a hardware fault quarantines the node again.

Hardware that contradicts the node's pool (GPU count, product, a PCIe board in an SXM pool)
fails with ``gate.hardware_mismatch``; GPU Feature Discovery labels (``nvidia.com/gpu.product``,
``.count``, ``.memory``) that contradict the hardware fail with ``gate.gfd_mismatch``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from validate.actions import is_hardware_fault
from validate.model import Status

CODE_HARDWARE = "gate.hardware_mismatch"
CODE_GFD = "gate.gfd_mismatch"
CODE_NOT_REGISTERED = "gate.not_registered"
# Evidence the gate does not act on (validate/evidence.py finds the first five).
CODE_EMPTY_RUN = "gate.empty_run"  # the run holds no rows at all: exit 2, nothing changed
CODE_STALE = "gate.stale_run"
CODE_INCOMPLETE = "gate.incomplete_run"
CODE_NON_FINITE = "gate.non_finite_value"
CODE_NOT_IN_RUN = "gate.node_not_in_run"
CODE_SUPERSEDED = "gate.superseded_run"  # older than the run that last judged the Node
CODE_QUARANTINED = "gate.quarantined"
# Problems that leave a node as it is whatever the run says about it; the others (incomplete,
# non-finite) still let a failure keep it out.
HOLDING = frozenset({CODE_STALE, CODE_NOT_IN_RUN, CODE_SUPERSEDED})
# Evidence the validators never write: a tool or file error (exit 2), not a verdict.
TOOL_ERRORS = frozenset({CODE_NON_FINITE, CODE_EMPTY_RUN})

PASSED = "passed"
FAILED = "failed"
QUARANTINED = "quarantined"
HELD = "held"  # not judged: the Node is left as it is
TAINT_PENDING = "pending"
TAINT_FAILED = "failed"
PENDING_EFFECT = "NoSchedule"  # the join's taint (roles/node_join/vars/main.yml)
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MEMORY = "nvidia.com/gpu.memory"
POOL_FIELDS = ("accelerator", "topology", "fabric", "workload", "sharing")
# Label and annotation names under the prefix.
VALIDATION = "validation"
LAST_RUN = "last-run"
VALIDATED_AT = "validated-at"
FAILED_CHECKS = "failed-checks"
LAST_RUN_TIME = "last-run-time"
QUARANTINE = "quarantine"
RELEASED = "released"
# A rolling upgrade's state on the Node (validate/upgrade.py writes them); the gate carries them
# over as they are: its patch in the middle of a roll must not erase where the roll stands.
UPGRADE_STATE = "upgrade-state"
UPGRADE_DETAIL = "upgrade-detail"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes reserves these for its own components; node-restriction.kubernetes.io is the one
# part of them it leaves to administrators (NodeRestriction keeps kubelets from setting it).
_RESERVED = ("kubernetes.io", "k8s.io")
_ADMIN_RESERVED = "node-restriction.kubernetes.io"


class IdentityError(ValueError):
    """A node's declared identity cannot become labels (names the node and the field)."""


class NotQuarantined(ValueError):
    """A release was asked for a node that is not quarantined."""


def check_prefix(prefix: str) -> str:
    """The prefix itself, or ValueError saying why the site cannot label under it: not a DNS
    subdomain, or under a domain Kubernetes reserves (``kubernetes.io``, ``k8s.io`` and their
    subdomains, but for ``node-restriction.kubernetes.io``)."""
    if not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix):
        raise ValueError(f"label prefix {prefix!r} is not a DNS subdomain (lowercase letters, "
                         "digits, '-' and '.', e.g. gpu.example.com)")
    admin = prefix == _ADMIN_RESERVED or prefix.endswith("." + _ADMIN_RESERVED)
    for reserved in _RESERVED:
        if (prefix == reserved or prefix.endswith("." + reserved)) and not admin:
            raise ValueError(
                f"label prefix {prefix!r} is under {reserved}, which Kubernetes reserves for "
                "its own components: use a domain the site owns (gpu.example.com), or a "
                f"subdomain of {_ADMIN_RESERVED} (gpu.example.com.{_ADMIN_RESERVED}) so that "
                "no kubelet can set the labels on itself")
    return prefix


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """A node as the inventory declares it."""

    name: str  # the Kubernetes Node name
    pool: str
    profile: str
    gpu_pool: Mapping[str, str]
    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int
    nvswitch: bool
    nvlinks_per_gpu: int
    host: str = ""  # the inventory host, when its Node has another name (node_join_node_name)

    @property
    def inventory_name(self) -> str:
        """The name the validators' results use."""
        return self.host or self.name


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """How the gate treats a node's pool: the label prefix and the failed taint's effect
    (``NoSchedule``, or ``NoExecute`` to evict what runs on a node that fails)."""

    prefix: str
    taint_effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class NodeResults:
    """What one validation run says about a node."""

    run_id: str
    status: Status  # worst row status
    codes: tuple[str, ...]  # codes of its failed and errored rows, sorted
    gpu_count: int | None  # gpu.count's measured value
    gpu_memory_mib: int | None  # gpu.memory's measured (smallest) value
    gpu_model_status: Status | None  # gpu.model's row
    gpu_model_detail: str

    @property
    def passed(self) -> bool:
        return self.status in (Status.PASS, Status.WARN, Status.SKIP)


@dataclass(frozen=True, slots=True)
class EvidenceProblem:
    """Why a run cannot admit a node: a ``gate.*`` code and the reason in words."""

    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeEvidence:
    """What a run holds about one node, and what keeps the gate from acting on it."""

    run_id: str
    measured_at: str | None  # ISO 8601: the node's first row in the run (None: unknown)
    results: NodeResults | None  # None: the node is not in the run
    problems: tuple[EvidenceProblem, ...] = ()


def not_in_run(run_id: str) -> NodeEvidence:
    """The evidence a run holds about a node it has no rows for."""
    return NodeEvidence(run_id, None, None, (EvidenceProblem(
        CODE_NOT_IN_RUN, f"run {run_id} has no rows for this node: it was not validated in it"),))


@dataclass(frozen=True, slots=True)
class Release:
    """An operator's release of a node's quarantine, as ``P/released`` records it."""

    by: str
    at: str  # ISO 8601
    reason: str
    codes: tuple[str, ...]  # the quarantine it lifted
    run: str  # the run that had found them

    def covers(self, evidence: NodeEvidence) -> bool:
        """Whether ``evidence`` predates the release (the operator released the node with
        these results known): measured at or before it, or, with no time known, the run that
        found the faults."""
        if evidence.measured_at:
            try:
                return parse_time(evidence.measured_at) <= parse_time(self.at)
            except ValueError:
                pass
        return bool(self.run) and evidence.run_id == self.run

    def __str__(self) -> str:
        return (f"released by {self.by or '?'} at {self.at or '?'}: {self.reason or '?'} "
                f"(lifted the quarantine for {', '.join(self.codes) or '?'} found by run "
                f"{self.run or '?'})")


@dataclass(frozen=True, slots=True)
class Desired:
    """What the gate sets on a node (for ``held``: what it has, left alone)."""

    labels: Mapping[str, str]  # every label under the prefix the node should have
    annotations: Mapping[str, str]  # every annotation under the prefix it should have
    taint: tuple[str, str] | None  # (value, effect) of <prefix>/validation; None: no taint
    verdict: str  # passed | failed | quarantined | held
    codes: tuple[str, ...]  # why it is out or held (run codes and gate codes), sorted
    reasons: tuple[str, ...]  # the gate's own findings, in words
    # The release the decision honours: the evidence predates it (None: none does).
    released: Release | None = None

    @property
    def hold(self) -> bool:
        """The gate leaves this node as it is."""
        return self.verdict == HELD

    @property
    def tainted(self) -> bool:
        return self.taint is not None


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # label | annotation | taint
    key: str
    old: str | None  # None: absent
    new: str | None

    def __str__(self) -> str:
        return f"{self.kind} {self.key}: {self.old or '<none>'} -> {self.new or '<none>'}"


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    changes: tuple[Change, ...]
    patch: Mapping[str, Any] | None  # a JSON merge patch, guarded by resourceVersion


def gfd_of(labels: Mapping[str, str]) -> dict[str, str]:
    """The GPU Feature Discovery labels the gate compares (those present)."""
    return {k: labels[k] for k in (GFD_PRODUCT, GFD_COUNT, GFD_MEMORY) if k in labels}


def form_factor(topology: str) -> str:
    words = topology.lower().split("-")
    return "sxm" if "sxm" in words else "pcie" if "pcie" in words else "other"


def run_label(run_id: str) -> str:
    """A run id as a label value (run ids the validators make are already one)."""
    return re.sub(r"[^A-Za-z0-9._-]", "", run_id)[:63].strip("._-")


def _label_value(node: str, what: str, value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise IdentityError(f"{node}: {what} {value!r} cannot be a label value (at most 63 "
                            "letters, digits, '-', '_' or '.', starting and ending with a "
                            "letter or digit)")
    return value


def _hardware_findings(identity: NodeIdentity, results: NodeResults) -> list[str]:
    found = []
    if results.gpu_count is not None and results.gpu_count != identity.gpu_count:
        found.append(f"{results.gpu_count} GPUs in a pool of {identity.gpu_count}-GPU nodes "
                     f"({identity.pool})")
    if results.gpu_model_status == Status.FAIL:
        found.append(f"GPU product is not the pool's {identity.gpu_model} "
                     f"({results.gpu_model_detail})")
    pool_form = form_factor(identity.gpu_pool.get("topology", ""))
    if pool_form == "sxm" and "pcie" in results.gpu_model_detail.lower():
        found.append(f"PCIe GPUs in an SXM pool ({identity.pool})")
    return found


def _gfd_findings(identity: NodeIdentity, results: NodeResults,
                  gfd: Mapping[str, str]) -> list[str]:
    found = []
    product = gfd.get(GFD_PRODUCT)
    expected = identity.gpu_model.replace(" ", "-")  # GFD writes spaces as '-'
    # Against the product the run saw: the pool's, unless the run found another (then the
    # hardware itself is the finding, and GFD may well be right about it).
    if product is not None and results.gpu_model_status != Status.FAIL and product != expected:
        found.append(f"GPU Feature Discovery labels the node {GFD_PRODUCT}={product}, the "
                     f"run found {expected}")
    count = results.gpu_count if results.gpu_count is not None else identity.gpu_count
    if GFD_COUNT in gfd and gfd[GFD_COUNT] != str(count):
        found.append(f"GPU Feature Discovery labels {GFD_COUNT}={gfd[GFD_COUNT]}, the run "
                     f"counted {count}")
    memory = results.gpu_memory_mib if results.gpu_memory_mib is not None \
        else identity.gpu_memory_mib
    if GFD_MEMORY in gfd and gfd[GFD_MEMORY] != str(memory):
        found.append(f"GPU Feature Discovery labels {GFD_MEMORY}={gfd[GFD_MEMORY]} MiB, the "
                     f"run measured {memory} MiB")
    return found


def parse_time(text: str) -> datetime:
    """An ISO 8601 time as the validators write it; one without a zone is UTC. ValueError
    when it is not one."""
    when = datetime.fromisoformat(text.strip())
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A node's quarantine as its annotation records it."""

    codes: tuple[str, ...]
    run: str
    since: str

    def to_json(self) -> str:
        return json.dumps({"codes": list(self.codes), "run": self.run, "since": self.since},
                          sort_keys=True)


def quarantine_of(node: Mapping[str, Any] | None, prefix: str) -> Quarantine | None:
    """The node's quarantine (None: not quarantined). An annotation someone garbled still
    quarantines: only a release lifts it."""
    text = _annotations(node).get(f"{prefix}/{QUARANTINE}")
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Quarantine(("unreadable",), "", "")
    codes = doc.get("codes")
    return Quarantine(tuple(str(c) for c in codes) if isinstance(codes, list) else (),
                      str(doc.get("run", "")), str(doc.get("since", "")))


def release_of(node: Mapping[str, Any] | None, prefix: str) -> Release | None:
    """The node's last release (``P/released``), None when it has none or it is garbled."""
    text = _annotations(node).get(f"{prefix}/{RELEASED}")
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return None
    codes = doc.get("codes")
    return Release(str(doc.get("by", "")), str(doc.get("at", "")), str(doc.get("reason", "")),
                   tuple(str(c) for c in codes) if isinstance(codes, list) else (),
                   str(doc.get("run", "")))


def _meta(node: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (node or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(node: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(_meta(node).get("labels") or {})


def _annotations(node: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(_meta(node).get("annotations") or {})


def _our_taints(node: Mapping[str, Any] | None, prefix: str) -> list[dict[str, Any]]:
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return [dict(t) for t in taints if t.get("key") == taint_key(prefix)]


def _held(node: Mapping[str, Any] | None, p: str,
          problems: list[EvidenceProblem]) -> Desired:
    """Leave the node as it is: what it carries under the prefix, and why."""
    ours = _our_taints(node, p.rstrip("/"))
    taint = ((str(ours[0].get("value", "")), str(ours[0].get("effect", "")))
             if len(ours) == 1 else None)
    return Desired(labels={k: v for k, v in _labels(node).items() if k.startswith(p)},
                   annotations={k: v for k, v in _annotations(node).items() if k.startswith(p)},
                   taint=taint, verdict=HELD,
                   codes=tuple(sorted({x.code for x in problems})),
                   reasons=tuple(x.reason for x in problems))


def _superseded(evidence: NodeEvidence, node: Mapping[str, Any] | None,
                p: str) -> EvidenceProblem | None:
    """The gate never goes back: a run that measured the node before the run that last
    judged it does not judge it again (the same run may be gated again)."""
    last_time = _annotations(node).get(p + LAST_RUN_TIME)
    last_run = _labels(node).get(p + LAST_RUN, "")
    if not last_time or not evidence.measured_at or last_run == run_label(evidence.run_id):
        return None
    try:
        older = parse_time(evidence.measured_at) < parse_time(last_time)
    except ValueError:
        return None  # an annotation someone garbled does not stop the gate
    if not older:
        return None
    return EvidenceProblem(CODE_SUPERSEDED, (
        f"run {evidence.run_id} measured the node at {evidence.measured_at}, before run "
        f"{last_run or '?'} ({last_time}) that last judged it: older evidence never overrides "
        "newer"))


def _quarantine(evidence: NodeEvidence, results: NodeResults, node: Mapping[str, Any] | None,
                prefix: str, release: Release | None) -> tuple[Quarantine | None, str | None]:
    """The node's quarantine after this evidence, and its annotation's text: the one it has,
    grown by the run's hardware faults, or a new one for them. Faults a release covers do not
    quarantine it again (it still fails with them until a run admits it)."""
    quarantine = quarantine_of(node, prefix)
    text = _annotations(node).get(f"{prefix}/{QUARANTINE}")
    hard = sorted(c for c in results.codes if is_hardware_fault(c))
    if hard and quarantine is None and release is None:
        quarantine = Quarantine(tuple(hard), evidence.run_id, evidence.measured_at or "")
        text = quarantine.to_json()
    elif hard and quarantine is not None and not set(hard) <= set(quarantine.codes):
        quarantine = Quarantine(tuple(sorted({*quarantine.codes, *hard})), quarantine.run,
                                quarantine.since)
        text = quarantine.to_json()
    return quarantine, text


def decide(identity: NodeIdentity, evidence: NodeEvidence, node: Mapping[str, Any] | None,
           policy: GatePolicy) -> Desired:
    """The gate's decision for one node: from its declared identity, what a run holds about
    it and the Node as the API server has it (``None`` when it has none), the labels, taint
    and annotations it should carry, or ``held``: leave it as it is (module docstring).
    Pure; raises IdentityError on an identity that cannot be labelled."""
    p = check_prefix(policy.prefix) + "/"
    problems = list(evidence.problems)
    superseded = _superseded(evidence, node, p)
    if superseded is not None:
        problems.append(superseded)
    held_by = {x.code for x in problems}
    results = evidence.results
    if results is None or held_by & HOLDING:
        return _held(node, p, problems)
    labels_now = _labels(node)
    annotations_now = _annotations(node)
    reasons = _hardware_findings(identity, results)
    codes = set(results.codes)
    if reasons:
        codes.add(CODE_HARDWARE)
    gfd_reasons = _gfd_findings(identity, results, gfd_of(labels_now))
    if gfd_reasons:
        codes.add(CODE_GFD)
    reasons += gfd_reasons
    failing = not results.passed or bool(reasons)
    if problems and not failing:
        return _held(node, p, problems)  # evidence that cannot admit, of a node that passed
    codes |= held_by
    reasons += [x.reason for x in problems]
    release = release_of(node, policy.prefix)
    if release is not None and not release.covers(evidence):
        release = None
    quarantine, quarantine_text = _quarantine(evidence, results, node, policy.prefix, release)
    if quarantine is not None:
        verdict = QUARANTINED
        codes |= {CODE_QUARANTINED, *quarantine.codes}
        reasons.append(
            f"quarantined for {', '.join(quarantine.codes)} (hardware fault, run "
            f"{quarantine.run or '?'} at {quarantine.since or '?'}): it stays out, clean runs "
            f"or not, until an operator releases it (validate gate --release {identity.name} "
            "--reason ...)")
    else:
        verdict = FAILED if failing else PASSED
    count = results.gpu_count if results.gpu_count is not None else identity.gpu_count
    memory = results.gpu_memory_mib if results.gpu_memory_mib is not None \
        else identity.gpu_memory_mib
    topology = identity.gpu_pool.get("topology", "")
    nvlink = "nvswitch" if identity.nvswitch else (
        "nvlink" if identity.nvlinks_per_gpu > 0 else "none")
    run = run_label(evidence.run_id)
    labels = {
        p + "pool": identity.pool, p + "profile": identity.profile,
        p + "gpu-count": str(count), p + "gpu-memory-gib": str(round(memory / 1024)),
        p + "form-factor": form_factor(topology), p + "nvlink": nvlink,
        p + VALIDATION: verdict, p + LAST_RUN: run,
    }
    if verdict == PASSED:
        labels[p + VALIDATED_AT] = run
    elif labels_now.get(p + VALIDATED_AT):
        labels[p + VALIDATED_AT] = labels_now[p + VALIDATED_AT]
    for pool_field in POOL_FIELDS:
        if identity.gpu_pool.get(pool_field):
            labels[p + pool_field] = identity.gpu_pool[pool_field]
    for key, value in labels.items():
        _label_value(identity.name, key, value)
    annotations: dict[str, str] = {}
    if verdict != PASSED:
        annotations[p + FAILED_CHECKS] = ",".join(sorted(codes))
    if evidence.measured_at:
        annotations[p + LAST_RUN_TIME] = evidence.measured_at
    if quarantine_text is not None:
        annotations[p + QUARANTINE] = quarantine_text
    for kept in (RELEASED, UPGRADE_STATE, UPGRADE_DETAIL):
        if p + kept in annotations_now:
            annotations[p + kept] = annotations_now[p + kept]
    if release is not None and verdict != PASSED:
        reasons.append(f"judged on run {evidence.run_id}, measured before the release: "
                       f"{release}")
    return Desired(labels=labels, annotations=annotations,
                   taint=None if verdict == PASSED else (TAINT_FAILED, policy.taint_effect),
                   verdict=verdict, codes=() if verdict == PASSED else tuple(sorted(codes)),
                   reasons=tuple(reasons), released=release)


def release_patch(node: Mapping[str, Any], prefix: str, *, by: str, at: str,
                  reason: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The merge patch that lifts a node's quarantine, and the release record it writes
    (``P/released``: who, when, why, and what was lifted). The taint stays: only a fresh,
    complete passing run admits the node. Raises NotQuarantined."""
    p = check_prefix(prefix) + "/"
    meta = _meta(node)
    quarantine = quarantine_of(node, prefix)
    if quarantine is None:
        raise NotQuarantined(f"{meta.get('name', '?')} is not quarantined (no {p}{QUARANTINE} "
                             "annotation): nothing to release")
    record = {"by": by, "at": at, "reason": reason, "codes": list(quarantine.codes),
              "run": quarantine.run, "since": quarantine.since}
    annotations: dict[str, str | None] = {
        p + QUARANTINE: None, p + RELEASED: json.dumps(record, sort_keys=True)}
    failed_checks = _annotations(node).get(p + FAILED_CHECKS)
    if failed_checks is not None and CODE_QUARANTINED in failed_checks.split(","):
        # What the gate writes for the same run after the release: out, not quarantined.
        annotations[p + FAILED_CHECKS] = ",".join(
            c for c in failed_checks.split(",") if c != CODE_QUARANTINED)
    patch_meta: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion"),
                                  "annotations": annotations}
    if _labels(node).get(p + VALIDATION) == QUARANTINED:
        patch_meta["labels"] = {p + VALIDATION: FAILED}
    return {"metadata": patch_meta}, record


def taint_key(prefix: str) -> str:
    return f"{prefix}/validation"


def plan_node(node: Mapping[str, Any], desired: Desired, prefix: str) -> NodePlan:
    """The changes that take ``node`` (a Node object) to ``desired``, and the merge patch
    (none for a node the gate holds)."""
    meta = _meta(node)
    name = str(meta.get("name", ""))
    if desired.hold:
        return NodePlan(name, (), None)
    p = prefix + "/"
    labels = _labels(node)
    annotations = _annotations(node)
    changes: list[Change] = []
    label_patch: dict[str, str | None] = {}
    for key in sorted(set(desired.labels) | {k for k in labels if k.startswith(p)}):
        old, new = labels.get(key), desired.labels.get(key)
        if old != new:
            changes.append(Change("label", key, old, new))
            label_patch[key] = new
    annotation_patch: dict[str, str | None] = {}
    for key in sorted(set(desired.annotations) | {k for k in annotations if k.startswith(p)}):
        old, new = annotations.get(key), desired.annotations.get(key)
        if old != new:
            changes.append(Change("annotation", key, old, new))
            annotation_patch[key] = new
    taints = [dict(t) for t in ((node.get("spec") or {}).get("taints") or [])]
    key = taint_key(prefix)
    ours = [t for t in taints if t.get("key") == key]
    new_taints: list[dict[str, Any]] | None = None
    if desired.taint is not None:
        value, effect = desired.taint
        if not (len(ours) == 1 and ours[0].get("value", "") == value
                and ours[0].get("effect") == effect):
            new_taints = [t for t in taints if t.get("key") != key] + [
                {"key": key, "value": value, "effect": effect}]
            changes.append(Change("taint", key, _taints_text(ours), f"{value}:{effect}"))
    elif ours:
        new_taints = [t for t in taints if t.get("key") != key]
        changes.append(Change("taint", key, _taints_text(ours), None))
    if not changes:
        return NodePlan(name, (), None)
    patch_meta: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
    if label_patch:
        patch_meta["labels"] = label_patch
    if annotation_patch:
        patch_meta["annotations"] = annotation_patch
    patch: dict[str, Any] = {"metadata": patch_meta}
    if new_taints is not None:
        # A merge patch replaces the list whole (as Node's taints are atomic anyway); the
        # resourceVersion guard keeps a taint someone added meanwhile from being lost.
        patch["spec"] = {"taints": new_taints}
    return NodePlan(name, tuple(changes), patch)


def _taints_text(taints: list[dict[str, Any]]) -> str | None:
    if not taints:
        return None
    return ",".join(f"{t.get('value', '')}:{t.get('effect', '')}" for t in taints)
