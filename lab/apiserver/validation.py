"""Object validation with kube-apiserver's rules and messages (apimachinery's
validation.IsQualifiedName / IsValidLabelValue / IsDNS1123Subdomain, and core's taint checks).
"""

from __future__ import annotations

import re
from typing import Any

from lab.apiserver.errors import (
    FieldError,
    duplicate,
    invalid_value,
    not_supported,
    required,
)

_NAME_FMT = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(f"^{_NAME_FMT}$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(f"^{_DNS1123_LABEL}(\\.{_DNS1123_LABEL})*$")

# The messages, character for character (the double space before "or" is apimachinery's).
QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
TAINT_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
ANNOTATIONS_MAX_BYTES = 256 * 1024


def qualified_name_errors(value: str) -> list[str]:
    """IsQualifiedName: ``[prefix/]name``; the messages of every rule it breaks."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        prefix = None
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return [QUALIFIED_NAME_MSG.replace("name part must", "a qualified name must", 1)]
    errs: list[str] = []
    if prefix is not None:
        errs += [f"prefix part {m}" for m in dns1123_subdomain_errors(prefix)]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not _NAME_RE.match(name):
        errs.append(QUALIFIED_NAME_MSG)
    return errs


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        errs.append(DNS1123_SUBDOMAIN_MSG)
    return errs


def label_value_errors(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.match(value):
        errs.append(LABEL_VALUE_MSG)
    return errs


def validate_labels(labels: Any, path: str = "metadata.labels") -> list[FieldError]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [invalid_value(path, str(labels), "must be a map of string keys and values")]
    out: list[FieldError] = []
    for key, value in sorted(labels.items()):
        out += [invalid_value(path, key, m) for m in qualified_name_errors(key)]
        if not isinstance(value, str):
            out.append(invalid_value(f"{path}", str(value), "label values must be strings"))
            continue
        out += [invalid_value(path, value, m) for m in label_value_errors(value)]
    return out


def validate_annotations(annotations: Any) -> list[FieldError]:
    path = "metadata.annotations"
    if annotations is None:
        return []
    if not isinstance(annotations, dict):
        return [invalid_value(path, str(annotations), "must be a map of string keys and values")]
    out: list[FieldError] = []
    size = 0
    for key, value in sorted(annotations.items()):
        out += [invalid_value(path, key, m) for m in qualified_name_errors(key.lower())]
        size += len(key) + len(str(value))
    if size > ANNOTATIONS_MAX_BYTES:
        out.append(FieldError("FieldValueTooLong", path,
                              f"Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes"))
    return out


def validate_metadata(meta: Any, cluster_scoped: bool) -> list[FieldError]:
    if not isinstance(meta, dict):
        return [required("metadata")]
    out: list[FieldError] = []
    name = meta.get("name")
    if not name:
        out.append(required("metadata.name", "name or generateName is required"))
    elif not isinstance(name, str):
        out.append(invalid_value("metadata.name", str(name), "must be a string"))
    else:
        out += [invalid_value("metadata.name", name, m) for m in dns1123_subdomain_errors(name)]
    if cluster_scoped and meta.get("namespace"):
        out.append(FieldError("FieldValueForbidden", "metadata.namespace",
                              "Forbidden: not allowed on this type"))
    out += validate_labels(meta.get("labels"))
    out += validate_annotations(meta.get("annotations"))
    return out


def validate_taints(taints: Any) -> list[FieldError]:
    if taints is None:
        return []
    if not isinstance(taints, list):
        return [invalid_value("spec.taints", str(taints), "must be a list")]
    out: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(taints):
        base = f"spec.taints[{i}]"
        if not isinstance(taint, dict):
            out.append(invalid_value(base, str(taint), "must be an object"))
            continue
        key = taint.get("key", "")
        if not key:
            out.append(required(f"{base}.key"))
        else:
            out += [invalid_value(f"{base}.key", key, m) for m in qualified_name_errors(key)]
        value = taint.get("value", "")
        if value:
            out += [invalid_value(f"{base}.value", value, m) for m in label_value_errors(value)]
        effect = taint.get("effect", "")
        if not effect:
            out.append(required(f"{base}.effect"))
        elif effect not in TAINT_EFFECTS:
            out.append(not_supported(f"{base}.effect", effect, TAINT_EFFECTS))
        if (key, effect) in seen:
            dup = duplicate(base, f"{key}={value}:{effect}")
            out.append(FieldError(dup.type, dup.field,
                                  f"{dup.body}: taints must be unique by key and effect pair"))
        seen.add((key, effect))
    return out


def validate_node(node: dict[str, Any]) -> list[FieldError]:
    out = validate_metadata(node.get("metadata"), cluster_scoped=True)
    spec = node.get("spec") or {}
    if not isinstance(spec, dict):
        return [*out, invalid_value("spec", str(spec), "must be an object")]
    out += validate_taints(spec.get("taints"))
    return out
