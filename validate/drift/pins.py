"""The package pins of the bootstrap roles, as the roles resolve them, against a dpkg database.

The roles install and hold exact Debian versions: containerd (``containerd_version``; empty
pins nothing), the container toolkit (``nvidia_container_toolkit_packages`` at
``nvidia_container_toolkit_version``), Kubernetes (``kubelet_packages`` at ``kubelet_version``)
and DCGM (``nvidia_dcgm_version``, a release: its major picks the packages and the Debian
version from the role's per-OS table). Each is read as the role reads it: the inventory's value,
else the role's default (validate/drift/declared.py); the package names and versions the roles
compute from their ``vars/<OS>.yml`` come from those files, and where the files differ by OS
(which this module does not know) the pin cannot be resolved and says so.

Output schema::

    package_pins(node) -> tuple[PackagePin, ...]       raises PinError
    PackagePin(role, names, version)
      names: dpkg package names; one with "*" stands for the installed packages it matches
    differences(pin, installed) -> list[str]           "kubelet, kubeadm 1.30.5-1.1 -> 1.37.2-1.1"
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from validate import desired
from validate.drift.declared import as_list, declared, os_values, role_constant_map
from validate.inventory import Node
from validate.parsers.dpkg_query import DpkgPackage

ABSENT = "absent"
# dpkg states of a package that is not on the node (a removed one may leave its conffiles).
_GONE = ("not-installed", "config-files")


class PinError(Exception):
    """A pin that cannot be resolved to packages and a version; the message says why."""


@dataclass(frozen=True, slots=True)
class PackagePin:
    """Packages one bootstrap role installs at one exact Debian version and holds. A name with
    ``*`` stands for whichever installed packages it matches (DCGM 4's diagnostics, one package
    per CUDA major, which the driver's branch picks: the driver pin is compared on its own)."""

    role: str
    names: tuple[str, ...]
    version: str


def _same_on_every_os(role: str, var: str, what: str) -> Any:
    values = os_values(role, var)
    distinct = {json.dumps(v, sort_keys=True) for v in values.values()}
    if not values:
        raise PinError(f"{what}: no roles/{role}/vars/<OS>.yml sets {var}")
    if len(distinct) > 1:
        raise PinError(f"{what}: roles/{role}/vars/ sets {var} differently by OS "
                       f"({', '.join(sorted(values))}); the plan cannot tell which applies")
    return next(iter(values.values()))


def _dcgm(release: str) -> PackagePin:
    # The role's series key: the release up to its first dot (vars/main.yml).
    series = release.split(".", 1)[0]
    tables = {os: t[series] for os, t in os_values("nvidia_dcgm", "_nvidia_dcgm_series").items()
              if isinstance(t, Mapping) and series in t}
    if not tables:
        raise PinError(f"DCGM {release}: no roles/nvidia_dcgm/vars/<OS>.yml carries DCGM "
                       f"{series}")
    if len({json.dumps(t, sort_keys=True) for t in tables.values()}) > 1:
        raise PinError(f"DCGM {release}: roles/nvidia_dcgm/vars/ installs DCGM {series} "
                       f"differently by OS ({', '.join(sorted(tables))}); the plan cannot tell "
                       "which applies")
    table = next(iter(tables.values()))
    names = tuple(str(n).replace("{cuda}", "*") for n in table["packages"])
    return PackagePin("nvidia_dcgm", names,
                      str(table["package_version"]).replace("{upstream}", release))


def package_pins(node: Node) -> tuple[PackagePin, ...]:
    """The node's package pins (see the module docstring), in the order the roles install."""
    pins: list[PackagePin] = []
    if node.desired.pins.dcgm_version:
        pins.append(_dcgm(node.desired.pins.dcgm_version))
    containerd = str(declared(node, "containerd", desired.CONTAINERD_PIN) or "")
    if containerd:
        source = str(declared(node, "containerd", desired.CONTAINERD_SOURCE) or "")
        name = (role_constant_map("containerd", "_containerd_packages") or {}).get(source)
        if not name:
            raise PinError(f"containerd: no package for containerd_source {source!r} in "
                           "roles/containerd/vars/main.yml (_containerd_packages)")
        pins.append(PackagePin("containerd", (str(name),), containerd))
    for role, version_var, packages_var in (
            ("nvidia_container_toolkit", desired.TOOLKIT_PIN, desired.TOOLKIT_PACKAGES),
            ("kubelet", desired.KUBELET_PIN, desired.KUBELET_PACKAGES)):
        version = str(declared(node, role, version_var) or "")
        names = tuple(as_list(declared(node, role, packages_var)))
        if version and names:
            pins.append(PackagePin(role, names, version))
    return tuple(pins)


def gone(pkg: DpkgPackage | None) -> bool:
    """dpkg has no such package, or only its configuration files (what ``apt remove`` leaves)."""
    return pkg is None or pkg.state in _GONE


def installed_state(pkg: DpkgPackage | None) -> str:
    """The version dpkg has, ``absent``, or the version with dpkg's unfinished state
    (``1.37.2-1.1 (half-configured)``): a failed install is not the pin."""
    if pkg is None or pkg.state in _GONE:
        return ABSENT + (f" ({pkg.state})" if pkg is not None and pkg.state != _GONE[0] else "")
    if pkg.installed and pkg.error == "ok":
        return pkg.version
    return f"{pkg.version} ({', '.join(x for x in (pkg.state, pkg.error) if x != 'ok')})"


def differences(pin: PackagePin, installed: Mapping[str, DpkgPackage]) -> list[str]:
    """What differs from ``pin``, one entry per version seen (packages at the same version
    together, in the pin's order): ``kubelet, kubeadm, kubectl 1.30.5-1.1 -> 1.37.2-1.1``."""
    seen: dict[str, list[str]] = {}
    for name in pin.names:
        if "*" in name:
            found = [p for n, p in installed.items()
                     if fnmatch.fnmatchcase(n, name) and not gone(p)]
            states = [(p.name, installed_state(p)) for p in found] or [(name, ABSENT)]
        else:
            states = [(name, installed_state(installed.get(name)))]
        for package, state in states:
            if state != pin.version:
                seen.setdefault(state, []).append(package)
    return [f"{', '.join(names)} {state} -> {pin.version}" for state, names in seen.items()]
