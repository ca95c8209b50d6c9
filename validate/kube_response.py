"""What a Kubernetes API server answered, checked before anything acts on it.

Every client of the API (the gate and drift's labels layer: validate/gate.py; the rolling
upgrade: validate/upgrade.py; ``cluster apply``: validate/cluster/apply.py) reads a response
body through here. A body is used only when it is JSON, nested no deeper than
:data:`MAX_DEPTH`, of the kind and apiVersion the request asks for (a pod list is a
``PodList`` of ``v1``: a ``NodeList`` answered for it would have the upgrade evict Nodes as
"bare pods"), with its items and the fields the clients read of the types they expect. Anything
else is a :class:`BadResponse` naming the request and what came back: exit 2, nothing acted on,
never ``TypeError``, ``RecursionError``, ``JSONDecodeError`` or "internal error".

Only the fields the clients read are checked (:data:`SHAPES`); the rest of an object passes as
the server sent it. An error body (a ``Status``) is read by :func:`status_message`, which never
fails: a proxy's HTML page for a 502 is quoted, not parsed.

This module knows no client: it takes the request's name and the body's bytes, so it moves
with the requests when the clients are one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from validate.errors import InputError
from validate.text import one_line

# Kubernetes objects nest a dozen levels or so; a body deeper than this is not an object the
# clients read (and recursive code, yaml's dumper for one, would overflow the stack on it).
MAX_DEPTH = 64
EXCERPT = 120


class BadResponse(InputError):
    """The API server (or whatever answered in its place) sent what a client cannot use."""

    def __init__(self, endpoint: str, what: str) -> None:
        super().__init__(f"{endpoint}: the API server answered {what}; nothing was done "
                         "with the answer")
        self.endpoint = endpoint


# -- shapes: the fields the clients read, and their types -------------------------------------
@dataclass(frozen=True)
class Obj:
    """A JSON object; ``fields`` are checked when present and not null, ``required`` must be
    there."""

    fields: Mapping[str, Shape] = field(default_factory=dict)
    required: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ListOf:
    item: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape


Shape = type | Obj | ListOf | MapOf

_STRINGS = MapOf(str)
METADATA = Obj({
    "name": str, "namespace": str, "uid": str, "resourceVersion": str,
    "labels": _STRINGS, "annotations": _STRINGS, "deletionTimestamp": str,
    "ownerReferences": ListOf(Obj({"kind": str, "name": str, "controller": bool})),
}, frozenset({"name"}))
_SELECTOR = Obj({"matchLabels": _STRINGS, "matchExpressions": ListOf(Obj(
    {"key": str, "operator": str, "values": ListOf(str)}))})
# By kind: the fields of an object of that kind the clients read.
SHAPES: dict[str, Obj] = {
    "Node": Obj({"metadata": METADATA, "spec": Obj({
        "unschedulable": bool,
        "taints": ListOf(Obj({"key": str, "value": str, "effect": str}, frozenset({"key"}))),
    })}, frozenset({"metadata"})),
    "Pod": Obj({"metadata": METADATA, "spec": Obj({"nodeName": str})},
               frozenset({"metadata"})),
    "PodDisruptionBudget": Obj({"metadata": METADATA, "spec": Obj({"selector": _SELECTOR}),
                                "status": Obj({"disruptionsAllowed": int})},
                               frozenset({"metadata"})),
    "APIResourceList": Obj({"resources": ListOf(Obj({"name": str}, frozenset({"name"})))},
                           frozenset({"resources"})),
    "Status": Obj({"status": str, "message": str, "code": int}),
    "SelfSubjectAccessReview": Obj({"status": Obj({"allowed": bool, "reason": str},
                                                  frozenset({"allowed"}))},
                                   frozenset({"status"})),
}
_ANY_OBJECT = Obj({"metadata": METADATA}, frozenset({"metadata"}))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _expected(shape: Shape) -> str:
    if isinstance(shape, Obj):
        return "an object"
    if isinstance(shape, ListOf):
        return "a list"
    if isinstance(shape, MapOf):
        return f"a map of {_expected(shape.value).removeprefix('a ').removeprefix('an ')}s"
    return {str: "a string", bool: "a boolean", int: "an integer"}.get(shape, shape.__name__)


def _problem(value: Any, shape: Shape, where: str) -> str | None:
    """Where ``value`` first departs from ``shape``, in words; None when it does not."""
    todo: list[tuple[Any, Shape, str]] = [(value, shape, where)]
    while todo:
        value, shape, where = todo.pop()
        if isinstance(shape, Obj):
            if not isinstance(value, dict):
                return f"{where} is {_type_name(value)}, not an object"
            missing = sorted(shape.required - value.keys())
            if missing:
                return f"{where} has no {missing[0]}"
            todo += [(value[k], s, f"{where}.{k}") for k, s in shape.fields.items()
                     if value.get(k) is not None]
        elif isinstance(shape, ListOf):
            if not isinstance(value, list):
                return f"{where} is {_type_name(value)}, not a list"
            todo += [(v, shape.item, f"{where}[{i}]") for i, v in enumerate(value)]
        elif isinstance(shape, MapOf):
            if not isinstance(value, dict):
                return f"{where} is {_type_name(value)}, not {_expected(shape)}"
            todo += [(v, shape.value, f"{where}[{k!r}]") for k, v in value.items()]
        elif not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
            return f"{where} is {_type_name(value)}, not {_expected(shape)}"
    return None


# -- reading a body ---------------------------------------------------------------------------
def _excerpt(text: str) -> str:
    flat = " ".join(text.split())  # repr escapes what is not printable
    return repr(flat[:EXCERPT] + ("..." if len(flat) > EXCERPT else ""))


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests deeper than ``limit``: level by level, the containers only (a
    thousand real Nodes in ~0.06 s, a third of parsing them)."""
    level = [doc] if isinstance(doc, dict | list) else []
    depth = 1
    while level:
        if depth > limit:
            return True
        below = []
        for value in level:
            for child in (value.values() if value.__class__ is dict else value):
                if child.__class__ is dict or child.__class__ is list:
                    below.append(child)
        level = below
        depth += 1
    return False


def decode(endpoint: str, body: bytes | str | None) -> Any:
    """The JSON document of a response body. Raises :class:`BadResponse` for a body that is
    not UTF-8 JSON (an HTML page from a proxy, an empty answer) or nests deeper than
    :data:`MAX_DEPTH`."""
    raw = body or b""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise BadResponse(endpoint, f"{len(raw)} bytes that are not UTF-8 text") from None
    if not text.strip():
        raise BadResponse(endpoint, "an empty body, not a JSON object")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise BadResponse(endpoint, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        kind = "an HTML page" if text.lstrip()[:1] == "<" else "text that is not JSON"
        raise BadResponse(endpoint, f"{kind}, {_excerpt(text)} (a proxy or load balancer in "
                                    "its place, or no Kubernetes API at that address?)") from None
    if _depth_over(doc, MAX_DEPTH):
        raise BadResponse(endpoint, f"JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def _what(doc: Any) -> str:
    """What a document is, as a person names it: ``a NodeList (v1)``, ``a list``."""
    if not isinstance(doc, dict):
        return _type_name(doc)
    kind, version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not kind:
        return "an object without a kind"
    return f"a {one_line(kind)}" + (f" ({one_line(version)})" if isinstance(version, str)
                                    else "")


def _check_kind(endpoint: str, doc: Any, kind: str, api_version: str) -> dict[str, Any]:
    if (not isinstance(doc, dict) or doc.get("kind") != kind
            or doc.get("apiVersion") != api_version):
        raise BadResponse(endpoint, f"{_what(doc)}, not a {kind} ({api_version})")
    return doc


def obj(endpoint: str, doc: Any, kind: str, api_version: str) -> dict[str, Any]:
    """``doc`` when it is an object of ``kind`` and ``api_version`` whose fields the clients
    read (:data:`SHAPES`; any other kind: its metadata) have their types."""
    checked = _check_kind(endpoint, doc, kind, api_version)
    problem = _problem(checked, SHAPES.get(kind, _ANY_OBJECT), kind)
    if problem is not None:
        nested = problem.startswith(f"{kind}.")
        raise BadResponse(endpoint, f"a {kind} whose {problem.removeprefix(kind + '.')}"
                          if nested else f"a {kind} that {problem.removeprefix(kind + ' ')}")
    return checked


def items(endpoint: str, doc: Any, kind: str, api_version: str) -> list[dict[str, Any]]:
    """The items of a list of ``kind`` (``kind + "List"`` of ``api_version``), each checked as
    :func:`obj` checks an object (list items carry no kind of their own)."""
    _check_kind(endpoint, doc, f"{kind}List", api_version)
    listed = doc.get("items")
    if listed is None:
        return []
    problem = _problem(listed, ListOf(SHAPES.get(kind, _ANY_OBJECT)), "items")
    if problem is not None:
        raise BadResponse(endpoint, f"a {kind}List whose {problem}")
    return list(listed)


def one_of(endpoint: str, doc: Any, kinds: Mapping[str, str]) -> dict[str, Any]:
    """``doc`` when it is an object of one of ``kinds`` (kind -> apiVersion): an eviction
    answers a ``Status``, a delete the object or a ``Status``."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(kind, str) and kind in kinds:
        return obj(endpoint, doc, kind, kinds[kind])
    wanted = " or ".join(f"a {k} ({v})" for k, v in kinds.items())
    raise BadResponse(endpoint, f"{_what(doc)}, not {wanted}")


def resources(endpoint: str, doc: Any, group_version: str) -> set[str]:
    """The resource names a discovery document (``GET /apis/<group>/<version>``, an
    ``APIResourceList``) says the server serves for ``group_version``."""
    if not isinstance(doc, dict) or doc.get("kind") != "APIResourceList":
        raise BadResponse(endpoint, f"{_what(doc)}, not an APIResourceList")
    if doc.get("groupVersion") != group_version:
        raise BadResponse(endpoint, f"the resources of {one_line(str(doc.get('groupVersion')))}"
                                    f", not of {group_version}")
    problem = _problem(doc, SHAPES["APIResourceList"], "APIResourceList")
    if problem is not None:
        raise BadResponse(endpoint, f"an {problem}")
    return {str(r["name"]) for r in doc["resources"]}


def status_message(body: bytes | str | None) -> str:
    """The message of an error body (a ``Status``), on one line; a body that is not one is
    quoted (an HTML page from a proxy), never parsed further. Never raises."""
    raw = body or b""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return _excerpt(text) if text.strip() else ""
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return one_line(doc["message"])
    return _excerpt(text)


# -- refusals ---------------------------------------------------------------------------------
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def can_i(endpoint: str) -> str:
    """The RBAC question a request asks, as ``kubectl auth can-i`` takes it: ``create
    pods/eviction -n train`` for ``POST /api/v1/namespaces/train/pods/web-0/eviction``; ""
    for a path that names no resource (discovery)."""
    method, _, target = endpoint.partition(" ")
    parts = target.split("?", 1)[0].strip("/").split("/")
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return ""
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if not rest or not rest[0]:
        return ""
    resource = rest[0] + (f".{group}" if group else "") + (f"/{rest[2]}" if len(rest) > 2
                                                           else "")
    verb = _VERBS.get(method) or ("get" if len(rest) > 1 else "list")
    return f"{verb} {resource}" + (f" -n {namespace}" if namespace else "")


def refusal(endpoint: str, server: str, status: int, message: str) -> str:
    """A 401 or 403 in words: which request, what the server said, what to do."""
    said = f": {message}" if message else ""
    if status == 401:
        return (f"{endpoint}: the API server at {server} did not accept the kubeconfig's "
                f"credentials (401 Unauthorized{said}); renew the token or client certificate "
                "in the kubeconfig")
    question = can_i(endpoint)
    todo = (f"if RBAC refused it, the kubeconfig's user needs the right to {question} "
            f"(`kubectl auth can-i {question}` says whether it has it); if an admission "
            "policy refused it, its message above says why" if question else
            "the kubeconfig's user lacks a permission the message names")
    return f"{endpoint}: the API server at {server} answered 403 Forbidden{said}; {todo}"
