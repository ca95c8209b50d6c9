"""Real clients against the API server stand-in over HTTPS: the official Python ``kubernetes``
client and a real ``kubectl`` (the machine's, or Debian's kubernetes-client that `make setup`
installs where there is none). What works for them here is what the gate and an SRE use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from tests.apiserver_helpers import StandIn, core_api, running_standin


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("clients"), 11) as running:
        yield running


def kubectl(standin: StandIn, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("no kubectl on PATH: `make setup` installs Debian's kubernetes-client")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "KUBECONFIG": str(standin.kubeconfig)}
    return subprocess.run([binary, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_python_client(standin: StandIn) -> None:
    api = core_api(standin)
    created = api.create_node({"metadata": {"name": "py1", "labels": {"pool": "h100"}}})
    assert created.metadata.uid and created.metadata.resource_version
    api.create_node({"metadata": {"name": "py2", "labels": {"pool": "l40s"}}})
    names = [n.metadata.name for n in api.list_node(label_selector="pool in (h100)").items]
    assert names == ["py1"]
    assert [n.metadata.name for n in api.list_node(
        field_selector="metadata.name=py2").items] == ["py2"]
    merged = api.patch_node("py1", {"metadata": {"labels": {"a": "1"}}},
                            _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"pool": "h100", "a": "1"}
    strategic = api.patch_node("py1", {"spec": {"taints": [
        {"key": "gpu.example.com/validation", "value": "pending", "effect": "NoSchedule"}]}},
        _content_type="application/strategic-merge-patch+json")
    assert strategic.spec.taints[0].key == "gpu.example.com/validation"
    # The client's default for a list body is a JSON patch.
    jsonpatch = api.patch_node("py1", [{"op": "remove", "path": "/metadata/labels/a"}])
    assert "a" not in jsonpatch.metadata.labels
    with pytest.raises(ApiException) as stale:
        api.patch_node("py1", {"metadata": {"resourceVersion": created.metadata.resource_version,
                                            "labels": {"b": "2"}}},
                       _content_type="application/merge-patch+json")
    assert stale.value.status == 409
    assert json.loads(stale.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as missing:
        api.read_node("nope")
    assert missing.value.status == 404
    status = api.delete_node("py2")
    # This client version returns the Status as a dict (its delete response type is Object).
    assert status["status"] == "Success" and status["details"]["name"] == "py2"


def test_real_kubectl(standin: StandIn, tmp_path: Path) -> None:
    version = kubectl(standin, "version", home=tmp_path)
    assert version.returncode == 0, version.stderr
    assert "Server Version: v1.30.5+gpuready-lab-simulated" in version.stdout
    body = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "kc1", "labels": {"tier": "kubectl"}}})
    path = tmp_path / "node.json"
    path.write_text(body)
    created = kubectl(standin, "create", "--validate=false", "-f", str(path), home=tmp_path)
    assert created.returncode == 0, created.stderr
    labelled = kubectl(standin, "label", "node", "kc1", "gpu.example.com/validation=passed",
                       home=tmp_path)
    assert labelled.returncode == 0, labelled.stderr
    assert labelled.stdout.strip() == "node/kc1 labeled"
    tainted = kubectl(standin, "taint", "node", "kc1", "dedicated=gpu:NoSchedule",
                      home=tmp_path)
    assert tainted.returncode == 0, tainted.stderr
    shown = kubectl(standin, "get", "nodes", "--show-labels", home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "LABELS"]
    assert row.split()[0] == "kc1"
    assert "gpu.example.com/validation=passed" in row and "tier=kubectl" in row
    selected = kubectl(standin, "get", "nodes", "-l", "tier=kubectl,!missing", "-o", "name",
                       home=tmp_path)
    assert selected.stdout.split() == ["node/kc1"]
    others = kubectl(standin, "get", "nodes", "-l", "tier notin (kubectl)", "-o", "name",
                     home=tmp_path)
    assert others.returncode == 0 and "node/kc1" not in others.stdout.split()
    taints = kubectl(standin, "get", "node", "kc1", "-o", "jsonpath={.spec.taints}",
                     home=tmp_path)
    assert json.loads(taints.stdout) == [{"effect": "NoSchedule", "key": "dedicated",
                                          "value": "gpu"}]
    untainted = kubectl(standin, "taint", "node", "kc1", "dedicated-", home=tmp_path)
    assert untainted.returncode == 0, untainted.stderr
    bad = kubectl(standin, "label", "node", "kc1", "--overwrite", "pool=not valid",
                  home=tmp_path)
    assert bad.returncode != 0
    patches = [e["userAgent"].split("/")[0] for e in standin.audit()
               if e["verb"] == "patch" and e.get("objectRef", {}).get("name") == "kc1"]
    assert patches == ["kubectl"] * 3  # label, taint, untaint (the bad label never left kubectl)
