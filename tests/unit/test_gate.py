"""validate/gate.py against the API server stand-in over HTTPS, with the official client: one
list and one guarded patch per changed Node (counted in the server's audit log), a real 409
from a concurrent writer retried, dry run, and the failures (unreachable API, refused
credentials, a Node that never joined) as exit codes."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apiserver_helpers import StandIn, core_api, running_standin, standin_address
from validate import cli
from validate.gate import KubeNodeApi, reconcile
from validate.labels import NodeIdentity, NodeResults
from validate.model import CheckResult, ExitCode, Status
from validate.report import write_report

P = "gpu.example.com.node-restriction.kubernetes.io"
TAINT = {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"}
RUN = "20261202T101500Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("gate"), 14) as standin:
        yield standin


def identity(name: str) -> NodeIdentity:
    return NodeIdentity(name=name, pool="pool_h100_sxm", profile="h100-sxm5-80gb-8x",
                        gpu_pool={"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                                  "fabric": "infiniband", "workload": "batch",
                                  "sharing": "full-gpu"},
                        gpu_count=8, gpu_model="NVIDIA H100 80GB HBM3", gpu_memory_mib=81559,
                        nvswitch=True, nvlinks_per_gpu=18)


def passed(codes: tuple[str, ...] = ()) -> NodeResults:
    return NodeResults(RUN, Status.FAIL if codes else Status.PASS, codes, 8, 81559,
                       Status.PASS, "NVIDIA H100 80GB HBM3")


def register(cluster: StandIn, *names: str) -> None:
    api = core_api(cluster)
    for name in names:
        api.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                         "spec": {"taints": [TAINT]}})


def patches(cluster: StandIn, names: set[str]) -> list[str]:
    return [e["objectRef"]["name"] for e in cluster.audit()
            if e["verb"] == "patch" and e.get("objectRef", {}).get("name") in names]


def test_one_list_and_one_patch_per_changed_node(cluster: StandIn) -> None:
    names = ("a1", "a2", "a3")
    register(cluster, *names)
    api = KubeNodeApi(cluster.kubeconfig)
    results = {"a1": passed(), "a2": passed(("gpu.ecc.uncorrectable",)), "a3": passed()}
    report = reconcile(api, [identity(n) for n in names], results, P)
    assert dict(api.calls) == {"list": 1, "patch": 3}
    assert [(o.node, o.verdict, o.patched) for o in report.nodes] == [
        ("a1", "passed", True), ("a2", "failed", True), ("a3", "passed", True)]
    assert report.exit_code == ExitCode.CHECK_FAILED
    nodes = {n.metadata.name: n for n in core_api(cluster).list_node().items}
    assert nodes["a1"].spec.taints is None
    assert nodes["a1"].metadata.labels[f"{P}/validation"] == "passed"
    assert nodes["a1"].metadata.labels["team"] == "ml"  # not ours: untouched
    assert [t.key for t in nodes["a2"].spec.taints] == [TAINT["key"]]
    assert nodes["a2"].metadata.annotations == {f"{P}/failed-checks": "gpu.ecc.uncorrectable"}
    # Again: every Node is right, so one list and nothing else.
    again_api = KubeNodeApi(cluster.kubeconfig)
    again = reconcile(again_api, [identity(n) for n in names], results, P)
    assert dict(again_api.calls) == {"list": 1}
    assert all(not o.changes and not o.patched for o in again.nodes)
    assert "nothing to change" in again.summary()
    assert patches(cluster, set(names)) == ["a1", "a2", "a3"]


class RacingApi(KubeNodeApi):
    """Writes to the Node (a real request, as a kubelet heartbeat or another controller would)
    between the gate's read and its patch, once per Node: the server answers 409."""

    def __init__(self, kubeconfig: Path, other: Any) -> None:
        super().__init__(kubeconfig)
        self.other = other
        self.raced: set[str] = set()

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        if name not in self.raced:
            self.raced.add(name)
            self.other.patch_node(name, {"metadata": {"labels": {"team": "racing"}}},
                                  _content_type="application/merge-patch+json")
        return super().patch_node(name, patch)


def test_a_conflict_is_read_again_and_retried(cluster: StandIn) -> None:
    register(cluster, "r1")
    api = RacingApi(cluster.kubeconfig, core_api(cluster))
    report = reconcile(api, [identity("r1")], {"r1": passed()}, P)
    outcome = report.nodes[0]
    assert (outcome.verdict, outcome.patched, outcome.attempts) == ("passed", True, 2)
    assert dict(api.calls) == {"list": 1, "patch": 2, "get": 1}
    codes = [e["responseStatus"]["code"] for e in cluster.audit()
             if e["verb"] == "patch" and e.get("objectRef", {}).get("name") == "r1"
             and e["userAgent"].startswith("OpenAPI")]
    assert 409 in codes and codes[-1] == 200
    node = core_api(cluster).read_node("r1")
    assert node.metadata.labels["team"] == "racing"  # the other writer's change survived
    assert node.metadata.labels[f"{P}/validation"] == "passed"


def test_dry_run_changes_nothing(cluster: StandIn) -> None:
    register(cluster, "d1")
    before = core_api(cluster).read_node("d1")
    api = KubeNodeApi(cluster.kubeconfig)
    report = reconcile(api, [identity("d1")], {"d1": passed()}, P, dry_run=True)
    assert dict(api.calls) == {"list": 1}
    assert report.nodes[0].changes and not report.nodes[0].patched
    after = core_api(cluster).read_node("d1")
    assert after.metadata.resource_version == before.metadata.resource_version


# -- the command ------------------------------------------------------------------------------
def inventory(tmp: Path, kubeconfig: Path, hosts: list[str],
              host_vars: dict[str, dict[str, Any]] | None = None) -> Path:
    root = tmp / "inventory"
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "children": {"pool_h100_sxm": {"hosts": {
            h: {"ansible_host": "192.0.2.1", **(host_vars or {}).get(h, {})}
            for h in hosts}}}}}}}))
    (root / "group_vars" / "all" / "vars.yml").write_text(yaml.safe_dump({
        "gpu_profile": "h100-sxm5-80gb-8x", "gpuready_label_prefix": P,
        "gpuready_kubeconfig": str(kubeconfig),
        "gpu_pool": {"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                     "fabric": "infiniband", "workload": "batch", "sharing": "full-gpu"}}))
    return root


def run_dir(tmp: Path, failing: dict[str, str]) -> Path:
    rows = []
    for node in ("c1", "c2", "c3"):
        code = failing.get(node)
        for check, metric, value in (("gpu.count", "gpu_count", 8.0),
                                     ("gpu.memory", "memory_total_mib", 81559.0)):
            rows.append(CheckResult(RUN, "2026-12-02T10:15:00+00:00", node, "pool_h100_sxm",
                                    "h100-sxm5-80gb-8x", check, metric, value, "", None, None,
                                    Status.PASS, "ok", "", 0.1))
        rows.append(CheckResult(RUN, "2026-12-02T10:15:00+00:00", node, "pool_h100_sxm",
                                "h100-sxm5-80gb-8x", "gpu.ecc", "uncorrectable_volatile",
                                2.0 if code else 0.0, "errors", None, 0.0,
                                Status.FAIL if code else Status.PASS, code or "ok", "", 0.1))
    return write_report(rows, tmp / "reports", RUN, update_latest=False).run_dir


def gate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["gate", *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_gate_command_reports_and_records_every_change(cluster: StandIn,
                                                          tmp_path: Path) -> None:
    register(cluster, "c1", "c2")  # c3 never joined
    inv = inventory(tmp_path, cluster.kubeconfig, ["c1", "c2", "c3", "c4"])
    run = run_dir(tmp_path, {"c2": "gpu.ecc.uncorrectable"})
    code, out, err = gate("-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED, err
    assert f"API {cluster.url}" in err
    lines = out.splitlines()
    assert "c1: passed; patched in 1 attempt(s)" in lines
    assert f"  taint {P}/validation: pending:NoSchedule -> <none>" in lines
    assert "c2: failed (gpu.ecc.uncorrectable); patched in 1 attempt(s)" in lines
    assert f"  annotation {P}/failed-checks: <none> -> gpu.ecc.uncorrectable" in lines
    assert "c3: not-registered (gate.not_registered)" in lines
    assert "not in this run (left alone): c4" in lines
    assert any(line.startswith("gate: patched 2, already right 0;") for line in lines)
    record = json.loads((run / "gate.json").read_text())
    assert record["prefix"] == P and record["calls"] == {"list": 1, "patch": 2}
    by_node = {n["node"]: n for n in record["nodes"]}
    assert {"kind": "label", "key": f"{P}/validation", "old": None, "new": "failed"} in \
        by_node["c2"]["changes"]
    # Nothing left to do: the gate says so.
    code, out, _ = gate("-i", str(inv), "--run", str(run), "--limit", "c1,c2")
    assert code == ExitCode.CHECK_FAILED  # c2 still failed
    assert "c1: passed; already right" in out and "nothing to change" in out


def test_an_unreachable_or_refusing_api_exits_2_and_changes_nothing(
        cluster: StandIn, tmp_path: Path) -> None:
    register(cluster, "u1")
    before = core_api(cluster).read_node("u1").metadata.resource_version
    text = cluster.kubeconfig.read_text()
    unreachable = tmp_path / "unreachable.conf"
    unreachable.write_text(text.replace(cluster.address, standin_address(15)))
    refused = tmp_path / "refused.conf"
    refused.write_text(text.replace(cluster.token, "x" * 48))
    run = run_dir(tmp_path, {})
    for config, words in ((unreachable, "cannot reach the Kubernetes API"),
                          (refused, "refused the gate (401)")):
        inv = tmp_path / config.stem
        inv.mkdir()
        code, out, err = gate("-i", str(inventory(inv, config, ["u1"])), "--run", str(run))
        assert code == ExitCode.USAGE_OR_TOOL_ERROR
        assert words in err and "nothing was changed" in err
        assert not (run / "gate.json").exists()
        assert out == ""
    assert core_api(cluster).read_node("u1").metadata.resource_version == before


def test_bad_input_is_a_clear_error(cluster: StandIn, tmp_path: Path) -> None:
    inv = inventory(tmp_path, cluster.kubeconfig, ["c1"])
    code, _, err = gate("-i", str(inv), "--run", str(tmp_path / "no-such-run"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "holds no validation results" in err
    code, _, err = gate("-i", str(inv), "--run", str(run_dir(tmp_path, {})), "--prefix", "A_B")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "not a DNS subdomain" in err


def test_a_renamed_node_is_found_and_a_bad_declaration_stops_before_any_patch(
        cluster: StandIn, tmp_path: Path) -> None:
    register(cluster, "k8s-name-c1")
    # A host that names a profile that does not exist is the inventory's error: the gate
    # refuses before it touches any Node, naming the variable and where it was set.
    bad = inventory(tmp_path / "bad", cluster.kubeconfig, ["c1", "c2"], {
        "c1": {"node_join_node_name": "k8s-name-c1"},
        "c2": {"gpu_profile": "no-such-profile"}})
    code, out, err = gate("-i", str(bad), "--run", str(run_dir(tmp_path / "bad", {})))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, err
    assert "gpu_profile (set on host c2)" in err and "no-such-profile" in err
    labels = core_api(cluster).read_node("k8s-name-c1").metadata.labels or {}
    assert f"{P}/validation" not in labels
    inv = inventory(tmp_path, cluster.kubeconfig, ["c1"], {
        "c1": {"node_join_node_name": "k8s-name-c1"}})
    code, out, err = gate("-i", str(inv), "--run", str(run_dir(tmp_path, {})))
    assert code == ExitCode.OK, err
    assert "k8s-name-c1: passed; patched in 1 attempt(s)" in out
    node = core_api(cluster).read_node("k8s-name-c1")
    assert node.metadata.labels[f"{P}/validation"] == "passed"
