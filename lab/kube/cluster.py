"""The lab's real Kubernetes control plane, made by the real kubeadm inside the control-plane host.

A control-plane lab host (a ``control_plane:`` entry in the fleet file)
gets the built binaries (lab.kube.build) bind-mounted read-only at ``/opt/gpuready-lab/kube/bin``
and linked where packages would put them. Once it has booted, ``init`` runs kubeadm's own
``init`` phases in it, as ``kubeadm init`` would, minus what needs a kubelet or images:

- ``certs all``, ``kubeconfig admin|super-admin|controller-manager|scheduler``: the PKI and
  kubeconfigs in ``/etc/kubernetes``;
- ``etcd local``, ``control-plane apiserver|controller-manager|scheduler``: kubeadm's static Pod
  manifests, which the lab runs as systemd units (no kubelet, no images on the control plane:
  the unit runs the manifest's own command line, so every flag, ``--authorization-mode=Node,RBAC``
  and ``--enable-admission-plugins=NodeRestriction`` among them, is kubeadm's);
- ``upload-config all``: the kubeadm-config and kubelet-config ConfigMaps (and, through the
  first client kubeadm makes, the admin kubeconfig's ClusterRoleBinding);
- ``bootstrap-token``: a token, the cluster-info ConfigMap and the bootstrap RBAC, so that
  discovery, node CSR auto-approval (kube-controller-manager's csrapproving) and certificate
  rotation are Kubernetes' own.

Skipped: ``preflight`` (it checks for a kubelet and a container runtime the control plane host
does not run), ``kubelet-start``/``wait-control-plane``/``kubelet-finalize`` (no kubelet),
``mark-control-plane`` (it labels the host's Node, which does not exist without a kubelet),
``addon`` (CoreDNS and kube-proxy need images). The controller manager runs kubeadm's
``--controllers=*,bootstrapsigner,tokencleaner``: the disruption controller among them keeps
PodDisruptionBudgets' status, which the API server's eviction reads, and the ReplicaSet
controller replaces an evicted Pod; kube-scheduler binds the replacement to a node that takes it
(not a cordoned one), as in any cluster.

Every lab host shares this machine's network namespace, so everything listens on the control
plane host's own loopback address, never on 127.0.0.1 or all addresses (kubeadm's defaults for
etcd, the API server and the controller manager): the ClusterConfiguration says so through
``extraArgs``.
"""

from __future__ import annotations

import base64
import json
import shlex
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab import hosts as hosts_mod
from lab.errors import LabError
from lab.fleet import LabHost
from lab.paths import LabPaths

API_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381
CLUSTER_NAME = "gpuready-lab"
POD_SUBNET = "10.244.0.0/16"
SERVICE_SUBNET = "10.96.0.0/12"

BIN_IN_HOST = "/opt/gpuready-lab/kube/bin"
KUBEADM_CONFIG = "/etc/kubernetes/gpuready-lab/kubeadm.yaml"
# The API server's audit log: writes to Node objects (not their status, which kubelets send
# every few seconds), so tests can count who patched a Node, as an auditor would.
AUDIT_POLICY = "/etc/kubernetes/gpuready-lab/audit-policy.yaml"
AUDIT_LOG = "/var/log/kubernetes/audit.log"
AUDIT_POLICY_DOC = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "resources": [{"group": "", "resources": ["nodes"]}],
               "verbs": ["create", "update", "patch", "delete"]},
              {"level": "None"}],
}
MANIFESTS = "/etc/kubernetes/manifests"
SUPER_ADMIN = "/etc/kubernetes/super-admin.conf"
CONTROLLER_MANAGER_CONF = "/etc/kubernetes/controller-manager.conf"
SCHEDULER_CONF = "/etc/kubernetes/scheduler.conf"
ADMINS = "kubeadm:cluster-admins"  # admin.conf's group, kubeadm's name for its binding
# Where the binaries appear in the host: kubeadm and kubectl where their packages put them, the
# control plane's own binaries (images, in a kubeadm cluster) in /usr/local/bin.
LINKS = {
    "usr/bin/kubeadm": "kubeadm",
    "usr/bin/kubectl": "kubectl",
    "usr/local/bin/etcd": "etcd",
    "usr/local/bin/kube-apiserver": "kube-apiserver",
    "usr/local/bin/kube-controller-manager": "kube-controller-manager",
    "usr/local/bin/kube-scheduler": "kube-scheduler",
}


@dataclass(frozen=True)
class Component:
    """A control-plane component: its kubeadm manifest and the unit the lab runs it as."""

    name: str  # manifest /etc/kubernetes/manifests/<name>.yaml, unit <name>.service
    description: str
    after: str = ""


COMPONENTS = (
    Component("etcd", "etcd for the Kubernetes control plane"),
    Component("kube-apiserver", "Kubernetes API server", after="etcd.service"),
    Component("kube-controller-manager", "Kubernetes controller manager",
              after="kube-apiserver.service"),
    Component("kube-scheduler", "Kubernetes scheduler", after="kube-apiserver.service"),
)

START_TIMEOUT_S = 90.0


def kubeadm_config(cp: LabHost, version: str) -> str:
    """kubeadm's InitConfiguration, ClusterConfiguration and the cluster's KubeletConfiguration.

    kubeadm will not advertise a loopback address: it reads one as "the global unicast address
    on the lo interface" (SetAPIEndpointDynamicDefaults), and the lab's hosts have only their
    127.x addresses. So the InitConfiguration leaves localAPIEndpoint.advertiseAddress to
    kubeadm (it picks this machine's default-route address, as on any host, and puts it in the
    certificates), and every listening and advertised address is set to the control-plane
    host's own through ``controlPlaneEndpoint``, the certificates' extra SANs and ``extraArgs``
    (which replace kubeadm's value of the same flag). The API server keeps kubeadm's
    ``--advertise-address`` (the ``kubernetes`` Service's endpoint, for in-cluster clients, of
    which the lab has none): kube-apiserver refuses a loopback one ("cannot use public IP
    127.0.5.x with endpoint reconciler ... may not be in the loopback range").
    """
    addr = cp.address
    etcd_client = f"https://{addr}:{ETCD_CLIENT_PORT}"
    etcd_peer = f"https://{addr}:{ETCD_PEER_PORT}"
    init = {
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
        "localAPIEndpoint": {"bindPort": API_PORT},
        "nodeRegistration": {"name": cp.name},
    }
    cluster = {
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
        # Always given: without it kubeadm asks dl.k8s.io for the latest release.
        "kubernetesVersion": version,
        "clusterName": CLUSTER_NAME,
        "controlPlaneEndpoint": f"{addr}:{API_PORT}",
        "networking": {"podSubnet": POD_SUBNET, "serviceSubnet": SERVICE_SUBNET},
        "apiServer": {
            "certSANs": [addr, cp.name],
            "extraArgs": [
                {"name": "bind-address", "value": addr},
                {"name": "etcd-servers", "value": etcd_client},
                {"name": "audit-policy-file", "value": AUDIT_POLICY},
                {"name": "audit-log-path", "value": AUDIT_LOG},
                # No kube-proxy routes a Service's ClusterIP here: webhooks and aggregated APIs
                # (Kueue's) are reached through their Service's endpoints instead.
                {"name": "enable-aggregator-routing", "value": "true"},
                # A Pod's log and exec go to the kubelet at the Node's hostname, which the
                # control-plane host's /etc/hosts maps to the kubelet's own loopback address;
                # its InternalIP is this machine's default-route address, where no kubelet
                # listens (lab.controlplane.provision).
                {"name": "kubelet-preferred-address-types",
                 "value": "Hostname,InternalIP,InternalDNS,ExternalDNS,ExternalIP"},
            ],
        },
        "controllerManager": {"extraArgs": [{"name": "bind-address", "value": addr}]},
        "scheduler": {"extraArgs": [{"name": "bind-address", "value": addr}]},
        "etcd": {"local": {
            "serverCertSANs": [addr],
            "peerCertSANs": [addr],
            "extraArgs": [
                {"name": "listen-client-urls", "value": etcd_client},
                {"name": "advertise-client-urls", "value": etcd_client},
                {"name": "listen-peer-urls", "value": etcd_peer},
                {"name": "initial-advertise-peer-urls", "value": etcd_peer},
                {"name": "initial-cluster", "value": f"{cp.name}={etcd_peer}"},
                {"name": "listen-metrics-urls", "value": f"http://{addr}:{ETCD_METRICS_PORT}"},
            ],
        }},
    }
    # Uploaded as the cluster's kubelet-config ConfigMap, which joining kubelets take. This
    # machine's kernel has cgroup v1 controllers only (an empty cgroup2 hierarchy), which the
    # kubelet refuses since 1.35 unless told otherwise (CHANGELOG-1.35 "ACTION REQUIRED").
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False,
    }
    return "---\n" + "---\n".join(yaml.safe_dump(doc, sort_keys=False)
                                   for doc in (init, cluster, kubelet))


def nspawn_args(bin_dir: Path) -> list[str]:
    return [f"--bind-ro={bin_dir}:{BIN_IN_HOST}"]


def provision(root: Path, cp: LabHost, version: str) -> None:
    """Before first boot: the binaries' links and kubeadm's configuration."""
    for link, name in LINKS.items():
        path = root / link
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(f"{BIN_IN_HOST}/{name}")
    config = root / KUBEADM_CONFIG.lstrip("/")
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(kubeadm_config(cp, version))
    (root / AUDIT_POLICY.lstrip("/")).write_text(yaml.safe_dump(AUDIT_POLICY_DOC, sort_keys=False))
    (root / AUDIT_LOG.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)


def _systemd_quote(arg: str) -> str:
    """One ExecStart argument: specifiers and variables escaped, quoted when needed."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if any(c in arg for c in " \t\"'\\;"):
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg


def unit_from_manifest(component: Component, manifest: dict[str, Any]) -> str:
    """A systemd unit running the static Pod manifest's command line."""
    containers = manifest.get("spec", {}).get("containers") or []
    if len(containers) != 1 or not containers[0].get("command"):
        raise LabError(f"kubeadm's {component.name} manifest has no single container command")
    command = [str(c) for c in containers[0]["command"]]
    # The image's binary, by name in the manifest; here the built one under /usr/local/bin.
    command[0] = f"/usr/local/bin/{Path(command[0]).name}"
    # Ordered after, not wanting, the component it needs: every unit is enabled, and a Wants=
    # made each restart of the controller manager (it exits when it loses the API server)
    # start the API server again, cancelling a `systemctl stop kube-apiserver` in progress
    # ("Job for kube-apiserver.service canceled").
    after = f"After={component.after}\n" if component.after else ""
    return (
        "# Written by the gpuready lab from kubeadm's static Pod manifest\n"
        f"# {MANIFESTS}/{component.name}.yaml (no kubelet runs on the lab's control plane).\n"
        "[Unit]\n"
        f"Description={component.description} (kubeadm's manifest, run by the gpuready lab)\n"
        f"{after}"
        "\n[Service]\n"
        "ExecStart=" + " ".join(_systemd_quote(a) for a in command) + "\n"
        "Restart=always\nRestartSec=2\n"
        "\n[Install]\nWantedBy=multi-user.target\n"
    )


def _exec(paths: LabPaths, cp: LabHost, argv: list[str], what: str,
          timeout: float = 120.0) -> str:
    proc = hosts_mod.host_exec(paths, cp.name, argv, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise LabError(f"{cp.name}: {what} failed (exit {proc.returncode}): "
                       + " | ".join(tail))
    return proc.stdout


def _kubeadm(paths: LabPaths, cp: LabHost, *phase: str, kubeconfig: str = "") -> str:
    flags = ["--kubeconfig", kubeconfig] if kubeconfig else []
    return _exec(paths, cp, ["kubeadm", "init", "phase", *phase, "--config", KUBEADM_CONFIG,
                             *flags], f"kubeadm init phase {' '.join(phase)}")


def audit_log(paths: LabPaths, cp: LabHost) -> Path:
    """The API server's audit log, seen from this machine (while its host runs)."""
    return paths.host_dir(cp.name) / "merged" / AUDIT_LOG.lstrip("/")


def admin_kubeconfig(paths: LabPaths) -> Path:
    return paths.run / "kube" / "admin.conf"


def ca_file(paths: LabPaths) -> Path:
    return paths.run / "kube" / "ca.crt"


def wait_ready(paths: LabPaths, cp: LabHost, deadline: float) -> None:
    """Until the API server's /readyz says ok (anonymous, as kubeadm's own wait does)."""
    context = ssl.create_default_context(cafile=str(ca_file(paths)))
    url = f"https://{cp.address}:{API_PORT}/readyz"
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, context=context, timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise LabError(f"{cp.name}: kube-apiserver not ready at {url} in time ({last}); see "
                   f"`python -m lab login {cp.name}` and `journalctl -u kube-apiserver`")


def init(paths: LabPaths, cp: LabHost, deadline: float) -> dict[str, float]:
    """Make the cluster in the booted control-plane host; the seconds each step took."""
    times: dict[str, float] = {}
    t0 = time.monotonic()
    _kubeadm(paths, cp, "certs", "all")
    for kubeconfig in ("admin", "super-admin", "controller-manager", "scheduler"):
        _kubeadm(paths, cp, "kubeconfig", kubeconfig)
    # kubeadm points the controller manager and the scheduler at localAPIEndpoint (its chosen
    # address, see kubeadm_config), not at controlPlaneEndpoint: point them at the host's own.
    for conf in (CONTROLLER_MANAGER_CONF, SCHEDULER_CONF):
        _exec(paths, cp, ["kubectl", "--kubeconfig", conf, "config", "set-cluster", CLUSTER_NAME,
                          f"--server=https://{cp.address}:{API_PORT}"],
              f"pointing {Path(conf).name} at the control-plane host")
    _kubeadm(paths, cp, "etcd", "local")
    for part in ("apiserver", "controller-manager", "scheduler"):
        _kubeadm(paths, cp, "control-plane", part)
    times["kubeadm_files_s"] = time.monotonic() - t0

    root = paths.host_dir(cp.name) / "merged"
    units = root / "etc/systemd/system"
    for component in COMPONENTS:
        manifest = yaml.safe_load((root / MANIFESTS.lstrip("/") / f"{component.name}.yaml")
                                  .read_text())
        (units / f"{component.name}.service").write_text(unit_from_manifest(component, manifest))
    kube = admin_kubeconfig(paths).parent
    kube.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_file(paths).write_bytes((root / "etc/kubernetes/pki/ca.crt").read_bytes())
    t1 = time.monotonic()
    _exec(paths, cp, ["systemctl", "daemon-reload"], "systemctl daemon-reload")
    _exec(paths, cp, ["systemctl", "enable", "--now", *(f"{c.name}.service" for c in COMPONENTS)],
          "starting the control plane units")
    wait_ready(paths, cp, deadline)
    times["apiserver_ready_s"] = time.monotonic() - t1

    t2 = time.monotonic()
    # With its default --kubeconfig, kubeadm's first client grants admin.conf's group
    # (kubeadm:cluster-admins) cluster-admin, dialling the API server at localAPIEndpoint: the
    # machine's address kubeadm chose, where the lab's API server does not listen. So these
    # phases use super-admin.conf (its server is controlPlaneEndpoint), and the lab makes that
    # one ClusterRoleBinding as kubeadm's EnsureAdminClusterRoleBindingImpl does.
    _kubeadm(paths, cp, "upload-config", "all", kubeconfig=SUPER_ADMIN)
    _kubeadm(paths, cp, "bootstrap-token", kubeconfig=SUPER_ADMIN)
    _exec(paths, cp, ["kubectl", "--kubeconfig", SUPER_ADMIN, "create", "clusterrolebinding",
                      ADMINS, "--clusterrole=cluster-admin", f"--group={ADMINS}"],
          f"granting {ADMINS} cluster-admin")
    times["kubeadm_cluster_objects_s"] = time.monotonic() - t2
    t3 = time.monotonic()
    device_plugin_access(paths, cp)
    times["device_plugin_access_s"] = time.monotonic() - t3
    admin = root / "etc/kubernetes/admin.conf"
    target = admin_kubeconfig(paths)
    target.write_bytes(admin.read_bytes())
    target.chmod(0o600)
    (kube / "init-times.json").write_text(json.dumps({k: round(v, 2) for k, v in times.items()})
                                          + "\n")
    return times


# The SIMULATED device plugin's access to the cluster (lab/sim/device_plugin.py): under the GPU
# Operator the real plugin's config-manager reads its Node's nvidia.com/device-plugin.config
# label with the plugin's service account and gets the operator's ConfigMap as a volume, and
# the operator hands it the ClusterPolicy's devicePlugin.config. The lab's plugin runs on the
# host, not in a Pod, so one service account stands in for all of that: it may read Nodes, the
# ClusterPolicies and ConfigMaps, nothing else, with a token the lab writes on each kubelet host.
DEVICE_PLUGIN_ACCOUNT = "gpuready-lab-device-plugin"
DEVICE_PLUGIN_ACCESS = "/etc/gpuready-lab/device-plugin/kubeconfig"
DEVICE_PLUGIN_RBAC = "/etc/gpuready-lab/device-plugin-rbac.yaml"


def device_plugin_rbac() -> list[dict[str, Any]]:
    name = f"gpuready-lab:{DEVICE_PLUGIN_ACCOUNT}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": DEVICE_PLUGIN_ACCOUNT, "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
                   {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"],
                    "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": DEVICE_PLUGIN_ACCOUNT,
                       "namespace": "kube-system"}]},
    ]


def device_plugin_access(paths: LabPaths, cp: LabHost) -> None:
    """The device plugin's service account, its rights and a token (ten years: the lab's
    clusters live for a test), as the kubeconfig the kubelet hosts get
    (:func:`write_device_plugin_access`), kept in the lab's run directory."""
    root = paths.host_dir(cp.name) / "merged"
    manifest = root / DEVICE_PLUGIN_RBAC.lstrip("/")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(yaml.safe_dump_all(device_plugin_rbac(), sort_keys=False))
    _exec(paths, cp, ["kubectl", "--kubeconfig", SUPER_ADMIN, "apply", "-f", DEVICE_PLUGIN_RBAC],
          "the device plugin's service account")
    token = _exec(paths, cp, ["kubectl", "--kubeconfig", SUPER_ADMIN, "-n", "kube-system",
                              "create", "token", DEVICE_PLUGIN_ACCOUNT, "--duration=87600h"],
                  "the device plugin's token").strip()
    ca = base64.b64encode((root / "etc/kubernetes/pki/ca.crt").read_bytes()).decode()
    text = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {
            "server": f"https://{cp.address}:{API_PORT}", "certificate-authority-data": ca}}],
        "users": [{"name": DEVICE_PLUGIN_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": DEVICE_PLUGIN_ACCOUNT, "context": {
            "cluster": CLUSTER_NAME, "user": DEVICE_PLUGIN_ACCOUNT}}],
        "current-context": DEVICE_PLUGIN_ACCOUNT}, sort_keys=False, width=1 << 16)
    (paths.run / "kube").mkdir(mode=0o700, parents=True, exist_ok=True)
    access = paths.run / "kube" / "device-plugin.conf"
    access.write_text(text)
    access.chmod(0o600)


def write_device_plugin_access(paths: LabPaths, host: LabHost) -> None:
    """The device plugin's kubeconfig on a kubelet host (what ``init`` made), 0600."""
    source = paths.run / "kube" / "device-plugin.conf"
    target = paths.host_dir(host.name) / "merged" / DEVICE_PLUGIN_ACCESS.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    target.chmod(0o600)


def is_active(paths: LabPaths, cp: LabHost, component: str = "kube-apiserver") -> bool:
    try:
        proc = hosts_mod.host_exec(paths, cp.name, ["systemctl", "is-active", "--quiet",
                                                     f"{component}.service"], timeout=10)
    except (LabError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def systemctl(paths: LabPaths, cp: LabHost, verb: str, component: str) -> None:
    _exec(paths, cp, ["systemctl", verb, f"{component}.service"],
          f"systemctl {verb} {shlex.quote(component)}")
