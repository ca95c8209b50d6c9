"""The cluster's manifests from a :class:`~validate.cluster.spec.ClusterSpec`: pure functions.

What :func:`manifests` returns, in the order they are applied (namespaces before what lives in
them, flavors before the queues that name them), each labelled
``app.kubernetes.io/managed-by: gpuready`` (what ``cluster apply`` owns and may prune):

- **GPU Operator, host-driver mode** (pinned release :data:`GPU_OPERATOR_VERSION`): the
  ``ClusterPolicy`` with the driver and the container toolkit disabled (the roles installed
  them on the host) and the device plugin, GFD, DCGM exporter and validator kept. One DCGM host
  engine per node, the host's: the ``nvidia_dcgm`` role runs ``nv-hostengine``, so the
  operator's own (``dcgm.enabled``) stays off and its exporter connects to the host's
  (:data:`DCGM_HOSTENGINE`, on the host's network) instead of starting one embedded; the device
  plugin's ``ConfigMap`` (``devicePlugin.config``) with one configuration per sharing mode the
  pools use: ``full-gpu`` (the default), ``time-slicing-<replicas>``, ``mig-single`` or
  ``mig-mixed``. Each Node selects its pool's by the label the operator reads,
  ``nvidia.com/device-plugin.config`` (:func:`node_labels`). :func:`helm_values` are the chart's
  values for the same settings, with ``clusterPolicy.deployCR: false``: the ClusterPolicy has one
  writer, ``cluster apply``.
- **Kueue** (:data:`KUEUE_VERSION`, API ``kueue.x-k8s.io/v1beta2``): a ``ResourceFlavor`` per pool
  (node labels: the gate's pool label and ``validation=passed``, so admitted work lands only on
  validated nodes; tolerations for the pool's taints; its ``Topology`` where the pool declares
  block/rack labels), a ``ClusterQueue`` per team (``nvidia.com/gpu`` quota per pool's flavor,
  cohort and borrowing limit where declared) and a ``LocalQueue`` in the team's namespace.
- **Team namespaces**: Pod Security labels (enforce, audit and warn at the team's level), a
  ``ResourceQuota`` on ``requests.nvidia.com/gpu`` (and CPU/memory where declared), a
  ``LimitRange`` with default container requests, a ``RoleBinding`` per role to its groups.

Not applied by ``cluster apply`` but written by ``render`` (``acceptance/``) and submitted by
``validate acceptance`` (validate/acceptance.py), once per run: **the acceptance Job** per pool,
in the namespace of the first team with quota there, queued through that team's LocalQueue
(``kueue.x-k8s.io/queue-name``), created suspended (Kueue unsuspends what it admits):
single-node NCCL all-reduce on the node's GPUs at the profile's size, then a checkpoint
written, synced, read back and compared, each step after a marker line its output is read by.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from validate.cluster.spec import (
    FULL_GPU,
    HOSTNAME_LABEL,
    TIME_SLICING,
    ClusterSpec,
    PoolSpec,
    TeamSpec,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuready"
GPU_OPERATOR_VERSION = "v26.7.0"
KUEUE_VERSION = "v0.19.2"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
DEVICE_PLUGIN_CONFIG_MAP = "gpuready-device-plugin-config"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"
CLUSTER_POLICY = "cluster-policy"  # the name the chart gives it
# The operands' images at the pinned release (the chart's values.yaml at v26.7.0).
_DEVICE_PLUGIN_IMAGE = {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin",
                        "version": "v0.20.0"}
_DCGM_EXPORTER_IMAGE = {"repository": "nvcr.io/nvidia/k8s", "image": "dcgm-exporter",
                        "version": "4.6.0-4.8.3-distroless"}
_VALIDATOR_IMAGE = {"repository": "nvcr.io/nvidia", "image": "gpu-operator",
                    "version": GPU_OPERATOR_VERSION}
# The node's one DCGM host engine is the host's: the nvidia_dcgm role runs nv-hostengine
# (nvidia-dcgm.service, NVIDIA's unit: no --port or --bind-interface, so DCGM's defaults,
# DCGM_HE_PORT_NUMBER 5555 on 127.0.0.1). dcgm-exporter starts an embedded host engine unless
# told a remote one (DCGM_REMOTE_HOSTENGINE_INFO, its --remote-hostengine-info); the operator
# runs an exporter told "localhost:..." on the host's network (its controller's case "DCGM
# running on the host itself"), where localhost is the node and 127.0.0.1:5555 the roles' engine.
DCGM_HOSTENGINE = "localhost:5555"
DCGM_REMOTE_HOSTENGINE_ENV = "DCGM_REMOTE_HOSTENGINE_INFO"
_DCGM_EXPORTER_ENV = [{"name": DCGM_REMOTE_HOSTENGINE_ENV, "value": DCGM_HOSTENGINE}]
# What a container gets when it asks for nothing (a quota on CPU/memory refuses such a pod).
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
ACCEPTANCE_CHECKPOINT_MIB = 4096
POD_SECURITY = "pod-security.kubernetes.io"

Manifest = dict[str, Any]


def _meta(name: str, namespace: str | None = None,
          labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {MANAGED_BY: MANAGER, **(labels or {})}
    return meta


def device_plugin_configs(spec: ClusterSpec) -> dict[str, str]:
    """The device plugin's configurations by name (k8s-device-plugin's config file, v1)."""
    configs = {FULL_GPU: {"version": "v1", "flags": {"migStrategy": "none"}}}
    for pool in spec.pools:
        sharing = pool.sharing
        if sharing.mode == TIME_SLICING:
            configs[sharing.config_name] = {
                "version": "v1", "flags": {"migStrategy": "none"},
                "sharing": {"timeSlicing": {"resources": [
                    {"name": GPU, "replicas": sharing.replicas}]}}}
        elif sharing.mode == "mig":
            configs[sharing.config_name] = {"version": "v1",
                                            "flags": {"migStrategy": sharing.mig_strategy}}
    return {name: yaml.safe_dump(body, sort_keys=False) for name, body in sorted(configs.items())}


def _operand_tolerations(spec: ClusterSpec) -> list[dict[str, str]]:
    """The operands run where the pools' GPUs are, taints or not: the chart's own toleration,
    each pool's taints, and the gate's validation taint (GFD labels a node before the gate
    admits it, and the gate compares them with the hardware)."""
    out = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
           {"key": f"{spec.label_prefix}/validation", "operator": "Exists"}]
    for pool in spec.pools:
        for taint in pool.taints:
            toleration = {"key": taint.key, "operator": "Exists", "effect": taint.effect}
            if toleration not in out:
                out.append(toleration)
    return out


def _mig(spec: ClusterSpec) -> tuple[str, bool]:
    """The ClusterPolicy's MIG strategy (mixed where any pool mixes profiles) and whether the
    MIG manager runs (any MIG pool)."""
    strategies = {p.sharing.mig_strategy for p in spec.pools if p.sharing.mode == "mig"}
    return ("mixed" if "mixed" in strategies else "single"), bool(strategies)


def cluster_policy(spec: ClusterSpec) -> Manifest:
    strategy, mig_manager = _mig(spec)
    return {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": _meta(CLUSTER_POLICY),
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "daemonsets": {"priorityClassName": "system-node-critical",
                           "tolerations": _operand_tolerations(spec)},
            # Host-driver mode: the nvidia_driver and nvidia_container_toolkit roles own these.
            "driver": {"enabled": False},
            "toolkit": {"enabled": False},
            "devicePlugin": {"enabled": True, **_DEVICE_PLUGIN_IMAGE,
                             "config": {"name": DEVICE_PLUGIN_CONFIG_MAP, "default": FULL_GPU}},
            "gfd": {"enabled": True, **_DEVICE_PLUGIN_IMAGE},
            # No operator host engine: the roles' nv-hostengine is the node's one (above).
            "dcgm": {"enabled": False},
            "dcgmExporter": {"enabled": True, **_DCGM_EXPORTER_IMAGE, "hostNetwork": True,
                             "env": [dict(e) for e in _DCGM_EXPORTER_ENV]},
            "validator": dict(_VALIDATOR_IMAGE),
            "nodeStatusExporter": {"enabled": False},
            "mig": {"strategy": strategy},
            "migManager": {"enabled": mig_manager},
        },
    }


def helm_values(spec: ClusterSpec) -> dict[str, Any]:
    values: dict[str, Any] = json.loads(json.dumps(_helm_values(spec)))
    return values


def _helm_values(spec: ClusterSpec) -> dict[str, Any]:
    """The gpu-operator chart's values (``helm install --version v26.7.0 -f``) for the same
    settings; the chart deploys the operator, ``cluster apply`` the ClusterPolicy and the
    device plugin's ConfigMap."""
    strategy, mig_manager = _mig(spec)
    return {
        "clusterPolicy": {"deployCR": False},
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "devicePlugin": {"enabled": True, "config": {
            "create": False, "name": DEVICE_PLUGIN_CONFIG_MAP, "default": FULL_GPU}},
        "gfd": {"enabled": True},
        "dcgm": {"enabled": False},
        "dcgmExporter": {"enabled": True, "env": [dict(e) for e in _DCGM_EXPORTER_ENV]},
        "mig": {"strategy": strategy},
        "migManager": {"enabled": mig_manager},
        "daemonsets": {"tolerations": _operand_tolerations(spec)},
    }


def node_labels(spec: ClusterSpec) -> dict[str, dict[str, str]]:
    """Per Node name, the labels ``cluster apply`` sets on it (its pool's device plugin
    configuration): the one field of a Node it owns."""
    return {f"{node}": {DEVICE_PLUGIN_CONFIG_LABEL: pool.sharing.config_name}
            for pool in spec.pools for node in pool.nodes}


def _flavor(spec: ClusterSpec, pool: PoolSpec) -> Manifest:
    body: dict[str, Any] = {"nodeLabels": {f"{spec.label_prefix}/pool": pool.group,
                                           f"{spec.label_prefix}/validation": "passed"}}
    if pool.taints:
        body["tolerations"] = [{"key": t.key, "operator": "Equal", "value": t.value,
                                "effect": t.effect} for t in pool.taints]
    if pool.topology_labels:
        body["topologyName"] = pool.name
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": _meta(pool.name),
            "spec": body}


def _topology(pool: PoolSpec) -> Manifest:
    levels = [*pool.topology_labels, HOSTNAME_LABEL]
    return {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": _meta(pool.name),
            "spec": {"levels": [{"nodeLabel": label} for label in levels]}}


def _cluster_queue(spec: ClusterSpec, team: TeamSpec) -> Manifest:
    flavors = []
    for quota in team.quotas:
        resource: dict[str, Any] = {"name": GPU, "nominalQuota": quota.gpus}
        if quota.borrowing_limit is not None:
            resource["borrowingLimit"] = quota.borrowing_limit
        flavors.append({"name": spec.pool(quota.pool).name, "resources": [resource]})
    body: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team.namespace}},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": flavors}],
    }
    if team.cohort:
        body["cohortName"] = team.cohort
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": _meta(team.queue),
            "spec": body}


def gpu_ceiling(spec: ClusterSpec, team: TeamSpec) -> int:
    """The most GPUs the team's pods may request at once (its ResourceQuota): its quota in
    each pool plus what it may borrow there (its borrowing limit, or the whole pool when it
    has a cohort and no limit), never more than the pool offers."""
    total = 0
    for quota in team.quotas:
        pool = spec.pool(quota.pool)
        borrow = (quota.borrowing_limit if quota.borrowing_limit is not None
                  else pool.capacity if team.cohort else 0)
        total += min(pool.capacity, quota.gpus + borrow)
    return total


def _team_objects(spec: ClusterSpec, team: TeamSpec) -> list[Manifest]:
    ns = team.namespace
    out: list[Manifest] = []
    hard = {f"requests.{GPU}": str(gpu_ceiling(spec, team))}
    if team.cpu is not None:
        hard["requests.cpu"] = team.cpu
    if team.memory is not None:
        hard["requests.memory"] = team.memory
    out.append({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": _meta("gpuready-team-quota", ns), "spec": {"hard": hard}})
    out.append({"apiVersion": "v1", "kind": "LimitRange",
                "metadata": _meta("gpuready-team-defaults", ns),
                "spec": {"limits": [{"type": "Container",
                                     "defaultRequest": dict(DEFAULT_REQUESTS)}]}})
    for role, groups in sorted(team.groups.items()):
        out.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(f"gpuready-{role}", ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}
                         for g in groups]})
    out.append({"apiVersion": KUEUE_API, "kind": "LocalQueue",
                "metadata": _meta(team.queue, ns),
                "spec": {"clusterQueue": team.queue}})
    return out


def namespace(team: TeamSpec) -> Manifest:
    labels = {f"{POD_SECURITY}/{mode}": team.pod_security for mode in ("enforce", "audit",
                                                                       "warn")}
    labels |= {f"{POD_SECURITY}/{mode}-version": "latest" for mode in ("enforce", "audit",
                                                                       "warn")}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(team.namespace,
                                                                        labels=labels)}


def acceptance_team(spec: ClusterSpec, pool: PoolSpec) -> TeamSpec | None:
    """The team whose LocalQueue runs the pool's acceptance Job: the first (inventory order)
    with quota or a borrowing limit on the pool."""
    for team in spec.teams:
        for quota in team.quotas:
            if quota.pool == pool.group and (quota.gpus or quota.borrowing_limit):
                return team
    return None


ACCEPTANCE_MARK = "# gpuready acceptance:"
ACCEPTANCE_SCRIPT = f"""\
set -eu
# Single-node NCCL all-reduce across the node's GPUs (nccl-tests), then a checkpoint written,
# synced, read back and compared: the seed's acceptance steps, as a workload. The marker lines
# split the log for validate acceptance; each checkpoint step is timed by /proc/uptime (10 ms
# resolution; every dd prints its byte count, not every dd its time: busybox's does not).
echo "{ACCEPTANCE_MARK} nccl"
all_reduce_perf -b "$NCCL_BYTES" -e "$NCCL_BYTES" -f 2 -g "$GPUS" -c 1
echo "{ACCEPTANCE_MARK} checkpoint-write"
read -r t0 _ < /proc/uptime
dd if=/dev/urandom of=/checkpoint/ckpt.bin bs=1M count="$CHECKPOINT_MIB" conv=fsync 2>&1
read -r t1 _ < /proc/uptime
echo "checkpoint bytes $((CHECKPOINT_MIB * 1048576)) uptime $t0 $t1"
sha256sum /checkpoint/ckpt.bin > /checkpoint/ckpt.sha256
echo "{ACCEPTANCE_MARK} checkpoint-read"
read -r t0 _ < /proc/uptime
dd if=/checkpoint/ckpt.bin of=/dev/null bs=1M 2>&1
read -r t1 _ < /proc/uptime
echo "checkpoint bytes $((CHECKPOINT_MIB * 1048576)) uptime $t0 $t1"
sha256sum -c /checkpoint/ckpt.sha256
echo "{ACCEPTANCE_MARK} done"
"""
ACCEPTANCE_NCCL_BYTES = 1 << 30  # when the pool's profile names no nccl.size_bytes


def acceptance_job(spec: ClusterSpec, pool: PoolSpec, team: TeamSpec, *,
                   name: str | None = None, nccl_bytes: int = ACCEPTANCE_NCCL_BYTES,
                   checkpoint_mib: int = ACCEPTANCE_CHECKPOINT_MIB,
                   labels: Mapping[str, str] | None = None) -> Manifest:
    """The pool's acceptance Job (``name``: ``acceptance-<pool>``), queued through ``team``."""
    gpus = pool.gpus_per_node
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {
        "name": "acceptance", "image": spec.acceptance_image,
        "imagePullPolicy": spec.acceptance_pull_policy,
        "command": ["/bin/sh", "-c", ACCEPTANCE_SCRIPT],
        "env": [{"name": "GPUS", "value": str(gpus)},
                {"name": "NCCL_BYTES", "value": str(nccl_bytes)},
                {"name": "CHECKPOINT_MIB", "value": str(checkpoint_mib)}],
        "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
        "securityContext": restricted,
        "volumeMounts": [{"name": "checkpoint", "mountPath": "/checkpoint"}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "checkpoint", "emptyDir": {
            "sizeLimit": f"{checkpoint_mib * 2}Mi"}}],
    }
    if spec.acceptance_host_network:
        pod_spec["hostNetwork"] = True
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _meta(name or f"acceptance-{pool.name}", team.namespace,
                          labels={QUEUE_LABEL: team.queue, **(labels or {})}),
        "spec": {
            "suspend": True, "backoffLimit": 0, "completions": 1, "parallelism": 1,
            "template": {
                "metadata": {"labels": {MANAGED_BY: MANAGER, QUEUE_LABEL: team.queue,
                                        **(labels or {})}},
                "spec": pod_spec},
        },
    }


def manifests(spec: ClusterSpec) -> list[Manifest]:
    """Every object ``cluster apply`` owns, in apply order (module docstring)."""
    out: list[Manifest] = [namespace(team) for team in spec.teams]
    out.append({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": _meta(DEVICE_PLUGIN_CONFIG_MAP, spec.operator_namespace),
                "data": device_plugin_configs(spec)})
    out.append(cluster_policy(spec))
    out += [_topology(pool) for pool in spec.pools if pool.topology_labels]
    out += [_flavor(spec, pool) for pool in spec.pools]
    out += [_cluster_queue(spec, team) for team in spec.teams]
    for team in spec.teams:
        out += _team_objects(spec, team)
    # Plain types throughout (names read from Ansible's inventory carry its tags).
    plain: list[Manifest] = json.loads(json.dumps(out))
    return plain


def acceptance_jobs(spec: ClusterSpec) -> list[Manifest]:
    """The acceptance Job of each pool some team has quota on (``validate acceptance``)."""
    out = []
    for pool in spec.pools:
        runner = acceptance_team(spec, pool)
        if runner is not None:
            out.append(acceptance_job(spec, pool, runner))
    plain: list[Manifest] = json.loads(json.dumps(out))
    return plain


def ident(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` (``Kind name`` when cluster-scoped), as the output says it."""
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


def write(spec: ClusterSpec, out: Path) -> list[Path]:
    """One file per object (``NN-kind-[namespace-]name.yaml``, apply order: ``kubectl apply
    -f DIR`` applies them in order), the Node labels (``nodes/device-plugin-config.yaml``) and
    the chart's values (``helm/gpu-operator-values.yaml``). Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9][0-9]-*.yaml"):
        old.unlink()
    written = []
    for i, obj in enumerate(manifests(spec)):
        meta = obj["metadata"]
        parts = [obj["kind"].lower(), *([meta["namespace"]] if meta.get("namespace") else []),
                 meta["name"]]
        path = out / f"{i:03d}-{'-'.join(parts)}.yaml"
        path.write_text("---\n" + yaml.safe_dump(obj, sort_keys=False))
        written.append(path)
    jobs = out / "acceptance"
    jobs.mkdir(exist_ok=True)
    for old in jobs.glob("job-*.yaml"):
        old.unlink()
    for job in acceptance_jobs(spec):
        path = jobs / f"job-{job['metadata']['namespace']}-{job['metadata']['name']}.yaml"
        path.write_text("---\n# Submitted by `validate acceptance` (one per run, under a name of "
                        "its own); `kubectl create -f` runs it by hand.\n"
                        + yaml.safe_dump(job, sort_keys=False))
        written.append(path)
    extra = out / "helm"
    extra.mkdir(exist_ok=True)
    values = extra / "gpu-operator-values.yaml"
    values.write_text(
        f"---\n# helm install gpu-operator nvidia/gpu-operator --version {GPU_OPERATOR_VERSION} "
        f"-n {spec.operator_namespace} --create-namespace -f {values.name}\n"
        "# Host-driver mode; the ClusterPolicy and the device plugin's ConfigMap are "
        "`validate cluster apply`'s.\n" + yaml.safe_dump(helm_values(spec), sort_keys=False))
    nodes = out / "nodes"
    nodes.mkdir(exist_ok=True)
    labels = nodes / "device-plugin-config.yaml"
    labels.write_text(
        "---\n# The label each Node carries for its pool's device plugin configuration "
        "(set by `validate cluster apply` on Nodes that exist):\n"
        + "\n".join(f"# kubectl label node {shlex.quote(n)} "
                    f"{shlex.quote(f'{k}={v}')} --overwrite"
                    for n, kv in node_labels(spec).items() for k, v in kv.items())
        + "\n" + yaml.safe_dump(node_labels(spec), sort_keys=True))
    return [*written, values, labels]
