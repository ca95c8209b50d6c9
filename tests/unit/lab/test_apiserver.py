"""The API server stand-in's semantics, request by request (lab/apiserver, no sockets), held
to the real kube-apiserver's: Status bodies and lists compared field by field with real ones
(tests/fixtures/k8s-api), selectors, the three patch types with Node's list semantics,
resourceVersion conflicts, authentication, NodeRestriction, bootstrap tokens, persistence."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.apiserver import server
from lab.apiserver.server import ApiServer, Config, Request, Response

ADDRESS = "127.0.22.250"  # never bound here: these tests call the handler directly
K8S = "k8s-api"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    # A new cluster's state, made once (RSA keys take a while); each test gets a copy.
    root = tmp_path_factory.mktemp("cluster") / "state"
    return root, server.init_state(root, ADDRESS)


@pytest.fixture
def state(template: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    shutil.copytree(template[0], tmp_path / "state")
    return tmp_path / "state", template[1]


@pytest.fixture
def api(state: tuple[Path, str]) -> ApiServer:
    return ApiServer(Config(state[0], ADDRESS))


@pytest.fixture
def admin(state: tuple[Path, str]) -> str:
    return state[1]


def call(api: ApiServer, method: str, path: str, body: Any = None, *, token: str | None = None,
         ctype: str = "application/json", query: dict[str, str] | None = None,
         cert: tuple[str, tuple[str, ...]] | None = None, accept: str = "") -> Response:
    headers = {"user-agent": "pytest"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if body is not None:
        headers["content-type"] = ctype
    if accept:
        headers["accept"] = accept
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    return api.handle(Request(method, path, query or {}, headers, data, cert, "127.0.0.1"))


def node(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}}, **extra}


def kubelet(name: str) -> tuple[str, tuple[str, ...]]:
    return (f"system:node:{name}", ("system:nodes",))


def _fixture_json(fixtures_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((fixtures_dir / K8S / name).read_text())


def _assert_same_shape(ours: Any, real: Any, where: str = "") -> None:
    """Same keys in the same order, and the same JSON types, all the way down."""
    assert type(ours) is type(real), (where, ours, real)
    if isinstance(real, dict):
        assert list(ours) == list(real), (where, list(ours), list(real))
        for key in real:
            _assert_same_shape(ours[key], real[key], f"{where}.{key}")


# -- Status bodies against the real ones ------------------------------------------------------
def test_not_found_status_is_the_real_shape(api: ApiServer, admin: str,
                                           fixtures_dir: Path) -> None:
    real = _fixture_json(fixtures_dir, "status-404-notfound-pods-api-conventions-example.json")
    got = call(api, "GET", "/api/v1/nodes/grafana", token=admin)
    assert got.code == 404 == real["code"]
    assert isinstance(got.body, dict)
    _assert_same_shape(got.body, real)
    # The real message, with our resource in place of pods.
    assert got.body["message"] == real["message"].replace("pods", "nodes")
    assert got.body["details"] == {"name": "grafana", "kind": "nodes"}


def test_conflict_status_is_the_real_shape(api: ApiServer, admin: str,
                                          fixtures_dir: Path) -> None:
    real = _fixture_json(fixtures_dir, "status-409-conflict-put-node-aks-tainter-test-fixture.json")
    name = real["details"]["name"]
    created = call(api, "POST", "/api/v1/nodes", node(name), token=admin)
    assert created.code == 201
    stale = json.loads(json.dumps(created.body))
    assert call(api, "PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"a": "1"}}},
                token=admin, ctype="application/merge-patch+json").code == 200
    got = call(api, "PUT", f"/api/v1/nodes/{name}", stale, token=admin)
    assert got.code == 409
    assert got.body == real  # field for field, message included


def test_forbidden_list_status_is_the_real_shape(api: ApiServer, fixtures_dir: Path) -> None:
    real = _fixture_json(fixtures_dir, "status-403-forbidden-list-nodes-anonymous-minikube-"
                                       "k8s1.14-jsoniter-empty-metadata.json")
    got = call(api, "GET", "/api/v1/nodes")  # anonymous
    assert got.code == 403
    assert got.body == real


def test_node_restriction_status_has_the_real_shape(api: ApiServer, admin: str,
                                                   fixtures_dir: Path) -> None:
    real = _fixture_json(fixtures_dir, "status-403-forbidden-delete-node-by-other-node-"
                                       "noderestriction-k8s1.7.json")
    for name in ("node-a", "node-b"):
        assert call(api, "POST", "/api/v1/nodes", node(name), token=admin).code == 201
    got = call(api, "DELETE", "/api/v1/nodes/node-b", cert=kubelet("node-a"))
    assert got.code == 403
    assert isinstance(got.body, dict)
    _assert_same_shape(got.body, real)
    # Today's NodeRestriction wording; 1.7 said "node node-A cannot modify node node-B".
    assert got.body["message"] == ('nodes "node-b" is forbidden: node "node-a" is not allowed '
                                   'to modify node "node-b"')
    assert call(api, "GET", "/api/v1/nodes/node-b", token=admin).code == 200


def test_unauthorized_and_invalid(api: ApiServer, admin: str) -> None:
    got = call(api, "GET", "/api/v1/nodes", token="not-a-token")
    assert got.code == 401
    assert got.body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": "Unauthorized",
                        "reason": "Unauthorized", "code": 401}
    call(api, "POST", "/api/v1/nodes", node("n1"), token=admin)
    bad = call(api, "PATCH", "/api/v1/nodes/n1",
               {"metadata": {"labels": {"ok": "a b", "bad key!": "x"}},
                "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}},
               token=admin, ctype="application/merge-patch+json")
    assert bad.code == 422
    assert isinstance(bad.body, dict)
    assert bad.body["reason"] == "Invalid"
    assert bad.body["details"]["kind"] == "Node"
    fields = [c["field"] for c in bad.body["details"]["causes"]]
    assert fields == ["metadata.labels", "metadata.labels", "spec.taints[0].effect"]
    # Several causes: apimachinery's aggregate puts them in brackets.
    assert bad.body["message"].startswith('Node "n1" is invalid: [metadata.labels: Invalid '
                                          'value: "bad key!": name part must consist of')
    assert ('spec.taints[0].effect: Unsupported value: "Sometimes": supported values: '
            '"NoSchedule", "PreferNoSchedule", "NoExecute"]') in bad.body["message"]
    # Nothing was stored.
    got = call(api, "GET", "/api/v1/nodes/n1", token=admin)
    assert isinstance(got.body, dict)
    assert "labels" not in got.body["metadata"]  # empty: omitted, as Go's omitempty does


# -- lists, objects, discovery -----------------------------------------------------------------
def test_node_list_has_the_raw_api_shape(api: ApiServer, admin: str,
                                        fixtures_dir: Path) -> None:
    real = _fixture_json(fixtures_dir,
                         "nodelist-raw-api-json-eks-arm64-2nodes-managedfields-taints-redacted.json")
    for item in real["items"]:  # the real Nodes go in, as a client would create them
        body = {k: v for k, v in item.items() if k != "status"}
        body["metadata"] = {k: v for k, v in item["metadata"].items()
                            if k in ("name", "labels", "annotations")}
        body["status"] = item["status"]
        assert call(api, "POST", "/api/v1/nodes", body, token=admin).code == 201
    got = call(api, "GET", "/api/v1/nodes", token=admin)
    assert isinstance(got.body, dict)
    assert list(got.body) == list(real)  # kind, apiVersion, metadata, items
    assert (got.body["kind"], got.body["apiVersion"]) == ("NodeList", "v1")
    assert got.body["metadata"]["resourceVersion"].isdigit()
    for ours, theirs in zip(got.body["items"], real["items"], strict=True):
        assert "kind" not in ours and "kind" not in theirs  # items carry no kind in a list
        assert list(ours) == list(theirs)  # metadata, spec, status
        # Our metadata keys in the real order (theirs also has managedFields).
        real_order = [k for k in theirs["metadata"] if k in ours["metadata"]]
        assert list(ours["metadata"]) == real_order
        assert ours["spec"]["taints"] == theirs["spec"]["taints"]
        assert ours["status"] == theirs["status"]


def test_discovery_and_version_say_simulated(api: ApiServer, admin: str) -> None:
    version = call(api, "GET", "/version")  # public, as system:public-info-viewer allows
    assert version.code == 200 and isinstance(version.body, dict)
    assert version.body["gitVersion"] == "v1.30.5+gpuready-lab-simulated"
    assert call(api, "GET", "/api").code == 403  # discovery needs authentication
    apis = call(api, "GET", "/api", token=admin)
    assert isinstance(apis.body, dict) and apis.body["versions"] == ["v1"]
    v1 = call(api, "GET", "/api/v1", token=admin)
    assert isinstance(v1.body, dict)
    nodes = next(r for r in v1.body["resources"] if r["name"] == "nodes")
    assert nodes["kind"] == "Node" and not nodes["namespaced"] and "patch" in nodes["verbs"]
    assert any(r["name"] == "nodes/status" for r in v1.body["resources"])
    groups = call(api, "GET", "/apis", token=admin)
    assert isinstance(groups.body, dict)
    assert [g["name"] for g in groups.body["groups"]] == ["certificates.k8s.io"]
    assert call(api, "GET", "/apis/nope.example.com/v1/things", token=admin).code == 404


def test_table_for_kubectl(api: ApiServer, admin: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    call(api, "POST", "/api/v1/nodes", node(
        "gpu1", {"node-role.kubernetes.io/worker": "", "a": "b"},
        status={"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": now}],
                "nodeInfo": {"kubeletVersion": "v1.30.5"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}), token=admin)
    got = call(api, "GET", "/api/v1/nodes", token=admin,
               accept="application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert isinstance(got.body, dict)
    assert (got.body["kind"], got.body["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in got.body["columnDefinitions"]][:5] == [
        "Name", "Status", "Roles", "Age", "Version"]
    row = got.body["rows"][0]
    assert row["cells"][:3] == ["gpu1", "Ready", "worker"]
    assert row["cells"][4:6] == ["v1.30.5", "10.0.0.7"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["labels"]["a"] == "b"


def test_human_duration_matches_apimachinery() -> None:
    cases = {0: "0s", 119: "119s", 120: "2m", 125: "2m5s", 600: "10m", 10799: "179m",
             3 * 3600 + 60: "3h1m", 8 * 3600: "8h", 47 * 3600: "47h", 49 * 3600: "2d1h",
             8 * 86400: "8d", 800 * 86400: "2y70d"}
    for seconds, text in cases.items():
        assert server.human_duration(seconds) == text, seconds


# -- selectors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("selector", "names"), [
    ("pool=h100", ["a", "b"]), ("pool==h100", ["a", "b"]), ("pool!=h100", ["c", "d"]),
    ("pool in (h100,l40s)", ["a", "b", "c"]), ("pool notin (h100)", ["c", "d"]),
    ("gpu", ["a", "c"]), ("!gpu", ["b", "d"]), ("pool=h100,gpu", ["a"]),
    ("count>4", ["a"]), ("count<8", ["c"]), ("pool=", []),
])
def test_label_selectors(api: ApiServer, admin: str, selector: str, names: list[str]) -> None:
    for name, labels in (("a", {"pool": "h100", "gpu": "", "count": "8"}),
                         ("b", {"pool": "h100"}),
                         ("c", {"pool": "l40s", "gpu": "x", "count": "4"}), ("d", {})):
        call(api, "POST", "/api/v1/nodes", node(name, labels), token=admin)
    got = call(api, "GET", "/api/v1/nodes", token=admin, query={"labelSelector": selector})
    assert got.code == 200, got.body
    assert isinstance(got.body, dict)
    assert [i["metadata"]["name"] for i in got.body["items"]] == names


def test_bad_selectors_are_400(api: ApiServer, admin: str) -> None:
    for query in ({"labelSelector": "pool in h100"}, {"labelSelector": "a b"},
                  {"fieldSelector": "spec.providerID=x"}):
        got = call(api, "GET", "/api/v1/nodes", token=admin, query=query)
        assert got.code == 400, query
        assert isinstance(got.body, dict) and got.body["reason"] == "BadRequest"


def test_field_selectors(api: ApiServer, admin: str) -> None:
    call(api, "POST", "/api/v1/nodes", node("a"), token=admin)
    call(api, "POST", "/api/v1/nodes", node("b", spec={"unschedulable": True}), token=admin)
    for query, names in (("metadata.name=b", ["b"]), ("metadata.name!=b", ["a"]),
                         ("spec.unschedulable=true", ["b"])):
        got = call(api, "GET", "/api/v1/nodes", token=admin, query={"fieldSelector": query})
        assert isinstance(got.body, dict)
        assert [i["metadata"]["name"] for i in got.body["items"]] == names, query


# -- patches -----------------------------------------------------------------------------------
NOW = "2026-01-01T00:00:00Z"


def _status_node(api: ApiServer, admin: str) -> dict[str, Any]:
    body = node("n", {"keep": "1", "vendor.example.com/x": "y"}, spec={
        "podCIDRs": ["10.0.0.0/24"],
        "taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]},
        status={"conditions": [
            {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": NOW},
            {"type": "Ready", "status": "False", "lastHeartbeatTime": NOW}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": "n"}]})
    got = call(api, "POST", "/api/v1/nodes", body, token=admin)
    assert got.code == 201 and isinstance(got.body, dict)
    return got.body


def _patch(api: ApiServer, admin: str, body: Any, ctype: str, sub: str = "") -> Response:
    return call(api, "PATCH", f"/api/v1/nodes/n{sub}", body, token=admin, ctype=ctype)


def test_json_patch(api: ApiServer, admin: str) -> None:
    _status_node(api, admin)
    got = _patch(api, admin, [
        {"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.count", "value": "8"},
        {"op": "remove", "path": "/metadata/labels/keep"},
        {"op": "test", "path": "/spec/taints/0/key", "value": "a"},
        {"op": "replace", "path": "/spec/taints/0/effect", "value": "PreferNoSchedule"},
        {"op": "copy", "from": "/metadata/labels/vendor.example.com~1x", "path":
         "/metadata/labels/copied"},
    ], "application/json-patch+json")
    assert got.code == 200, got.body
    assert isinstance(got.body, dict)
    assert got.body["metadata"]["labels"] == {"copied": "y", "nvidia.com/gpu.count": "8",
                                              "vendor.example.com/x": "y"}
    assert got.body["spec"]["taints"][0] == {"key": "a", "effect": "PreferNoSchedule"}
    failed = _patch(api, admin, [{"op": "test", "path": "/metadata/name", "value": "m"}],
                    "application/json-patch+json")
    assert failed.code == 422 and isinstance(failed.body, dict)
    assert failed.body["message"] == ("the server rejected our request due to an error in our "
                                      "request")
    assert _patch(api, admin, {"op": "add"}, "application/json-patch+json").code == 400


def test_merge_patch_replaces_lists_and_null_deletes(api: ApiServer, admin: str) -> None:
    _status_node(api, admin)
    got = _patch(api, admin, {"metadata": {"labels": {"keep": None, "new": "1"}},
                              "spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}},
                 "application/merge-patch+json")
    assert isinstance(got.body, dict)
    assert got.body["metadata"]["labels"] == {"new": "1", "vendor.example.com/x": "y"}
    assert got.body["spec"]["taints"] == [{"key": "c", "effect": "NoSchedule"}]
    assert got.body["spec"]["podCIDRs"] == ["10.0.0.0/24"]


def test_strategic_merge_patch_uses_nodes_list_semantics(api: ApiServer, admin: str) -> None:
    _status_node(api, admin)
    smp = "application/strategic-merge-patch+json"
    # conditions and addresses merge by their "type" key (status subresource) ...
    got = _patch(api, admin, {"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                       {"type": "PIDPressure", "status": "False"},
                       {"type": "MemoryPressure", "$patch": "delete"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]}}, smp, "/status")
    assert got.code == 200 and isinstance(got.body, dict)
    conditions = got.body["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", "PIDPressure"]
    assert conditions[0] == {"type": "Ready", "status": "True", "lastHeartbeatTime": NOW,
                             "reason": "KubeletReady"}
    assert got.body["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.2"},
                                               {"type": "Hostname", "address": "n"}]
    # ... taints have no patch strategy (atomic): the list is replaced whole ...
    got = _patch(api, admin, {"spec": {"taints": [{"key": "z", "effect": "NoSchedule"}]}}, smp)
    assert isinstance(got.body, dict)
    assert got.body["spec"]["taints"] == [{"key": "z", "effect": "NoSchedule"}]
    # ... and podCIDRs is a merged set, with $deleteFromPrimitiveList.
    got = _patch(api, admin, {"spec": {"podCIDRs": ["fd00::/64"],
                                       "$deleteFromPrimitiveList/podCIDRs": ["10.0.0.0/24"]}},
                 smp)
    assert isinstance(got.body, dict)
    assert got.body["spec"]["podCIDRs"] == ["fd00::/64"]
    # $patch: replace on a map, $retainKeys.
    got = _patch(api, admin, {"metadata": {"labels": {"$patch": "replace", "only": "this"}}},
                 smp)
    assert isinstance(got.body, dict)
    assert got.body["metadata"]["labels"] == {"only": "this"}
    # A merge-keyed element without its key is a bad request.
    bad = _patch(api, admin, {"status": {"conditions": [{"status": "True"}]}}, smp, "/status")
    assert bad.code == 400


def test_status_and_main_resource_writes_are_kept_apart(api: ApiServer, admin: str) -> None:
    _status_node(api, admin)
    smp = "application/strategic-merge-patch+json"
    got = _patch(api, admin, {"metadata": {"labels": {"via": "status"}},
                              "status": {"phase": "Running"}}, smp, "/status")
    assert isinstance(got.body, dict)
    assert "via" not in got.body["metadata"]["labels"]
    assert got.body["status"]["phase"] == "Running"
    got = _patch(api, admin, {"metadata": {"labels": {"via": "main"}},
                              "status": {"phase": "Pending"}}, smp)
    assert isinstance(got.body, dict)
    assert got.body["metadata"]["labels"]["via"] == "main"
    assert got.body["status"]["phase"] == "Running"


def test_resource_version_guards_writes(api: ApiServer, admin: str) -> None:
    created = _status_node(api, admin)
    rv = created["metadata"]["resourceVersion"]
    merge = "application/merge-patch+json"
    ok = _patch(api, admin, {"metadata": {"resourceVersion": rv, "labels": {"x": "1"}}}, merge)
    assert ok.code == 200 and isinstance(ok.body, dict)
    assert int(ok.body["metadata"]["resourceVersion"]) > int(rv)
    stale = _patch(api, admin, {"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}},
                   merge)
    assert stale.code == 409 and isinstance(stale.body, dict)
    assert stale.body["reason"] == "Conflict"
    # A patch that changes nothing stores nothing: the resourceVersion stays.
    same = _patch(api, admin, {"metadata": {"labels": {"x": "1"}}}, merge)
    assert isinstance(same.body, dict)
    assert same.body["metadata"]["resourceVersion"] == ok.body["metadata"]["resourceVersion"]
    listed = call(api, "GET", "/api/v1/nodes", token=admin)
    assert isinstance(listed.body, dict)
    assert int(listed.body["metadata"]["resourceVersion"]) >= int(
        ok.body["metadata"]["resourceVersion"])
    assert call(api, "PATCH", "/api/v1/nodes/n", {"a": 1}, token=admin,
                ctype="application/json").code == 415


def test_state_survives_a_restart(state: tuple[Path, str]) -> None:
    first = ApiServer(Config(state[0], ADDRESS))
    created = call(first, "POST", "/api/v1/nodes", node("keep", {"a": "1"}), token=state[1])
    assert isinstance(created.body, dict)
    again = ApiServer(Config(state[0], ADDRESS))
    got = call(again, "GET", "/api/v1/nodes/keep", token=state[1])
    assert got.body == created.body
    more = call(again, "POST", "/api/v1/nodes", node("next"), token=state[1])
    assert isinstance(more.body, dict)
    assert int(more.body["metadata"]["resourceVersion"]) > int(
        created.body["metadata"]["resourceVersion"])


# -- authentication, NodeRestriction, bootstrap tokens -------------------------------------------
def test_node_restriction(api: ApiServer, admin: str) -> None:
    own = kubelet("w1")
    created = call(api, "POST", "/api/v1/nodes", node(
        "w1", {"vendor.example.com/ok": "1"},
        spec={"taints": [{"key": "gpu.example.com/validation", "value": "pending",
                          "effect": "NoSchedule"}]}), cert=own)
    assert created.code == 201  # a kubelet registers its Node, with taints
    merge = "application/merge-patch+json"
    cases = [
        ({"spec": {"taints": []}}, 'node "w1" is not allowed to modify taints'),
        ({"metadata": {"labels": {"gpu.node-restriction.kubernetes.io/validation": "passed"}}},
         'node "w1" is not allowed to modify labels: '
         "gpu.node-restriction.kubernetes.io/validation"),
        ({"metadata": {"labels": {"node-role.kubernetes.io/gpu": ""}}},
         'node "w1" is not allowed to modify labels: node-role.kubernetes.io/gpu'),
    ]
    for body, message in cases:
        got = call(api, "PATCH", "/api/v1/nodes/w1", body, cert=own, ctype=merge)
        assert got.code == 403, body
        assert isinstance(got.body, dict)
        assert got.body["message"] == f'nodes "w1" is forbidden: {message}'
    allowed = call(api, "PATCH", "/api/v1/nodes/w1",
                   {"metadata": {"labels": {"nvidia.com/gpu.count": "8",
                                            "node.kubernetes.io/instance-type": "x"}}},
                   cert=own, ctype=merge)
    assert allowed.code == 200
    refused = call(api, "POST", "/api/v1/nodes", node(
        "w2", {"gpu.node-restriction.kubernetes.io/pool": "a"}), cert=kubelet("w2"))
    assert refused.code == 403 and isinstance(refused.body, dict)
    assert refused.body["message"] == ('nodes "w2" is forbidden: node "w2" is not allowed to '
                                       "set the following labels: "
                                       "gpu.node-restriction.kubernetes.io/pool")
    # The admin may do what the kubelet may not.
    assert call(api, "PATCH", "/api/v1/nodes/w1", {"spec": {"taints": []}}, token=admin,
                ctype=merge).code == 200


def _bootstrap_secret(token_id: str, secret: str, expires: datetime) -> dict[str, Any]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
            "data": {"token-id": b64(token_id), "token-secret": b64(secret),
                     "expiration": b64(expires.strftime("%Y-%m-%dT%H:%M:%SZ")),
                     "usage-bootstrap-authentication": b64("true"),
                     "usage-bootstrap-signing": b64("true"),
                     "auth-extra-groups": b64("system:bootstrappers:kubeadm:default-node-token")}}


def test_bootstrap_tokens_sign_cluster_info_and_expire(api: ApiServer, admin: str,
                                                     fixtures_dir: Path) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=15)
    secrets_path = "/api/v1/namespaces/kube-system/secrets"
    assert call(api, "POST", secrets_path, _bootstrap_secret("abcdef", "0123456789abcdef",
                                                             soon), token=admin).code == 201
    token = "abcdef.0123456789abcdef"
    # The token authenticates a bootstrapper: it may create CSRs and read Nodes, not list them.
    assert call(api, "GET", "/api/v1/nodes/x", token=token).code == 404
    listed = call(api, "GET", "/api/v1/nodes", token=token)
    assert listed.code == 403 and isinstance(listed.body, dict)
    assert 'User "system:bootstrap:abcdef" cannot list' in listed.body["message"]
    # cluster-info is readable without credentials and carries the token's JWS of its
    # kubeconfig, shaped as kubeadm's (the real ConfigMap in tests/fixtures).
    info = call(api, "GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
    assert info.code == 200 and isinstance(info.body, dict)
    real = yaml.safe_load((fixtures_dir / K8S / "configmap-kube-public-cluster-info-k8s-docs-"
                                               "bootstrap-tokens-ca-elided.yaml").read_text())
    assert sorted(info.body["data"]) == sorted(k.replace("07401b", "abcdef")
                                               for k in real["data"])
    ours, theirs = (yaml.safe_load(info.body["data"]["kubeconfig"]),
                    yaml.safe_load(real["data"]["kubeconfig"]))
    assert list(ours) == list(theirs)

    def empty_as_none(v: object) -> object:
        # kubeadm serialises the empty contexts/users lists as null today; the documentation's
        # example comes from a kubeadm that printed [].
        return None if v == [] else v

    assert {k: empty_as_none(v) for k, v in ours.items() if k != "clusters"} == {
        k: empty_as_none(v) for k, v in theirs.items() if k != "clusters"}
    assert list(ours["clusters"][0]) == list(theirs["clusters"][0])
    assert list(ours["clusters"][0]["cluster"]) == list(theirs["clusters"][0]["cluster"])
    header, _, signature = info.body["data"]["jws-kubeconfig-abcdef"].partition("..")
    real_header = real["data"]["jws-kubeconfig-07401b"].partition("..")[0]
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {
        **json.loads(base64.urlsafe_b64decode(real_header + "==")), "kid": "abcdef"}
    payload = base64.urlsafe_b64encode(info.body["data"]["kubeconfig"].encode()).rstrip(b"=")
    mac = hmac.new(b"0123456789abcdef", header.encode() + b"." + payload, hashlib.sha256)
    assert base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode() == signature
    # An expired token: refused, its Secret cleaned up and its signature gone.
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert call(api, "POST", secrets_path, _bootstrap_secret("zzzzzz", "0123456789abcdef",
                                                             past), token=admin).code == 201
    api.sync_controllers()
    assert call(api, "GET", "/api/v1/nodes/x", token="zzzzzz.0123456789abcdef").code == 401
    assert call(api, "GET", f"{secrets_path}/bootstrap-token-zzzzzz", token=admin).code == 404
    info = call(api, "GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
    assert isinstance(info.body, dict)
    assert "jws-kubeconfig-zzzzzz" not in info.body["data"]
    assert call(api, "GET", "/api/v1/nodes/x", token="abcdef.wrongwrongwrong1").code == 401


def test_ready_turns_unknown_when_the_kubelet_stops(state: tuple[Path, str]) -> None:
    api = ApiServer(Config(state[0], ADDRESS, node_grace_s=5))
    old = (datetime.now(UTC) - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    call(api, "POST", "/api/v1/nodes", node("quiet", status={"conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": old}]}), token=state[1])
    api.sync_controllers()
    got = call(api, "GET", "/api/v1/nodes/quiet", token=state[1])
    assert isinstance(got.body, dict)
    ready = got.body["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")


def test_every_request_is_audited_without_bodies(api: ApiServer, admin: str,
                                                state: tuple[Path, str]) -> None:
    call(api, "POST", "/api/v1/nodes", node("a"), token=admin)
    call(api, "PATCH", "/api/v1/nodes/a", {"metadata": {"labels": {"secret-ish": "v"}}},
         token=admin, ctype="application/merge-patch+json")
    events = [json.loads(line) for line in (state[0] / "audit.log").read_text().splitlines()]
    assert [(e["verb"], e["objectRef"]["name"], e["responseStatus"]["code"])
            for e in events] == [("create", "a", 201), ("patch", "a", 200)]
    assert events[1]["user"]["username"] == "kubernetes-admin"
    assert events[1]["kind"] == "Event" and events[1]["apiVersion"] == "audit.k8s.io/v1"
    text = (state[0] / "audit.log").read_text()
    assert "secret-ish" not in text and admin not in text
