"""The three PATCH formats kube-apiserver accepts for built-in types.

- ``application/json-patch+json``: RFC 6902 (add, remove, replace, move, copy, test).
- ``application/merge-patch+json``: RFC 7386 (maps merge, ``null`` deletes, lists replace).
- ``application/strategic-merge-patch+json``: apimachinery's strategic merge patch. Lists
  follow the type's ``patchStrategy``/``patchMergeKey`` struct tags (``LIST_SEMANTICS``, taken
  from k8s.io/api/core/v1/types.go and meta/v1); every other list is replaced whole. Directives:
  ``$patch: replace|delete`` (maps and list items), ``$retainKeys``,
  ``$deleteFromPrimitiveList/<field>`` and ``$setElementOrder/<field>``.

Errors: :class:`PatchError` (the request is malformed: 400) and :class:`PatchApplyError` (a
JSON patch that does not apply: 422).
"""

from __future__ import annotations

import copy
import json
from typing import Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, "application/apply-patch+yaml")

Path = tuple[str, ...]
# (strategy, merge key) by field path, for the kinds the stand-in serves. A path absent here
# holds a list that a strategic merge patch replaces whole (Node.spec.taints is one: it has no
# patchStrategy, +listType=atomic).
_META: dict[Path, tuple[str, str | None]] = {
    ("metadata", "finalizers"): ("merge", None),
    ("metadata", "ownerReferences"): ("merge", "uid"),
}
LIST_SEMANTICS: dict[str, dict[Path, tuple[str, str | None]]] = {
    "Node": {
        **_META,
        ("spec", "podCIDRs"): ("merge", None),
        ("status", "conditions"): ("merge", "type"),
        ("status", "addresses"): ("merge", "type"),
    },
    "ConfigMap": dict(_META),
    "Secret": dict(_META),
    "Namespace": {**_META, ("spec", "finalizers"): ("merge", None)},
    "CertificateSigningRequest": dict(_META),
}


class PatchError(ValueError):
    """The patch body is not a valid patch of its type (HTTP 400)."""


class PatchApplyError(ValueError):
    """A well-formed JSON patch that does not apply to the object (HTTP 422)."""


def apply(content_type: str, current: dict[str, Any], body: bytes,
          kind: str) -> dict[str, Any]:
    """The object ``current`` with the patch ``body`` of ``content_type`` applied."""
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise PatchError(f"error decoding patch: {exc}") from None
    if content_type == JSON_PATCH:
        return json_patch(current, patch)
    if content_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise PatchError("error decoding patch: json: cannot unmarshal "
                             f"{_go_type(patch)} into Go value of type map[string]interface {{}}")
        result = merge_patch(current, patch)
        assert isinstance(result, dict)
        return result
    if content_type == STRATEGIC_MERGE_PATCH:
        if not isinstance(patch, dict):
            raise PatchError("error decoding patch: json: cannot unmarshal "
                             f"{_go_type(patch)} into Go value of type map[string]interface {{}}")
        merged = strategic_merge(current, patch, LIST_SEMANTICS.get(kind, _META), ())
        return merged if merged is not None else {}
    raise PatchError(f"unsupported patch type {content_type}")


def _go_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "bool", type(None): "null"}.get(
        type(value), "number")


# -- RFC 7386 ------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- RFC 6902 ------------------------------------------------------------------------------
def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'JSON pointer must be empty or start with a "/": {path}')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchApplyError(f"doc is missing path: /{'/'.join(parts)}")
    return node, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchApplyError(f"doc is missing path: /{'/'.join(parts)}")


def _remove(doc: Any, parts: list[str]) -> Any:
    parent, last = _parent(doc, parts)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchApplyError(f"unable to remove nonexistent key: {last}: missing value")


def _add(doc: Any, parts: list[str], value: Any, replace: bool = False) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchApplyError(f"replace operation does not apply: doc is missing key: "
                                  f"/{'/'.join(parts)}: missing value")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchApplyError(f"index out of range: /{'/'.join(parts)}")
    else:
        raise PatchApplyError(f"doc is missing path: /{'/'.join(parts)}")
    return doc


def json_patch(current: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc: Any = copy.deepcopy(current)
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise PatchError("Unexpected kind: <nil>")
        kind = op["op"]
        path = _pointer(op.get("path"))
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchApplyError(f"{kind} operation does not apply: value is missing")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            try:
                found = _get(doc, path)
            except PatchApplyError:
                found = None
            if found != op["value"]:
                raise PatchApplyError(f"testing value /{'/'.join(path)} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    if not isinstance(doc, dict):
        raise PatchApplyError("the patched document is not an object")
    return doc


# -- strategic merge patch -----------------------------------------------------------------
DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM = "$deleteFromPrimitiveList/"
ELEMENT_ORDER = "$setElementOrder/"


def _strip(value: Any) -> Any:
    """A patch fragment without directives, as it lands in the object when nothing merges."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and DIRECTIVE in v)]
    return value


def strategic_merge(original: Any, patch: dict[str, Any],
                    lists: dict[Path, tuple[str, str | None]], path: Path) -> Any:
    """Merge ``patch`` into the map ``original``; None means the map itself is deleted."""
    directive = patch.get(DIRECTIVE)
    if directive == "replace":
        return _strip({k: v for k, v in patch.items() if k != DIRECTIVE})
    if directive == "delete":
        return None
    if directive is not None:
        raise PatchError(f"Unknown patch type: {directive} in map: {patch}")
    result: dict[str, Any] = dict(original) if isinstance(original, dict) else {}
    retain = patch.get(RETAIN_KEYS)
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError(f"invalid value for {RETAIN_KEYS}: {retain}")
        result = {k: v for k, v in result.items() if k in retain}
    for key, value in patch.items():
        if key.startswith(DELETE_FROM):
            field = key[len(DELETE_FROM):]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [x for x in current if x not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value, lists, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            strategy, merge_key = lists.get(sub, (None, None))
            if strategy == "merge":
                result[key] = _merge_list(result.get(key), value, merge_key, lists, sub)
            else:
                replaced = [v for v in value if not (isinstance(v, dict)
                                                     and v.get(DIRECTIVE) == "replace")]
                result[key] = _strip(replaced)
        else:
            result[key] = value
    for key, order in patch.items():
        if key.startswith(ELEMENT_ORDER):
            field = key[len(ELEMENT_ORDER):]
            _, merge_key = lists.get((*path, field), (None, None))
            if isinstance(result.get(field), list) and isinstance(order, list):
                result[field] = _ordered(result[field], order, merge_key)
    return result


def _merge_list(original: Any, patch: list[Any], merge_key: str | None,
                lists: dict[Path, tuple[str, str | None]], path: Path) -> list[Any]:
    items = list(original) if isinstance(original, list) else []
    if any(isinstance(p, dict) and p.get(DIRECTIVE) == "replace" for p in patch):
        return [_strip(p) for p in patch if not (isinstance(p, dict) and DIRECTIVE in p)]
    if merge_key is None:  # a set of primitives: union, in order
        for value in patch:
            if isinstance(value, dict) and value.get(DIRECTIVE) == "delete":
                continue
            if value not in items:
                items.append(value)
        return items
    for element in patch:
        if not isinstance(element, dict):
            raise PatchError(f"merging an object in json but data type is not struct, "
                             f"instead is: {_go_type(element)}")
        if merge_key not in element:
            raise PatchError(f"map: {element} does not contain declared merge key: {merge_key}")
        wanted = element[merge_key]
        index = next((i for i, item in enumerate(items)
                      if isinstance(item, dict) and item.get(merge_key) == wanted), None)
        if element.get(DIRECTIVE) == "delete":
            items = [item for item in items
                     if not (isinstance(item, dict) and item.get(merge_key) == wanted)]
        elif index is None:
            items.append(_strip(element))
        else:
            merged = strategic_merge(items[index], element, lists, path)
            if merged is None:
                items.pop(index)
            else:
                items[index] = merged
    return items


def _ordered(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        return item.get(merge_key) if merge_key and isinstance(item, dict) else item

    wanted = [ident(o) for o in order]
    placed = sorted((i for i in items if ident(i) in wanted), key=lambda i: wanted.index(ident(i)))
    rest = [i for i in items if ident(i) not in wanted]
    return placed + rest
