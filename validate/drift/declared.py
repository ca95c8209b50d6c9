"""What the inventory (and, where it is silent, the roles' defaults) declares for a node.

The check-mode run reads most of the declared state from the roles themselves (package pins,
holds, files, services come out of its events). The live probes need a few role inputs too:
those are read here, inventory first, then the role's own ``defaults/main.yml`` (the value
Ansible would use when the inventory does not set it). Only plain values are read this way; a
default that is a Jinja expression is not evaluated and reads as unset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from validate import desired
from validate.desired import DesiredState
from validate.inventory import Node

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"

# The role inputs drift compares against, as the node's declared state holds them.
_DECLARED: dict[str, Callable[[DesiredState], Any]] = {
    desired.PERSISTENCED: lambda d: d.drift.persistenced_enabled,
    desired.PEERMEM_FABRICS: lambda d: d.drift.peermem_fabrics,
    desired.KERNEL_MODULES: lambda d: d.drift.kernel_modules,
    desired.RUNTIME_NAME: lambda d: d.drift.runtime_name,
    desired.CONTAINERD_PIN: lambda d: d.pins.containerd_version,
    desired.CONTAINERD_SOURCE: lambda d: d.pins.containerd_source,
    desired.TOOLKIT_PIN: lambda d: d.pins.toolkit_version,
    desired.TOOLKIT_PACKAGES: lambda d: d.pins.toolkit_packages,
    desired.KUBELET_PIN: lambda d: d.pins.kubelet_version,
    desired.KUBELET_PACKAGES: lambda d: d.pins.kubelet_packages,
}


@functools.cache
def _role_defaults(role: str) -> dict[str, Any]:
    path = ROLES_DIR / role / "defaults" / "main.yml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def role_default(role: str, var: str) -> Any:
    """``var`` from ``roles/<role>/defaults/main.yml`` (None when absent or templated)."""
    value = _role_defaults(role).get(var)
    if isinstance(value, str) and "{{" in value:
        return None
    return value


@functools.cache
def _role_constants(role: str) -> dict[str, Any]:
    path = ROLES_DIR / role / "vars" / "main.yml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def role_constant(role: str, var: str) -> str | None:
    """A plain constant of ``roles/<role>/vars/main.yml`` (e.g. the unit a role runs); None
    when absent or templated."""
    value = _role_constants(role).get(var)
    return value if isinstance(value, str) and "{{" not in value else None


def role_constant_map(role: str, var: str) -> dict[str, Any] | None:
    """A plain mapping of ``roles/<role>/vars/main.yml`` (e.g. a package per source); None when
    absent or not a mapping."""
    value = _role_constants(role).get(var)
    return dict(value) if isinstance(value, dict) else None


@functools.cache
def _os_vars(role: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((ROLES_DIR / role / "vars").glob("*.yml")):
        if path.stem == "main":
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        out[path.stem] = data if isinstance(data, dict) else {}
    return out


def os_values(role: str, var: str) -> dict[str, Any]:
    """``var`` from each per-OS file of ``roles/<role>/vars/`` that sets it (the files the role
    picks by the host's distribution, ``Debian-12.yml``...), by the file's stem."""
    return {os: data[var] for os, data in _os_vars(role).items() if var in data}


def declared(node: Node, role: str, var: str) -> Any:
    """The inventory's value of ``var`` for ``node`` (its declared state), else the role's
    default."""
    value = _DECLARED[var](node.desired)
    return value if value is not None else role_default(role, var)


def as_bool(value: Any, default: bool) -> bool:
    """Ansible's truthiness for a variable that may come as a string ("yes", "false")."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y")
    return bool(value)


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]
