"""The Ansible inventory, read through Ansible's own API, as the validators need it.

Group and host vars merge exactly as ``ansible-playbook`` merges them (``InventoryManager`` +
``VariableManager``), and ``--limit`` accepts Ansible's host patterns. A node's pool is the child
group of ``gpu_nodes`` it belongs to; its profile is ``gpu_profile``.

Output: a tuple of :class:`Node` records, sorted by name.

Bad input is an :class:`InventoryError` naming the host and the variable: a value that does not
template, a port that is not a port, ``gpu_pool`` that is not a mapping, and a boolean that
Ansible itself would not read as one. Booleans are parsed with Ansible's own rules
(``convert_bool.boolean``): an INI inventory or a quoted YAML ``"false"`` is the string
``"false"``, which Python's ``bool()`` reads as true (that once turned host key checking off).
A ``--limit`` term that matches no host of the inventory is an error too, not a silent smaller
run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible.inventory.manager import InventoryManager, split_host_pattern
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible.vars.manager import VariableManager

from validate.transport.route import Route, RouteError, resolve, tcp_port

PARENT_GROUP = "gpu_nodes"

# Vars whose values the validators read; only these are templated (templating every var would
# resolve lookups the validators never use).
_USED_VARS = (
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_connection",
    "ansible_become",
    "ansible_become_user",
    "ansible_become_method",
    "gpuready_ssh_known_hosts",
    "gpuready_ssh_accept_unknown_host_keys",
    "gpu_profile",
    "gpu_pool",
    "gpu_thresholds",
    "nvidia_driver_version",
    "gpuready_scratch_path",
    "gpuready_drive_class",
    "gpuready_services",
    "gpuready_checkpoint_path",
    "gpuready_fio_size_mib",
    "gpuready_checkpoint_size_mib",
    "gpuready_xid_window",
    "gpuready_environment",
    # The gate: where the cluster is, which label prefix is the site's, the Node's name.
    "gpuready_kubeconfig",
    "gpuready_label_prefix",
    "node_join_node_name",
    # drift (validate/drift): role inputs the live probes compare against, and its settings
    "nvidia_driver_persistenced_enabled",
    "nvidia_driver_peermem_fabrics",
    "gpu_kernel_prereqs_modules",
    "nvidia_container_toolkit_runtime_name",
    "gpuready_kernel_release",
    "gpuready_drift_margins",
    # fabric.nccl_pair (validate/fabric.py): the pool's NCCL environment and MPI parameters
    "gpuready_fabric_nccl_ib_hca",
    "gpuready_fabric_nccl_ib_gid_index",
    "gpuready_fabric_nccl_socket_ifname",
    "gpuready_fabric_nccl_env",
    "gpuready_fabric_mpi_mca",
    # the capacity and cost view (validate/cost.py)
    "gpuready_cost",
)


class InventoryError(Exception):
    """The inventory cannot be read, or a GPU host lacks a pool or profile."""


@dataclass(frozen=True, slots=True)
class Node:
    """One GPU host as the validators see it.

    ``vars`` holds the templated values of the variables listed in ``_USED_VARS`` that are set.
    ``route`` is how Ansible's ssh would reach it (jump hosts, proxy command, every known_hosts
    file); ``address``/``port``/``user``/``key_file`` are its target hop, ``known_hosts`` the
    first of its files.
    """

    name: str
    address: str
    port: int
    user: str
    connection: str  # ansible_connection: ssh (default) or local
    key_file: Path | None
    known_hosts: Path | None
    accept_unknown_host_keys: bool
    pool: str
    profile: str
    gpu_pool: Mapping[str, str]
    vars: Mapping[str, Any] = field(default_factory=dict)
    route: Route | None = None
    # ansible_become: the user a command that needs root runs as, through `sudo -n -u`; None
    # when the inventory does not become (commands run as the login user).
    become_user: str | None = None


def _boolean(host: str, var: str, value: Any) -> bool:
    try:
        return bool(boolean(value, strict=True))
    except TypeError:
        raise InventoryError(
            f"host {host}: {var} is {value!r}, not a boolean (Ansible reads yes/no, true/false, "
            "on/off, 1/0)"
        ) from None


def _port(host: str, value: Any) -> int:
    try:
        return tcp_port(value, "ansible_port")
    except RouteError as exc:
        raise InventoryError(f"host {host}: {exc}") from None


def _template(host: str, templar: Templar, raw: Mapping[str, Any]) -> dict[str, Any]:
    used: dict[str, Any] = {}
    for var in _USED_VARS:
        if var not in raw:
            continue
        try:
            used[var] = templar.template(raw[var])
        except Exception as exc:  # Ansible raises several types; each names only the template
            reason = " ".join(str(exc).split())[:300]
            raise InventoryError(
                f"host {host}: variable {var} cannot be templated: {type(exc).__name__}: {reason}"
            ) from None
    return used


def _become(host: str, used: Mapping[str, Any]) -> str | None:
    """The become user, when ansible_become is true; only sudo is supported."""
    if not _boolean(host, "ansible_become", used.get("ansible_become", False)):
        return None
    method = str(used.get("ansible_become_method") or "sudo")
    if method != "sudo":
        raise InventoryError(
            f"host {host}: ansible_become_method is {method!r}; the validators become root only "
            "with sudo (sudo -n, passwordless): set ansible_become_method: sudo"
        )
    user = str(used.get("ansible_become_user") or "root")
    if not user or user.startswith("-"):
        raise InventoryError(f"host {host}: ansible_become_user is {user!r}, not a user name")
    return user


def _check_limit(inventory: InventoryManager, source: Path, limit: str) -> None:
    """Every term of an Ansible limit must match some host of the inventory: a typo in one
    term would otherwise quietly validate fewer nodes."""
    for term in split_host_pattern(limit):
        name = term.lstrip("!&")
        if not name or name.startswith("@"):
            continue
        if not inventory.get_hosts(pattern=name):
            raise InventoryError(f"--limit term {term!r} matches no host in {source}")


def load(source: Path, limit: str | None = None) -> tuple[Node, ...]:
    """Read the GPU nodes (members of ``gpu_nodes``) of the inventory at ``source``.

    ``limit`` is an Ansible host pattern (``pool_h100_sxm:!gpu-h100-02``, ``gpu-*``, ...).
    Raises :class:`InventoryError` on an unreadable inventory, a host with no pool/profile, a
    limit term that matches nothing, or a bad value (see the module docstring).
    """
    if not source.exists():
        raise InventoryError(f"inventory {source} does not exist")
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    if PARENT_GROUP not in inventory.groups:
        raise InventoryError(f"inventory {source} has no group {PARENT_GROUP!r}")
    variables = VariableManager(loader=loader, inventory=inventory)
    pools = {g.name for g in inventory.groups[PARENT_GROUP].child_groups}
    if limit:
        _check_limit(inventory, source, limit)
        inventory.subset(limit)
    nodes: list[Node] = []
    for host in inventory.get_hosts(pattern=PARENT_GROUP):
        raw = variables.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=raw)
        used = _template(host.name, templar, raw)
        host_pools = sorted(pools & {g.name for g in host.get_groups()})
        if len(host_pools) != 1:
            raise InventoryError(
                f"host {host.name}: must be in exactly one pool group under {PARENT_GROUP} "
                f"(found {host_pools or 'none'})"
            )
        profile = used.get("gpu_profile")
        if not isinstance(profile, str) or not profile:
            raise InventoryError(f"host {host.name}: gpu_profile is not set (pool {host_pools[0]})")
        _port(host.name, used.get("ansible_port", 22))
        try:
            route = resolve(host.name, used)
        except RouteError as exc:
            raise InventoryError(f"host {host.name}: {exc}") from None
        gpu_pool = used.get("gpu_pool") or {}
        if not isinstance(gpu_pool, Mapping):
            raise InventoryError(f"host {host.name}: gpu_pool must be a mapping, got {gpu_pool!r}")
        nodes.append(
            Node(
                name=host.name,
                address=route.target.address,
                port=route.target.port,
                user=route.target.user,
                connection=str(used.get("ansible_connection", "ssh")),
                key_file=route.target.key_files[0] if route.target.key_files else None,
                known_hosts=route.known_hosts[0] if route.known_hosts else None,
                accept_unknown_host_keys=_boolean(
                    host.name,
                    "gpuready_ssh_accept_unknown_host_keys",
                    used.get("gpuready_ssh_accept_unknown_host_keys", False),
                ),
                pool=host_pools[0],
                profile=profile,
                gpu_pool={str(k): str(v) for k, v in dict(gpu_pool).items()},
                vars=used,
                route=route,
                become_user=_become(host.name, used),
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.name))
