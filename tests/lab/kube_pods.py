"""Pods on lab nodes (issue 33): bound to a node by ``spec.nodeName``, or a Deployment's, placed
by the lab's real kube-scheduler; running the lab's locally built image (lab/kube/images.py, no
registry), on the host's network (lab/kube/node.py says why); and the Eviction API, called as
the admin kubeconfig's user so a test sees the API server's own HTTP status."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lab.kube import build, images

LABEL = {"app": "gpuready-sleep"}


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build.bin_dir() / "kubectl"), "--kubeconfig", str(kubeconfig),
                           *args], input=stdin, capture_output=True, text=True, timeout=60,
                          check=False)


def sleep_pod(name: str, node: str, namespace: str = "default") -> dict[str, Any]:
    """A Pod bound to ``node`` running the lab's image, Ready once its exec probe passes. On the
    host's network: the lab's CNI bridge cannot make a Pod network namespace (its loopback
    plugin needs CAP_NET_ADMIN on this machine's network, which a host lacks)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(LABEL)},
        "spec": {"nodeName": node, "hostNetwork": True, "automountServiceAccountToken": False,
                 "containers": [{"name": "sleep", "image": images.IMAGE,
                                 "imagePullPolicy": "Never",
                                 "readinessProbe": {"exec": {"command": ["true"]},
                                                    "periodSeconds": 2}}]},
    }


def spread_deployment(name: str, replicas: int, namespace: str = "default") -> dict[str, Any]:
    """A Deployment of the lab's image with at most one Pod per node (required anti-affinity on
    the hostname), as a training job's workers are spread: the replacement for a Pod evicted
    from a cordoned node waits Pending until a node without one takes Pods again."""
    labels = {"app": name}
    template = sleep_pod(name, "", namespace)
    spec = template["spec"]
    del spec["nodeName"]
    spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}]}}
    spec["terminationGracePeriodSeconds"] = 5
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }


def disruption_budget(name: str, max_unavailable: int, namespace: str = "default"
                      ) -> dict[str, Any]:
    """A PodDisruptionBudget over the Deployment ``name``'s Pods."""
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"maxUnavailable": max_unavailable,
                 "selector": {"matchLabels": {"app": name}}},
    }


def ready_pods(kubeconfig: Path, app: str, namespace: str = "default") -> dict[str, str]:
    """{Pod name: its node} of the app's Pods whose Ready condition is True."""
    proc = kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l", f"app={app}", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    out: dict[str, str] = {}
    for pod in json.loads(proc.stdout)["items"]:
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
            out[pod["metadata"]["name"]] = pod["spec"]["nodeName"]
    return out


def apply(kubeconfig: Path, doc: dict[str, Any]) -> None:
    proc = kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(doc))
    assert proc.returncode == 0, proc.stderr


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"not {what} in {timeout:.0f} s")


def ready_pod(kubeconfig: Path, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """The Pod if its Ready condition is True, else None."""
    proc = kubectl(kubeconfig, "-n", namespace, "get", "pod", name, "-o", "json")
    if proc.returncode != 0:
        return None
    pod: dict[str, Any] = json.loads(proc.stdout)
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return pod if conditions.get("Ready") == "True" else None


def wait_ready(kubeconfig: Path, name: str, image_id: str, timeout: float = 120
               ) -> dict[str, Any]:
    """Until the Pod is Ready; its container must be running the image ``image_id``."""
    pod: dict[str, Any] = wait_for(f"{name} Ready", lambda: ready_pod(kubeconfig, name),
                                   timeout)
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and "running" in status["state"], status
    assert status["imageID"] == image_id, status  # the lab's image, not another
    return pod


def evict(kubeconfig: Path, ca_file: Path, tmp: Path, name: str, namespace: str = "default"
          ) -> tuple[int, dict[str, Any]]:
    """POST pods/<name>/eviction as the kubeconfig's user; (HTTP status, body)."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = ssl.create_default_context(cafile=str(ca_file))
    context.load_cert_chain(str(_client_pem(config, tmp / "client.pem")))
    server = config["clusters"][0]["cluster"]["server"]
    body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": namespace}}).encode()
    request = urllib.request.Request(
        f"{server}/api/v1/namespaces/{namespace}/pods/{name}/eviction", data=body,
        method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def kubelet_metrics(kubeconfig: Path, address: str, tmp: Path) -> str:
    """GET the kubelet's /metrics on its own address as the kubeconfig's user (the kubelet
    authenticates the client certificate against the cluster CA and asks the API server's
    authorizer). Not through the API server's node proxy: a lab node's InternalIP is this
    machine's own address (the kubelet refuses a loopback --node-ip), where no kubelet
    listens. The kubelet's serving certificate is self-signed: not verified here."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(_client_pem(config, tmp / "kubelet-client.pem")))
    with urllib.request.urlopen(f"https://{address}:10250/metrics", context=context,
                                timeout=30) as response:
        return response.read().decode()


def _client_pem(config: dict[str, Any], pem: Path) -> Path:
    """The kubeconfig's first user's client certificate and key, in one PEM file (0600)."""
    user = config["users"][0]["user"]
    pem.write_bytes(base64.b64decode(user["client-certificate-data"])
                    + base64.b64decode(user["client-key-data"]))
    pem.chmod(0o600)
    return pem
