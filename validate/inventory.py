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
run. The inventory's YAML is read as ansible.cfg makes ``ansible-playbook`` read it
(``duplicate_dict_key = error``): a mapping key given twice (two teams of one name, a host
listed twice) is an error naming the file and line, never Ansible's "Using last defined value
only" warning with one of the two dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.inventory.group import Group
from ansible.inventory.helpers import sort_groups
from ansible.inventory.host import Host
from ansible.inventory.manager import InventoryManager, split_host_pattern
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible.vars.manager import VariableManager
from ansible.vars.plugins import get_vars_from_inventory_sources

from validate import desired
from validate.desired import DesiredState
from validate.errors import InputError
from validate.profiles import Profile, ProfileError, load_profile
from validate.transport.route import Route, RouteError, resolve, tcp_port

PARENT_GROUP = "gpu_nodes"

# The connection settings (validate.transport.route reads them); the declared state's variables
# come from validate.desired. Only these are templated (templating every var would resolve
# lookups the validators never use).
_CONNECTION_VARS = (
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
)
_USED_VARS = _CONNECTION_VARS + tuple(v for v in desired.VARS if v not in _CONNECTION_VARS)
# How Ansible's own ssh reaches any host (GPU node or not): what validate.ansible_ssh needs to
# make it verify host keys as the validators do.
_SSH_VARS = (*(v for v in _CONNECTION_VARS if not v.startswith("ansible_become")),
             "ansible_ssh_args")


class InventoryError(InputError):
    """The inventory cannot be read, or a GPU host lacks a pool or profile."""


# Ansible reads this setting each time it parses a YAML document (ansible.cfg sets it for
# ansible-playbook; python -m validate may run from anywhere, so the loader sets it itself).
_STRICT_YAML = {"ANSIBLE_DUPLICATE_YAML_DICT_KEY": "error"}
# The files Ansible reads as YAML: an inventory source's (its yaml plugin's) and group_vars' and
# host_vars' (its host_group_vars plugin's, where a file without an extension is YAML too).
_INVENTORY_YAML = (".yml", ".yaml", ".json")
_VARS_YAML = ("", *_INVENTORY_YAML)


@contextlib.contextmanager
def strict_yaml() -> Iterator[None]:
    """Ansible's YAML reading with duplicate mapping keys an error, for the ``with`` body."""
    saved = {k: os.environ.get(k) for k in _STRICT_YAML}
    os.environ.update(_STRICT_YAML)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _yaml_files(source: Path) -> Iterator[Path]:
    """The inventory's YAML files: the source (a file, or the files of a directory) and the
    group_vars and host_vars beside or in it, as Ansible finds them."""
    base = source if source.is_dir() else source.parent
    if source.is_file():
        if source.suffix in _INVENTORY_YAML:
            yield source
    else:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).parts
            if (path.is_file() and path.suffix in _INVENTORY_YAML and rel[0] not in
                    ("group_vars", "host_vars") and not any(p.startswith(".") for p in rel)):
                yield path
    for folder in ("group_vars", "host_vars"):
        for path in sorted((base / folder).rglob("*")):
            rel = path.relative_to(base / folder).parts
            if (path.is_file() and path.suffix in _VARS_YAML
                    and not any(p.startswith(".") for p in rel)):
                yield path


def read_strictly(source: Path, loader: DataLoader) -> None:
    """Parse every YAML file of the inventory at ``source`` with duplicate keys an error;
    raise InventoryError naming the file, line and key of the first problem. (Ansible itself
    would say only that the source could not be parsed, or use the last value.)"""
    with strict_yaml():
        for path in _yaml_files(source):
            try:
                loader.load_from_file(str(path), cache="none")
            except AnsibleError as exc:
                origin = getattr(exc, "obj", None)
                line = getattr(origin, "line_num", None)
                where = f"{path}:{line}" if line else str(path)
                raise InventoryError(f"inventory {where}: {exc.message}") from None


@dataclass(frozen=True, slots=True)
class SshHost:
    """How Ansible's ssh connection reaches one inventory host, GPU node or not: its route
    (with every known_hosts file the validators trust), the ``ansible_ssh_args`` it sets (None:
    Ansible's configured ones) and whether unknown host keys are accepted for it."""

    name: str
    connection: str  # ansible_connection: ssh (default), local, ...
    route: Route
    ssh_args: str | None
    accept_unknown_host_keys: bool


@dataclass(frozen=True, slots=True)
class Node:
    """One GPU host as the validators see it.

    ``desired`` is what the inventory declares for it (validate.desired), read and checked once
    by :func:`load`; everything downstream reads it. ``vars`` holds the templated values it was
    read from (the connection settings and the declared state's variables, as given).
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
    # Filled from ``vars`` when not given (a Node built by hand, as tests do); a bad value
    # there raises InventoryError naming the host and the variable.
    desired: DesiredState = field(default=None)  # type: ignore[assignment]
    # The profile it is judged against, its inventory overrides applied: :func:`load` resolves
    # it once per distinct (profile, overrides) and every reader takes it from here
    # (:func:`profile_for`). None on a Node built by hand until profile_for loads it.
    loaded_profile: Profile | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.desired is None:
            state, problems = desired.read(self.vars)
            if problems:
                raise InventoryError("; ".join(f"host {self.name}: {p.var} {p.reason}"
                                               for p in problems))
            object.__setattr__(self, "desired", state)


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


def _plain(templar: Templar, value: Any) -> bool:
    """Whether ``value`` holds no string that could be a template (keys included): its
    templated value then depends on no variable."""
    if isinstance(value, str):
        return not templar.is_possibly_template(value)
    if isinstance(value, Mapping):
        return all(_plain(templar, k) and _plain(templar, v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(templar, v) for v in value)
    return value is None or isinstance(value, (bool, int, float))


def _template(host: str, templar: Templar, raw: Mapping[str, Any],
              plain_cache: dict[tuple[str, str], Any],
              names: tuple[str, ...] = _USED_VARS) -> dict[str, Any]:
    """The variables the validators use, templated. A value with no template in it (most of
    them, set once in group_vars for a whole pool) is templated once per distinct value, not
    once per host: templating was half of loading a 1,000-host inventory. Hosts share the
    cached value (nothing changes a node's variables after loading)."""
    used: dict[str, Any] = {}
    for var in names:
        if var not in raw:
            continue
        value = raw[var]
        key = (var, f"{type(value).__name__}:{value!r}")
        if key in plain_cache:
            used[var] = plain_cache[key]
            continue
        try:
            used[var] = templar.template(value)
            if _plain(templar, value):
                plain_cache[key] = used[var]
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


def _origin(host: Host, var: str, loader: DataLoader, sources: list[str]) -> str:
    """Where ``var`` of ``host`` was set, as a person would look for it: the host itself (its
    inventory entry or host_vars), else the most specific of its groups that sets it (Ansible's
    own precedence: deeper groups, then higher ansible_group_priority, then name, win)."""
    def sets(entity: Host | Group) -> bool:
        if var in entity.get_vars():
            return True
        # "task": the stage at which Ansible itself reads host_vars/ and group_vars/.
        found = get_vars_from_inventory_sources(loader, sources, [entity], "task")
        return var in found

    if sets(host):
        return f"host {host.name}"
    for group in reversed(sort_groups(host.get_groups())):
        if sets(group):
            return f"group {group.name}"
    return f"host {host.name}"


@dataclass
class _Problems:
    """Bad declared values of every host, one line per (origin, variable, reason) with the
    hosts it affects: a bad group variable is said once, naming its group."""

    source: Path
    lines: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)

    def add(self, origin: str, var: str, reason: str, host: str) -> None:
        self.lines.setdefault((origin, var, reason), []).append(host)

    def raise_if_any(self) -> None:
        if not self.lines:
            return
        said = []
        for (origin, var, reason), hosts in self.lines.items():
            if origin.startswith("host "):
                where = f"set on {origin}"
            else:
                where = f"set in {origin}, host{'s' if len(hosts) > 1 else ''} {_names(hosts)}"
            said.append(f"{var} ({where}) {reason}")
        raise InventoryError(f"inventory {self.source}: {len(said)} bad declared value(s); "
                             "nothing was connected to:\n  " + "\n  ".join(said))


def _names(hosts: list[str]) -> str:
    return ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")


def profile_for(node: Node) -> Profile:
    """The node's profile with its inventory overrides, as its checks judge against it (and as
    run.json records it): the one :func:`load` resolved, else loaded now. Raises ProfileError."""
    if node.loaded_profile is not None:
        return node.loaded_profile
    return load_profile(
        node.profile,
        node.desired.thresholds,
        inventory_vars=node.desired.profile_overrides,
        override_source=f"inventory gpu_thresholds ({node.name})",
    )


def _resolve_profiles(nodes: list[Node], problems: _Problems,
                      origin: Callable[[str, str], str]) -> list[Node]:
    """Each node with its profile resolved, each distinct (profile, overrides) loaded once,
    before any connection. A profile that does not exist or thresholds that do not apply are
    the inventory's error, each problem named with the variable (gpu_profile, gpu_thresholds or
    gpuready_drive_class) and where it was set."""
    seen: dict[str, Profile | list[tuple[str, str]]] = {}
    out = []
    for node in nodes:
        key = json.dumps([node.profile, dict(node.desired.profile_overrides)], sort_keys=True,
                         default=repr)
        if key not in seen:
            try:
                seen[key] = profile_for(node)
            except ProfileError as exc:
                seen[key] = _profile_problems(exc)
        got = seen[key]
        if isinstance(got, Profile):
            out.append(replace(node, loaded_profile=got))
            continue
        out.append(node)
        for var, reason in got:
            problems.add(origin(node.name, var), var, f"is not usable: {reason}", node.name)
    return out


def _profile_problems(exc: ProfileError) -> list[tuple[str, str]]:
    """(variable, reason) for each problem of a profile that did not load: the overrides'
    own problems are gpu_thresholds', an unknown drive class set in the inventory is
    gpuready_drive_class's, the rest belong to the profile (gpu_profile), named with its file."""
    if exc.source.startswith(f"inventory {desired.DRIVE_CLASS}"):
        return [(desired.DRIVE_CLASS, exc.reason)]
    if exc.source.startswith(f"inventory {desired.THRESHOLDS}"):
        return [(desired.THRESHOLDS, f"{k}: {r}" if k else r) for k, r in exc.problems]
    # The merged thresholds ("<file> + inventory gpu_thresholds (...)"): the overrides made them
    # incomplete or inverted a band.
    merged = f"inventory {desired.THRESHOLDS}" in exc.source
    var = desired.THRESHOLDS if merged else desired.PROFILE
    where = f"merged over {exc.source.split(' + ')[0]}" if merged else exc.source
    return [(var, f"{where}: {k}: {r}" if k else f"{where}: {r}") for k, r in exc.problems]


def load(source: Path, limit: str | None = None) -> tuple[Node, ...]:
    """Read the GPU nodes (members of ``gpu_nodes``) of the inventory at ``source``.

    ``limit`` is an Ansible host pattern (``pool_h100_sxm:!gpu-h100-02``, ``gpu-*``, ...).
    Raises :class:`InventoryError` on an unreadable inventory, a host with no pool/profile, a
    limit term that matches nothing, or a bad value (see the module docstring). Declared values
    (validate.desired) and each pool's profile are checked for every selected host first, and
    every bad one is named with the group or host it was set on, before anything connects.
    """
    if not source.exists():
        raise InventoryError(f"inventory {source} does not exist")
    loader = DataLoader()
    read_strictly(source, loader)
    with strict_yaml():
        return _load(source, loader, limit)


def _load(source: Path, loader: DataLoader, limit: str | None) -> tuple[Node, ...]:
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    if PARENT_GROUP not in inventory.groups:
        raise InventoryError(f"inventory {source} has no group {PARENT_GROUP!r}")
    variables = VariableManager(loader=loader, inventory=inventory)
    pools = {g.name for g in inventory.groups[PARENT_GROUP].child_groups}
    if limit:
        _check_limit(inventory, source, limit)
        inventory.subset(limit)
    hosts = {h.name: h for h in inventory.get_hosts(pattern=PARENT_GROUP)}

    def origin(host: str, var: str) -> str:
        return _origin(hosts[host], var, loader, [str(source)])

    problems = _Problems(source)
    nodes: list[Node] = []
    plain_cache: dict[tuple[str, str], Any] = {}
    for host in hosts.values():
        raw = variables.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=raw)
        used = _template(host.name, templar, raw, plain_cache)
        host_pools = sorted(pools & {g.name for g in host.get_groups()})
        if len(host_pools) != 1:
            raise InventoryError(
                f"host {host.name}: must be in exactly one pool group under {PARENT_GROUP} "
                f"(found {host_pools or 'none'})"
            )
        state, bad = desired.read(used)
        for problem in bad:
            problems.add(origin(host.name, problem.var), problem.var, problem.reason, host.name)
        profile = used.get(desired.PROFILE)
        if profile is None:
            problems.add(f"host {host.name}", desired.PROFILE,
                         f"is not set (pool {host_pools[0]})", host.name)
            continue
        if not isinstance(profile, str) and not any(p.var == desired.PROFILE for p in bad):
            # Never dropped quietly: a host that is not a node must be named as not one.
            problems.add(origin(host.name, desired.PROFILE), desired.PROFILE,
                         f"is {profile!r}, not a profile name", host.name)
            continue
        if bad:
            continue
        _port(host.name, used.get("ansible_port", 22))
        try:
            route = resolve(host.name, used)
        except RouteError as exc:
            raise InventoryError(f"host {host.name}: {exc}") from None
        gpu_pool = _pool_labels(used)
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
                gpu_pool=gpu_pool,
                vars=used,
                route=route,
                become_user=_become(host.name, used),
                desired=state,
            )
        )
    problems.raise_if_any()
    nodes = _resolve_profiles(nodes, problems, origin)
    problems.raise_if_any()
    return tuple(sorted(nodes, key=lambda n: n.name))


def ssh_hosts(source: Path, limit: str | None = None) -> tuple[SshHost, ...]:
    """Every host of the inventory at ``source`` (``limit``: an Ansible host pattern) with its
    SSH settings, resolved as :func:`load` resolves a GPU node's. Raises InventoryError."""
    if not source.exists():
        raise InventoryError(f"inventory {source} does not exist")
    loader = DataLoader()
    read_strictly(source, loader)
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    if limit:
        _check_limit(inventory, source, limit)
        inventory.subset(limit)
    out: list[SshHost] = []
    plain_cache: dict[tuple[str, str], Any] = {}
    for host in inventory.get_hosts(pattern="all"):
        raw = variables.get_vars(host=host, include_hostvars=False)
        used = _template(host.name, Templar(loader=loader, variables=raw), raw, plain_cache,
                         _SSH_VARS)
        _port(host.name, used.get("ansible_port", 22))
        try:
            route = resolve(host.name, used)
        except RouteError as exc:
            raise InventoryError(f"host {host.name}: {exc}") from None
        args = used.get("ansible_ssh_args")
        out.append(SshHost(
            name=host.name, connection=str(used.get("ansible_connection") or "ssh"),
            route=route, ssh_args=None if args is None else str(args),
            accept_unknown_host_keys=_boolean(
                host.name, "gpuready_ssh_accept_unknown_host_keys",
                used.get("gpuready_ssh_accept_unknown_host_keys", False))))
    return tuple(sorted(out, key=lambda h: h.name))


def _pool_labels(used: Mapping[str, Any]) -> dict[str, str]:
    """gpu_pool as strings (its type was checked by validate.desired)."""
    return {str(k): str(v) for k, v in dict(used.get(desired.POOL) or {}).items()}


def set_in(source: Path, host: Host, var: str, loader: DataLoader) -> str:
    """Where ``var`` of ``host`` was set, with the file a person would open: ``group all
    (inventory/staging.example/group_vars/all/cluster.yml)``; the inventory file itself when
    no group_vars/host_vars file sets it."""
    where = _origin(host, var, loader, [str(source)])
    kind, _, name = where.partition(" ")
    base = source if source.is_dir() else source.parent
    folder = base / ("group_vars" if kind == "group" else "host_vars")
    candidates = [folder / f"{name}{ext}" for ext in (".yml", ".yaml", "")]
    if (folder / name).is_dir():
        candidates += sorted((folder / name).iterdir())
    for path in candidates:
        if not path.is_file():
            continue
        try:
            doc = loader.load_from_file(str(path))
        except Exception:  # a file Ansible cannot read names nothing here
            continue
        if isinstance(doc, Mapping) and var in doc:
            return f"{where} ({path})"
    inventory_file = source / "hosts.yml" if source.is_dir() else source
    return f"{where} ({inventory_file})"
