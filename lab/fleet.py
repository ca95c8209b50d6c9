"""Fleet files: which hosts to boot, in which pool, on which simulated hardware, with which faults.

Schema (``lab/fleets/<name>.yml``)::

    pools:                      # inventory group -> simulated hardware profile (and OS)
      pool_h100_sxm: {hw_profile: h100-sxm5-8x, os: debian-12}
    hosts:                      # optional; `--nodes N` spreads N hosts over the pools instead
      - {name: node1, pool: pool_h100_sxm, faults: [ecc-uncorrectable]}
      - {name: node2, pool: pool_h100_sxm, os: debian-13}
    control_plane:              # optional: Kubernetes control-plane hosts (no GPUs), group
      - {name: cp1}             # kube_control_plane; real Kubernetes answers on the first

A fleet with a control plane runs real Kubernetes: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler built from source and set up by the real kubeadm on the first control-plane
host (lab.controlplane, lab.kube.cluster), and GPU hosts that can run a real kubelet
(lab.kube.node). There is no other kind: ``kubernetes: real``, which fleets once had to say, is
still accepted; anything else is an error.

``os`` (per pool, or per host overriding its pool's) is one of ``lab.rootfs.OSES``; default
debian-12 (control-plane hosts too). Each OS boots from its own cached rootfs.

Every error names the file and the offending entry; nothing is booted before the whole fleet is
valid.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from lab import hardware
from lab.errors import LabError
from lab.rootfs import DEFAULT_OS, OSES

FLEETS_DIR = Path(__file__).resolve().parent / "fleets"
# Hosts live on 127.0.1.(BASE+i): below BASE stays free (Debian maps the machine's own hostname
# to 127.0.1.1), and every address stays inside 127.0.0.0/8.
# GPUREADY_LAB_NET moves a second lab (say, one per test worker) to another /24 of loopback.
ADDRESS_NET = ipaddress.IPv4Network(os.environ.get("GPUREADY_LAB_NET", "127.0.1.0/24"))
if not ADDRESS_NET.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")) or ADDRESS_NET.prefixlen != 24:
    raise ValueError(f"GPUREADY_LAB_NET must be a /24 inside 127.0.0.0/8, not {ADDRESS_NET}")
ADDRESS_BASE = 10
MAX_HOSTS = 254 - ADDRESS_BASE
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


GPU_NODE = "gpu"
CONTROL_PLANE = "control-plane"
CONTROL_PLANE_GROUP = "kube_control_plane"
# A fleet with a control plane runs real Kubernetes (its hosts' ``kubernetes``); one without
# has none ("").
REAL = "real"


@dataclass(frozen=True)
class LabHost:
    name: str
    pool: str  # inventory group: a gpu_nodes pool, or kube_control_plane
    hw_profile: str  # "" for a control-plane host (no simulated GPUs)
    address: str
    port: int = 22
    faults: tuple[str, ...] = field(default_factory=tuple)
    os: str = DEFAULT_OS
    kind: str = GPU_NODE
    kubernetes: str = ""  # REAL in a fleet with a control plane: its hosts can run kubelets


def address_for(position: int) -> str:
    """The loopback address of the host at 1-based ``position`` in the fleet."""
    if not 1 <= position <= MAX_HOSTS:
        raise LabError(
            f"host #{position} does not fit the lab address range "
            f"{ADDRESS_NET[ADDRESS_BASE + 1]}-{ADDRESS_NET[ADDRESS_BASE + MAX_HOSTS]} "
            f"(at most {MAX_HOSTS} hosts)"
        )
    return str(ADDRESS_NET[ADDRESS_BASE + position])


def fleet_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yml", ".yaml") and candidate.exists():
        return candidate
    path = FLEETS_DIR / f"{name_or_path}.yml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in FLEETS_DIR.glob("*.yml")))
        raise LabError(f"unknown fleet '{name_or_path}' (known: {known}, or a path to a .yml)")
    return path


def load_fleet(name_or_path: str = "default", nodes: int | None = None,
               port: int = 22) -> list[LabHost]:
    """Read and validate a fleet; with ``nodes`` spread that many hosts over its pools."""
    path = fleet_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise LabError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("pools"), dict) or not data["pools"]:
        raise LabError(f"{path}: needs a non-empty 'pools' mapping")
    if data.get("kubernetes", REAL) != REAL:
        raise LabError(f"{path}: kubernetes: {data['kubernetes']!r}: the lab's control plane is "
                       "real Kubernetes, set up by kubeadm (the SIMULATED API server stand-in "
                       "is gone); remove the key")
    kubernetes = REAL if data.get("control_plane") else ""
    pools: dict[str, str] = {}
    pool_os: dict[str, str] = {}
    for pool, spec in data["pools"].items():
        if not isinstance(spec, dict) or "hw_profile" not in spec:
            raise LabError(f"{path}: pool '{pool}' needs a hw_profile")
        _check_profile(path, f"pool '{pool}'", spec["hw_profile"])
        pools[pool] = spec["hw_profile"]
        pool_os[pool] = _check_os(path, f"pool '{pool}'", spec.get("os", DEFAULT_OS))

    entries: list[dict[str, Any]]
    if nodes is not None:
        if nodes < 1:
            raise LabError(f"--nodes must be at least 1 (got {nodes})")
        if nodes > MAX_HOSTS:
            address_for(nodes)  # raises the address-range error
        names = list(pools)
        entries = [{"name": f"node{i}", "pool": names[(i - 1) % len(names)]}
                   for i in range(1, nodes + 1)]
    else:
        entries = data.get("hosts") or []
        if not entries:
            raise LabError(f"{path}: no hosts listed (use --nodes N to spread N over the pools)")

    hosts: list[LabHost] = []
    seen: set[str] = set()
    for position, entry in enumerate(entries, start=1):
        name = str(entry.get("name", ""))
        if not _NAME_RE.match(name):
            raise LabError(f"{path}: host #{position}: bad name '{name}' (lowercase, digits, '-')")
        if name in seen:
            raise LabError(f"{path}: host name '{name}' appears twice")
        seen.add(name)
        pool = entry.get("pool")
        if pool not in pools:
            raise LabError(f"{path}: host '{name}': unknown pool '{pool}' (pools: "
                           f"{', '.join(pools)})")
        hw_profile = entry.get("hw_profile", pools[pool])
        _check_profile(path, f"host '{name}'", hw_profile)
        faults = tuple(entry.get("faults") or ())
        for fault in faults:
            check_fault(fault, where=f"{path}: host '{name}'")
        host_os = _check_os(path, f"host '{name}'", entry.get("os", pool_os[pool]))
        hosts.append(LabHost(name=name, pool=pool, hw_profile=hw_profile,
                             address=address_for(position), port=port, faults=faults,
                             os=host_os, kubernetes=kubernetes))
    for entry in data.get("control_plane") or []:
        name = str(entry.get("name", "")) if isinstance(entry, dict) else ""
        if not _NAME_RE.match(name):
            raise LabError(f"{path}: control_plane: bad host name '{name}' (lowercase, digits, "
                           "'-')")
        if name in seen:
            raise LabError(f"{path}: host name '{name}' appears twice")
        seen.add(name)
        hosts.append(LabHost(name=name, pool=CONTROL_PLANE_GROUP, hw_profile="",
                             address=address_for(len(hosts) + 1), port=port,
                             kind=CONTROL_PLANE, kubernetes=kubernetes))
    return hosts


def _check_os(path: Path, where: str, os_key: object) -> str:
    if not isinstance(os_key, str) or os_key not in OSES:
        raise LabError(f"{path}: {where}: unknown os {os_key!r} (lab hosts run: "
                       f"{', '.join(OSES)})")
    return os_key


def check_fault(fault: str, where: str = "") -> None:
    try:
        hardware.check_fault(fault)
    except ValueError as exc:
        raise LabError(f"{where + ': ' if where else ''}{exc}") from None


def _check_profile(path: Path, where: str, hw_profile: object) -> None:
    if hw_profile not in hardware.HW_PROFILES:
        known = ", ".join(sorted(hardware.HW_PROFILES))
        raise LabError(f"{path}: {where}: unknown hardware profile '{hw_profile}' "
                       f"(known: {known})")


def apply_fault_args(hosts: list[LabHost], fault_args: list[str]) -> list[LabHost]:
    """Apply ``--fault HOST=FAULT[,FAULT]`` arguments; every name is checked first."""
    by_name = {h.name: h for h in hosts}
    extra: dict[str, list[str]] = {}
    for arg in fault_args:
        host, sep, faults = arg.partition("=")
        if not sep or not faults:
            raise LabError(f"--fault '{arg}': expected HOST=FAULT[,FAULT...]")
        if host not in by_name:
            raise LabError(f"--fault '{arg}': no host '{host}' in the fleet "
                           f"({', '.join(by_name)})")
        for fault in faults.split(","):
            check_fault(fault, where=f"--fault '{arg}'")
            extra.setdefault(host, []).append(fault)
    return [replace(h, faults=tuple(dict.fromkeys((*h.faults, *extra.get(h.name, ())))))
            for h in hosts]
