"""A real etcd and kube-apiserver (the ones lab.kube.build made) as processes on this machine,
on one loopback address: no lab host, no kubelet, no root. The unit tests of the gate and of
drift's labels layer (tests/kube_helpers.py) and bench/gate.py talk to it.

The certificates are the real kubeadm's (``kubeadm init phase certs all``: the cluster CA, the
API server's serving certificate with the address as a SAN, etcd's CA and certificates, the
service account keys). The command lines are ours, not kubeadm's manifests (those are written
to /etc/kubernetes/manifests, which is this machine's, not a test's), and carry what the gate
meets on a real cluster: TLS only, ``--authorization-mode=Node,RBAC``, NodeRestriction, and an
audit log of every request for Nodes (watches aside), which the tests count as an auditor
would. Clients authenticate with a static token (``--token-auth-file``) in ``system:masters``,
so a test can refuse them by changing one string.

Differences from a production API server, on purpose: etcd does not fsync (the data dies with
the test), the ``kubernetes`` Service's endpoint is not reconciled (kube-apiserver refuses a
loopback advertise address for it), no controller manager runs (Nodes are created and edited by
the tests, never marked NotReady).

Opt-in (``controllers``): the real kube-controller-manager with only the named controllers, e.g.
``resourcequota`` (a ResourceQuota's status and the quota admission depend on it), ``namespace``
(a deleted Namespace is emptied and goes) and ``serviceaccount``/``serviceaccount-token`` (every
namespace gets its ``default`` ServiceAccount, which Pod admission needs). It runs as kubeadm
runs it (``--use-service-account-credentials``: each controller with its own bootstrap RBAC
role), authenticated by a static token as ``system:kube-controller-manager``; no serving port.
The default (none) keeps the start as fast as it was.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.errors import LabError
from lab.kube import build
from lab.kube.cluster import SERVICE_SUBNET

API_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
START_TIMEOUT_S = 60.0
ADMIN_USER = "gpuready-test-admin"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# Every request for Nodes but watches: no kubelet runs here, so reads are the clients' own and
# a test or benchmark can count the gate's list as well as its patches.
AUDIT_POLICY_DOC = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "resources": [{"group": "", "resources": ["nodes"]}],
               "verbs": ["get", "list", "create", "update", "patch", "delete"]},
              {"level": "None"}],
}


def kubeconfig(server_url: str, ca_pem: bytes, token: str) -> str:
    """An admin kubeconfig with a bearer token."""
    import base64  # noqa: PLC0415

    ca = base64.b64encode(ca_pem).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "gpuready-test", "cluster": {
            "certificate-authority-data": ca, "server": server_url}}],
        "contexts": [{"name": "admin@gpuready-test",
                      "context": {"cluster": "gpuready-test", "user": ADMIN_USER}}],
        "current-context": "admin@gpuready-test",
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
    }, sort_keys=False)


def make_ca(cert_dir: Path) -> Path:
    """A cluster CA of its own (the real kubeadm's), e.g. another cluster's for a test that a
    certificate does not verify; its ca.crt."""
    bin_dir = build.ensure_built(log=False)
    _run([str(bin_dir / "kubeadm"), "init", "phase", "certs", "ca", "--cert-dir", str(cert_dir)],
         "kubeadm init phase certs ca")
    return cert_dir / "ca.crt"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise LabError(f"{what} failed (exit {proc.returncode}): "
                       + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:]))


@dataclass
class LocalApiServer:
    """One real control plane (etcd + kube-apiserver) in ``root``, listening on ``address``."""

    address: str
    root: Path
    token: str = ""
    # kube-controller-manager's controllers (--controllers); empty: it does not run.
    controllers: tuple[str, ...] = ()
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://{self.address}:{API_PORT}"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.conf"

    @property
    def controller_manager_kubeconfig(self) -> Path:
        return self.root / "controller-manager.conf"

    @property
    def ca_pem(self) -> bytes:
        return (self.pki / "ca.crt").read_bytes()

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.log"

    def audit(self) -> list[dict[str, Any]]:
        """The audit events written so far (audit.k8s.io/v1 Event, one JSON object a line)."""
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def prepare(self) -> None:
        """Certificates, token file, audit policy and admin kubeconfig (once per root)."""
        if self.kubeconfig.exists():
            self.token = self.kubeconfig_token()
            self._prepare_controller_manager()
            return
        self.root.mkdir(parents=True, exist_ok=True)
        bin_dir = build.ensure_built(log=False)
        version = build.read_go_mod().kubernetes_version
        config = self.root / "kubeadm.yaml"
        # kubeadm will not advertise a loopback address (lab.kube.cluster.kubeadm_config says
        # why): it picks this machine's, and the address the tests use is a SAN of its own.
        config.write_text("---\n" + "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in (
            {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
             "localAPIEndpoint": {"bindPort": API_PORT}},
            {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
             "kubernetesVersion": version, "certificatesDir": str(self.pki),
             "controlPlaneEndpoint": f"{self.address}:{API_PORT}",
             "networking": {"serviceSubnet": SERVICE_SUBNET},
             "apiServer": {"certSANs": [self.address]},
             "etcd": {"local": {"serverCertSANs": [self.address]}}})))
        _run([str(bin_dir / "kubeadm"), "init", "phase", "certs", "all", "--config", str(config)],
             "kubeadm init phase certs all")
        self.token = secrets.token_hex(24)
        tokens = self.root / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        (self.root / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY_DOC))
        self.kubeconfig.write_text(kubeconfig(self.url, self.ca_pem, self.token))
        self.kubeconfig.chmod(0o600)
        self._prepare_controller_manager()

    def _prepare_controller_manager(self) -> None:
        """kube-controller-manager's token (a row of the static token file, read by the API
        server when it starts) and kubeconfig, once, when it is asked for."""
        if not self.controllers or self.controller_manager_kubeconfig.exists():
            return
        token = secrets.token_hex(24)
        tokens = self.root / "tokens.csv"
        with tokens.open("a") as out:
            out.write(f"{token},{CONTROLLER_MANAGER_USER},{CONTROLLER_MANAGER_USER}\n")
        doc = yaml.safe_load(kubeconfig(self.url, self.ca_pem, token))
        self.controller_manager_kubeconfig.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.controller_manager_kubeconfig.chmod(0o600)

    def kubeconfig_token(self) -> str:
        doc = yaml.safe_load(self.kubeconfig.read_text())
        return str(doc["users"][0]["user"]["token"])

    def _argv(self) -> dict[str, list[str]]:
        bin_dir = build.ensure_built(log=False)
        a, pki = self.address, self.pki
        etcd_url = f"https://{a}:{ETCD_CLIENT_PORT}"
        peer_url = f"http://{a}:{ETCD_PEER_PORT}"
        argv = {
            "etcd": [
                str(bin_dir / "etcd"), "--name", "gpuready-test",
                "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"gpuready-test={peer_url}",
                "--cert-file", str(pki / "etcd/server.crt"),
                "--key-file", str(pki / "etcd/server.key"),
                "--trusted-ca-file", str(pki / "etcd/ca.crt"), "--client-cert-auth",
                "--unsafe-no-fsync"],
            "kube-apiserver": [
                str(bin_dir / "kube-apiserver"),
                f"--bind-address={a}", f"--secure-port={API_PORT}",
                f"--etcd-servers={etcd_url}",
                f"--etcd-cafile={pki / 'etcd/ca.crt'}",
                f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={self.root / 'tokens.csv'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_SUBNET}",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                # As kubeadm's manifest sets it: a privileged pod is Pod Security's to refuse.
                "--allow-privileged=true",
                f"--audit-policy-file={self.root / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--endpoint-reconciler-type=none"],
        }
        if self.controllers:
            argv["kube-controller-manager"] = [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.controller_manager_kubeconfig}",
                f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--leader-elect=false", "--secure-port=0",
                # Quota is recomputed from the objects at once, not only on the resync.
                "--concurrent-resource-quota-syncs=2"]
        return argv

    def start(self) -> None:
        """Start etcd, then the API server; return once /readyz says ok."""
        self.prepare()
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            for name, argv in self._argv().items():
                if name == "kube-controller-manager":
                    # It gives up on an API server that does not answer within seconds.
                    self.wait_ready(deadline)
                log = (self.root / f"{name}.log").open("ab")
                self.procs.append((name, subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True)))
            self.wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, deadline: float) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise LabError(f"{name} exited ({proc.returncode}) while starting: "
                                   + self.log_tail(name))
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context,
                                            timeout=5) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise LabError(f"kube-apiserver at {self.url} not ready in time ({last}): "
                       + self.log_tail("kube-apiserver"))

    def log_tail(self, name: str, lines: int = 3) -> str:
        try:
            text = (self.root / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the API server, then etcd (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


@contextlib.contextmanager
def running(root: Path, address: str,
            controllers: tuple[str, ...] = ()) -> Iterator[LocalApiServer]:
    """A control plane for the length of a ``with``; stopped however it ends. ``controllers``:
    kube-controller-manager's, when it should run too (module docstring)."""
    server = LocalApiServer(address, root, controllers=controllers)
    server.start()
    try:
        yield server
    finally:
        server.stop()
