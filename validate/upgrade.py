"""``python -m validate upgrade``: the Kubernetes side of a rolling upgrade (playbooks/upgrade.yml).

    python -m validate upgrade plan   -i <inventory> [--limit PATTERN] [--serial N|P%]
                                      [--format text|json] [--kubeconfig FILE]
    python -m validate upgrade drain  -i <inventory> --node HOST [--timeout S]
                                      [--force] [--delete-emptydir-data]
                                      [--force-delete] [--dry-run]
    python -m validate upgrade mark   -i <inventory> --node HOST --state STATE [--detail TEXT]
    python -m validate upgrade finish -i <inventory> --node HOST

``plan`` reads what every node runs with drift's versions probes (validate/drift/probes.py:
kernel, driver library and module, the two disagreeing; the dpkg database against the package
pins of DCGM, containerd, the container toolkit and Kubernetes, validate/drift/pins.py) and each
Node's upgrade state: a node that differs from its pins, or whose roll stopped before ``done``,
is pending; a node at its pins is not drained. It lists the batches (``--serial`` as Ansible's
``serial`` reads it), the pods each drain would evict and the PodDisruptionBudgets that would
refuse it now. It writes nothing. A node whose versions cannot be read is listed as unreadable
and not upgraded.

``drain`` first reads the node's pods and the PDBs and asks the API server whether its user may
patch the Node and evict (with ``--force-delete``, delete) the pods (SelfSubjectAccessReview,
``kubectl auth can-i``): a cluster that serves no policy/v1 PDBs, a right it lacks or an answer
that is not what was asked for (validate/kube_response.py) stops it with the node as it was,
exit 2. Then ``kubectl drain``'s guards, still before any write: a bare pod (no controller
``ownerReference``: nothing recreates it) is refused unless ``--force`` (the inventory's
``gpuready_upgrade_drain_force``), a pod with ``emptyDir`` volumes (data lost with it) unless
``--delete-emptydir-data`` (``gpuready_upgrade_drain_delete_emptydir_data``); a finished pod
(Succeeded, Failed) passes both, as in kubectl. A refusal names every refused pod and the
variable that would let it go, changes nothing on the Node (no cordon, taint or state) and exits
1. Otherwise it records the state on the Node
(``<prefix>/upgrade-state``, ``<prefix>/upgrade-detail``), cordons it, puts the validation
taint on it (``<prefix>/validation=upgrading``: the gate lifts it only on a pass) and evicts its
pods through the Eviction API, so the API server enforces every PDB. DaemonSet pods and static
(mirror) pods are left, as ``kubectl drain --ignore-daemonsets`` leaves them. A refused
eviction (429) is asked again every few seconds until ``--timeout``; then the node is left
cordoned and tainted, its state ``drain-timeout`` with the pods and PDBs in the way, and the
command exits 1. Only ``--force-delete`` (the inventory's ``gpuready_upgrade_force_delete``)
deletes the pods still there at the timeout, PDBs notwithstanding; nothing else ever does.

``mark`` records a state (``upgrading``, ``validating``, ``failed``) with its detail. ``finish``
uncordons a node the gate has admitted (label ``<prefix>/validation=passed``, no validation
taint) and records ``done``; a node the gate did not admit stays cordoned, ``failed``, exit 1.

Every Node write is one JSON merge patch guarded by the ``resourceVersion`` it was decided on,
read again on 409 (as the gate does). Exit codes: 0 done; 1 a node is left out (drain timed out,
not admitted); 2 bad input, a refused request (403: named with what to do) or an answer that is
not what was asked for; 3 the API server cannot be reached or does not accept the credentials
(401).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from validate import gate, kube_response, runner
from validate.checks.base import NodeContext
from validate.drift import pins, probes
from validate.drift.model import FindingStatus, Layer
from validate.inventory import Node, load, profile_for
from validate.labels import UPGRADE_DETAIL, UPGRADE_STATE, taint_key
from validate.model import ExitCode
from validate.profiles import ProfileError
from validate.text import one_line
from validate.upgrade_cli import FAILED

STATE, DETAIL = UPGRADE_STATE, UPGRADE_DETAIL  # annotations under the prefix (the gate keeps them)
DRAINING, DRAINED, DRAIN_TIMEOUT = "draining", "drained", "drain-timeout"
DONE = "done"
TAINT_UPGRADING = "upgrading"
TAINT_EFFECT = "NoSchedule"
RETRY_S = 2.0
MAX_DETAIL = 1000
MIRROR = "kubernetes.io/config.mirror"
# kubectl drain's guards, each with the inventory variable (and the flag) that lets it go.
GUARD_BARE = "bare"
GUARD_EMPTYDIR = "emptydir"
FORCE_VAR = "gpuready_upgrade_drain_force"
EMPTYDIR_VAR = "gpuready_upgrade_drain_delete_emptydir_data"
FINISHED = ("Succeeded", "Failed")


class UpgradeError(gate.GateError):
    """The upgrade step cannot do its work (exit 2); the message says why."""


# -- the API ------------------------------------------------------------------------------------
class UpgradeApi(gate.KubeNodeApi):
    """The gate's Node client, plus what a drain needs: the node's pods, the PDBs, evictions."""

    def __init__(self, kubeconfig: Path | None) -> None:
        super().__init__(kubeconfig)
        self._policy = self._client.PolicyV1Api(self._api.api_client)
        self._authz = self._client.AuthorizationV1Api(self._api.api_client)

    def may(self, verb: str, resource: str, namespace: str = "",
            subresource: str = "") -> tuple[bool, str]:
        """Whether the kubeconfig's user may ``verb`` the core ``resource`` (a
        SelfSubjectAccessReview, what ``kubectl auth can-i`` asks), and the server's reason."""
        endpoint = "POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {
                    "verb": verb, "group": "", "resource": resource,
                    "subresource": subresource, "namespace": namespace}}}
        doc = self._call("review", endpoint, self._authz.create_self_subject_access_review,
                         body)
        review = self.checked(kube_response.obj, endpoint, doc, "SelfSubjectAccessReview",
                              "authorization.k8s.io/v1")
        status = review.get("status") or {}
        return status.get("allowed") is True, one_line(str(status.get("reason") or ""))

    def server_version(self) -> str:
        """The API server's ``gitVersion`` (``v1.37.2``), as ``kubectl version`` reads it."""
        endpoint = "GET /version"
        doc = self._call("read", endpoint,
                         self._client.VersionApi(self._api.api_client).get_code)
        version = doc.get("gitVersion") if isinstance(doc, Mapping) else None
        if not isinstance(version, str) or release(version) is None:
            raise UpgradeError(f"{endpoint}: the API server at {self.server} answered no "
                               f"Kubernetes version (gitVersion {one_line(repr(version))})")
        return version

    def list_pods(self, node_name: str) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={node_name}"
        endpoint = f"GET /api/v1/pods?fieldSelector={selector}"
        doc = self._call("list", endpoint, self._api.list_pod_for_all_namespaces,
                         field_selector=selector)
        pods = self.checked(kube_response.items, endpoint, doc, "Pod", "v1")
        # A pod of another node in the answer would be evicted from under its workload.
        elsewhere = [p for p in pods if (p.get("spec") or {}).get("nodeName") != node_name]
        if elsewhere:
            meta = elsewhere[0]["metadata"]
            raise UpgradeError(
                f"{endpoint}: the API server answered pods of other nodes too (first "
                f"{one_line(str(meta.get('namespace')))}/{one_line(meta['name'])} on "
                f"{one_line(str((elsewhere[0].get('spec') or {}).get('nodeName')))}); "
                "nothing was evicted")
        return [dict(p) for p in pods]

    def list_pdbs(self) -> list[dict[str, Any]]:
        endpoint = "GET /apis/policy/v1/poddisruptionbudgets"
        try:
            doc = self._call("list", endpoint,
                             self._policy.list_pod_disruption_budget_for_all_namespaces)
        except gate.NotFound as exc:
            raise UpgradeError(
                f"the API server at {self.server} does not serve PodDisruptionBudgets of "
                f"policy/v1 ({exc}): the drain evicts through the Eviction API so that every "
                "PDB holds, and cannot tell which would refuse without them (Kubernetes 1.21 "
                "or later serves policy/v1); nothing was changed") from None
        return [dict(p) for p in self.checked(kube_response.items, endpoint, doc,
                                              "PodDisruptionBudget", "policy/v1")]

    def evict(self, namespace: str, name: str) -> str:
        """``evicted``, ``gone`` (404); raises :class:`gate.TooManyRequests` when a PDB (or
        its controller not having counted yet) refuses."""
        endpoint = f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace}}
        try:
            doc = self._call("evict", endpoint, self._api.create_namespaced_pod_eviction, name,
                             namespace, body)
        except gate.NotFound:
            return "gone"
        self.checked(kube_response.one_of, endpoint, doc,
                     {"Status": "v1", "Eviction": "policy/v1"})
        return "evicted"

    def delete_pod(self, namespace: str, name: str) -> None:
        endpoint = f"DELETE /api/v1/namespaces/{namespace}/pods/{name}"
        with contextlib.suppress(gate.NotFound):
            doc = self._call("delete", endpoint, self._api.delete_namespaced_pod, name,
                             namespace)
            self.checked(kube_response.one_of, endpoint, doc, {"Pod": "v1", "Status": "v1"})


# -- pods and PDBs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodOnNode:
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    owner: str  # "ReplicaSet/web-abc", "" for a bare pod
    action: str  # evict | leave (daemonset, mirror)
    why: str = ""
    # kubectl drain's guards this pod's eviction meets (GUARD_BARE, GUARD_EMPTYDIR).
    guards: tuple[str, ...] = ()
    emptydir: tuple[str, ...] = ()  # its emptyDir volumes

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_on_node(pod: Mapping[str, Any]) -> PodOnNode:
    meta = pod.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    owner = f"{owners[0].get('kind')}/{owners[0].get('name')}" if owners else ""
    emptydir = tuple(str(v.get("name", "")) for v in (pod.get("spec") or {}).get("volumes") or []
                     if v.get("emptyDir") is not None)
    notes = ([] if owner else ["bare pod: nothing recreates it"]) + (
        [f"emptyDir data: {', '.join(emptydir)}"] if emptydir else [])
    action, why = "evict", "; ".join(notes)
    guards: tuple[str, ...] = ()
    if owners and owners[0].get("kind") == "DaemonSet":
        action, why = "leave", "DaemonSet"
    elif MIRROR in (meta.get("annotations") or {}):
        action, why = "leave", "static pod"
    elif (pod.get("status") or {}).get("phase") not in FINISHED:
        # kubectl drain lets a finished pod go without either flag: nothing runs to lose.
        guards = ((() if owner else (GUARD_BARE,))
                  + ((GUARD_EMPTYDIR,) if emptydir else ()))
    return PodOnNode(str(meta.get("namespace", "")), str(meta.get("name", "")),
                     str(meta.get("uid", "")), dict(meta.get("labels") or {}), owner, action,
                     why, guards, emptydir)


def guard_vars(pod: PodOnNode) -> list[str]:
    """The inventory variables a drain needs to evict ``pod`` (kubectl drain's guards)."""
    return [var for guard, var in ((GUARD_BARE, FORCE_VAR), (GUARD_EMPTYDIR, EMPTYDIR_VAR))
            if guard in pod.guards]


def refusals(pods: Sequence[PodOnNode], *, force: bool,
             delete_emptydir_data: bool) -> list[str]:
    """kubectl drain's refusals, one line per pod, naming what would let it go."""
    lines = []
    for pod in pods:
        if pod.action != "evict":
            continue
        if GUARD_BARE in pod.guards and not force:
            lines.append(f"{pod.ref}: a bare pod (no controller recreates it); "
                         f"{FORCE_VAR}: true evicts it (kubectl drain --force)")
        if GUARD_EMPTYDIR in pod.guards and not delete_emptydir_data:
            lines.append(f"{pod.ref}: emptyDir data ({', '.join(pod.emptydir)}) is lost with "
                         f"it; {EMPTYDIR_VAR}: true evicts it "
                         "(kubectl drain --delete-emptydir-data)")
    return lines


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against a pod's labels. An empty
    selector matches every pod of the namespace (policy/v1), a missing one none."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def pdbs_for(pod: PodOnNode, pdbs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pdbs if (p.get("metadata") or {}).get("namespace") == pod.namespace
            and selector_matches((p.get("spec") or {}).get("selector"), pod.labels)]


def pdb_text(pdb: Mapping[str, Any]) -> str:
    meta, status = pdb.get("metadata") or {}, pdb.get("status") or {}
    return (f"PDB {meta.get('namespace')}/{meta.get('name')} allows "
            f"{status.get('disruptionsAllowed', 0)} disruption(s)")


def blocking(pod: PodOnNode, pdbs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The PDBs that would refuse this pod's eviction now (none left to allow)."""
    return [pdb_text(p) for p in pdbs_for(pod, pdbs)
            if int((p.get("status") or {}).get("disruptionsAllowed", 0)) < 1]


# -- Node state ---------------------------------------------------------------------------------
def k8s_name(node: Node) -> str:
    return node.desired.gate.node_name or node.name


def node_state(node: Mapping[str, Any], prefix: str) -> tuple[str | None, str]:
    notes = (node.get("metadata") or {}).get("annotations") or {}
    return notes.get(f"{prefix}/{STATE}"), str(notes.get(f"{prefix}/{DETAIL}", ""))


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def state_patch(node: Mapping[str, Any], prefix: str, state: str, detail: str, *,
                cordon: bool | None = None, taint: bool | None = None) -> dict[str, Any]:
    """The merge patch recording ``state`` (and, when asked, cordoning or uncordoning and
    putting on or lifting the upgrading taint), guarded by the Node's resourceVersion."""
    meta = node.get("metadata") or {}
    patch: dict[str, Any] = {"metadata": {
        "resourceVersion": meta.get("resourceVersion"),
        "annotations": {f"{prefix}/{STATE}": state,
                        f"{prefix}/{DETAIL}": f"{_now()} {detail}".strip()[:MAX_DETAIL]}}}
    spec: dict[str, Any] = {}
    if cordon is not None:
        spec["unschedulable"] = True if cordon else None
    if taint is not None:
        key = taint_key(prefix)
        taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
        others = [t for t in taints if t.get("key") != key]
        if taint:
            ours = [t for t in taints if t.get("key") == key]
            # A failed node's taint stays as the gate set it: it says more than "upgrading".
            others += ours or [{"key": key, "value": TAINT_UPGRADING, "effect": TAINT_EFFECT}]
        spec["taints"] = others
    if spec:
        patch["spec"] = spec
    return patch


def write_state(api: gate.NodeApi, name: str, prefix: str, state: str, detail: str, *,
                cordon: bool | None = None, taint: bool | None = None) -> dict[str, Any]:
    """Read the Node, patch it, and on 409 read it again (up to the gate's MAX_ATTEMPTS)."""
    for _attempt in range(gate.MAX_ATTEMPTS):
        try:
            node = api.get_node(name)
        except gate.NotFound:
            raise UpgradeError(f"no Node {name!r} in the cluster (never joined?)") from None
        try:
            return api.patch_node(name, state_patch(node, prefix, state, detail,
                                                    cordon=cordon, taint=taint))
        except gate.Conflict:
            continue
    raise UpgradeError(f"Node {name}: still changing after {gate.MAX_ATTEMPTS} attempts")


# -- what the node runs, and the version skew policy ----------------------------------------------
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
# Kubernetes' version skew policy: the kubelet may be up to three minor versions older than
# kube-apiserver, never newer (https://kubernetes.io/releases/version-skew-policy/).
MAX_KUBELET_MINORS_BEHIND = 3


def release(text: str) -> tuple[int, int, int] | None:
    """The first ``X.Y.Z`` in ``text`` (``v1.37.2``, ``1.37.2-1.1``, ``containerd://2.2.9``,
    ``2.2.9-1~debian.12~bookworm``), or None."""
    m = _RELEASE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


@dataclass(frozen=True)
class Running:
    """What the Node's kubelet reports (``status.nodeInfo``): what really runs, which dpkg's
    answer does not say (a new package, an old process)."""

    kubelet: str = ""  # kubeletVersion, e.g. v1.37.2 ("": not reported)
    runtime: str = ""  # containerRuntimeVersion, e.g. containerd://2.2.9


def running(node: Mapping[str, Any]) -> Running:
    info = ((node.get("status") or {}).get("nodeInfo")) or {}
    return Running(str(info.get("kubeletVersion") or ""),
                   str(info.get("containerRuntimeVersion") or ""))


def running_pins(node: Node) -> tuple[str | None, str | None]:
    """The kubelet and containerd versions ``node`` is pinned to (None: not pinned)."""
    by_role = {p.role: p.version for p in pins.package_pins(node)}
    return by_role.get("kubelet"), by_role.get("containerd")


def running_differences(kubelet_pin: str | None, containerd_pin: str | None,
                        seen: Running) -> list[str]:
    """What runs that is not the pinned release, both as releases: ``kubelet running v1.37.1 ->
    v1.37.2`` (the Node's kubeletVersion, then the pin's release), ``containerd running 2.2.8 ->
    2.2.9``."""
    found = []
    if kubelet_pin and release(seen.kubelet) != release(kubelet_pin):
        found.append(f"kubelet running {seen.kubelet or 'unknown'} -> "
                     f"v{_release_text(kubelet_pin)}")
    runtime = seen.runtime.partition("://")[2]
    if containerd_pin and release(runtime) != release(containerd_pin):
        found.append(f"containerd running {runtime or 'unknown'} -> "
                     f"{_release_text(containerd_pin)}")
    return found


def _release_text(pin: str) -> str:
    found = release(pin)
    return ".".join(map(str, found)) if found else pin


def skew_refusals(nodes: Sequence[Node], server: str) -> list[str]:
    """Each node whose kubelet pin the version skew policy forbids against the API server
    ``server`` (``v1.37.2``): newer than it, or more than three minor versions older."""
    refused = []
    have = release(server)
    for node in nodes:
        try:
            pin = running_pins(node)[0]
        except pins.PinError:
            continue  # the plan names the node unreadable, and does not roll it
        want = release(pin or "")
        if have is None or want is None:
            continue
        if want > have:
            refused.append(f"{node.name}: kubelet_version {pin} is newer than the API server "
                           f"({server}): the kubelet must not be newer than kube-apiserver; "
                           "upgrade the control plane first")
        elif want[0] == have[0] and have[1] - want[1] > MAX_KUBELET_MINORS_BEHIND:
            refused.append(f"{node.name}: kubelet_version {pin} is more than "
                           f"{MAX_KUBELET_MINORS_BEHIND} minor versions older than the API "
                           f"server ({server}): the kubelet may be at most "
                           f"{MAX_KUBELET_MINORS_BEHIND} minors behind kube-apiserver")
    return refused


# -- plan ---------------------------------------------------------------------------------------
@dataclass
class NodePlan:
    host: str
    name: str
    reasons: list[str] = field(default_factory=list)  # versions that differ from the pins
    state: str | None = None
    detail: str = ""
    unreadable: str = ""
    pods: list[PodOnNode] = field(default_factory=list)
    blocked: dict[str, list[str]] = field(default_factory=dict)
    running: Running = field(default_factory=Running)

    @property
    def pending(self) -> bool:
        return not self.unreadable and (bool(self.reasons)
                                        or self.state not in (None, DONE))


def read_versions(node: Node, timeout_s: float, accept_unknown_host_keys: bool
                  ) -> tuple[list[str], str]:
    """(what differs from the pins, why the node could not be read)."""
    try:
        profile = profile_for(node)
    except ProfileError as exc:
        return [], str(exc)
    try:
        transport = runner.default_transport(node, accept_unknown_host_keys)
    except Exception as exc:  # a bad connection setting is this node's problem only
        return [], f"cannot set up the connection: {exc}"
    try:
        seen = probes.probe(NodeContext("upgrade-plan", node, profile, transport, timeout_s))
    except Exception as exc:  # a bug must cost one node, not the plan
        return [], f"the versions probe failed: {type(exc).__name__}: {exc}"
    finally:
        transport.close()
    return versions_from(node, seen)


def versions_from(node: Node, seen: probes.NodeProbe) -> tuple[list[str], str]:
    """(what differs from the pins, why the node could not be read) from drift's probes: the
    kernel and driver findings, then the package pins (DCGM, containerd, the container toolkit,
    Kubernetes) against the node's dpkg database. A node whose driver version could not be
    read (drift's ``driver`` error finding), or that has package pins and a dpkg database that
    could not be read, is unreadable, never "at the pins"."""
    if seen.unreachable:
        return [], seen.unreachable
    versions = [f for f in seen.findings if f.layer is Layer.VERSIONS]
    errors = [f"{f.item}: {f.detail or f.actual}" for f in versions
              if f.status is not FindingStatus.DRIFT]
    try:
        package_pins = pins.package_pins(node)
    except pins.PinError as exc:
        package_pins = ()
        errors.append(str(exc))
    if package_pins and seen.packages is None and not any(f.item == "packages"
                                                          for f in versions):
        errors.append("packages: the dpkg database could not be read")
    if errors:
        return [], "; ".join(errors)
    return [f"{f.item} {f.actual} -> {f.declared}" for f in versions] + [
        diff for pin in package_pins for diff in pins.differences(pin, seen.packages or {})], ""


def batches(hosts: Sequence[str], serial: str) -> list[list[str]]:
    """Ansible's ``serial`` over the pending hosts: a count, or a percentage of them (at least
    one host per batch)."""
    if not hosts:
        return []
    size = (max(1, int(len(hosts) * float(serial[:-1]) / 100)) if serial.endswith("%")
            else int(serial))
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def plan(nodes: Sequence[Node], api: UpgradeApi, prefix: str, *, timeout_s: float,
         concurrency: int, accept_unknown_host_keys: bool) -> list[NodePlan]:
    plans = [NodePlan(n.name, k8s_name(n)) for n in nodes]
    # The API first: one that cannot answer (or answers wrong) costs no node a probe, and a
    # pin the version skew policy forbids stops the roll before anything changes.
    server = api.server_version()
    refused = skew_refusals(nodes, server)
    if refused:
        raise UpgradeError("the version skew policy refuses these pins (nothing was changed): "
                           + "; ".join(refused))
    by_name = {(n.get("metadata") or {}).get("name"): n for n in api.list_nodes()}
    pdbs = api.list_pdbs()
    inventory = {n.name: n for n in nodes}
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(nodes)))) as pool:
        versions = list(pool.map(
            lambda n: read_versions(n, timeout_s, accept_unknown_host_keys), nodes))
    for p, (reasons, unreadable) in zip(plans, versions, strict=True):
        p.reasons, p.unreadable = reasons, unreadable
        node = by_name.get(p.name)
        if node is None:
            p.unreadable = p.unreadable or f"no Node {p.name!r} in the cluster"
            continue
        p.state, p.detail = node_state(node, prefix)
        p.running = running(node)
        if not p.unreadable:
            # A package at its pin does not make it run: the kubelet and containerd the Node
            # reports must be the pinned releases too.
            p.reasons += running_differences(*running_pins(inventory[p.host]), p.running)
        if p.pending:
            p.pods = [pod_on_node(pod) for pod in api.list_pods(p.name)]
            p.blocked = {pod.ref: b for pod in p.pods if pod.action == "evict"
                         and (b := blocking(pod, pdbs))}
    return plans


def plan_lines(plans: Sequence[NodePlan], serial: str) -> list[str]:
    pending = [p for p in plans if p.pending]
    groups = batches([p.host for p in pending], serial)
    current = [p.host for p in plans if not p.pending and not p.unreadable]
    unreadable = [p for p in plans if p.unreadable]
    lines = [f"upgrade plan: {len(pending)} of {len(plans)} node(s) to upgrade in "
             f"{len(groups)} batch(es) (serial {serial}); {len(current)} at the pins; "
             f"{len(unreadable)} unreadable"]
    by_host = {p.host: p for p in plans}
    for i, group in enumerate(groups, 1):
        lines.append(f"batch {i}: {', '.join(group)}")
        for host in group:
            p = by_host[host]
            why = "; ".join(p.reasons) or f"its last roll stopped at {p.state}"
            lines.append(f"  {host}: {why}" + (f" (state {p.state})" if p.state
                                               and p.reasons else ""))
            for pod in p.pods:
                verb = "evict" if pod.action == "evict" else "leave"
                needs = guard_vars(pod)
                note = ", ".join(x for x in (pod.owner, pod.why, *(
                    [f"refused unless {' and '.join(needs)}"] if needs else [])) if x)
                lines.append(f"    {verb} {pod.ref}" + (f" ({note})" if note else ""))
                lines += [f"      blocked now: {b}" for b in p.blocked.get(pod.ref, [])]
    lines += [f"{h}: at the pins{_runs(by_host[h].running)}, not drained" for h in current]
    lines += [f"{p.host}: unreadable, not upgraded: {p.unreadable}" for p in unreadable]
    return lines


def _runs(seen: Running) -> str:
    shown = ", ".join(x for x in (f"kubelet {seen.kubelet}" if seen.kubelet else "",
                                  seen.runtime) if x)
    return f" (runs {shown})" if shown else ""


def plan_json(plans: Sequence[NodePlan], serial: str) -> dict[str, Any]:
    pending = [p.host for p in plans if p.pending]
    return {
        "serial": serial, "batches": batches(pending, serial), "pending": pending,
        "current": [p.host for p in plans if not p.pending and not p.unreadable],
        "unreadable": {p.host: p.unreadable for p in plans if p.unreadable},
        "nodes": {p.host: {"node": p.name, "reasons": p.reasons, "state": p.state,
                           "detail": p.detail,
                           "running": {"kubelet": p.running.kubelet,
                                       "runtime": p.running.runtime},
                           "evict": [x.ref for x in p.pods if x.action == "evict"],
                           "leave": [x.ref for x in p.pods if x.action != "evict"],
                           "refused_unless": {x.ref: guard_vars(x) for x in p.pods
                                              if x.action == "evict" and guard_vars(x)},
                           "blocked": p.blocked} for p in plans},
        "lines": plan_lines(plans, serial),
    }


# -- drain --------------------------------------------------------------------------------------
def _say(out: TextIO, line: str) -> None:
    """One line of output; what the API server sent in it (pod names, its messages) cannot
    break the line or act on the terminal (validate/text.py)."""
    out.write(one_line(line) + "\n")


def permitted(api: UpgradeApi, name: str, evict: Sequence[PodOnNode], *,
              force_delete: bool) -> None:
    """Raise UpgradeError unless the kubeconfig's user may do every write the drain does:
    patch the Node, evict its pods in their namespaces, delete them with ``--force-delete``.
    Asked before the first write, so that a refusal never leaves a node cordoned with its
    pods on it."""
    needs = [("patch", "nodes", "", "")]
    for namespace in sorted({p.namespace for p in evict}):
        needs.append(("create", "pods", namespace, "eviction"))
        if force_delete:
            needs.append(("delete", "pods", namespace, ""))
    denied = []
    for verb, resource, namespace, sub in needs:
        allowed, reason = api.may(verb, resource, namespace, sub)
        if not allowed:
            what = (f"{verb} {resource}" + (f"/{sub}" if sub else "")
                    + (f" -n {namespace}" if namespace else ""))
            denied.append(what + (f" ({reason})" if reason else ""))
    if denied:
        raise UpgradeError(
            f"drain {name}: the kubeconfig's user may not {'; '.join(denied)} (asked the API "
            f"server at {api.server} with a SelfSubjectAccessReview); nothing was changed: "
            "grant it (`kubectl auth can-i <verb> <resource> -n <namespace>` says whether it "
            "has it) and drain again")


def drain(api: UpgradeApi, name: str, prefix: str, *, timeout_s: float, force_delete: bool,
          dry_run: bool, out: TextIO, force: bool = False, delete_emptydir_data: bool = False,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> ExitCode:
    pods = [pod_on_node(p) for p in api.list_pods(name)]
    evict = [p for p in pods if p.action == "evict"]
    # Read and ask before the first write: a cluster without PDBs to hold, an answer that is
    # not a pod list, or a right the drain lacks stops it with the node as it was.
    pdbs = api.list_pdbs()
    permitted(api, name, evict, force_delete=force_delete)
    guarded = refusals(pods, force=force, delete_emptydir_data=delete_emptydir_data)
    if guarded:
        # kubectl's guards, still before any write: the Node is not cordoned, tainted or marked.
        _say(out, f"drain {name}{' (dry run)' if dry_run else ''}: refused, as kubectl drain "
                  f"refuses; nothing changed on Node {name}:")
        for line in guarded:
            _say(out, f"  {line}")
        return ExitCode.CHECK_FAILED
    if dry_run:
        _say(out, f"drain {name} (dry run): would cordon, taint and evict {len(evict)} pod(s)")
        for pod in pods:
            _say(out, f"  {'evict' if pod.action == 'evict' else 'leave'} {pod.ref}"
                 + "".join(f"; blocked now: {b}" for b in blocking(pod, pdbs)))
        return ExitCode.OK
    write_state(api, name, prefix, DRAINING, f"evicting {len(evict)} pod(s)", cordon=True,
                taint=True)
    _say(out, f"drain {name}: cordoned and tainted; evicting {len(evict)} pod(s)")
    deadline = clock() + timeout_s
    left = {p.uid: p for p in evict}
    evicted: set[str] = set()
    refused: dict[str, str] = {}  # uid -> the API server's last refusal
    while True:
        for uid, pod in left.items():
            if uid in evicted:
                continue  # going: its kubelet confirms the deletion
            try:
                api.evict(pod.namespace, pod.name)
            except gate.TooManyRequests as exc:
                if refused.get(uid) != str(exc):
                    _say(out, f"  refused {pod.ref}: {exc}")
                refused[uid] = str(exc)
                continue
            except gate.Forbidden as exc:  # an admission policy: RBAC was asked before
                raise UpgradeError(f"{exc}. {name} is left cordoned and tainted (state "
                                   f"{DRAINING}) with {pod.ref} on it; drain again once its "
                                   "eviction is allowed") from None
            evicted.add(uid)
            refused.pop(uid, None)
            let_go = guard_vars(pod)
            _say(out, f"  evicted {pod.ref}"
                 + (f" ({pod.why}; {', '.join(let_go)})" if let_go else ""))
        present = {(p.get("metadata") or {}).get("uid") for p in api.list_pods(name)}
        left = {uid: p for uid, p in left.items() if uid in present}
        if not left:
            write_state(api, name, prefix, DRAINED, f"evicted {len(evict)} pod(s)")
            _say(out, f"drain {name}: done, {len(evict)} pod(s) evicted")
            return ExitCode.OK
        if clock() >= deadline:
            break
        sleep(RETRY_S)
    still = ", ".join(f"{p.ref} ({refused.get(uid, 'evicted, not gone yet')})"
                      for uid, p in left.items())
    if force_delete:
        for pod in left.values():
            api.delete_pod(pod.namespace, pod.name)
            _say(out, f"  deleted {pod.ref} (gpuready_upgrade_force_delete)")
        write_state(api, name, prefix, DRAINED,
                    f"timed out after {timeout_s:g} s; deleted by force: {still}")
        return ExitCode.OK
    write_state(api, name, prefix, DRAIN_TIMEOUT,
                f"timed out after {timeout_s:g} s; still on the node: {still}")
    _say(out, f"drain {name}: timed out after {timeout_s:g} s; left cordoned and tainted; "
         f"still on the node: {still}")
    return ExitCode.CHECK_FAILED


# -- finish -------------------------------------------------------------------------------------
# How long finish waits for a restarted kubelet to report its version on the Node.
RUNNING_WAIT_S = 60.0


def finish(api: UpgradeApi, name: str, prefix: str, out: TextIO,
           expect: tuple[str | None, str | None] = (None, None),
           wait_s: float = RUNNING_WAIT_S, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> ExitCode:
    """Uncordon a node the gate admitted and that runs its pins (``expect``: the kubelet and
    containerd pins); a node whose kubelet or containerd still reports the old release after
    ``wait_s`` (a package upgraded, the process not restarted) is not done."""
    deadline = clock() + wait_s
    while True:
        try:
            node = api.get_node(name)
        except gate.NotFound:
            raise UpgradeError(f"no Node {name!r} in the cluster (never joined?)") from None
        # The gate's word first: a node it did not admit is not waited on.
        labels = (node.get("metadata") or {}).get("labels") or {}
        ours = [t for t in (node.get("spec") or {}).get("taints") or []
                if t.get("key") == taint_key(prefix)]
        verdict = labels.get(f"{prefix}/validation", "none")
        if verdict != "passed" or ours:
            why = (f"the gate did not admit it (validation {verdict}"
                   + (f", taint {ours[0].get('value')}" if ours else "") + ")")
            write_state(api, name, prefix, FAILED, why)
            _say(out, f"upgrade {name}: {why}; left cordoned")
            return ExitCode.CHECK_FAILED
        stale = running_differences(*expect, running(node))
        if not stale or clock() >= deadline:
            break
        sleep(RETRY_S)
    if stale:
        why = (f"{'; '.join(stale)}: the node does not run its pins (a restart that did not "
               "happen?)")
        write_state(api, name, prefix, FAILED, why)
        _say(out, f"upgrade {name}: {why}; left cordoned")
        return ExitCode.CHECK_FAILED
    write_state(api, name, prefix, DONE, "admitted by the gate", cordon=False)
    _say(out, f"upgrade {name}: admitted; uncordoned")
    return ExitCode.OK


# -- command line -------------------------------------------------------------------------------
def cmd_upgrade(args: argparse.Namespace, stdout: TextIO, stderr: TextIO,
                api_factory: Callable[[Path | None], UpgradeApi] = UpgradeApi) -> ExitCode:
    try:
        return _cmd(args, stdout, api_factory)
    except gate.ApiUnavailable as exc:
        stderr.write(f"error: {exc}\n")
        return ExitCode.UNREACHABLE
    except (gate.GateError, gate.NotFound, pins.PinError) as exc:
        stderr.write(f"error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR


def _cmd(args: argparse.Namespace, stdout: TextIO,
         api_factory: Callable[[Path | None], UpgradeApi]) -> ExitCode:
    limit = getattr(args, "limit", None) if args.upgrade_cmd == "plan" else args.node
    nodes = load(args.inventory, limit)
    if args.upgrade_cmd != "plan":
        nodes = tuple(n for n in nodes if n.name == args.node)
    if not nodes:
        raise UpgradeError(f"no GPU node in {args.inventory} matches "
                           f"{limit!r}")
    setup = gate.setup_for(nodes, kubeconfig=args.kubeconfig, prefix=args.prefix)
    api = api_factory(setup.kubeconfig)
    if args.upgrade_cmd == "plan":
        plans = plan(nodes, api, setup.prefix, timeout_s=args.timeout,
                     concurrency=args.concurrency,
                     accept_unknown_host_keys=args.accept_unknown_host_keys)
        if args.format == "json":
            stdout.write(json.dumps(plan_json(plans, args.serial), indent=1) + "\n")
        else:
            # The plan's lines carry the nodes' versions and the API's names: one line each.
            stdout.write("\n".join(one_line(line) for line in plan_lines(plans, args.serial))
                         + "\n")
        return ExitCode.OK
    name = k8s_name(nodes[0])
    if args.upgrade_cmd == "drain":
        return drain(api, name, setup.prefix, timeout_s=args.timeout,
                     force_delete=args.force_delete, dry_run=args.dry_run, out=stdout,
                     force=args.force, delete_emptydir_data=args.delete_emptydir_data)
    if args.upgrade_cmd == "mark":
        write_state(api, name, setup.prefix, args.state, args.detail,
                    taint=True if args.state != FAILED else None)
        stdout.write(f"upgrade {name}: {args.state}\n")
        return ExitCode.OK
    return finish(api, name, setup.prefix, stdout, expect=running_pins(nodes[0]))
