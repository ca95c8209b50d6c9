"""What the gate would set on a Node, and what differs from what it has: pure functions.

:func:`desired_state` takes a node's declared identity (its pool and SKU profile, from the
inventory) and what a validation run measured on it, and says which labels, taint and
annotations it should carry. :func:`plan_node` compares that with a Node object (the API's JSON)
and returns the changes and the one merge patch that makes them. Neither talks to anything, so
the gate (validate/gate.py) and a drift check can both ask "what would you set on this node".

Under the prefix ``P`` (a DNS subdomain the site owns):

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
``P/validation``            ``passed`` | ``failed``
``P/validated-at``          the run (``20261202T101500Z``) that reached the current verdict
==========================  ================================================================

A node that fails keeps the taint ``P/validation=pending:NoSchedule`` (it is added back if
missing) and gets the annotation ``P/failed-checks`` (comma-separated codes); one that passes
loses both. Labels and annotations under ``P`` that are not wanted are removed; nothing outside
``P`` is touched. ``P/validated-at`` keeps its value while the verdict stays the same, so
validating a healthy fleet again changes nothing.

Hardware that contradicts the node's pool (GPU count, product, a PCIe board in an SXM pool)
fails with ``gate.hardware_mismatch``; GPU Feature Discovery labels (``nvidia.com/gpu.product``,
``.count``, ``.memory``) that contradict the hardware fail with ``gate.gfd_mismatch``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from validate.model import Status

CODE_HARDWARE = "gate.hardware_mismatch"
CODE_GFD = "gate.gfd_mismatch"
CODE_NOT_REGISTERED = "gate.not_registered"
PASSED = "passed"
FAILED = "failed"
TAINT_VALUE = "pending"
TAINT_EFFECT = "NoSchedule"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MEMORY = "nvidia.com/gpu.memory"
POOL_FIELDS = ("accelerator", "topology", "fabric", "workload", "sharing")

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class IdentityError(ValueError):
    """A node's declared identity cannot become labels (names the node and the field)."""


def check_prefix(prefix: str) -> str:
    """The prefix itself, or ValueError saying why it is not a DNS subdomain."""
    if not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix):
        raise ValueError(f"label prefix {prefix!r} is not a DNS subdomain (lowercase letters, "
                         "digits, '-' and '.', e.g. gpu.example.com)")
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
class Desired:
    """What the gate sets on a node."""

    labels: Mapping[str, str]  # every label under the prefix the node should have
    annotations: Mapping[str, str]  # every annotation under the prefix it should have
    tainted: bool  # whether it keeps <prefix>/validation=pending:NoSchedule
    verdict: str  # passed | failed
    codes: tuple[str, ...]  # why it failed (run codes and gate codes), sorted
    reasons: tuple[str, ...]  # the gate's own findings, in words


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


def desired_state(identity: NodeIdentity, results: NodeResults, prefix: str,
                  gfd: Mapping[str, str] | None = None) -> Desired:
    """Labels, taint and annotations for a node; ``gfd`` are its GPU Feature Discovery labels
    (:func:`gfd_of`), compared when given. Raises IdentityError on an identity that cannot
    be labelled."""
    p = check_prefix(prefix) + "/"
    name = identity.name
    codes = set(results.codes)
    reasons = _hardware_findings(identity, results)
    if reasons:
        codes.add(CODE_HARDWARE)
    gfd_reasons = _gfd_findings(identity, results, gfd or {})
    if gfd_reasons:
        codes.add(CODE_GFD)
    reasons += gfd_reasons
    passed = results.passed and not reasons
    count = results.gpu_count if results.gpu_count is not None else identity.gpu_count
    memory = results.gpu_memory_mib if results.gpu_memory_mib is not None \
        else identity.gpu_memory_mib
    topology = identity.gpu_pool.get("topology", "")
    nvlink = "nvswitch" if identity.nvswitch else (
        "nvlink" if identity.nvlinks_per_gpu > 0 else "none")
    labels = {
        p + "pool": identity.pool, p + "profile": identity.profile,
        p + "gpu-count": str(count), p + "gpu-memory-gib": str(round(memory / 1024)),
        p + "form-factor": form_factor(topology), p + "nvlink": nvlink,
        p + "validation": PASSED if passed else FAILED,
        p + "validated-at": re.sub(r"[^A-Za-z0-9._-]", "", results.run_id)[:63].strip("._-"),
    }
    for field in POOL_FIELDS:
        if identity.gpu_pool.get(field):
            labels[p + field] = identity.gpu_pool[field]
    for key, value in labels.items():
        _label_value(name, key, value)
    annotations = {} if passed else {p + "failed-checks": ",".join(sorted(codes))}
    return Desired(labels=labels, annotations=annotations, tainted=not passed,
                   verdict=PASSED if passed else FAILED,
                   codes=() if passed else tuple(sorted(codes)), reasons=tuple(reasons))


def taint_key(prefix: str) -> str:
    return f"{prefix}/validation"


def plan_node(node: Mapping[str, Any], desired: Desired, prefix: str) -> NodePlan:
    """The changes that take ``node`` (a Node object) to ``desired``, and the merge patch."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    p = prefix + "/"
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    wanted_labels = dict(desired.labels)
    # The validation time stays while the verdict does: a rerun that agrees changes nothing.
    stamp = p + "validated-at"
    if labels.get(p + "validation") == wanted_labels.get(p + "validation") and labels.get(stamp):
        wanted_labels[stamp] = labels[stamp]
    changes: list[Change] = []
    label_patch: dict[str, str | None] = {}
    for key in sorted(set(wanted_labels) | {k for k in labels if k.startswith(p)}):
        old, new = labels.get(key), wanted_labels.get(key)
        if old != new:
            changes.append(Change("label", key, old, new))
            label_patch[key] = new
    annotation_patch: dict[str, str | None] = {}
    for key in sorted(set(desired.annotations) | {k for k in annotations if k.startswith(p)}):
        old, new = annotations.get(key), desired.annotations.get(key)
        if old != new:
            changes.append(Change("annotation", key, old, new))
            annotation_patch[key] = new
    taints = list((node.get("spec") or {}).get("taints") or [])
    key = taint_key(prefix)
    ours = [t for t in taints if t.get("key") == key]
    wanted_taint = {"key": key, "value": TAINT_VALUE, "effect": TAINT_EFFECT}
    new_taints: list[dict[str, Any]] | None = None
    if desired.tainted and not any(t.get("value", "") == TAINT_VALUE
                                   and t.get("effect") == TAINT_EFFECT for t in ours):
        new_taints = [t for t in taints if t.get("key") != key] + [wanted_taint]
        changes.append(Change("taint", key, _taints_text(ours),
                              f"{TAINT_VALUE}:{TAINT_EFFECT}"))
    elif not desired.tainted and ours:
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
