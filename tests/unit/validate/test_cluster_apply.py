"""``validate cluster apply`` on a real kube-apiserver (tests/kube_helpers.py) with the real CRDs
of the pinned GPU Operator (v26.7.0) and Kueue (v0.19.2) releases (tests/fixtures/crds/) and
kube-controller-manager's resourcequota, namespace and serviceaccount controllers, as a cluster
has them; no GPU Operator or Kueue controller runs (none does in the lab: no images).

Apply creates every object and the server's validation accepts each; a second apply changes
nothing; the check mode's dry-run diff changes nothing; removing a team removes exactly its
objects, never one gpuready does not own; the server rejects a deliberately wrong ClusterQueue
and ClusterPolicy; Pod Security refuses a privileged pod in a restricted team namespace; the
team's quota refuses a pod that asks for more GPUs than the team has; a bad inventory applies
nothing."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_helpers import LocalApiServer, core_api, running_apiserver
from tests.unit.validate.cluster_inventories import REPO, edit, lab_copy, teams_file
from validate import cli
from validate.cluster import apply as cluster_apply
from validate.cluster import render
from validate.cluster.spec import load_spec
from validate.model import ExitCode

CRDS = REPO / "tests" / "fixtures" / "crds"
CONTROLLERS = ("resourcequota", "namespace", "serviceaccount", "serviceaccount-token")
LAB_NODES = ("node1", "node2")  # of the default fleet's GPU hosts; node3 has not joined


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("cluster"), 18, CONTROLLERS) as server:
        install_crds(server.kubeconfig)
        api = core_api(server)
        api.create_namespace({"metadata": {"name": "gpu-operator"}})
        for name in LAB_NODES:
            api.create_node({"metadata": {"name": name}})
        yield server


@pytest.fixture(scope="module")
def lab_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lab_copy(tmp_path_factory.mktemp("inventory"), "default")


def install_crds(kubeconfig: Path) -> None:
    """The pinned releases' CRDs, created through ``kubeconfig``'s API server; once every kind
    is served (also the lab's real control plane, tests/lab/test_cluster.py)."""
    from kubernetes import client, config  # noqa: PLC0415

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    ext = client.ApiextensionsV1Api(client.ApiClient(configuration))
    names = []
    for path in sorted(CRDS.glob("*/*.yaml")):
        doc = yaml.safe_load(path.read_text())
        ext.create_custom_resource_definition(doc)
        names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + 30
    api = cluster_apply.ClusterApi(kubeconfig)
    while time.monotonic() < deadline:
        served = {r["name"] for v in ("kueue.x-k8s.io/v1beta2", "nvidia.com/v1")
                  for r in _resources(api, v)}
        if {"clusterpolicies", "resourceflavors", "clusterqueues", "localqueues",
                "topologies"} <= served and all(_lists(api, kind) for kind in cluster_apply.KINDS):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRDs {names} not served in time")


def _lists(api: cluster_apply.ClusterApi, kind: cluster_apply.Kind) -> bool:
    """Whether the kind can be listed yet: a new CRD's storage answers 429 for a moment."""
    try:
        api._request("GET", kind.collection(), (), None, "application/json")
    except cluster_apply.ApplyError:
        return False
    return True


def _resources(api: cluster_apply.ClusterApi, version: str) -> list[dict[str, Any]]:
    try:
        return list(api.request("GET", f"/apis/{version}").get("resources", []))
    except cluster_apply.NotFound:
        return []


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def apply_cli(server: LocalApiServer, inv: Path, *extra: str) -> tuple[int, list[str], str]:
    code, out, err = run_cli("cluster", "apply", "-i", str(inv), "--kubeconfig",
                             str(server.kubeconfig), *extra)
    return code, out.splitlines(), err


def changes(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("cluster: ")]


def get(server: LocalApiServer, path: str) -> dict[str, Any] | None:
    try:
        return cluster_apply.ClusterApi(server.kubeconfig).request("GET", path)
    except cluster_apply.NotFound:
        return None


def test_apply_creates_everything_then_a_second_apply_changes_nothing(
        cluster: LocalApiServer, lab_inventory: Path) -> None:
    code, lines, err = apply_cli(cluster, lab_inventory)
    assert (code, err) == (ExitCode.OK, ""), err
    created = {line.removeprefix("created ") for line in changes(lines)
               if line.startswith("created ")}
    assert {"Namespace research", "Namespace platform",
            "ConfigMap gpu-operator/gpuready-device-plugin-config",
            "ClusterPolicy cluster-policy", "ResourceFlavor pool-h100-sxm",
            "ResourceFlavor pool-a100-sxm", "ResourceFlavor pool-l40s-pcie",
            "ClusterQueue research", "ClusterQueue platform",
            "ResourceQuota research/gpuready-team-quota",
            "LimitRange research/gpuready-team-defaults",
            "RoleBinding research/gpuready-edit", "RoleBinding platform/gpuready-admin",
            "LocalQueue research/research", "LocalQueue platform/platform"} <= created
    assert len(created) == 17
    assert "labelled Node node2 nvidia.com/device-plugin.config=time-slicing-4" in lines
    assert "Node node3 has not joined: its device plugin label waits for a later apply" in lines
    assert lines[-1].startswith("cluster: 17 created, 2 configured, 0 deleted, 0 unchanged; ")
    assert "no GPU Operator: no images can be pulled there" in lines[-1]
    # What the server holds is what was rendered (accepted, not pruned by a schema).
    queue = get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/research")
    assert queue is not None
    assert queue["spec"]["cohortName"] == "training"
    assert queue["spec"]["resourceGroups"][0]["flavors"] == [{
        "name": "pool-h100-sxm",
        "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4, "borrowingLimit": 4}]}]
    policy = get(cluster, "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")
    assert policy is not None
    assert policy["spec"]["driver"]["enabled"] is False
    assert policy["spec"]["devicePlugin"]["config"]["name"] == "gpuready-device-plugin-config"
    # The acceptance Job is a run (validate acceptance), not state cluster apply keeps.
    assert get(cluster, "/apis/batch/v1/namespaces/research/jobs/acceptance-pool-h100-sxm") is None
    node = core_api(cluster).read_node("node1")
    assert node.metadata.labels["nvidia.com/device-plugin.config"] == "full-gpu"
    managers = {m.manager for m in node.metadata.managed_fields}
    assert "gpuready" in managers

    code, lines, err = apply_cli(cluster, lab_inventory)
    assert (code, err) == (ExitCode.OK, "")
    assert changes(lines) == ["Node node3 has not joined: its device plugin label waits for a "
                              "later apply"]
    assert lines[-1].startswith("cluster: 0 created, 0 configured, 0 deleted, 17 unchanged; ")


def test_check_mode_shows_the_servers_diff_and_changes_nothing(
        cluster: LocalApiServer, lab_inventory: Path, tmp_path: Path) -> None:
    inv = lab_copy(tmp_path)
    edit(teams_file(inv), lambda d: d["gpuready_cluster_teams"]["platform"]["gpus"].update(
        pool_h100_sxm=2))
    before = get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/platform")
    code, lines, err = apply_cli(cluster, inv, "--check")
    assert (code, err) == (ExitCode.OK, "")
    assert lines[0].startswith("cluster: check (server dry run, nothing changed) on https://")
    assert "would configure ClusterQueue platform" in lines
    # Its namespace quota stays 8: 2 of its own, the rest of the 8 borrowed through the cohort.
    assert "would configure ResourceQuota platform/gpuready-team-quota" not in lines
    assert "    -        nominalQuota: 4" in lines
    assert "    +        nominalQuota: 2" in lines
    assert lines[-1].startswith("cluster: 0 would be created, 1 would be configured, "
                                "0 would be deleted")
    after = get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/platform")
    assert after == before


def test_removing_a_team_removes_exactly_its_objects(
        cluster: LocalApiServer, lab_inventory: Path, tmp_path: Path) -> None:
    api = cluster_apply.ClusterApi(cluster.kubeconfig)
    # Objects of the same kinds that are not gpuready's: one with no label, one another
    # tool manages, one in a team namespace gpuready keeps.
    api.request("POST", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues", body={
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "hand-made"}, "spec": {}})
    api.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", body={
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "helm-made", "labels": {"app.kubernetes.io/managed-by": "Helm"}}})
    core_api(cluster).create_namespaced_config_map("research", {
        "metadata": {"name": "notes"}, "data": {"a": "b"}})
    inv = lab_copy(tmp_path)
    edit(teams_file(inv), lambda d: d["gpuready_cluster_teams"].pop("platform"))
    code, lines, err = apply_cli(cluster, inv)
    assert (code, err) == (ExitCode.OK, "")
    assert sorted(changes(lines)) == sorted([
        "Node node3 has not joined: its device plugin label waits for a later apply",
        "deleted LocalQueue platform/platform (no longer in the inventory)",
        "deleted RoleBinding platform/gpuready-admin (no longer in the inventory)",
        "deleted LimitRange platform/gpuready-team-defaults (no longer in the inventory)",
        "deleted ResourceQuota platform/gpuready-team-quota (no longer in the inventory)",
        "deleted ClusterQueue platform (no longer in the inventory)",
        "deleted Namespace platform and everything in it (no longer in the inventory)"])
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/platform") is None
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/hand-made") is not None
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/helm-made") is not None
    assert get(cluster, "/api/v1/namespaces/research/configmaps/notes") is not None
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/research") is not None
    # The namespace controller empties and removes the team's namespace.
    deadline = time.monotonic() + 60
    while get(cluster, "/api/v1/namespaces/platform") is not None:
        assert time.monotonic() < deadline, "namespace platform never went"
        time.sleep(0.5)
    # Putting the team back recreates it; nothing else changes.
    code, lines, err = apply_cli(cluster, lab_inventory)
    assert code == ExitCode.OK
    assert "created Namespace platform" in lines and "created ClusterQueue platform" in lines
    assert not [line for line in lines if line.startswith(("deleted", "configured"))]


def test_an_object_of_the_same_name_not_owned_stops_the_run(
        cluster: LocalApiServer, lab_inventory: Path, tmp_path: Path) -> None:
    core_api(cluster).create_namespace({"metadata": {"name": "newteam"}})
    inv = lab_copy(tmp_path)
    edit(teams_file(inv), lambda d: d["gpuready_cluster_teams"].update(
        newteam={"gpus": {"pool_a100_sxm": 2}}))
    code, lines, err = apply_cli(cluster, inv)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert ("Namespace newteam exists and is not gpuready's (app.kubernetes.io/managed-by: "
            "unset): left untouched") in err
    assert err.rstrip().endswith("nothing was applied")
    assert changes(lines) == []
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/newteam") is None
    ns = get(cluster, "/api/v1/namespaces/newteam")
    assert ns is not None and "app.kubernetes.io/managed-by" not in ns["metadata"].get(
        "labels", {})


def test_the_api_servers_validation_rejects_a_wrong_object(cluster: LocalApiServer,
                                                          lab_inventory: Path) -> None:
    api = cluster_apply.ClusterApi(cluster.kubeconfig)
    bad_queue = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": "wrong"},
                 "spec": {"queueingStrategy": "WhenItFeelsLikeIt",
                          "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                              "flavors": [{"name": "pool-h100-sxm"}]}]}}
    with pytest.raises(cluster_apply.ApplyError) as caught:
        api.request("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/wrong",
                    [("fieldManager", "gpuready")], body=bad_queue,
                    content_type=cluster_apply.APPLY_PATCH)
    message = str(caught.value)
    assert "422" in message
    assert 'spec.queueingStrategy: Unsupported value: "WhenItFeelsLikeIt"' in message
    assert "spec.resourceGroups[0].flavors[0].resources: Required value" in message
    bad_policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                  "metadata": {"name": "wrong"}, "spec": {"driver": {"enabled": "maybe"}}}
    # A wrong type is refused as server-side apply builds the typed object (the server's own
    # answer, 500 as it sends it); a missing required field by the CRD's schema (422).
    with pytest.raises(cluster_apply.ApplyError,
                       match=r"\.spec\.driver\.enabled: expected boolean, got &\{maybe\}"):
        api.request("PATCH", "/apis/nvidia.com/v1/clusterpolicies/wrong",
                    [("fieldManager", "gpuready")], body=bad_policy,
                    content_type=cluster_apply.APPLY_PATCH)
    policy = render.cluster_policy(load_spec(lab_inventory))
    policy["metadata"]["name"] = "wrong"
    del policy["spec"]["daemonsets"]
    with pytest.raises(cluster_apply.ApplyError, match=r"422: .*spec.daemonsets: Required value"):
        api.request("PATCH", "/apis/nvidia.com/v1/clusterpolicies/wrong",
                    [("fieldManager", "gpuready")], body=policy,
                    content_type=cluster_apply.APPLY_PATCH)
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/wrong") is None


def _pod(name: str, gpus: int, privileged: bool = False) -> dict[str, Any]:
    security: dict[str, Any] = (
        {"privileged": True} if privileged else
        {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
         "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}})
    return {"metadata": {"name": name}, "spec": {"containers": [{
        "name": "c", "image": "registry.example.com/none:1", "securityContext": security,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _wait_for_quota_and_account(cluster: LocalApiServer, namespace: str) -> dict[str, str]:
    api = core_api(cluster)
    deadline = time.monotonic() + 60
    while True:
        quota = api.read_namespaced_resource_quota("gpuready-team-quota", namespace)
        accounts = [a.metadata.name for a in api.list_namespaced_service_account(namespace).items]
        if quota.status and quota.status.hard and "default" in accounts:
            return dict(quota.status.hard)
        assert time.monotonic() < deadline, "the quota controller never filled status.hard"
        time.sleep(0.3)


def test_pod_security_refuses_a_privileged_pod(cluster: LocalApiServer,
                                               lab_inventory: Path) -> None:
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    _wait_for_quota_and_account(cluster, "research")
    with pytest.raises(ApiException) as caught:
        core_api(cluster).create_namespaced_pod("research", _pod("root", 1, privileged=True))
    assert caught.value.status == 403, caught.value.body
    message = json.loads(caught.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest": privileged (container "c" must not set ' \
           'securityContext.privileged=true)' in message


def test_the_team_quota_refuses_more_gpus_than_the_team_has(cluster: LocalApiServer,
                                                            lab_inventory: Path) -> None:
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    hard = _wait_for_quota_and_account(cluster, "research")
    # research: 4 GPUs of pool_h100_sxm plus a borrowing limit of 4.
    assert hard["requests.nvidia.com/gpu"] == "8"
    api = core_api(cluster)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_pod("research", _pod("greedy", 9))
    assert caught.value.status == 403
    message = json.loads(caught.value.body)["message"]
    assert "exceeded quota: gpuready-team-quota" in message, message
    assert "requested: requests.nvidia.com/gpu=9" in message
    # Within the quota the same pod is admitted (server dry run: nothing is kept).
    admitted = api.create_namespaced_pod("research", _pod("fits", 8), dry_run="All")
    assert admitted.spec.containers[0].resources.requests["nvidia.com/gpu"] == "8"
    # The LimitRange's defaults filled the requests the CPU/memory quota needs.
    assert admitted.spec.containers[0].resources.requests["cpu"] == "100m"


def test_a_bad_inventory_applies_nothing(cluster: LocalApiServer, tmp_path: Path) -> None:
    inv = lab_copy(tmp_path)

    def change(doc: dict[str, Any]) -> None:
        teams = doc["gpuready_cluster_teams"]
        teams["probe"] = {"gpus": {"pool_a100_sxm": 1}}  # valid: would be created
        teams["research"]["gpus"]["pool_h100_sxm"] = {"quota": 9}  # the lab has 8
    edit(teams_file(inv), change)
    code, lines, err = apply_cli(cluster, inv)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert lines == []
    assert f"gpuready_cluster_teams (set in group all ({teams_file(inv)}))" in err
    assert "gpus.pool_h100_sxm is 9, more than pool pool_h100_sxm offers: 1 node(s) x 8 GPUs" \
           in err
    assert get(cluster, "/api/v1/namespaces/probe") is None
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/probe") is None


def test_a_cluster_without_the_crds_is_refused_before_any_write(tmp_path: Path,
                                                                lab_inventory: Path) -> None:
    with running_apiserver(tmp_path, 19) as bare:
        code, lines, err = apply_cli(bare, lab_inventory)
        assert code == ExitCode.USAGE_OR_TOOL_ERROR
        assert changes(lines) == []
        assert ("the API server does not serve ClusterPolicy (nvidia.com/v1, clusterpolicies): "
                "install its CRDs first") in err
        assert "ResourceFlavor (kueue.x-k8s.io/v1beta2, resourceflavors)" in err
        assert get(bare, "/api/v1/namespaces/research") is None


def test_spec_reads_the_lab_inventory(lab_inventory: Path) -> None:
    spec = load_spec(lab_inventory)
    assert [p.group for p in spec.pools] == ["pool_a100_sxm", "pool_h100_sxm", "pool_l40s_pcie"]
    assert [t.name for t in spec.teams] == ["research", "platform"]


def _playbook(inv: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inv), str(REPO / "playbooks/cluster.yml"),
         *extra], capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
             "PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_the_playbook_applies_and_checks_through_the_command(
        cluster: LocalApiServer, lab_inventory: Path, tmp_path: Path) -> None:
    """playbooks/cluster.yml: changed only when the command changed something; --check is the
    server's dry run; the inventory's gpuready_kubeconfig is the credentials."""
    inv = lab_copy(tmp_path)
    edit(teams_file(inv), lambda d: d.update(gpuready_kubeconfig=str(cluster.kubeconfig)))
    converged = _playbook(inv, "--check")
    assert converged.returncode == 0, converged.stdout[-3000:]
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0 ", converged.stdout)
    edit(teams_file(inv), lambda d: d["gpuready_cluster_teams"]["research"]["gpus"].update(
        pool_h100_sxm={"quota": 3, "borrowing_limit": 4}))
    before = get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/research")
    checked = _playbook(inv, "--check")
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "would configure ClusterQueue research" in checked.stdout
    assert re.search(r"localhost\s+: ok=\d+\s+changed=1 ", checked.stdout)
    assert get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/research") == before
    applied = _playbook(inv, "-e", f"cluster_render_dir={tmp_path / 'rendered'}")
    assert applied.returncode == 0, applied.stdout[-3000:]
    assert "configured ClusterQueue research" in applied.stdout
    assert (tmp_path / "rendered" / "helm" / "gpu-operator-values.yaml").is_file()
    queue = get(cluster, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/research")
    assert queue is not None
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0][
        "nominalQuota"] == 3
    # Back to the shipped lab inventory for whatever runs next.
    assert apply_cli(cluster, lab_inventory)[0] == ExitCode.OK
