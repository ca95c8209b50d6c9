"""validate/cluster: the manifests the shipped inventories make, and bad inventories refused
before anything is rendered, each problem named with its variable and the file that sets it.
No cluster here: tests/unit/validate/test_cluster_apply.py puts the same objects on a real
kube-apiserver with the real CRDs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.validate.cluster_inventories import edit, lab_copy, staging_copy, teams_file
from validate import cli
from validate.cluster import render
from validate.cluster.spec import load_spec
from validate.model import ExitCode


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def rendered(directory: Path) -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(directory.glob("[0-9][0-9][0-9]-*.yaml")):
        obj = yaml.safe_load(path.read_text())
        docs[render.ident(obj)] = obj
    return docs


def test_render_staging_writes_every_object_in_apply_order(tmp_path: Path) -> None:
    code, out, err = run_cli("cluster", "render", "-i", str(staging_copy(tmp_path)),
                             "-o", str(tmp_path / "out"))
    assert (code, err) == (ExitCode.OK, "")
    assert "3 pool(s), 3 team(s)" in out
    assert "no GPU Operator: no images can be pulled there" in out
    docs = rendered(tmp_path / "out")
    assert list(docs)[:5] == ["Namespace research", "Namespace platform",
                              "Namespace inference-serving",
                              "ConfigMap gpu-operator/gpuready-device-plugin-config",
                              "ClusterPolicy cluster-policy"]
    assert all(d["metadata"]["labels"][render.MANAGED_BY] == "gpuready" for d in docs.values())
    # GPU Operator, host-driver mode.
    policy = docs["ClusterPolicy cluster-policy"]["spec"]
    assert policy["driver"] == {"enabled": False} and policy["toolkit"] == {"enabled": False}
    assert [policy[k]["enabled"] for k in ("devicePlugin", "gfd", "dcgmExporter")] == [True] * 3
    assert policy["devicePlugin"]["config"] == {"name": "gpuready-device-plugin-config",
                                                "default": "full-gpu"}
    configs = docs["ConfigMap gpu-operator/gpuready-device-plugin-config"]["data"]
    assert set(configs) == {"full-gpu", "time-slicing-4"}
    assert yaml.safe_load(configs["time-slicing-4"])["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}]
    values = yaml.safe_load((tmp_path / "out/helm/gpu-operator-values.yaml").read_text())
    assert values["driver"] == {"enabled": False} and values["toolkit"] == {"enabled": False}
    assert values["clusterPolicy"] == {"deployCR": False}
    labels = yaml.safe_load((tmp_path / "out/nodes/device-plugin-config.yaml").read_text())
    assert labels["staging-l40s-01"] == {"nvidia.com/device-plugin.config": "time-slicing-4"}
    assert labels["staging-h100-02"] == {"nvidia.com/device-plugin.config": "full-gpu"}
    # Kueue: a flavor per pool selecting validated nodes of the pool, the H100 topology.
    prefix = "gpu.example.com.node-restriction.kubernetes.io"
    h100 = docs["ResourceFlavor pool-h100-sxm"]["spec"]
    assert h100["nodeLabels"] == {f"{prefix}/pool": "pool_h100_sxm",
                                  f"{prefix}/validation": "passed"}
    assert h100["tolerations"] == [{"key": "gpu.example.com/pool", "operator": "Equal",
                                    "value": "h100", "effect": "NoSchedule"}]
    assert h100["topologyName"] == "pool-h100-sxm"
    assert docs["Topology pool-h100-sxm"]["spec"]["levels"] == [
        {"nodeLabel": "network.example.com/block"}, {"nodeLabel": "network.example.com/rack"},
        {"nodeLabel": "kubernetes.io/hostname"}]
    assert "topologyName" not in docs["ResourceFlavor pool-l40s-pcie"]["spec"]
    research = docs["ClusterQueue research"]["spec"]
    assert research["cohortName"] == "training"
    assert research["resourceGroups"] == [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "pool-h100-sxm", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 8}]},
        {"name": "pool-a100-sxm", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]
    assert docs["LocalQueue inference-serving/inference"]["spec"] == {
        "clusterQueue": "inference"}
    # Team namespaces.
    assert docs["Namespace research"]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    # H100: 8 + borrowing 8 (of 16); A100: 4 + the whole pool through the cohort, capped at 8.
    assert docs["ResourceQuota research/gpuready-team-quota"]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "24", "requests.cpu": "192", "requests.memory": "1536Gi"}
    assert docs["ResourceQuota inference-serving/gpuready-team-quota"]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "8"}
    assert docs["RoleBinding research/gpuready-view"]["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "research-readers"}]
    # The acceptance Job per pool, through the first team with quota there: written apart
    # (validate acceptance submits it, cluster apply does not).
    assert not [k for k in docs if k.startswith("Job ")]
    jobs = {render.ident(obj): obj for obj in (
        yaml.safe_load(path.read_text())
        for path in sorted((tmp_path / "out/acceptance").glob("job-*.yaml")))}
    assert set(jobs) == {"Job research/acceptance-pool-h100-sxm",
                         "Job research/acceptance-pool-a100-sxm",
                         "Job inference-serving/acceptance-pool-l40s-pcie"}
    l40s = jobs["Job inference-serving/acceptance-pool-l40s-pcie"]
    assert l40s["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "inference"
    assert l40s["spec"]["suspend"] is True
    container = l40s["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "all_reduce_perf" in container["command"][2]
    assert "sha256sum -c" in container["command"][2]
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "GPUS": "4", "NCCL_BYTES": str(1 << 30), "CHECKPOINT_MIB": "4096"}
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert "hostNetwork" not in l40s["spec"]["template"]["spec"]


@pytest.mark.parametrize("fleet_name", ["default", "cluster"])
def test_render_lab_inventory(tmp_path: Path, fleet_name: str) -> None:
    inv = lab_copy(tmp_path, fleet_name)
    code, out, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path / "out"))
    assert (code, err) == (ExitCode.OK, ""), err
    assert "2 team(s)" in out
    docs = rendered(tmp_path / "out")
    assert {k for k in docs if k.startswith("ClusterQueue")} == {"ClusterQueue research",
                                                                "ClusterQueue platform"}
    flavors = {k for k in docs if k.startswith("ResourceFlavor")}
    expected = ({"pool-h100-sxm"} if fleet_name == "cluster"
                else {"pool-h100-sxm", "pool-a100-sxm", "pool-l40s-pcie"})
    assert flavors == {f"ResourceFlavor {p}" for p in expected}
    assert docs["ResourceFlavor pool-h100-sxm"]["spec"]["nodeLabels"] == {
        "gpuready.node-restriction.kubernetes.io/pool": "pool_h100_sxm",
        "gpuready.node-restriction.kubernetes.io/validation": "passed"}


def test_rendering_twice_gives_the_same_files(tmp_path: Path) -> None:
    inv = staging_copy(tmp_path)
    spec = load_spec(inv)
    first = [p.read_text() for p in render.write(spec, tmp_path / "a")]
    second = [p.read_text() for p in render.write(load_spec(inv), tmp_path / "a")]
    assert first == second


def _bad(tmp_path: Path, file: str, change: Any) -> tuple[int, str, Path]:
    inv = staging_copy(tmp_path)
    path = inv / "group_vars" / file
    edit(path, change)
    code, out, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path / "out"))
    assert out == ""
    assert not (tmp_path / "out").exists()  # nothing rendered
    return code, err, path


def test_unknown_sharing_mode_is_named_with_its_file(tmp_path: Path) -> None:
    code, err, path = _bad(tmp_path, "pool_l40s_pcie/pool.yml",
                           lambda d: d["gpu_pool"].update(sharing="mps"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert f"gpu_pool (set in group pool_l40s_pcie ({path}))" in err
    assert "sharing is 'mps', not a sharing mode" in err


def test_time_slicing_replicas_zero_or_missing(tmp_path: Path) -> None:
    code, err, path = _bad(tmp_path, "pool_l40s_pcie/pool.yml",
                           lambda d: d.update(gpuready_cluster_time_slicing_replicas=0))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_cluster_time_slicing_replicas (set in group pool_l40s_pcie ({path})) "
            "is 0: replicas per GPU must be a whole number of at least 1") in err
    code, err, path = _bad(tmp_path / "b", "pool_l40s_pcie/pool.yml",
                           lambda d: d.pop("gpuready_cluster_time_slicing_replicas"))
    # Set nowhere: the message says where a site sets it (the pool's group_vars file), not a
    # host that never set it.
    assert ("gpuready_cluster_time_slicing_replicas is not set: a time-slicing pool needs its "
            f"replicas per GPU; set it in group pool_l40s_pcie ({path})") in err
    assert "set in host" not in err


def test_a_missing_label_prefix_names_group_all(tmp_path: Path) -> None:
    code, err, path = _bad(tmp_path, "all/cluster.yml",
                           lambda d: d.pop("gpuready_label_prefix"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_label_prefix is not set: the pools' Kueue flavors select nodes by the "
            f"gate's labels under it; set it in group all ({path})") in err


def test_mig_on_a_gpu_without_mig_is_refused(tmp_path: Path) -> None:
    code, err, _ = _bad(tmp_path, "pool_l40s_pcie/pool.yml", lambda d: (
        d["gpu_pool"].update(sharing="mig-1g.10gb"),
        d.pop("gpuready_cluster_time_slicing_replicas")))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "gpu_pool (set in group pool_l40s_pcie" in err
    assert "accelerator 'l40s-48gb' has no known MIG profiles" in err


def test_quota_above_capacity_and_unknown_pool_are_both_named(tmp_path: Path) -> None:
    def change(doc: dict[str, Any]) -> None:
        teams = doc["gpuready_cluster_teams"]
        teams["research"]["gpus"]["pool_h100_sxm"] = {"quota": 17}
        teams["platform"]["gpus"]["pool_b200"] = 8
    code, err, path = _bad(tmp_path, "all/cluster.yml", change)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    where = f"gpuready_cluster_teams (set in group all ({path}))"
    assert (f"{where} team research: gpus.pool_h100_sxm is 17, more than pool pool_h100_sxm "
            "offers: 2 node(s) x 8 GPUs = 16") in err
    assert (f"{where} team platform: gpus names pool 'pool_b200', which is not a pool of "
            "gpu_nodes (pools: pool_a100_sxm, pool_h100_sxm, pool_l40s_pcie)") in err
    assert "2 bad cluster value(s); nothing was rendered or applied" in err


def test_time_sliced_capacity_counts_replicas(tmp_path: Path) -> None:
    code, err, _ = _bad(tmp_path, "all/cluster.yml", lambda d: d["gpuready_cluster_teams"][
        "inference"]["gpus"].update(pool_l40s_pcie=17))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "1 node(s) x 4 GPUs x 4 time-slicing replicas = 16" in err


def test_borrowing_without_cohort_and_a_bad_level(tmp_path: Path) -> None:
    def change(doc: dict[str, Any]) -> None:
        team = doc["gpuready_cluster_teams"]["inference"]
        team["gpus"]["pool_l40s_pcie"] = {"quota": 4, "borrowing_limit": 4}
        team["pod_security"] = "strict"
        team["quota"] = 3
    code, err, _ = _bad(tmp_path, "all/cluster.yml", change)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "team inference: pod_security is 'strict', not one of privileged, baseline, " \
           "restricted" in err
    assert "team inference: quota is not a team setting" in err
    assert "gpus.pool_l40s_pcie.borrowing_limit is set, but the team has no cohort" in err


def test_a_team_whose_gpus_is_not_a_mapping_names_the_file(tmp_path: Path) -> None:
    """The error names the file a person opens to fix it, not only the group."""
    inv = staging_copy(tmp_path)
    edit(teams_file(inv), lambda d: d["gpuready_cluster_teams"]["research"].update(gpus=[8]))
    code, out, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path / "o"))
    assert (code, out) == (ExitCode.USAGE_OR_TOOL_ERROR, "")
    assert f"({teams_file(inv)})" in err and "team research: gpus is [8]" in err


def test_teams_set_apart_for_one_pool_are_refused(tmp_path: Path) -> None:
    """The cluster has one teams map: a pool group that sets its own is named, not ignored."""
    code, err, path = _bad(tmp_path, "pool_a100_sxm/pool.yml", lambda d: d.update(
        gpuready_cluster_teams={"solo": {"gpus": {"pool_a100_sxm": 1}}}))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert f"gpuready_cluster_teams (set in group pool_a100_sxm ({path}) and group all (" in err
    assert "differs between hosts: the cluster has one (set it in group all only)" in err


@pytest.mark.parametrize("namespace, why", [
    ("kube-system", "is Kubernetes' own"),
    ("kube-public", "is Kubernetes' own"),
    ("kube-node-lease", "is Kubernetes' own"),
    ("kube-flannel", "is Kubernetes' own"),  # every kube-* name is reserved
    ("default", "is Kubernetes' own"),
    ("gpu-operator", "is the GPU Operator's (gpuready_cluster_operator_namespace)"),
])
def test_a_team_in_a_reserved_namespace_is_refused(tmp_path: Path, namespace: str,
                                                   why: str) -> None:
    """A team's namespace gets Pod Security restricted, a GPU quota and a LimitRange: rendered
    for kube-system or the operator's namespace and applied, they would break the cluster."""
    code, err, path = _bad(tmp_path, "all/cluster.yml", lambda d: d["gpuready_cluster_teams"][
        "research"].update(namespace=namespace))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_cluster_teams (set in group all ({path})) team research: namespace "
            f"{namespace} {why}") in err, err


def test_a_team_named_default_without_a_namespace_is_refused(tmp_path: Path) -> None:
    code, err, _ = _bad(tmp_path, "all/cluster.yml", lambda d: d["gpuready_cluster_teams"]
                        .update(default={"gpus": {"pool_a100_sxm": 1}}))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "team default: namespace default is Kubernetes' own" in err


def test_a_node_name_that_is_no_kubernetes_name_is_refused_where_it_was_set(
        tmp_path: Path) -> None:
    """node_join_node_name goes into the API's paths (/api/v1/nodes/<name>): '../nodes/x' is
    refused with the variable and its file as the inventory is read; a host without it whose
    inventory name is no Node name is named too."""
    inv = staging_copy(tmp_path)
    host_vars = inv / "host_vars"
    host_vars.mkdir()
    (host_vars / "staging-h100-01.yml").write_text('node_join_node_name: "../nodes/x"\n')
    code, out, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path / "out"))
    assert (code, out) == (ExitCode.USAGE_OR_TOOL_ERROR, "")
    assert ("node_join_node_name (set on host staging-h100-01) is '../nodes/x', not a "
            "Kubernetes Node name (an RFC 1123 subdomain") in err, err
    assert not (tmp_path / "out").exists()
    inv = staging_copy(tmp_path / "b")
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("staging-a100-01:", "Staging_A100_01:"))
    code, out, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path / "out"))
    assert (code, out) == (ExitCode.USAGE_OR_TOOL_ERROR, "")
    assert ("node_join_node_name (set in host Staging_A100_01) is not set, and the host's "
            "inventory name 'Staging_A100_01' (the Node's name then) is not a Kubernetes "
            "Node name") in err, err


def test_a_bad_cost_baseline_and_bad_acceptance_settings_are_named(tmp_path: Path) -> None:
    code, err, path = _bad(tmp_path, "pool_h100_sxm/pool.yml", lambda d: d.update(
        gpuready_cluster_cost_baseline={"per_gpu_hour": "cheap", "source": "rental"}))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_cluster_cost_baseline (set in group pool_h100_sxm ({path})) is "
            "{'per_gpu_hour': 'cheap', 'source': 'rental'}, not {per_gpu_hour: N > 0, source: "
            "TEXT}") in err
    code, err, path = _bad(tmp_path / "b", "all/cluster.yml", lambda d: d.update(
        gpuready_cluster_acceptance_pull_policy="Sometimes",
        gpuready_cluster_acceptance_host_network="yes"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_cluster_acceptance_pull_policy (set in group all ({path})) is "
            "'Sometimes', not one of Always, IfNotPresent, Never") in err
    assert "gpuready_cluster_acceptance_host_network (set in group all" in err
    assert "is 'yes', not true or false" in err
