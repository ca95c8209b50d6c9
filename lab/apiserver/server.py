"""The stand-in's HTTPS front: authentication, authorization, admission, the REST verbs,
discovery, server-side tables for kubectl, and the controllers kubeadm relies on.

:class:`ApiServer` answers :class:`Request` objects (no sockets: tests drive it directly, and
:func:`serve` puts it behind a threading HTTPS server). What each part stands in for:

- authentication: client certificates signed by the cluster CA (CN user, O groups), static
  bearer tokens (kube-apiserver's ``--token-auth-file`` format in ``tokens.csv``), bootstrap
  tokens; anonymous otherwise.
- authorization: ``system:masters`` may do anything; the public-info and discovery roles;
  kubeadm's cluster-info role (anonymous may read ``kube-public/cluster-info``); the
  node-bootstrapper role (bootstrap tokens create CSRs and get Nodes); ``system:node`` (kubelets
  read Nodes and write Nodes and their status), narrowed by the NodeRestriction admission
  plugin (a kubelet may change only its own Node, never its taints after registration, never
  ``node-restriction.kubernetes.io`` or unknown ``kubernetes.io`` labels).
- controllers: CSR auto-approval and signing of kubelet client certificates, the token cleaner
  and bootstrap signer (see bootstrap), and node lifecycle (Ready turns Unknown when a kubelet
  stops posting status for ``node_grace_s``).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import random
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lab.apiserver import bootstrap, errors, patch, pki, selectors, validation
from lab.apiserver.errors import ApiError, Resource
from lab.apiserver.store import AuditLog, Key, Store, now_rfc3339

SIMULATED = "gpuready lab simulator"
KUBE_VERSION = "1.30.5"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
MASTERS = "system:masters"
NODES_GROUP = "system:nodes"
AUTHENTICATED = "system:authenticated"
ANONYMOUS = "system:anonymous"


@dataclass(frozen=True)
class ResourceType:
    plural: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...]
    subresources: tuple[str, ...]
    fields: dict[str, Callable[[dict[str, Any]], str]]

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def res(self) -> Resource:
        return Resource(self.plural, self.group)


def _meta(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda obj: str((obj.get("metadata") or {}).get(name, ""))


def _path(*parts: str) -> Callable[[dict[str, Any]], str]:
    def read(obj: dict[str, Any]) -> str:
        node: Any = obj
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, bool):
            return "true" if node else "false"
        return "" if node is None else str(node)
    return read


NODES = ResourceType("nodes", "node", "Node", "", "v1", False, ("no",), ("status",),
                     {"metadata.name": _meta("name"),
                      "spec.unschedulable": lambda o: "true" if (o.get("spec") or {}).get(
                          "unschedulable") else "false"})
NAMESPACES_RT = ResourceType("namespaces", "namespace", "Namespace", "", "v1", False, ("ns",),
                             ("status",), {"metadata.name": _meta("name"),
                                           "status.phase": _path("status", "phase")})
CONFIGMAPS = ResourceType("configmaps", "configmap", "ConfigMap", "", "v1", True, ("cm",), (),
                          {"metadata.name": _meta("name"), "metadata.namespace": _meta(
                              "namespace")})
SECRETS = ResourceType("secrets", "secret", "Secret", "", "v1", True, (), (),
                       {"metadata.name": _meta("name"), "metadata.namespace": _meta(
                           "namespace"), "type": _path("type")})
CSRS = ResourceType("certificatesigningrequests", "certificatesigningrequest",
                    "CertificateSigningRequest", "certificates.k8s.io", "v1", False, ("csr",),
                    ("approval", "status"), {"metadata.name": _meta("name"),
                                             "spec.signerName": _path("spec", "signerName")})
RESOURCES = (NODES, NAMESPACES_RT, CONFIGMAPS, SECRETS, CSRS)
VERBS = ["create", "delete", "get", "list", "patch", "update"]


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]
    uid: str = ""

    @property
    def node_name(self) -> str | None:
        if NODES_GROUP in self.groups and self.name.startswith("system:node:"):
            return self.name[len("system:node:"):]
        return None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    client_cert: tuple[str, tuple[str, ...]] | None = None  # verified (CN, O...)
    remote: str = ""


@dataclass
class Response:
    code: int
    body: dict[str, Any] | str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    state_dir: Path
    advertise_address: str
    port: int = 6443
    # Lab hosts' hardware dirs (<dir>/<node>/hw/faults.json): where the lab's join-fails fault
    # is read. None outside the lab (tests, benchmarks).
    faults_dir: Path | None = None
    node_grace_s: float = 40.0
    version: str = KUBE_VERSION


def _cluster_kubeconfig(ca_pem: bytes, server: str) -> str:
    # cluster-info's kubeconfig, in the exact shape kubeadm writes (tests/fixtures/k8s-api).
    ca = base64.b64encode(ca_pem).decode()
    return ("apiVersion: v1\nclusters:\n- cluster:\n"
            f"    certificate-authority-data: {ca}\n    server: {server}\n"
            '  name: ""\ncontexts: null\ncurrent-context: ""\nkind: Config\n'
            "preferences: {}\nusers: null\n")


def init_state(state_dir: Path, advertise_address: str, port: int = 6443,
               hostnames: tuple[str, ...] = ()) -> str:
    """Create a new cluster's state: PKI, namespaces, cluster-info and an admin token
    (returned; it is also in ``tokens.csv``). Refuses to overwrite an existing state."""
    if (state_dir / "tokens.csv").exists():
        raise FileExistsError(f"{state_dir} already holds a cluster")
    keys = pki.Pki(state_dir / "pki")
    pki.make_ca(keys)
    pki.make_serving_cert(keys, [advertise_address, "127.0.0.1"], list(hostnames))
    token = secrets.token_hex(24)
    fd = os.open(state_dir / "tokens.csv", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f'{token},kubernetes-admin,kubernetes-admin,"{MASTERS}"\n')
    store = Store(state_dir)
    for ns in NAMESPACES:
        store.create(("namespaces", "", ns), {
            "kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
    kubeconfig = _cluster_kubeconfig(keys.ca_cert.read_bytes(),
                                     f"https://{advertise_address}:{port}")
    store.create(("configmaps", "kube-public", "cluster-info"), {
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": kubeconfig}})
    return token


def _read_tokens(path: Path) -> dict[str, User]:
    users: dict[str, User] = {}
    if not path.exists():
        return users
    for line in path.read_text().splitlines():
        parts = line.split(",", 3)
        if len(parts) >= 3:
            groups = tuple(g for g in parts[3].strip('"').split(",") if g) if len(parts) > 3 \
                else ()
            users[parts[0]] = User(parts[1], (*groups, AUTHENTICATED), parts[2])
    return users


def _kube_label(key: str) -> bool:
    ns = key.split("/", 1)[0] if "/" in key else ""
    return any(ns == d or ns.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))


_KUBELET_LABELS = {
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
    "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch"}


def kubelet_may_set(key: str) -> bool:
    """NodeRestriction: may a kubelet set this label on its own Node?"""
    ns = key.split("/", 1)[0] if "/" in key else ""
    restricted = "node-restriction.kubernetes.io"
    if ns == restricted or ns.endswith("." + restricted):
        return False
    if _kube_label(key):
        return key in _KUBELET_LABELS or any(
            ns == d or ns.endswith("." + d) for d in ("kubelet.kubernetes.io",
                                                      "node.kubernetes.io"))
    return True


# -- printing -------------------------------------------------------------------------------
_ORDER = {
    "": ["kind", "apiVersion", "metadata", "immutable", "spec", "data", "binaryData",
         "stringData", "type", "status"],
    "metadata": ["name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
                 "generation", "creationTimestamp", "deletionTimestamp",
                 "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
                 "finalizers", "managedFields"],
    "spec": ["podCIDR", "podCIDRs", "providerID", "unschedulable", "taints", "configSource",
             "externalID", "request", "signerName", "expirationSeconds", "usages", "username",
             "uid", "groups", "extra", "finalizers"],
    "status": ["capacity", "allocatable", "phase", "conditions", "addresses",
               "daemonEndpoints", "nodeInfo", "images", "volumesInUse", "volumesAttached",
               "config", "runtimeHandlers", "features", "certificate"],
    "nodeInfo": ["machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
                 "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion",
                 "operatingSystem", "architecture"],
    "conditions": ["type", "status", "lastProbeTime", "lastHeartbeatTime", "lastUpdateTime",
                   "lastTransitionTime", "reason", "message"],
    "taints": ["key", "value", "effect", "timeAdded"],
    "addresses": ["type", "address"],
}
_SORTED_MAPS = {"labels", "annotations", "capacity", "allocatable", "data", "binaryData"}


def ordered(obj: Any, where: str = "") -> Any:
    """Go's encoding/json order: struct fields as declared, map keys sorted."""
    if isinstance(obj, list):
        return [ordered(v, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if where in _SORTED_MAPS:
        return {k: obj[k] for k in sorted(obj)}
    order = _ORDER.get(where, [])
    keys = [k for k in order if k in obj] + sorted(k for k in obj if k not in order)
    return {k: ordered(obj[k], k) for k in keys}


# Fields of map type in the kinds served: Go's omitempty drops them when empty, as it drops every
# empty slice; an empty struct (spec: {}) stays.
_MAP_FIELDS = {"labels", "annotations", "capacity", "allocatable", "data", "binaryData",
               "stringData", "extra"}


def omit_empty(obj: Any, key: str = "") -> Any:
    """An object as the real server would store and print it: empty lists and maps gone."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            value = omit_empty(v, k)
            if (isinstance(value, list) and not value) or (
                    isinstance(value, dict) and not value and k in _MAP_FIELDS):
                continue
            out[k] = value
        return out
    if isinstance(obj, list):
        return [omit_empty(v) for v in obj]
    return obj


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, as kubectl prints AGE."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: dict[str, Any]) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return human_duration((datetime.now(UTC) - then).total_seconds())


_NAME_DESC = ("Name must be unique within a namespace. Is required when creating resources, "
              "although some resources may allow a client to request the generation of an "
              "appropriate name automatically. Name is primarily intended for creation "
              "idempotence and configuration definition. Cannot be updated. More info: "
              "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_CREATED_DESC = ("CreationTimestamp is a timestamp representing the server time when this "
                 "object was created.")


def _column(name: str, desc: str, priority: int = 0, fmt: str = "",
            kind: str = "string") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": desc,
            "priority": priority}


NODE_COLUMNS = [
    _column("Name", _NAME_DESC, fmt="name"),
    _column("Status", "The status of the node"),
    _column("Roles", "The roles of the node"),
    _column("Age", _CREATED_DESC),
    _column("Version", "Kubelet Version reported by the node."),
    _column("Internal-IP", "List of addresses reachable to the node. Queried from cloud "
            "provider, if available.", 1),
    _column("External-IP", "List of addresses reachable to the node. Queried from cloud "
            "provider, if available.", 1),
    _column("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian "
            "GNU/Linux 7 (wheezy)).", 1),
    _column("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. "
            "3.16.0-0.bpo.4-amd64).", 1),
    _column("Container-Runtime", "ContainerRuntime Version reported by the node through "
            "runtime remote API (e.g. containerd://1.4.2).", 1),
]
DEFAULT_COLUMNS = [_column("Name", _NAME_DESC, fmt="name"),
                   _column("Created At", _CREATED_DESC, kind="date")]


def node_cells(node: dict[str, Any]) -> list[Any]:
    """printNode of kubectl's server-side printer."""
    status = node.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    states = []
    if "Ready" in conditions:
        states.append("Ready" if conditions["Ready"].get("status") == "True" else "NotReady")
    if not states:
        states.append("Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = (node.get("metadata") or {}).get("labels") or {}
    roles = sorted({k.split("/", 1)[1] for k in labels
                    if k.startswith("node-role.kubernetes.io/") and k.split("/", 1)[1]}
                   | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role")
                      else set()))
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        return next((a.get("address", "") for a in status.get("addresses") or []
                     if a.get("type") == kind), "<none>")

    return [node["metadata"]["name"], ",".join(states), ",".join(roles) or "<none>",
            _age(node), info.get("kubeletVersion", ""), address("InternalIP"),
            address("ExternalIP"), info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


# -- the server -----------------------------------------------------------------------------
class ApiServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = Store(config.state_dir)
        self.audit = AuditLog(config.state_dir / "audit.log")
        self.pki = pki.Pki(config.state_dir / "pki")
        self.static_tokens = _read_tokens(config.state_dir / "tokens.csv")
        self.started = time.time()
        self.sync_controllers()

    # -- controllers ---------------------------------------------------------------------
    def sync_controllers(self) -> None:
        """Token cleaner, bootstrap signer and node lifecycle, as one pass."""
        with self.store.lock:
            tokens = []
            for key, secret in self.store.items(SECRETS.key, "kube-system"):
                token = bootstrap.from_secret(secret)
                if token is None:
                    continue
                if token.expired():
                    self.store.delete(key)
                else:
                    tokens.append(token)
            info_key: Key = (CONFIGMAPS.key, "kube-public", "cluster-info")
            info = self.store.get(info_key)
            if info is not None:
                data = info.get("data") or {}
                wanted = bootstrap.cluster_info_data(data.get("kubeconfig", ""), tokens)
                if wanted != data:
                    self.store.replace(info_key, {**info, "data": wanted})
            self._node_lifecycle()

    def _node_lifecycle(self) -> None:
        now = datetime.now(UTC)
        for key, node in self.store.items(NODES.key):
            conditions = (node.get("status") or {}).get("conditions") or []
            ready = next((c for c in conditions if c.get("type") == "Ready"), None)
            if ready is None or ready.get("status") == "Unknown":
                continue
            beat = ready.get("lastHeartbeatTime")
            if not beat:
                continue
            age = (now - datetime.fromisoformat(beat.replace("Z", "+00:00"))).total_seconds()
            if age < self.config.node_grace_s:
                continue
            stamp = now_rfc3339()
            unknown = [{**c, "status": "Unknown", "reason": "NodeStatusUnknown",
                        "message": "Kubelet stopped posting node status.",
                        "lastTransitionTime": stamp} if c.get("type") in (
                            "Ready", "MemoryPressure", "DiskPressure", "PIDPressure") else c
                       for c in conditions]
            self.store.replace(key, {**node, "status": {**node["status"],
                                                        "conditions": unknown}})

    # -- authentication and authorization ------------------------------------------------
    def authenticate(self, req: Request) -> User:
        auth = req.headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise errors.unauthorized()
            if token in self.static_tokens:
                return self.static_tokens[token]
            match = bootstrap.TOKEN_RE.match(token)
            if match:
                secret = self.store.get((SECRETS.key, "kube-system",
                                         bootstrap.SECRET_PREFIX + match.group(1)))
                parsed = bootstrap.from_secret(secret) if secret else None
                if (parsed is not None and parsed.authentication and not parsed.expired()
                        and secrets.compare_digest(parsed.secret, match.group(2))):
                    return User(f"system:bootstrap:{parsed.token_id}",
                                (bootstrap.BOOTSTRAPPERS, *parsed.extra_groups,
                                 AUTHENTICATED))
            if req.client_cert is None:
                raise errors.unauthorized()
        if req.client_cert is not None:
            cn, orgs = req.client_cert
            return User(cn, (*orgs, AUTHENTICATED))
        return User(ANONYMOUS, ("system:unauthenticated",))

    def authorize(self, user: User, verb: str, rt: ResourceType | None, namespace: str,
                  name: str, subresource: str, path: str) -> None:
        if MASTERS in user.groups:
            return
        allowed = False
        if rt is None:
            public = path in ("/version", "/healthz", "/livez", "/readyz") or path.startswith(
                ("/healthz/", "/livez/", "/readyz/"))
            discovery = path in ("/api", "/apis", "/openapi/v2", "/openapi/v3") or \
                path.startswith(("/api/", "/apis/", "/openapi/"))
            allowed = verb == "get" and (public or (discovery and AUTHENTICATED in user.groups))
        elif (rt is CONFIGMAPS and namespace == "kube-public" and name == "cluster-info"
              and verb == "get"):
            allowed = True
        elif bootstrap.BOOTSTRAPPERS in user.groups:
            allowed = (rt is CSRS and verb in ("create", "get", "list") and not subresource) \
                or (rt is NODES and verb == "get" and not subresource)
        elif user.node_name is not None:
            allowed = (rt is NODES and verb in ("get", "list", "create", "update", "patch",
                                                "delete")) or (
                rt is CSRS and verb in ("create", "get", "list") and not subresource)
        if allowed:
            return
        who = f'User "{user.name}" cannot {verb} '
        if rt is None:
            raise errors.forbidden(None, "", who + f'path "{path}"')
        resource = rt.plural + (f"/{subresource}" if subresource else "")
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise errors.forbidden(rt.res, name, who + f'resource "{resource}" in API group '
                               f'"{rt.group}" {scope}')

    def node_restriction(self, user: User, verb: str, subresource: str, name: str,
                         old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        node = user.node_name
        if node is None:
            return
        if name != node:
            raise errors.forbidden(NODES.res, name,
                                   f'node "{node}" is not allowed to modify node "{name}"')
        if subresource or new is None:
            return
        new_labels = (new.get("metadata") or {}).get("labels") or {}
        if old is None:
            refused = sorted(k for k in new_labels if not kubelet_may_set(k))
            if refused:
                raise errors.forbidden(NODES.res, name, f'node "{node}" is not allowed to set '
                                       f'the following labels: {", ".join(refused)}')
            return
        if (old.get("spec") or {}).get("taints") != (new.get("spec") or {}).get("taints"):
            raise errors.forbidden(NODES.res, name,
                                   f'node "{node}" is not allowed to modify taints')
        old_labels = (old.get("metadata") or {}).get("labels") or {}
        changed = {k for k in set(old_labels) | set(new_labels)
                   if old_labels.get(k) != new_labels.get(k)}
        refused = sorted(k for k in changed if not kubelet_may_set(k))
        if refused:
            raise errors.forbidden(NODES.res, name, f'node "{node}" is not allowed to modify '
                                   f'labels: {", ".join(refused)}')

    def join_policy(self, csr_node: str) -> None:
        """The lab fault ``join-fails``: the cluster refuses this host's join, as an admission
        webhook enforcing a join policy would."""
        if self.config.faults_dir is None or not csr_node:
            return
        path = self.config.faults_dir / csr_node / "hw" / "faults.json"
        try:
            faults = json.loads(path.read_text()).get("faults", [])
        except (OSError, ValueError):
            return
        if "join-fails" in faults:
            raise ApiError(403, "Forbidden",
                           'admission webhook "join-policy.gpuready-lab.invalid" denied the '
                           f'request: node "{csr_node}" may not join this cluster '
                           f"({SIMULATED}: lab fault join-fails)", {})

    # -- request entry -------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        received = datetime.now(UTC)
        audit_id = str(uuid.uuid4())
        user: User | None = None
        # What the request turned out to address (objectRef, verb), for the audit event.
        seen: dict[str, Any] = {"verb": _verb_for(req), "ref": None}
        try:
            user = self.authenticate(req)
            response = self._dispatch(req, user, seen)
        except ApiError as exc:
            response = Response(exc.code, exc.status())
        except Exception as exc:
            response = Response(500, ApiError(500, "InternalError",
                                              f"Internal error occurred: {exc}",
                                              {"causes": [{"message": str(exc)}]}).status())
        response.headers.setdefault("Audit-Id", audit_id)
        if req.path not in ("/healthz", "/livez", "/readyz"):
            self._audit(req, user, seen["verb"], seen["ref"], response.code, audit_id,
                        received)
        return response

    def _audit(self, req: Request, user: User | None, verb: str,
               ref: dict[str, str] | None, code: int, audit_id: str,
               received: datetime) -> None:
        uri = req.path + ("?" + "&".join(f"{k}={v}" for k, v in req.query.items())
                          if req.query else "")
        event: dict[str, Any] = {
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": audit_id, "stage": "ResponseComplete", "requestURI": uri, "verb": verb,
            "user": {"username": user.name, "groups": list(user.groups)} if user
            else {"username": "", "groups": []},
            "sourceIPs": [req.remote] if req.remote else [],
            "userAgent": req.headers.get("user-agent", "")}
        if ref:
            event["objectRef"] = ref
        event["responseStatus"] = {"metadata": {}, "code": code}
        event["requestReceivedTimestamp"] = received.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event["stageTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.audit.write(event)

    def _dispatch(self, req: Request, user: User, seen: dict[str, Any]) -> Response:
        parts = [p for p in req.path.split("/") if p]
        verb = _verb_for(req)
        if not parts or parts[0] not in ("api", "apis") or (
                parts[0] == "api" and len(parts) < 3) or (parts[0] == "apis" and len(parts) < 4):
            self.authorize(user, verb, None, "", "", "", req.path)
            if req.method != "GET":
                raise ApiError(405, "MethodNotAllowed",
                               "the server does not allow this method on the requested "
                               "resource", {})
            return Response(200, self._non_resource(parts, req))
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        rt, namespace, name, sub = self._resolve(group, version, rest)
        verb = _verb_for(req, collection=not name)
        ref = {"resource": rt.plural, "namespace": namespace, "name": name,
               "apiGroup": rt.group, "apiVersion": rt.version, "subresource": sub}
        ref = {k: v for k, v in ref.items() if v}
        seen.update(verb=verb, ref=ref)
        self.authorize(user, verb, rt, namespace, name, sub, req.path)
        if rt.namespaced and namespace and self.store.get(
                (NAMESPACES_RT.key, "", namespace)) is None:
            raise errors.not_found(NAMESPACES_RT.res, namespace)
        if req.method == "GET":
            if req.query.get("watch") in ("true", "1"):
                raise errors.bad_request(f"watch is not supported by the {SIMULATED} API "
                                         "stand-in")
            if name:
                return self._get(rt, namespace, name, req)
            return self._list(rt, namespace, req)
        if req.method == "POST" and not name:
            created = self._create(rt, namespace, req, user)
            if isinstance(created.body, dict):  # the audit names what was created
                ref["name"] = created.body["metadata"]["name"]
            return created
        if req.method == "PUT" and name:
            return self._update(rt, namespace, name, sub, req, user)
        if req.method == "PATCH" and name:
            return self._patch(rt, namespace, name, sub, req, user)
        if req.method == "DELETE" and name and not sub:
            return self._delete(rt, namespace, name, user)
        raise errors.method_not_supported(rt.res, verb)

    def _resolve(self, group: str, version: str, rest: list[str]
                 ) -> tuple[ResourceType, str, str, str]:
        by_plural = {r.plural: r for r in RESOURCES if r.group == group and r.version == version}
        if not by_plural:
            raise errors.path_not_found()
        namespace = ""
        if (len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in by_plural
                and by_plural[rest[2]].namespaced):
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in by_plural or len(rest) > 3:
            raise errors.path_not_found()
        rt = by_plural[rest[0]]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in rt.subresources:
            raise errors.path_not_found()
        if rt.namespaced and name and not namespace:
            raise errors.path_not_found()
        return rt, namespace, name, sub

    # -- discovery -----------------------------------------------------------------------
    def version_info(self) -> dict[str, str]:
        major, minor = self.config.version.split(".")[:2]
        # Build metadata ("+...") is how distributions mark their builds (v1.31.6+rke2r1);
        # here it says, wherever a client prints the server version, that this is simulated.
        return {"major": major, "minor": minor,
                "gitVersion": f"v{self.config.version}+gpuready-lab-simulated",
                "gitCommit": SIMULATED, "gitTreeState": "clean",
                "buildDate": "1970-01-01T00:00:00Z", "goVersion": "go1.22.6",
                "compiler": "gc", "platform": "linux/amd64"}

    def _non_resource(self, parts: list[str], req: Request) -> dict[str, Any] | str:
        path = "/" + "/".join(parts)
        if path == "/version":
            return self.version_info()
        if path in ("/healthz", "/livez", "/readyz"):
            return "ok"
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{
                        "clientCIDR": "0.0.0.0/0",
                        "serverAddress": f"{self.config.advertise_address}:{self.config.port}"}]}
        if path == "/api/v1":
            return self._resource_list("", "v1")
        groups = sorted({r.group for r in RESOURCES if r.group})
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [self._group(g) for g in groups]}
        if len(parts) == 2 and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1])}
        if len(parts) == 3 and parts[1] in groups:
            return self._resource_list(parts[1], parts[2])
        if path == "/":
            return {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz",
                              "/version"] + [f"/apis/{g}" for g in groups]}
        raise errors.path_not_found()

    def _group(self, group: str) -> dict[str, Any]:
        version = next(r.version for r in RESOURCES if r.group == group)
        gv = {"groupVersion": f"{group}/{version}", "version": version}
        return {"name": group, "versions": [gv], "preferredVersion": gv}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        found = [r for r in RESOURCES if r.group == group and r.version == version]
        if not found:
            raise errors.path_not_found()
        resources: list[dict[str, Any]] = []
        for r in found:
            entry: dict[str, Any] = {"name": r.plural, "singularName": r.singular,
                                     "namespaced": r.namespaced, "kind": r.kind,
                                     "verbs": VERBS}
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            resources.append(entry)
            resources += [{"name": f"{r.plural}/{s}", "singularName": "",
                           "namespaced": r.namespaced, "kind": r.kind,
                           "verbs": ["get", "patch", "update"]} for s in r.subresources]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # -- reads ---------------------------------------------------------------------------
    def _get(self, rt: ResourceType, ns: str, name: str, req: Request) -> Response:
        obj = self.store.get((rt.key, ns, name))
        if obj is None:
            raise errors.not_found(rt.res, name)
        if _wants_table(req):
            return Response(200, self._table(rt, [obj], str(self.store.revision), req))
        return Response(200, self._out(rt, obj))

    def _list(self, rt: ResourceType, ns: str, req: Request) -> Response:
        try:
            by_label = selectors.label_matcher(req.query.get("labelSelector"))
            by_field = selectors.field_matcher(req.query.get("fieldSelector"), rt.fields,
                                               rt.plural)
        except selectors.SelectorError as exc:
            raise errors.bad_request(str(exc)) from None
        with self.store.lock:
            revision = str(self.store.revision)
            items = [obj for _, obj in self.store.items(rt.key, ns or None)
                     if by_label((obj.get("metadata") or {}).get("labels") or {})
                     and by_field(obj)]
        if _wants_table(req):
            return Response(200, self._table(rt, items, revision, req))
        # A list's items carry no kind/apiVersion (the raw NodeList of tests/fixtures).
        body = {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": revision},
                "items": [ordered({k: v for k, v in o.items() if k not in ("kind",
                                                                           "apiVersion")})
                          for o in items]}
        return Response(200, body)

    def _out(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        return ordered({**obj, "kind": rt.kind, "apiVersion": rt.api_version})

    def _table(self, rt: ResourceType, items: list[dict[str, Any]], revision: str,
               req: Request) -> dict[str, Any]:
        include = req.query.get("includeObject", "Metadata")
        rows = []
        for obj in items:
            cells = node_cells(obj) if rt is NODES else [
                obj["metadata"]["name"], obj["metadata"].get("creationTimestamp", "")]
            row: dict[str, Any] = {"cells": cells}
            if include == "Object":
                row["object"] = self._out(rt, obj)
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata",
                                 "apiVersion": "meta.k8s.io/v1",
                                 "metadata": ordered(obj["metadata"], "metadata")}
            rows.append(row)
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": revision},
                "columnDefinitions": NODE_COLUMNS if rt is NODES else DEFAULT_COLUMNS,
                "rows": rows}

    # -- writes --------------------------------------------------------------------------
    def _body(self, req: Request, rt: ResourceType) -> dict[str, Any]:
        try:
            obj = json.loads(req.body or b"null")
        except ValueError as exc:
            raise errors.bad_request(f"error decoding body: {exc}") from None
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        if obj.get("apiVersion") not in (None, rt.api_version):
            raise errors.bad_request(f"the API version in the data ({obj['apiVersion']}) does "
                                     f"not match the expected API version ({rt.api_version})")
        if obj.get("kind") not in (None, rt.kind):
            raise errors.bad_request(f"the kind in the data ({obj['kind']}) does not match the "
                                     f"expected kind ({rt.kind})")
        return obj

    def _validate(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt is NODES:
            problems = validation.validate_node(obj)
        else:
            problems = validation.validate_metadata(obj.get("metadata"), not rt.namespaced)
        if problems:
            name = str((obj.get("metadata") or {}).get("name", ""))
            raise errors.invalid(rt.kind, rt.group, name, problems)

    def _create(self, rt: ResourceType, ns: str, req: Request, user: User) -> Response:
        obj = self._body(req, rt)
        meta = dict(obj.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        for volatile in ("uid", "resourceVersion", "creationTimestamp", "selfLink"):
            meta.pop(volatile, None)
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            meta["namespace"] = ns
        obj = {**obj, "kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
        name = str(meta.get("name", ""))
        if rt is SECRETS:
            obj = _fold_string_data(obj)
        if rt is CSRS:
            obj = self._admit_csr(obj, user)
        obj = omit_empty(obj)
        self._validate(rt, obj)
        if rt is NODES:
            self.node_restriction(user, "create", "", name, None, obj)
        with self.store.lock:
            key = (rt.key, ns, name)
            if self.store.get(key) is not None:
                raise errors.already_exists(rt.res, name)
            stored = self.store.create(key, obj)
            if rt is CSRS:
                self._approve_and_sign(key)
            if rt is SECRETS and ns == "kube-system":
                self.sync_controllers()
        return Response(201, self._out(rt, stored))

    def _admit_csr(self, obj: dict[str, Any], user: User) -> dict[str, Any]:
        spec = dict(obj.get("spec") or {})
        try:
            request = base64.b64decode(spec.get("request", ""), validate=True)
            cn, _orgs = pki.csr_subject(request)
        except (ValueError, pki.CsrError) as exc:
            raise errors.invalid(CSRS.kind, CSRS.group, obj["metadata"].get("name", ""), [
                errors.invalid_value("spec.request", "<request>", str(exc))]) from None
        if not spec.get("signerName"):
            raise errors.invalid(CSRS.kind, CSRS.group, obj["metadata"].get("name", ""),
                                 [errors.required("spec.signerName")])
        if cn.startswith("system:node:"):
            self.join_policy(cn[len("system:node:"):])
        spec.update(username=user.name, groups=list(user.groups), uid=user.uid)
        return {**obj, "spec": spec, "status": {}}

    def _approve_and_sign(self, key: Key) -> None:
        """kube-controller-manager's csrapproving and csrsigning for kubelet client certs."""
        csr = self.store.get(key)
        assert csr is not None
        spec = csr["spec"]
        request = base64.b64decode(spec["request"])
        cn, orgs = pki.csr_subject(request)
        requester_ok = bootstrap.BOOTSTRAPPERS in spec.get("groups", []) or \
            spec.get("username") == cn
        if not (spec.get("signerName") == KUBELET_SIGNER and orgs == [NODES_GROUP]
                and cn.startswith("system:node:") and requester_ok):
            return
        stamp = now_rfc3339()
        seconds = int(spec.get("expirationSeconds") or pki.LEAF_DAYS * 86400)
        certificate = pki.sign_client_csr(self.pki, request, seconds)
        status = {"conditions": [{
            "type": "Approved", "status": "True", "reason": "AutoApproved",
            "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
            "lastUpdateTime": stamp, "lastTransitionTime": stamp}],
            "certificate": base64.b64encode(certificate).decode()}
        self.store.replace(key, {**csr, "status": status})

    def _write_checks(self, rt: ResourceType, current: dict[str, Any],
                      new: dict[str, Any], sub: str) -> dict[str, Any]:
        """Apply the type's update strategy: which parts a (sub)resource write may change."""
        meta = {**new.get("metadata", {})}
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if immutable in current["metadata"]:
                meta[immutable] = current["metadata"][immutable]
        new = {**new, "kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
        if sub == "status":
            # Status writes change status only (ResetObjectMetaForStatus, spec kept).
            return {**current, "status": new.get("status", {})}
        if "status" in current or "status" in new:
            new = {**new, "status": current.get("status", {})}
        if rt is SECRETS:
            new = _fold_string_data(new)
        return new

    def _commit(self, rt: ResourceType, key: Key, current: dict[str, Any],
                new: dict[str, Any], sub: str, user: User, wanted_rv: str) -> dict[str, Any]:
        """Validate, admit and store ``new`` over ``current`` (lock held)."""
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.res, key[2])
        new = omit_empty(self._write_checks(rt, current, new, sub))
        new["metadata"] = {**new["metadata"],
                           "resourceVersion": current["metadata"]["resourceVersion"]}
        self._validate(rt, new)
        if rt is NODES:
            self.node_restriction(user, "update", sub, key[2], current, new)
        if new == current:
            return current  # a no-op write stores nothing and keeps the resourceVersion
        stored = self.store.replace(key, new)
        if rt is SECRETS and key[1] == "kube-system":
            self.sync_controllers()
        return stored

    def _update(self, rt: ResourceType, ns: str, name: str, sub: str, req: Request,
                user: User) -> Response:
        obj = self._body(req, rt)
        body_name = (obj.get("metadata") or {}).get("name")
        if body_name != name:
            raise errors.bad_request(f"the name of the object ({body_name}) does not match the "
                                     f"name on the URL ({name})")
        with self.store.lock:
            key = (rt.key, ns, name)
            current = self.store.get(key)
            if current is None:
                raise errors.not_found(rt.res, name)
            wanted = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            stored = self._commit(rt, key, current, obj, sub, user, wanted)
        return Response(200, self._out(rt, stored))

    def _patch(self, rt: ResourceType, ns: str, name: str, sub: str, req: Request,
               user: User) -> Response:
        content_type = req.headers.get("content-type", "").split(";")[0].strip()
        if content_type not in patch.PATCH_TYPES:
            raise errors.unsupported_media_type(content_type, list(patch.PATCH_TYPES))
        if content_type == "application/apply-patch+yaml":
            raise errors.bad_request(f"server-side apply is not supported by the {SIMULATED} "
                                     "API stand-in")
        with self.store.lock:
            key = (rt.key, ns, name)
            current = self.store.get(key)
            if current is None:
                raise errors.not_found(rt.res, name)
            try:
                patched = patch.apply(content_type, copy.deepcopy(current), req.body, rt.kind)
            except patch.PatchApplyError:
                raise errors.unprocessable_patch() from None
            except patch.PatchError as exc:
                raise errors.bad_request(str(exc)) from None
            # A resourceVersion the patch sets is a precondition (optimistic concurrency).
            wanted = str((patched.get("metadata") or {}).get("resourceVersion") or "")
            stored = self._commit(rt, key, current, patched, sub, user, wanted)
        return Response(200, self._out(rt, stored))

    def _delete(self, rt: ResourceType, ns: str, name: str, user: User) -> Response:
        with self.store.lock:
            key = (rt.key, ns, name)
            current = self.store.get(key)
            if current is None:
                raise errors.not_found(rt.res, name)
            if rt is NODES:
                self.node_restriction(user, "delete", "", name, current, None)
            if rt is NAMESPACES_RT:
                raise errors.forbidden(rt.res, name, f"this namespace may not be deleted "
                                       f"({SIMULATED})")
            self.store.delete(key)
        details = {"name": name, "group": rt.group, "kind": rt.plural,
                   "uid": current["metadata"]["uid"]}
        return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success",
                              "details": {k: v for k, v in details.items() if v}})


def _fold_string_data(secret: dict[str, Any]) -> dict[str, Any]:
    string_data = secret.get("stringData")
    if not string_data:
        return {k: v for k, v in secret.items() if k != "stringData"}
    data = dict(secret.get("data") or {})
    data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
    return {**{k: v for k, v in secret.items() if k != "stringData"}, "data": data}


def _wants_table(req: Request) -> bool:
    return "as=Table" in req.headers.get("accept", "").replace(" ", "")


def _verb_for(req: Request, collection: bool | None = None) -> str:
    """The audit/authorization verb; ``collection`` when the resolved path names no object
    (guessed from the path's length before it is resolved)."""
    if collection is None:
        parts = [p for p in req.path.split("/") if p]
        collection = (len(parts) in (3, 5) and parts[0] == "api") or (
            len(parts) in (4, 6) and parts[0] == "apis" and not (
                len(parts) == 6 and parts[3] != "namespaces"))
    if req.method == "GET":
        if req.query.get("watch") in ("true", "1"):
            return "watch"
        return "list" if collection else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "deletecollection" if collection else "delete"}.get(
        req.method, req.method.lower())


# -- HTTPS ----------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpuready-lab-apiserver"
    sys_version = ""
    timeout = 30
    api: ApiServer

    def _handle(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self._read_body(headers)
        cert = None
        with contextlib.suppress(AttributeError, ValueError):
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            if peer:
                subject = [dict(rdn) for rdn in peer.get("subject", ())]
                cn = next((s["commonName"] for s in subject if "commonName" in s), "")
                orgs = tuple(s["organizationName"] for s in subject
                             if "organizationName" in s)
                cert = (cn, orgs)
        req = Request(self.command, split.path or "/", query, headers, body, cert,
                      self.client_address[0])
        response = self.api.handle(req)
        if isinstance(response.body, str):
            payload = response.body.encode()
            content_type = "text/plain; charset=utf-8"
        else:
            pretty = query.get("pretty") == "true" or headers.get("user-agent", "").startswith(
                ("curl", "Wget"))
            payload = (json.dumps(response.body, indent=2) if pretty else
                       json.dumps(response.body, separators=(",", ":"))).encode() + b"\n"
            content_type = "application/json"
        self.send_response(response.code)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _read_body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(headers.get("content-length", "0") or 0)
        return self.rfile.read(length) if length else b""

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        # Every request is in the audit log; stderr gets only what went wrong.
        if args and str(args[1] if len(args) > 1 else "").startswith("5"):
            super().log_message(format, *args)


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext) -> None:
        super().__init__(address, _Handler)
        self.context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs in the connection's own thread, so a slow or broken client
        # cannot hold up accept() for everyone else.
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            with contextlib.suppress(OSError):
                tls.close()


def tls_context(pki_files: pki.Pki) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(pki_files.serving_cert, pki_files.serving_key)
    # Client certificates are optional (tokens and anonymous requests have none) but, when
    # sent, must chain to the cluster CA.
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(pki_files.ca_cert)
    context.set_alpn_protocols(["http/1.1"])
    return context


def serve(config: Config, bind: str, ready: Callable[[], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever); controllers run every second."""
    api = ApiServer(config)
    handler = type("Handler", (_Handler,), {"api": api})
    server = _TLSServer((bind, config.port), tls_context(api.pki))
    server.RequestHandlerClass = handler
    stop = stop or threading.Event()

    def controllers() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(Exception):
                api.sync_controllers()

    threading.Thread(target=controllers, daemon=True).start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              daemon=True)
    thread.start()
    if ready is not None:
        ready()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()


def wait_listening(address: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False
