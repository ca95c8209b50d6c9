"""Kueue in the lab, installed as its release installs it, its manager running on the control plane.

Kueue's release manifest (``manifests.yaml``) is ``kustomize build config/default`` of its source
with the image set; the lab builds the same from the release's own ``config/`` (the module the
manager is built from: lab/kueue/build.py) with the built kubectl's kustomize, so the CRDs, the
RBAC, the ServiceAccount, the webhook configurations, the visibility APIService and the
manager's configuration are the release's, and applies them with ``kubectl apply
--server-side``. What the lab changes, each for a reason the lab has:

- **The manager runs as a systemd unit on the control-plane host** (``kueue-controller-manager``,
  like the lab's control-plane components: no image can be pulled, and the control-plane host
  runs no kubelet), with the Deployment's own arguments, as the release's ServiceAccount (a
  kubeconfig with a token the API server issues for it: RBAC is the release's) and the release's
  configuration file. The Deployment is not applied: nothing could run its image.
- **Its Services have no selector, and an EndpointSlice naming the manager** (``kueue-webhook-
  service`` -> :9443, ``kueue-visibility-server`` -> :8082): without kube-proxy a Service's
  ClusterIP routes nowhere, so the API server reaches the webhooks and the visibility API through
  the Service's endpoints (``--enable-aggregator-routing``, lab/kube/cluster.py), and checks the
  webhook's certificate against the Service's DNS name as on any cluster. The API server refuses
  endpoint addresses in 127.0.0.0/8 (every lab address), so the slice names the manager by an
  FQDN (``MANAGER_FQDN``) that the control-plane host's /etc/hosts maps to its address. Kueue's
  own certificate management makes the webhook's certificate and puts its CA into the webhook
  configurations, as in its release; the lab copies the certificate from its Secret into the
  directory the manager reads, as the kubelet does for the Deployment's Secret volume.
- **The configuration binds to the control-plane host's address** (webhook, health probes,
  metrics, visibility: every lab host shares this machine's network namespace), names the
  leader election's namespace (a Pod's manager reads it from its ServiceAccount mount), reads
  its webhook certificate from ``CERT_DIR``, and takes what
  docs/cluster.md tells sites to set (``resources.excludeResourcePrefixes`` for cpu and memory).

``install(paths, state)`` does it on a running lab with a control plane and waits until the
manager is ready and its webhooks answer: a Job with a queue name is created suspended, a Job
without one is left alone (tests/lab/test_cluster.py).
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from lab import controlplane
from lab import hosts as hosts_mod
from lab.core import LabState
from lab.errors import LabError
from lab.fleet import LabHost
from lab.kube import build as kube_build
from lab.kube import cluster
from lab.kueue import build
from lab.paths import LabPaths

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
DEPLOYMENT = "kueue-controller-manager"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
UNIT = "kueue-controller-manager"
IN_HOST = "/etc/kueue"
BINARY = "/usr/local/bin/kueue"
# Service -> the port on the control-plane host its targetPort names.
SERVICES = {"kueue-webhook-service": 9443, "kueue-visibility-server": 8082}
# The manager's name in its Services' EndpointSlices (module docstring).
MANAGER_FQDN = "kueue-manager.gpuready-lab.internal"
CERT_SECRET = "kueue-webhook-server-cert"
CERT_DIR = f"{IN_HOST}/serving-certs"
HEALTH_PORT = 8081
METRICS_PORT = 8443
# docs/cluster.md: the ClusterQueues count GPUs only; CPU and memory are the namespaces' quota.
EXCLUDED_RESOURCE_PREFIXES = ["cpu", "memory"]
TOKEN_DURATION = "48h"
READY_TIMEOUT_S = 120.0


def release_documents(kubectl: Path) -> list[dict[str, Any]]:
    """``kustomize build config/default`` of the release's source: its manifest, bar the image."""
    source = build.source_dir() / "config" / "default"
    proc = subprocess.run([str(kubectl), "kustomize", str(source)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"kubectl kustomize {source}: {proc.stderr.strip()[-500:]}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _named(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc.get("kind") == kind and doc.get("metadata", {}).get("name") == name:
            return doc
    raise LabError(f"Kueue's release manifest has no {kind} {name}")


def manager_args(docs: list[dict[str, Any]]) -> list[str]:
    """The Deployment's manager command line, with the configuration file where the lab puts
    it (the Deployment mounts the ConfigMap at /controller_manager_config.yaml)."""
    deployment = _named(docs, "Deployment", DEPLOYMENT)
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "manager")
    args = [a for a in container.get("args", []) if not a.startswith("--config=")]
    # --kubeconfig, not only $KUBECONFIG: the visibility server's delegated authentication
    # reads the flag, and without it looks for a Pod's in-cluster credentials.
    return [*args, f"--config={IN_HOST}/{CONFIG_KEY}", f"--kubeconfig={IN_HOST}/kubeconfig"]


def configuration(docs: list[dict[str, Any]], address: str) -> dict[str, Any]:
    """The release's manager configuration with the lab's addresses and docs/cluster.md's
    settings (module docstring)."""
    config: dict[str, Any] = yaml.safe_load(
        _named(docs, "ConfigMap", CONFIG_MAP)["data"][CONFIG_KEY])
    config["webhook"] = {**config.get("webhook", {}), "host": address, "certDir": CERT_DIR}
    # In a Pod the manager finds its namespace in the ServiceAccount's mount; here it is told.
    config["leaderElection"] = {**config.get("leaderElection", {}),
                                "resourceNamespace": NAMESPACE}
    config["health"] = {**config.get("health", {}),
                        "healthProbeBindAddress": f"{address}:{HEALTH_PORT}"}
    config["metrics"] = {**config.get("metrics", {}), "bindAddress": f"{address}:{METRICS_PORT}"}
    config["visibilityServer"] = {"bindAddress": address,
                                  "bindPort": SERVICES["kueue-visibility-server"]}
    config["resources"] = {**config.get("resources", {}),
                           "excludeResourcePrefixes": EXCLUDED_RESOURCE_PREFIXES}
    return config


def for_lab(docs: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
    """What the lab applies: the release's objects but the Deployment, its Services without a
    selector, an EndpointSlice for each naming the manager, and the ConfigMap holding the
    configuration the manager runs with."""
    out = []
    for original in docs:
        kind, name = original.get("kind"), original.get("metadata", {}).get("name")
        if kind == "Deployment" and name == DEPLOYMENT:
            continue
        doc: dict[str, Any] = json.loads(json.dumps(original))
        if kind == "Service" and name in SERVICES:
            doc["spec"].pop("selector", None)
            port = doc["spec"]["ports"][0]
            out.append(doc)
            out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"name": f"{name}-lab", "namespace": NAMESPACE,
                                     "labels": {**doc["metadata"].get("labels", {}),
                                                "kubernetes.io/service-name": name,
                                                "endpointslice.kubernetes.io/managed-by":
                                                    "gpuready-lab"}},
                        "addressType": "FQDN",
                        "endpoints": [{"addresses": [MANAGER_FQDN],
                                       "conditions": {"ready": True}}],
                        "ports": [{"name": port.get("name", ""), "port": SERVICES[name],
                                   "protocol": "TCP"}]})
            continue
        if kind == "ConfigMap" and name == CONFIG_MAP:
            doc["data"][CONFIG_KEY] = yaml.safe_dump(configuration(docs, address),
                                                     sort_keys=False)
        out.append(doc)
    return out


def _kubectl(paths: LabPaths, *args: str, stdin: str | None = None,
             timeout: float = 120) -> str:
    argv = [str(kube_build.bin_dir() / "kubectl"), "--kubeconfig",
            str(controlplane.admin_kubeconfig(paths)), *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise LabError(f"kubectl {shlex.join(args)}: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc.stdout


def _kubeconfig(paths: LabPaths, cp: LabHost, token: str) -> str:
    ca = base64.b64encode(cluster.ca_file(paths).read_bytes()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kueue",
        "clusters": [{"name": cluster.CLUSTER_NAME, "cluster": {
            "server": f"https://{cp.address}:{cluster.API_PORT}",
            "certificate-authority-data": ca}}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "kueue", "context": {"cluster": cluster.CLUSTER_NAME,
                                                   "user": SERVICE_ACCOUNT,
                                                   "namespace": NAMESPACE}}]})


def unit(args: list[str]) -> str:
    return (
        "[Unit]\n"
        "Description=Kueue controller manager (the release's, built from source by the gpuready "
        "lab; lab/kueue)\n"
        "After=kube-apiserver.service\n\n"
        "[Service]\n"
        f"Environment=KUBECONFIG={IN_HOST}/kubeconfig\n"
        f"ExecStart={BINARY} {' '.join(shlex.quote(a) for a in args)}\n"
        "Restart=always\nRestartSec=2\n\n"
        "[Install]\nWantedBy=multi-user.target\n")


def install(paths: LabPaths, state: LabState, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Install Kueue on the running lab's cluster (module docstring); the seconds it took."""
    started = time.monotonic()
    cp = controlplane.control_plane(state.hosts)
    if cp is None:
        raise LabError("Kueue needs a lab with a control plane (a fleet with control_plane:)")
    kubectl = kube_build.bin_dir() / "kubectl"
    docs = release_documents(kubectl)
    applied = for_lab(docs, cp.address)
    root = paths.host_dir(cp.name) / "merged"
    # The manager's name resolves before anything names it (the API server's resolver keeps
    # /etc/hosts for a few seconds once read).
    hosts_file = root / "etc/hosts"
    if MANAGER_FQDN not in hosts_file.read_text():
        with hosts_file.open("a") as f:
            f.write(f"{cp.address}\t{MANAGER_FQDN}\n")
    _kubectl(paths, "apply", "--server-side", "--force-conflicts", "-f", "-",
             stdin="---\n".join(yaml.safe_dump(d, sort_keys=False) for d in applied))
    token = _kubectl(paths, "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                     f"--duration={TOKEN_DURATION}").strip()
    etc = root / IN_HOST.lstrip("/")
    (etc / "serving-certs").mkdir(parents=True, exist_ok=True)
    (etc / "kubeconfig").write_text(_kubeconfig(paths, cp, token))
    (etc / "kubeconfig").chmod(0o600)
    (etc / CONFIG_KEY).write_text(yaml.safe_dump(configuration(docs, cp.address),
                                                 sort_keys=False))
    binary = build.KUEUE.ensure_built(log=False) / "kueue"
    # Beside, then renamed over: a manager already running keeps its binary open.
    staged = root / (BINARY.lstrip("/") + ".new")
    staged.write_bytes(binary.read_bytes())
    staged.chmod(0o755)
    staged.replace(root / BINARY.lstrip("/"))
    (root / f"etc/systemd/system/{UNIT}.service").write_text(unit(manager_args(docs)))
    for argv in (["systemctl", "daemon-reload"], ["systemctl", "enable", UNIT],
                 ["systemctl", "restart", UNIT]):
        proc = hosts_mod.host_exec(paths, cp.name, argv)
        if proc.returncode != 0:
            raise LabError(f"{cp.name}: {shlex.join(argv)}: {proc.stderr.strip()}")
    deadline = time.monotonic() + timeout_s
    mount_certificate(paths, cp, etc / "serving-certs", deadline)
    wait_ready(paths, cp, deadline)
    return time.monotonic() - started


def mount_certificate(paths: LabPaths, cp: LabHost, directory: Path, deadline: float) -> None:
    """What the kubelet does for the Deployment's Secret volume: the webhook certificate that
    Kueue's certificate management wrote into its Secret, as files where the manager waits for
    them (``webhook.certDir``)."""
    last = "no Secret yet"
    while time.monotonic() < deadline:
        try:
            secret = json.loads(_kubectl(paths, "get", "secret", CERT_SECRET, "-n", NAMESPACE,
                                         "-o", "json"))
        except LabError as exc:
            last = str(exc)
        else:
            data = secret.get("data") or {}
            if data.get("tls.crt") and data.get("tls.key"):
                for key in ("ca.crt", "tls.crt", "tls.key"):
                    if data.get(key):
                        target = directory / key
                        target.write_bytes(base64.b64decode(data[key]))
                        target.chmod(0o600)
                return
            last = f"Secret {CERT_SECRET} has no tls.crt/tls.key yet"
        time.sleep(1)
    raise LabError(f"Kueue's manager made no webhook certificate in time ({last}):\n"
                   + _journal(paths, cp))


def _journal(paths: LabPaths, cp: LabHost) -> str:
    return hosts_mod.host_exec(paths, cp.name, ["journalctl", "-u", UNIT, "--no-pager", "-n",
                                                "30", "-o", "cat"]).stdout


def wait_ready(paths: LabPaths, cp: LabHost, deadline: float) -> None:
    """Until the manager answers its readiness probe, its webhooks carry their CA, and the API
    server reaches them: a queued Job, created as a server-side dry run, comes back suspended
    (Kueue's mutating webhook did it)."""
    url = f"http://{cp.address}:{HEALTH_PORT}/readyz"
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200 and _webhooks_have_ca(paths):
                    if _webhook_suspends(paths):
                        return
                    last = "a queued Job came back unsuspended"
                else:
                    last = f"readyz {answer.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        except LabError as exc:  # the API server could not call the webhook (yet)
            last = str(exc)
        time.sleep(1)
    raise LabError(f"Kueue's manager was not ready in time ({last}):\n" + _journal(paths, cp))


# A Job as a team would submit one (a queue name; the namespace is outside the webhooks'
# exclusions), created only as a server-side dry run: nothing is stored.
PROBE_JOB = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "gpuready-lab-kueue-probe", "namespace": "default",
                 "labels": {"kueue.x-k8s.io/queue-name": "gpuready-lab-probe"}},
    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "probe", "image": "gpuready.lab/none", "command": ["true"]}]}}},
}


def _webhook_suspends(paths: LabPaths) -> bool:
    created = json.loads(_kubectl(paths, "create", "--dry-run=server", "-o", "json", "-f", "-",
                                  stdin=json.dumps(PROBE_JOB), timeout=30))
    return bool(created.get("spec", {}).get("suspend"))


def _webhooks_have_ca(paths: LabPaths) -> bool:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        doc = json.loads(_kubectl(paths, "get", kind, f"kueue-{kind.split('webhook')[0]}"
                                  "-webhook-configuration", "-o", "json"))
        if not all(w.get("clientConfig", {}).get("caBundle") for w in doc.get("webhooks", [])):
            return False
    return True
