"""The API clients (the gate, the upgrade's drain, cluster apply) against a Kubernetes API that
answers wrong: a real kube-apiserver (tests/kube_helpers.py) behind the hostile API server
(tests/hostile_api.py), which passes every request through but those a test scripts.

Each wrong answer (an HTML page with status 200, a list of another kind, fields of the wrong
type, JSON nested 100,000 deep, a 404 for PodDisruptionBudgets, a 403 on an eviction) is exit 2
with a message naming the request and what came back, never a traceback, ``internal error`` or
an exception's name; and the cluster is left as it was: no write reaches the real server
(counted by the hostile server, and the Nodes' resourceVersion unchanged). A drain whose user
lacks the right to evict is refused before its first write by a real RBAC answer (a
ServiceAccount's token on the real server).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lab.kube.local import kubeconfig
from tests.hostile_api import (
    Answer,
    HostileApi,
    Rule,
    Substitute,
    Transform,
    deep_body,
    hostile_api,
    status_body,
)
from tests.kube_helpers import LocalApiServer, core_api, loopback_address, running_apiserver
from tests.unit.validate import gate_runs
from tests.unit.validate.cluster_inventories import lab_copy
from validate import cli
from validate.model import ExitCode

P = "gpu.example.com.node-restriction.kubernetes.io"
TAINT = {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"}
HOSTS = ("g1-h100", "u1-h100", "u2-h100")
NS = "train"
NOW = datetime.now(UTC).replace(microsecond=0)
# What no wrong answer may print: the Python exceptions the clients used to end in.
NEVER = ("Traceback", "internal error", "TypeError", "RecursionError", "JSONDecodeError",
         "KeyError", "AttributeError", "refused the gate")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("hostile-api"), 22) as server:
        api = core_api(server)
        for name in HOSTS:
            api.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                             "spec": {"taints": [TAINT]}})
        api.create_namespace({"metadata": {"name": NS}})
        # No controller manager: the ServiceAccount admission needs the namespace's default.
        api.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})
        api.create_namespaced_pod(NS, {
            "metadata": {"name": "web-0", "labels": {"app": "web"}},
            "spec": {"nodeName": "u2-h100", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "gpuready.lab/sleep:1"}]}})
        yield server


@pytest.fixture(scope="module")
def hostile(cluster: LocalApiServer) -> Iterator[HostileApi]:
    with hostile_api(cluster, loopback_address(22)) as api:
        yield api


@pytest.fixture()
def peer(hostile: HostileApi) -> HostileApi:
    """The module's hostile server with no rule yet and no request recorded."""
    hostile.rules.clear()
    hostile.requests.clear()
    return hostile


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, hostile: HostileApi,
         fixtures_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("site")
    config = hostile.kubeconfig(root / "hostile.conf")
    inv = gate_runs.write_inventory(root / "inventory", HOSTS, prefix=P, kubeconfig=config)
    run = gate_runs.write_run(fixtures_dir, inv, root / "reports", "r-fresh",
                              NOW - timedelta(hours=1), limit="g1-h100")
    return {"inventory": inv, "run": run, "root": root}


def main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def version(cluster: LocalApiServer, name: str) -> str:
    return str(core_api(cluster).read_node(name).metadata.resource_version)


def _labels_as_a_list(doc: Any) -> None:
    doc["items"][0]["metadata"]["labels"] = ["team=ml"]


def _taint_key_a_number(doc: Any) -> None:
    doc["items"][0]["spec"]["taints"][0]["key"] = 7


def _deep(doc: Any) -> bytes:
    doc["items"][0]["metadata"]["annotations"] = {"x": "DEEP"}
    return deep_body(doc, 100_000)


NODES = r"^/api/v1/nodes(\?|$)"
WRONG_NODE_LISTS = {
    "html": (Answer(200, b"<html><head><title>502 Bad Gateway</title></head><body>nginx"
                         b"</body></html>", "text/html"),
             "the API server answered an HTML page, '<html><head><title>502 Bad Gateway"),
    "not-json": (Answer(200, b"upstream connect error or disconnect/reset before headers",
                        "text/plain"),
                 "the API server answered text that is not JSON, 'upstream connect error"),
    "empty": (Answer(200, b""), "the API server answered an empty body"),
    "wrong-kind": (Substitute(f"/api/v1/namespaces/{NS}/pods"),
                   "the API server answered a PodList (v1), not a NodeList (v1)"),
    "not-an-object": (Answer(200, b'["g1-h100"]'), "the API server answered a list, not a "
                      "NodeList (v1)"),
    "labels-a-list": (Transform(_labels_as_a_list), "the API server answered a NodeList whose "
                      "items[0].metadata.labels is a list, not a map of strings"),
    "taint-key-a-number": (Transform(_taint_key_a_number), "the API server answered a "
                           "NodeList whose items[0].spec.taints[0].key is an integer, not a "
                           "string"),
    "nested-100000-deep": (Transform(_deep), "the API server answered JSON nested deeper "
                           "than 64 levels"),
}


@pytest.mark.parametrize("case", sorted(WRONG_NODE_LISTS))
def test_the_gate_acts_on_no_wrong_answer(case: str, cluster: LocalApiServer, peer: HostileApi,
                                          site: dict[str, Path]) -> None:
    """The node would be admitted (a fresh, complete passing run); the Node list it is
    judged against comes back wrong, so nothing is patched."""
    action, words = WRONG_NODE_LISTS[case]
    peer.rules.append(Rule("GET", NODES, action))
    before = version(cluster, "g1-h100")
    code, out, err = main("gate", "-i", str(site["inventory"]), "--limit", "g1-h100",
                          "--run", str(site["run"]))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
    assert f"gate: error: GET /api/v1/nodes: {words}" in err, err
    assert "nothing was changed" in err and out == ""
    assert not any(w in err for w in NEVER), err
    assert peer.writes() == [] and version(cluster, "g1-h100") == before
    assert not (site["run"] / "gate.json").exists()


def test_the_gate_admits_through_the_hostile_server_when_it_answers_right(
        cluster: LocalApiServer, peer: HostileApi, site: dict[str, Path]) -> None:
    """The counter-check: with no rule the same command admits the node, so the refusals
    above are the wrong answers', not the set-up's."""
    code, out, err = main("gate", "-i", str(site["inventory"]), "--limit", "g1-h100",
                          "--run", str(site["run"]), "--dry-run")
    assert code == ExitCode.OK, (out, err)
    assert "g1-h100: passed; would change" in out


def test_a_pod_list_answered_with_the_nodes_evicts_nothing(
        cluster: LocalApiServer, peer: HostileApi, site: dict[str, Path]) -> None:
    """Issue 42's finding: the pods of a node answered with the real server's NodeList would
    have had the drain evict the Nodes as "bare pods"."""
    peer.rules.append(Rule("GET", r"^/api/v1/pods\?", Substitute("/api/v1/nodes")))
    before = version(cluster, "u1-h100")
    for dry in ((), ("--dry-run",)):
        code, out, err = main("upgrade", "drain", "-i", str(site["inventory"]), "--node",
                              "u1-h100", *dry)
        assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
        assert ("error: GET /api/v1/pods?fieldSelector=spec.nodeName=u1-h100: the API server "
                "answered a NodeList (v1), not a PodList (v1); nothing was done with the "
                "answer") in err, err
        assert not any(w in err for w in NEVER), err
        assert "evict" not in out
    assert peer.writes() == [] and version(cluster, "u1-h100") == before


def test_a_cluster_without_policy_v1_pdbs_is_said_so_before_any_write(
        cluster: LocalApiServer, peer: HostileApi, site: dict[str, Path]) -> None:
    """An API server that does not serve policy/v1 PodDisruptionBudgets answers their list
    404 (as a server before Kubernetes 1.21 does): the drain and the plan say what is missing,
    the Node is not cordoned."""
    peer.rules.append(Rule("GET", r"^/apis/policy/v1/poddisruptionbudgets", Answer(
        404, status_body(404, "NotFound", "the server could not find the requested resource"))))
    before = version(cluster, "u2-h100")
    for argv in (("drain", "--node", "u2-h100"), ("plan", "--limit", "u2-h100")):
        code, out, err = main("upgrade", argv[0], "-i", str(site["inventory"]), *argv[1:])
        assert code == ExitCode.USAGE_OR_TOOL_ERROR, (argv, out, err)
        assert (f"the API server at {peer.url} does not serve PodDisruptionBudgets of policy/v1 "
                "(GET /apis/policy/v1/poddisruptionbudgets: 404 Not Found: the server could not "
                "find the requested resource)") in err, err
        assert "Kubernetes 1.21" in err and "nothing was changed" in err
        assert not any(w in err for w in NEVER), err
    assert peer.writes() == [] and version(cluster, "u2-h100") == before


def test_a_403_on_an_eviction_names_the_request_and_what_to_do(
        cluster: LocalApiServer, peer: HostileApi, site: dict[str, Path]) -> None:
    """An admission webhook refuses the eviction (403) after RBAC allowed it: the message
    names the request, the status and the refusal, says what to do, and that the node is left
    cordoned with its pod; not "refused the gate", and exit 2, not 3 (the API was reached)."""
    denial = ('admission webhook "deny-evictions.example.com" denied the request: jobs in '
              f"{NS} are checkpointing")
    peer.rules.append(Rule("POST", r"/pods/web-0/eviction$",
                           Answer(403, status_body(403, "Forbidden", denial))))
    # web-0 is a bare pod: --force lets kubectl's guard pass it (test_upgrade.py has the guard).
    code, out, err = main("upgrade", "drain", "-i", str(site["inventory"]), "--node", "u2-h100",
                          "--timeout", "5", "--force")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
    assert (f"error: POST /api/v1/namespaces/{NS}/pods/web-0/eviction: the API server at "
            f"{peer.url} answered 403 Forbidden: {denial}; if RBAC refused it, the "
            f"kubeconfig's user needs the right to create pods/eviction -n {NS} (`kubectl auth "
            f"can-i create pods/eviction -n {NS}` says whether it has it)") in err, err
    assert "u2-h100 is left cordoned and tainted (state draining) with train/web-0 on it" in err
    assert not any(w in err for w in NEVER), err
    assert [p.metadata.name for p in core_api(cluster).list_namespaced_pod(NS).items] == [
        "web-0"]
    node = core_api(cluster).read_node("u2-h100")
    assert node.spec.unschedulable is True
    core_api(cluster).patch_node("u2-h100", {"spec": {"unschedulable": None}})


def test_a_drain_its_user_may_not_do_is_refused_before_the_first_write(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    """A real RBAC answer: a ServiceAccount that may read and patch Nodes and list pods and
    PDBs, but not evict. The drain asks the server (SelfSubjectAccessReview) before it
    cordons, so the node is left as it was, and the message says which right is missing."""
    from kubernetes import client  # noqa: PLC0415

    api = core_api(cluster)
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    api.create_namespaced_service_account(NS, {"metadata": {"name": "roller"}})
    rbac.create_cluster_role({"metadata": {"name": "roller"}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": "roller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "roller"},
        "subjects": [{"kind": "ServiceAccount", "name": "roller", "namespace": NS}]})
    token = api.create_namespaced_service_account_token(
        "roller", NS, {"spec": {"expirationSeconds": 3600}}).status.token
    config = tmp_path / "roller.conf"
    config.write_text(kubeconfig(cluster.url, cluster.ca_pem, token))
    before = version(cluster, "u2-h100")
    code, out, err = main("upgrade", "drain", "-i", str(site["inventory"]), "--node", "u2-h100",
                          "--kubeconfig", str(config))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
    assert (f"error: drain u2-h100: the kubeconfig's user may not create pods/eviction -n {NS}"
            ) in err and "nothing was changed" in err, err
    assert "patch nodes" not in err  # that one it may
    assert version(cluster, "u2-h100") == before


def test_cluster_apply_acts_on_no_wrong_discovery(cluster: LocalApiServer, peer: HostileApi,
                                                  tmp_path: Path) -> None:
    inv = lab_copy(tmp_path / "inventory", "default")
    config = peer.kubeconfig(tmp_path / "hostile.conf")
    for action, words in (
            (Answer(200, b"<!doctype html><title>Sign in</title>", "text/html"),
             "GET /api/v1: the API server answered an HTML page, '<!doctype html><title>Sign "
             "in</title>'"),
            (Substitute("/apis/batch/v1"),
             "GET /api/v1: the API server answered the resources of batch/v1, not of v1")):
        peer.rules[:] = [Rule("GET", r"^/api/v1$", action)]
        code, out, err = main("cluster", "apply", "-i", str(inv), "--kubeconfig", str(config))
        assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
        assert f"error: {words}" in err, err
        assert not any(w in err for w in NEVER), err
    assert peer.writes() == []


def test_an_error_body_that_is_not_a_status_is_quoted_on_one_line(
        cluster: LocalApiServer, peer: HostileApi, site: dict[str, Path]) -> None:
    """A 500 whose body is a proxy's page with control characters: quoted, escaped."""
    peer.rules.append(Rule("GET", NODES, Answer(500, b"<h1>oops\x1b[2J\x07</h1>\n<p>later</p>",
                                                "text/html")))
    code, _, err = main("gate", "-i", str(site["inventory"]), "--limit", "g1-h100", "--run",
                        str(site["run"]))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert ("GET /api/v1/nodes: the API server at " + peer.url + " answered 500: "
            "'<h1>oops\\x1b[2J\\x07</h1> <p>later</p>'") in err, err
    assert "\x1b" not in err and "\x07" not in err

