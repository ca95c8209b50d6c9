"""What the inventory declares for the cluster above the nodes, read once and checked whole.

The pools are the inventory's (``gpu_nodes`` children, read by validate.inventory.load: their
nodes, ``gpu_pool`` and SKU profile); this module adds the cluster's variables:

================================================  ================================================
``gpuready_cluster_teams`` (group ``all``)        teams: namespace, Pod Security level, GPU quota
                                                  per pool, cohort and borrowing limits, CPU and
                                                  memory quota, the groups bound to admin/edit/view
``gpuready_cluster_time_slicing_replicas`` (pool) replicas per GPU of a ``time-slicing`` pool
``gpuready_cluster_pool_taints`` (pool)           taints the pool's nodes carry (``key``,
                                                  ``value``, ``effect``): Kueue's flavor tolerates
``gpuready_cluster_topology_labels`` (pool)       node labels of the physical topology, widest
                                                  first (block, rack): Kueue's Topology levels
``gpuready_cluster_cost_baseline`` (pool)         what an accepted GPU-hour is compared with by
                                                  ``validate acceptance``: ``{per_gpu_hour: N,
                                                  source: TEXT}`` (a rental or API price)
``gpuready_cluster_operator_namespace`` (all)     where the GPU Operator runs (``gpu-operator``)
``gpuready_cluster_acceptance_image`` (all)       the acceptance Job's image (nccl-tests inside)
``gpuready_cluster_acceptance_host_network`` (all) the acceptance Pods use the host's network
                                                  (``false``; the namespace's Pod Security must
                                                  allow it: ``privileged``)
``gpuready_cluster_acceptance_pull_policy`` (all) its ``imagePullPolicy`` (``IfNotPresent``)
================================================  ================================================

Every problem is collected and raised at once as an InventoryError naming the variable, where it
was set (group or host, and the file) and what is wrong, before anything talks to a cluster:
an unknown sharing mode, a time-slicing pool without replicas (or 0), a quota above what the
pool offers, a team naming a pool the inventory does not have, a borrowing limit without a
cohort, a team namespace that is Kubernetes' own (``default``, ``kube-*``) or the GPU
Operator's, a Node name (``node_join_node_name``, else the host's name) that is not a Kubernetes
name. MIG on an accelerator without MIG is refused earlier, by validate.inventory.load
(validate.mig).

Output: :class:`ClusterSpec`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible.vars.manager import VariableManager

from validate import desired
from validate.inventory import PARENT_GROUP, InventoryError, Node, load, profile_for, set_in
from validate.mig import is_mig_sharing

TEAMS = "gpuready_cluster_teams"
REPLICAS = "gpuready_cluster_time_slicing_replicas"
TAINTS = "gpuready_cluster_pool_taints"
TOPOLOGY = "gpuready_cluster_topology_labels"
COST_BASELINE = "gpuready_cluster_cost_baseline"
OPERATOR_NAMESPACE = "gpuready_cluster_operator_namespace"
ACCEPTANCE_IMAGE = "gpuready_cluster_acceptance_image"
ACCEPTANCE_HOST_NETWORK = "gpuready_cluster_acceptance_host_network"
ACCEPTANCE_PULL_POLICY = "gpuready_cluster_acceptance_pull_policy"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
POOL_VARS = (REPLICAS, TAINTS, TOPOLOGY, COST_BASELINE)
GLOBAL_VARS = (TEAMS, OPERATOR_NAMESPACE, ACCEPTANCE_IMAGE, ACCEPTANCE_HOST_NETWORK,
               ACCEPTANCE_PULL_POLICY)

DEFAULT_OPERATOR_NAMESPACE = "gpu-operator"
# A placeholder a site replaces with its own build (nccl-tests at the roles' pinned version).
DEFAULT_ACCEPTANCE_IMAGE = "registry.example.com/gpuready/acceptance:nccl-tests-2.17.1"
FULL_GPU = "full-gpu"
TIME_SLICING = "time-slicing"
SHARING_MODES = (FULL_GPU, TIME_SLICING, "mig", "mig-mixed", "mig-<profile>")
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")
ROLES = ("admin", "edit", "view")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TEAM_KEYS = ("namespace", "pod_security", "cohort", "gpus", "cpu", "memory", "groups")
HOSTNAME_LABEL = "kubernetes.io/hostname"
NOT_SET = "is not set: "  # how sharing_of says a variable is missing
# Namespaces the cluster's own components live in (Kubernetes reserves every kube-* name): a
# team's namespace gets Pod Security, a GPU quota and a LimitRange, which would break them.
RESERVED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


@dataclass(frozen=True, slots=True)
class Sharing:
    """How a pool's GPUs are shared (``gpu_pool.sharing``): ``full-gpu``, ``time-slicing``
    (``replicas`` per GPU) or MIG (``mig_strategy`` single with every device ``mig_profile``,
    or mixed)."""

    mode: str  # full-gpu | time-slicing | mig
    replicas: int | None = None
    mig_strategy: str | None = None  # single | mixed
    mig_profile: str | None = None

    @property
    def config_name(self) -> str:
        """The device plugin configuration's name in the shared ConfigMap."""
        if self.mode == TIME_SLICING:
            return f"time-slicing-{self.replicas}"
        if self.mode == "mig":
            return f"mig-{self.mig_strategy}"
        return FULL_GPU


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class CostBaseline:
    per_gpu_hour: float
    source: str


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool: its inventory group, its Nodes (Kubernetes names), GPUs per node (the SKU
    profile's), ``gpu_pool``, sharing, taints and physical topology labels."""

    group: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    gpu_pool: Mapping[str, str]
    sharing: Sharing
    taints: tuple[Taint, ...] = ()
    topology_labels: tuple[str, ...] = ()
    # MIG devices per node (single strategy: what nvidia.com/gpu counts on a node).
    mig_devices_per_node: int = 0
    # What an accepted GPU-hour is compared with (validate acceptance), in the pool's cost
    # currency (validate.cost's gpuready_cost), and where the figure comes from.
    cost_baseline: CostBaseline | None = None

    @property
    def name(self) -> str:
        """The pool as a Kubernetes object name (``pool_h100_sxm`` -> ``pool-h100-sxm``)."""
        return self.group.lower().replace("_", "-")

    @property
    def gpus(self) -> int:
        """Physical GPUs: nodes x GPUs per node."""
        return len(self.nodes) * self.gpus_per_node

    @property
    def capacity(self) -> int:
        """``nvidia.com/gpu`` the device plugin advertises across the pool: the GPUs, times
        the replicas when time-sliced, or the MIG devices with the single strategy (a mixed
        MIG pool advertises nvidia.com/mig-<profile> resources instead: 0)."""
        if self.sharing.mode == TIME_SLICING:
            return self.gpus * (self.sharing.replicas or 0)
        if self.sharing.mode == "mig":
            return (len(self.nodes) * self.mig_devices_per_node
                    if self.sharing.mig_strategy == "single" else 0)
        return self.gpus


@dataclass(frozen=True, slots=True)
class PoolQuota:
    pool: str  # the inventory group
    gpus: int
    borrowing_limit: int | None = None


@dataclass(frozen=True, slots=True)
class TeamSpec:
    name: str
    namespace: str
    pod_security: str
    quotas: tuple[PoolQuota, ...]
    cohort: str | None = None
    cpu: str | None = None
    memory: str | None = None
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def queue(self) -> str:
        """The team's ClusterQueue and LocalQueue name."""
        return self.name


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    source: Path
    label_prefix: str
    pools: tuple[PoolSpec, ...]
    teams: tuple[TeamSpec, ...]
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    acceptance_image: str = DEFAULT_ACCEPTANCE_IMAGE
    acceptance_host_network: bool = False
    acceptance_pull_policy: str = "IfNotPresent"
    kubeconfig: str | None = None  # gpuready_kubeconfig, as the gate reads it

    def pool(self, group: str) -> PoolSpec:
        return next(p for p in self.pools if p.group == group)


class _Problems:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, var: str, where: str, reason: str) -> None:
        self.lines.append(f"{var} (set in {where}) {reason}")

    def missing(self, var: str, where: str, reason: str) -> None:
        """``var`` is set nowhere: say where a site sets it (a group and its file)."""
        self.lines.append(f"{var} is not set: {reason}; set it in {where}")


def sharing_of(gpu_pool: Mapping[str, str], replicas: Any) -> tuple[Sharing | None, str]:
    """The pool's sharing, or None and why not (the reason names the variable at fault:
    ``gpu_pool`` or the replicas variable)."""
    mode = gpu_pool.get("sharing", "")
    if mode == FULL_GPU:
        if replicas is not None:
            return None, f"{REPLICAS}: is set, but gpu_pool.sharing is {FULL_GPU}"
        return Sharing(FULL_GPU), ""
    if mode == TIME_SLICING:
        if replicas is None:
            return None, f"{REPLICAS}: {NOT_SET}a time-slicing pool needs its replicas per GPU"
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            return None, (f"{REPLICAS}: is {replicas!r}: replicas per GPU must be a whole "
                          "number of at least 1")
        return Sharing(TIME_SLICING, replicas=replicas), ""
    if is_mig_sharing(mode):
        if replicas is not None:
            return None, f"{REPLICAS}: is set, but gpu_pool.sharing is {mode}"
        if mode in ("mig", "mig-mixed"):
            return Sharing("mig", mig_strategy="mixed"), ""
        return Sharing("mig", mig_strategy="single", mig_profile=mode.removeprefix("mig-")), ""
    return None, (f"{desired.POOL}: sharing is {mode!r}, not a sharing mode the GPU Operator's "
                  f"device plugin is configured for (one of {', '.join(SHARING_MODES)})")


def _acceptance_settings(glob: Mapping[str, Any], where: Any, problems: _Problems
                         ) -> tuple[bool, str]:
    """``gpuready_cluster_acceptance_host_network`` and ``_pull_policy``, checked."""
    host_network = glob.get(ACCEPTANCE_HOST_NETWORK, False)
    if not isinstance(host_network, bool):
        problems.add(ACCEPTANCE_HOST_NETWORK, where(ACCEPTANCE_HOST_NETWORK),
                     f"is {host_network!r}, not true or false")
    pull_policy = glob.get(ACCEPTANCE_PULL_POLICY, "IfNotPresent")
    if pull_policy not in PULL_POLICIES:
        problems.add(ACCEPTANCE_PULL_POLICY, where(ACCEPTANCE_PULL_POLICY),
                     f"is {pull_policy!r}, not one of {', '.join(PULL_POLICIES)}")
    return host_network is True, str(pull_policy)


def load_spec(source: Path) -> ClusterSpec:
    """The cluster the inventory at ``source`` declares. Raises InventoryError listing every
    problem (module docstring), nothing having been contacted."""
    nodes = load(source)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    variables = VariableManager(loader=loader, inventory=inventory)
    problems = _Problems()
    by_pool: dict[str, list[Node]] = {}
    for node in nodes:
        by_pool.setdefault(node.pool, []).append(node)
    hosts = {h.name: h for h in inventory.get_hosts(pattern=PARENT_GROUP)}

    def read(host: str, names: Sequence[str]) -> dict[str, Any]:
        raw = variables.get_vars(host=hosts[host], include_hostvars=False)
        templar = Templar(loader=loader, variables=raw)
        out: dict[str, Any] = {}
        for var in names:
            if var in raw:
                try:
                    # Plain Python types (Ansible's templated values carry tags of their own).
                    out[var] = json.loads(json.dumps(templar.template(raw[var]), default=str))
                except Exception as exc:  # Ansible raises several types
                    problems.add(var, where(host, var), f"cannot be templated: {exc}")
        return out

    def where(host: str, var: str) -> str:
        return set_in(source, hosts[host], var, loader)

    pools = []
    for group in sorted(by_pool):
        members = by_pool[group]
        values = {n.name: read(n.name, POOL_VARS) for n in members}
        first = members[0]
        for n in members[1:]:
            for var in POOL_VARS:
                if values[n.name].get(var) != values[first.name].get(var):
                    problems.add(var, where(n.name, var),
                                 f"differs between hosts {first.name} and {n.name} of pool "
                                 f"{group}: the cluster's settings are one per pool")
        pool = _pool(group, members, values[first.name], problems,
                     lambda var, h=first.name: where(h, var))
        if pool is not None:
            pools.append(pool)
    first_host = nodes[0].name if nodes else ""
    glob = read(first_host, GLOBAL_VARS) if first_host else {}
    others = {node.name: read(node.name, GLOBAL_VARS) for node in nodes[1:]}
    for var in GLOBAL_VARS:
        differing = [name for name, got in others.items() if got.get(var) != glob.get(var)]
        if differing:
            origins = dict.fromkeys(where(h, var) for h in (first_host, *differing))
            problems.add(var, " and ".join(origins),
                         "differs between hosts: the cluster has one (set it in group all only)")
            glob.pop(var, None)
    prefix = (nodes[0].desired.gate.label_prefix if nodes else None) or ""
    if not prefix:
        problems.missing(desired.LABEL_PREFIX, _group_all_file(source),
                         "the pools' Kueue flavors select nodes by the gate's labels under it")
    operator_ns = glob.get(OPERATOR_NAMESPACE, DEFAULT_OPERATOR_NAMESPACE)
    if not isinstance(operator_ns, str) or not _DNS_LABEL.match(operator_ns):
        problems.add(OPERATOR_NAMESPACE, where(first_host, OPERATOR_NAMESPACE),
                     f"is {operator_ns!r}, not a namespace name")
    image = glob.get(ACCEPTANCE_IMAGE, DEFAULT_ACCEPTANCE_IMAGE)
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        problems.add(ACCEPTANCE_IMAGE, where(first_host, ACCEPTANCE_IMAGE),
                     f"is {image!r}, not an image reference")
    host_network, pull_policy = _acceptance_settings(
        glob, lambda var: where(first_host, var), problems)
    teams: tuple[TeamSpec, ...] = ()
    _node_names(nodes, problems)
    if TEAMS in glob:
        teams = _teams(glob[TEAMS], {p.group: p for p in pools}, set(by_pool),
                       problems, where(first_host, TEAMS), str(operator_ns))
    if problems.lines:
        raise InventoryError(
            f"inventory {source}: {len(problems.lines)} bad cluster value(s); nothing was "
            "rendered or applied:\n  " + "\n  ".join(problems.lines))
    return ClusterSpec(source=source, label_prefix=prefix, pools=tuple(pools), teams=teams,
                       operator_namespace=str(operator_ns), acceptance_image=str(image),
                       acceptance_host_network=host_network,
                       acceptance_pull_policy=pull_policy,
                       kubeconfig=nodes[0].desired.gate.kubeconfig if nodes else None)


def _node_names(nodes: Sequence[Node], problems: _Problems) -> None:
    """A host without node_join_node_name is its Node's name (in the pools' node lists, the
    device plugin's labels): it must be a Kubernetes name (the variable itself was checked as
    the inventory was read)."""
    for node in nodes:
        if not node.desired.gate.node_name and not desired.is_node_name(node.name):
            problems.add(desired.NODE_NAME, f"host {node.name}", "is not set, and the host's "
                         f"inventory name {node.name!r} (the Node's name then) is not "
                         f"{desired.NODE_NAME_RULE}: set it to the name its kubelet registers")


def _pool(group: str, members: list[Node], values: Mapping[str, Any], problems: _Problems,
          where: Any) -> PoolSpec | None:
    first = members[0]
    gpu_pool = dict(first.gpu_pool)
    sharing, reason = sharing_of(gpu_pool, values.get(REPLICAS))
    if sharing is None:
        var, _, why = reason.partition(": ")
        if why.startswith(NOT_SET):
            # Set nowhere: name the pool's own group_vars file, where its gpu_pool is set.
            problems.missing(var, where(desired.POOL), why.removeprefix(NOT_SET))
        else:
            problems.add(var, where(var), why)
        return None
    taints = _taints(values.get(TAINTS, []), problems, where(TAINTS))
    labels = values.get(TOPOLOGY, [])
    if not isinstance(labels, list) or not all(
            isinstance(x, str) and _LABEL_KEY.match(x) and x != HOSTNAME_LABEL for x in labels):
        problems.add(TOPOLOGY, where(TOPOLOGY),
                     f"is {labels!r}, not a list of node label names, widest level first "
                     f"({HOSTNAME_LABEL} is added as the last level)")
        labels = []
    mig_devices = 0
    layout = first.desired.mig
    if sharing.mig_strategy == "single" and layout is not None:
        count = profile_for(first).hardware.gpu_count
        mig_devices = sum(len(layout.for_gpu(i) or ()) for i in range(count))
    baseline = _cost_baseline(values.get(COST_BASELINE), problems, where(COST_BASELINE))
    name = group.lower().replace("_", "-")
    if not _DNS_LABEL.match(name):
        problems.add(desired.POOL, f"group {group}", f"pool group {group!r} does not make a "
                     f"Kubernetes name ({name!r})")
    return PoolSpec(
        group=group,
        nodes=tuple(sorted(n.desired.gate.node_name or n.name for n in members)),
        gpus_per_node=profile_for(first).hardware.gpu_count,
        gpu_pool=gpu_pool, sharing=sharing, taints=taints, topology_labels=tuple(labels),
        mig_devices_per_node=mig_devices, cost_baseline=baseline)


def _cost_baseline(value: Any, problems: _Problems, where: str) -> CostBaseline | None:
    if value is None:
        return None
    amount = value.get("per_gpu_hour") if isinstance(value, Mapping) else None
    source = value.get("source") if isinstance(value, Mapping) else None
    if (not isinstance(value, Mapping) or set(value) != {"per_gpu_hour", "source"}
            or isinstance(amount, bool) or not isinstance(amount, int | float)
            or not 0 < amount < float("inf") or not isinstance(source, str)
            or not source.strip()):
        problems.add(COST_BASELINE, where, f"is {value!r}, not {{per_gpu_hour: N > 0, source: "
                     "TEXT}} (a rental or API price per GPU-hour, in the pool's cost currency)")
        return None
    return CostBaseline(float(amount), source.strip())


def _group_all_file(source: Path) -> str:
    """Where a site-wide variable goes: group all's file for the cluster (the examples'
    ``group_vars/all/cluster.yml``)."""
    base = source if source.is_dir() else source.parent
    return f"group all ({base / 'group_vars' / 'all' / 'cluster.yml'})"


def _taints(value: Any, problems: _Problems, where: str) -> tuple[Taint, ...]:
    out = []
    if not isinstance(value, list):
        problems.add(TAINTS, where, f"is {value!r}, not a list of taints")
        return ()
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or set(item) - {"key", "value", "effect"}:
            problems.add(TAINTS, where, f"[{i}] is {item!r}, not a mapping of key, value "
                         "and effect")
            continue
        key, val, effect = item.get("key"), str(item.get("value", "")), item.get("effect")
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            problems.add(TAINTS, where, f"[{i}].key is {key!r}, not a taint key")
        elif not _LABEL_VALUE.match(val):
            problems.add(TAINTS, where, f"[{i}].value is {val!r}, not a taint value")
        elif effect not in TAINT_EFFECTS:
            problems.add(TAINTS, where, f"[{i}].effect is {effect!r}, not one of "
                         f"{', '.join(TAINT_EFFECTS)}")
        else:
            out.append(Taint(key, val, str(effect)))
    return tuple(out)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _teams(value: Any, pools: Mapping[str, PoolSpec], pool_groups: set[str],
           problems: _Problems, where: str, operator_ns: str) -> tuple[TeamSpec, ...]:
    if not isinstance(value, Mapping):
        problems.add(TEAMS, where, f"is {type(value).__name__}, not a mapping of team names")
        return ()
    teams = []
    namespaces: dict[str, str] = {}
    for name, body in value.items():
        team = _team(str(name), body, pools, pool_groups, problems, where, operator_ns)
        if team is None:
            continue
        if team.namespace in namespaces:
            problems.add(TEAMS, where, f"team {name}: namespace {team.namespace} is also team "
                         f"{namespaces[team.namespace]}'s")
            continue
        namespaces[team.namespace] = team.name
        teams.append(team)
    return tuple(teams)


def _team(name: str, body: Any, pools: Mapping[str, PoolSpec], pool_groups: set[str],
          problems: _Problems, where: str, operator_ns: str) -> TeamSpec | None:
    said = len(problems.lines)

    def bad(reason: str) -> None:
        problems.add(TEAMS, where, f"team {name}: {reason}")

    if not _DNS_LABEL.match(name):
        bad("the team's name is not a DNS label (lowercase letters, digits, '-'): it names "
            "its ClusterQueue and LocalQueue")
    if not isinstance(body, Mapping):
        bad(f"is {body!r}, not a mapping ({', '.join(TEAM_KEYS)})")
        return None
    for key in sorted(set(body) - set(TEAM_KEYS)):
        bad(f"{key} is not a team setting (known: {', '.join(TEAM_KEYS)})")
    namespace = str(body.get("namespace", name))
    if not _DNS_LABEL.match(namespace):
        bad(f"namespace {namespace!r} is not a namespace name")
    elif namespace in RESERVED_NAMESPACES or namespace.startswith("kube-"):
        bad(f"namespace {namespace} is Kubernetes' own: a team's namespace gets Pod Security, "
            "a GPU quota and a LimitRange, which would break what the cluster runs there; "
            "give the team a namespace of its own")
    elif namespace == operator_ns:
        bad(f"namespace {namespace} is the GPU Operator's ({OPERATOR_NAMESPACE}): a team's "
            "Pod Security, quota and LimitRange would stop the operator's pods; give the team "
            "a namespace of its own")
    level = body.get("pod_security", "restricted")
    if level not in POD_SECURITY_LEVELS:
        bad(f"pod_security is {level!r}, not one of {', '.join(POD_SECURITY_LEVELS)}")
    cohort = body.get("cohort")
    if cohort is not None and (not isinstance(cohort, str) or not _DNS_LABEL.match(cohort)):
        bad(f"cohort is {cohort!r}, not a cohort name (a DNS label)")
    for key in ("cpu", "memory"):
        if key in body and not _QUANTITY.match(str(body[key])):
            bad(f"{key} is {body[key]!r}, not a Kubernetes quantity (e.g. 64, 500m, 512Gi)")
    groups: dict[str, tuple[str, ...]] = {}
    raw_groups = body.get("groups", {})
    if not isinstance(raw_groups, Mapping):
        bad(f"groups is {raw_groups!r}, not a mapping of {'/'.join(ROLES)} to group names")
        raw_groups = {}
    for role, names in raw_groups.items():
        if role not in ROLES:
            bad(f"groups.{role} is not a role this renderer binds ({', '.join(ROLES)})")
        elif not isinstance(names, list) or not all(isinstance(g, str) and g for g in names):
            bad(f"groups.{role} is {names!r}, not a list of group names")
        else:
            groups[str(role)] = tuple(names)
    quotas = _quotas(body.get("gpus"), pools, pool_groups, bad, cohort is not None)
    if len(problems.lines) > said:
        return None
    return TeamSpec(name=name, namespace=namespace, pod_security=str(level), quotas=quotas,
                    cohort=cohort, cpu=None if "cpu" not in body else str(body["cpu"]),
                    memory=None if "memory" not in body else str(body["memory"]),
                    groups=groups)


def _quotas(value: Any, pools: Mapping[str, PoolSpec], pool_groups: set[str], bad: Any,
            has_cohort: bool) -> tuple[PoolQuota, ...]:
    if not isinstance(value, Mapping) or not value:
        bad(f"gpus is {value!r}, not a mapping of pools to GPU quotas "
            "({pool: N} or {pool: {quota: N, borrowing_limit: M}})")
        return ()
    out = []
    for group, item in value.items():
        if group not in pool_groups:
            bad(f"gpus names pool {group!r}, which is not a pool of {PARENT_GROUP} (pools: "
                f"{', '.join(sorted(pool_groups))})")
            continue
        pool = pools.get(str(group))
        if pool is None:
            continue  # the pool itself is bad, and said so
        limit_raw = item.get("borrowing_limit") if isinstance(item, Mapping) else None
        quota = _count(item.get("quota") if isinstance(item, Mapping) else item)
        if quota is None or (isinstance(item, Mapping)
                             and set(item) - {"quota", "borrowing_limit"}):
            bad(f"gpus.{group} is {item!r}, not a GPU count or {{quota: N, borrowing_limit: M}}")
            continue
        limit = None if limit_raw is None else _count(limit_raw)
        if limit_raw is not None and limit is None:
            bad(f"gpus.{group}.borrowing_limit is {limit_raw!r}, not a GPU count")
            continue
        if limit is not None and not has_cohort:
            bad(f"gpus.{group}.borrowing_limit is set, but the team has no cohort to borrow from")
            continue
        if quota > pool.capacity:
            bad(f"gpus.{group} is {quota}, more than pool {group} offers: {_offer(pool)}")
            continue
        out.append(PoolQuota(str(group), quota, limit))
    return tuple(out)


def _offer(pool: PoolSpec) -> str:
    base = f"{len(pool.nodes)} node(s) x {pool.gpus_per_node} GPUs"
    if pool.sharing.mode == TIME_SLICING:
        return f"{base} x {pool.sharing.replicas} time-slicing replicas = {pool.capacity}"
    if pool.sharing.mode == "mig" and pool.sharing.mig_strategy == "single":
        return f"{len(pool.nodes)} node(s) x {pool.mig_devices_per_node} MIG devices = " \
               f"{pool.capacity} nvidia.com/gpu"
    if pool.sharing.mode == "mig":
        return ("0 nvidia.com/gpu: a mixed-strategy MIG pool offers nvidia.com/mig-<profile> "
                "resources, which team GPU quotas do not cover")
    return f"{base} = {pool.capacity}"
