"""``cluster apply``: the rendered objects onto a cluster with server-side apply.

One field manager (``gpuready``) applies every object (``force``: the inventory wins over an
edit by hand), then prunes: each kind it renders is listed by the label selector
``app.kubernetes.io/managed-by=gpuready`` and what the inventory no longer declares is deleted
(a team's Namespace last, with what is in it). A change is one line; an object the server
returns as it was is no change, so a second run prints none. ``check`` sends the same requests
with ``dryRun=All`` and prints the server's answer as a diff against the live object.

Nothing it does not own is touched: before the first write it reads every object it would
apply, and one that exists without its label (a ClusterPolicy the chart made, a namespace made
by hand) stops the run with nothing applied. The only foreign objects it writes are Nodes, and
of a Node only the label ``nvidia.com/device-plugin.config`` (its own field under the field
manager); a Node that has not joined gets it on a later run. The acceptance Jobs are runs, not
state: ``validate acceptance`` submits them (validate/acceptance.py); this neither creates nor
prunes Jobs, so a run's Jobs and their Pods' logs stay until someone deletes them.

It needs the GPU Operator's and Kueue's CRDs installed (pinned releases: validate.cluster.render)
and checks that the server serves every kind before it writes; the controllers that act on the
objects are not its business (the lab runs Kueue's, built from source: lab/kueue; no GPU
Operator can run there).
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import urllib3
import yaml

from validate import kube_response
from validate.cluster.render import MANAGED_BY, MANAGER, ident, manifests, node_labels
from validate.cluster.spec import ClusterSpec
from validate.gate import _certificate_failure, _short
from validate.text import one_line

FIELD_MANAGER = MANAGER
APPLY_PATCH = "application/apply-patch+yaml"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
CONTROLLERS_NOTE = ("these are objects only: the GPU Operator and Kueue controllers act on "
                    "them once installed (the gpuready lab runs Kueue's manager, built from "
                    "source, and no GPU Operator: no images can be pulled there)")


@dataclass(frozen=True, slots=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def collection(self, namespace: str | None = None) -> str:
        base = ("/api/" if "/" not in self.api_version else "/apis/") + self.api_version
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}"


# Every kind the renderer makes, in apply order; prune goes the other way.
KINDS = (
    Kind("v1", "Namespace", "namespaces", False),
    Kind("v1", "ConfigMap", "configmaps", True),
    Kind("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False),
    Kind("kueue.x-k8s.io/v1beta2", "Topology", "topologies", False),
    Kind("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", False),
    Kind("kueue.x-k8s.io/v1beta2", "ClusterQueue", "clusterqueues", False),
    Kind("v1", "ResourceQuota", "resourcequotas", True),
    Kind("v1", "LimitRange", "limitranges", True),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    Kind("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues", True),
)
NODE = Kind("v1", "Node", "nodes", False)
_BY_KIND = {k.kind: k for k in KINDS}
# What the server adds that is no part of the declared object.
_SERVER_META = ("managedFields", "resourceVersion", "generation", "creationTimestamp", "uid",
                "selfLink")


class ApplyError(Exception):
    """The cluster refused, or holds what this run may not touch: nothing more was written."""


class ApiUnavailable(ApplyError):
    """The API server cannot be reached or refused the credentials."""


class NotFound(ApplyError):
    pass


class Busy(ApplyError):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


BUSY_RETRY_S = 30.0


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or 1), 0.2), 5.0)
    except ValueError:
        return 1.0


class ClusterApi:
    """The official client's ApiClient, used for raw JSON requests (the renderer's kinds are
    partly CRDs, which the generated API classes do not cover). Each answer is JSON checked by
    validate/kube_response.py before use (:meth:`get`, :meth:`list`, ...: of the kind asked
    for); one that is not is an ApplyError naming the request and what came back."""

    def __init__(self, kubeconfig: Path | None, timeout: tuple[float, float] = (5.0, 60.0)):
        from kubernetes import client, config  # noqa: PLC0415 (slow import; cluster only)

        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped upstream
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration)
        except (config.ConfigException, OSError, TypeError, ValueError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise ApiUnavailable(f"cannot load the kubeconfig {where}: {exc}") from None
        configuration.retries = 0
        self._client = client
        self._api = client.ApiClient(configuration)
        self._timeout = timeout
        self.server = str(configuration.host)

    def object(self, kind: Kind, method: str, path: str, query: Sequence[tuple[str, str]] = (),
               body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        """One request whose answer must be an object of ``kind``."""
        doc = self.request(method, path, query, body, content_type)
        return dict(_checked(kube_response.obj, f"{method} {path}", doc, kind.kind,
                             kind.api_version))

    def listing(self, kind: Kind, query: Sequence[tuple[str, str]] = ()
                ) -> list[dict[str, Any]]:
        """The objects of ``kind`` (every namespace) that ``query`` selects."""
        path = kind.collection()
        doc = self.request("GET", path, query)
        return list(_checked(kube_response.items, f"GET {path}", doc, kind.kind,
                             kind.api_version))

    def text(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """A GET whose answer is text, not JSON (a Pod's log); 429s retried as by request."""
        data = self._retrying("GET", path, query, None, "", decode=False)
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def request(self, method: str, path: str, query: Sequence[tuple[str, str]] = (),
                body: Any = None, content_type: str = "application/json") -> Any:
        """One request; a 429 (the server busy, or a CRD's storage still initialising just
        after it was installed) is retried after the server's Retry-After, for up to
        :data:`BUSY_RETRY_S` seconds."""
        return self._retrying(method, path, query, body, content_type)

    def _retrying(self, method: str, path: str, query: Sequence[tuple[str, str]], body: Any,
                  content_type: str, *, decode: bool = True) -> Any:
        deadline = time.monotonic() + BUSY_RETRY_S
        while True:
            try:
                return self._request(method, path, query, body, content_type, decode=decode)
            except Busy as exc:
                if time.monotonic() + exc.retry_after_s > deadline:
                    raise ApplyError(str(exc)) from None
                time.sleep(exc.retry_after_s)

    def _request(self, method: str, path: str, query: Sequence[tuple[str, str]],
                 body: Any, content_type: str, *, decode: bool = True) -> Any:
        headers = {"Accept": "application/json" if decode else "*/*"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self._api.param_serialize(
            method, path, query_params=list(query), header_params=headers,
            body=body, auth_settings=["BearerToken"])
        try:
            response = self._api.call_api(*params, _request_timeout=self._timeout)
            response.read()  # type: ignore[no-untyped-call]  # untyped upstream
            data = response.data
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            untrusted = _certificate_failure(exc)
            if untrusted is not None:
                raise ApiUnavailable(f"the API server at {self.server} answered, but its "
                                     f"certificate did not verify: {untrusted}") from None
            raise ApiUnavailable(f"cannot reach the Kubernetes API at {self.server}: "
                                 f"{_short(exc)}") from None
        status = int(response.status)
        endpoint = f"{method} {path}"
        if status >= 400:
            message = kube_response.status_message(data) or one_line(str(response.reason))
            if status == 404:
                raise NotFound(f"{endpoint}: 404 Not Found: {message}")
            if status == 429:
                wait = response.getheader("Retry-After")  # type: ignore[no-untyped-call]
                raise Busy(f"{endpoint}: the API server answered 429: {message}",
                           _retry_after(wait))
            if status == 401:
                raise ApiUnavailable(kube_response.refusal(endpoint, self.server, status,
                                                           message))
            if status == 403:
                raise ApplyError(kube_response.refusal(endpoint, self.server, status, message))
            raise ApplyError(f"{endpoint}: the API server answered {status}: {message}")
        if not decode:
            return data
        try:
            return kube_response.decode(endpoint, data)
        except kube_response.BadResponse as exc:
            raise ApplyError(str(exc)) from None


def _checked(check: Any, endpoint: str, doc: Any, *args: Any) -> Any:
    """``check(endpoint, doc, *args)`` (a kube_response check), its BadResponse an
    ApplyError."""
    try:
        return check(endpoint, doc, *args)
    except kube_response.BadResponse as exc:
        raise ApplyError(str(exc)) from None


def _path(kind: Kind, obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{kind.collection(meta.get('namespace'))}/{meta['name']}"


def _clean(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """The object without what the server adds (status, bookkeeping metadata)."""
    if obj is None:
        return {}
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = {k: v for k, v in dict(obj.get("metadata", {})).items()
                       if k not in _SERVER_META}
    return out


def _diff(before: Mapping[str, Any] | None, after: Mapping[str, Any], name: str) -> list[str]:
    a = yaml.safe_dump(_clean(before), sort_keys=True).splitlines() if before else []
    b = yaml.safe_dump(_clean(after), sort_keys=True).splitlines()
    return list(difflib.unified_diff(a, b, f"live/{name}", f"applied/{name}", lineterm="", n=2))


@dataclass
class Summary:
    created: int = 0
    configured: int = 0
    unchanged: int = 0
    deleted: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return self.created + self.configured + self.deleted


class Applier:
    """One apply (or check) of a spec's objects: preflight, apply in order, prune."""

    def __init__(self, api: ClusterApi, spec: ClusterSpec, *, check: bool, out: TextIO):
        self.api = api
        self.spec = spec
        self.check = check
        self.out = out
        self.summary = Summary()
        self.objects = manifests(spec)
        self.live: dict[str, dict[str, Any] | None] = {}

    def _say(self, line: str) -> None:
        self.summary.lines.append(line)
        self.out.write(line + "\n")

    def _query(self, *extra: tuple[str, str]) -> list[tuple[str, str]]:
        return [*extra, *([("dryRun", "All")] if self.check else [])]

    def preflight(self) -> None:
        """Every kind served, the operator's namespace there, and no object this run would
        write that exists without its label. Raises ApplyError listing every problem."""
        problems = []
        served: dict[str, set[str]] = {}
        for kind in (*KINDS, NODE):
            if kind.api_version not in served:
                base = "/api/" if "/" not in kind.api_version else "/apis/"
                path = base + kind.api_version
                try:
                    doc = self.api.request("GET", path)
                    served[kind.api_version] = _checked(kube_response.resources, f"GET {path}",
                                                        doc, kind.api_version)
                except NotFound:
                    served[kind.api_version] = set()
            if kind.plural not in served[kind.api_version]:
                problems.append(f"the API server does not serve {kind.kind} "
                                f"({kind.api_version}, {kind.plural}): install its CRDs first "
                                "(docs/cluster.md)")
        if problems:
            raise ApplyError("; ".join(problems) + "; nothing was applied")
        try:
            self.api.object(_BY_KIND["Namespace"], "GET",
                            f"/api/v1/namespaces/{self.spec.operator_namespace}")
        except NotFound:
            problems.append(f"namespace {self.spec.operator_namespace} (the GPU Operator's, "
                            "gpuready_cluster_operator_namespace) does not exist: install the "
                            "operator's chart there first")
        for obj in self.objects:
            kind = _BY_KIND[obj["kind"]]
            try:
                live = self.api.object(kind, "GET", _path(kind, obj))
            except NotFound:
                live = None
            self.live[ident(obj)] = live
            if live is not None:
                owner = (live.get("metadata", {}).get("labels") or {}).get(MANAGED_BY)
                if owner != MANAGER:
                    problems.append(f"{ident(obj)} exists and is not gpuready's ({MANAGED_BY}: "
                                    f"{owner or 'unset'}): left untouched")
        if problems:
            raise ApplyError("; ".join(problems) + "; nothing was applied")

    def apply_all(self) -> None:
        new_namespaces = {o["metadata"]["name"] for o in self.objects
                          if o["kind"] == "Namespace" and self.live[ident(o)] is None}
        for obj in self.objects:
            self._apply_one(obj, new_namespaces)
        self._label_nodes()
        self._prune()

    def _apply_one(self, obj: Mapping[str, Any], new_namespaces: set[str]) -> None:
        name = ident(obj)
        kind = _BY_KIND[obj["kind"]]
        live = self.live[name]
        verb = "would " if self.check else ""
        if self.check and obj["metadata"].get("namespace") in new_namespaces:
            # The server cannot dry-run an object into a namespace that does not exist yet.
            self.summary.created += 1
            self._say(f"{verb}create {name} (in a new namespace: not dry-run by the server)")
            return
        applied = self.api.object(
            kind, "PATCH", _path(kind, obj),
            self._query(("fieldManager", FIELD_MANAGER), ("force", "true")), body=obj,
            content_type=APPLY_PATCH)
        if live is None:
            self.summary.created += 1
            self._say(f"{verb}create {name}" if self.check else f"created {name}")
        elif _clean(applied) != _clean(live):
            self.summary.configured += 1
            self._say(f"{verb}configure {name}" if self.check else f"configured {name}")
            if self.check:
                for line in _diff(live, applied, name):
                    self._say("    " + line)
        else:
            self.summary.unchanged += 1

    def _label_nodes(self) -> None:
        for node, labels in node_labels(self.spec).items():
            try:
                live = self.api.object(NODE, "GET", f"{NODE.collection()}/{node}")
            except NotFound:
                self._say(f"Node {node} has not joined: its device plugin label waits for a "
                          "later apply")
                continue
            have = live.get("metadata", {}).get("labels") or {}
            if all(have.get(k) == v for k, v in labels.items()):
                continue
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": dict(labels)}}
            self.api.object(NODE, "PATCH", f"{NODE.collection()}/{node}",
                            self._query(("fieldManager", FIELD_MANAGER), ("force", "true")),
                            body=body, content_type=APPLY_PATCH)
            self.summary.configured += 1
            said = ", ".join(f"{k}={v}" for k, v in labels.items())
            self._say(f"{'would label' if self.check else 'labelled'} Node {node} {said}")

    def _prune(self) -> None:
        keep = {ident(o) for o in self.objects}
        for kind in reversed(KINDS):
            for item in self.api.listing(kind, [("labelSelector", SELECTOR)]):
                obj = {"kind": kind.kind, "metadata": item.get("metadata", {})}
                name = ident(obj)
                if name in keep:
                    continue
                if item.get("metadata", {}).get("deletionTimestamp"):
                    continue  # already going
                path = _path(kind, obj)
                try:
                    doc = self.api.request("DELETE", path,
                                           self._query(("propagationPolicy", "Background")))
                except NotFound:
                    continue
                _checked(kube_response.one_of, f"DELETE {path}", doc,
                         {kind.kind: kind.api_version, "Status": "v1"})
                self.summary.deleted += 1
                what = " and everything in it" if kind.kind == "Namespace" else ""
                self._say(f"{'would delete' if self.check else 'deleted'} {name}{what} "
                          "(no longer in the inventory)")


def run(spec: ClusterSpec, api: ClusterApi, *, check: bool, out: TextIO) -> Summary:
    """Apply (or check) ``spec``'s objects on the cluster behind ``api``. Raises ApplyError
    before anything is written when a kind is not served or an object is not gpuready's."""
    applier = Applier(api, spec, check=check, out=out)
    applier.preflight()
    applier.apply_all()
    return applier.summary

