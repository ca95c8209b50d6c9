"""Real Kubernetes in the lab (issue 29, phase A): the control plane built from source and set
up by the real kubeadm in cp1, and the real `kubeadm join` of a real kubelet on a Debian 12 and
a Debian 13 host, on containerd 2 (Docker's containerd.io as the lab serves it: containerd and
runc built from their sources, lab/runtime) on each; Pods bound to those nodes run the lab's
locally built image (lab/kube/images.py, no registry), turn Ready, and the real API server's
eviction honours a PodDisruptionBudget over them (issue 33). Issue 40: containerd 2 answers the
kubelet's RuntimeConfig call, so neither kubeadm's preflight nor the kubelet warns that the
runtime is losing support, and the kubelet exports no ``kubelet_cri_losing_support`` series.

The nodes are made by hand here (containerd.io from the lab repository, Debian's CNI plugins,
the built kubelet and kubeadm with the pkgs.k8s.io packages' unit and drop-in), apart from the
roles, which have their own tests. What the lab itself must give a host for a kubelet
(lab/kube/node.py) and the join settings a shared network namespace needs (each kubelet on its
own address; preflight checks of the machine's kernel skipped) are the lab's.
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from lab import controlplane, core, hosts, supervisor
from lab.core import LabState
from lab.fleet import LabHost
from lab.kube import build, cluster, images
from lab.paths import REPO_ROOT, LabPaths
from tests.lab import kube_pods
from tests.lab.conftest import (
    CONTAINERD_IO,
    assert_host_cgroups,
    lab_cli,
    lab_docker_source,
    running_lab,
)

PACKAGING = REPO_ROOT / "tests/fixtures/kube-packaging"
VERSION = build.read_go_mod().kubernetes_version
JOIN_CONFIG = "/etc/kubernetes/gpuready-lab/join.yaml"
PATCHES = "/etc/kubernetes/gpuready-lab/patches"
# This machine's kernel, seen from a lab host: cgroup v1 (the kubelet runs with failCgroupV1:
# false, uploaded by the lab's cluster); net.ipv4.ip_forward=0 in a read-only /proc/sys;
# port 10250 taken by another host's kubelet in the shared network namespace (each kubelet
# listens on its own address only).
LAB_PREFLIGHT_SKIPS = ["SystemVerification", "FileContent--proc-sys-net-ipv4-ip_forward",
                       "Port-10250"]
CNI_CONFIG = {
    "cniVersion": "1.0.0", "name": "gpuready-lab",
    "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}},
                {"type": "portmap", "capabilities": {"portMappings": True}}],
}


@pytest.fixture(scope="module")
def kube() -> Iterator[LabState]:
    with running_lab(fleet="kube") as state:
        yield state


@pytest.fixture(scope="module")
def nodes(kube: LabState) -> LabState:
    """Both GPU hosts with containerd and the Kubernetes packages, not joined yet."""
    paths = LabPaths.default()
    for host in kube.hosts:
        if host.kind != "control-plane":
            prepare_node(paths, host, kube.repo_port)
    return kube


def run(paths: LabPaths, host: str, argv: list[str], timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    return hosts.host_exec(paths, host, argv, timeout=timeout)


def ok(paths: LabPaths, host: str, argv: list[str], timeout: float = 300) -> str:
    proc = run(paths, host, argv, timeout)
    assert proc.returncode == 0, f"{host}: {argv}: {proc.stderr or proc.stdout}"
    return proc.stdout


def kubectl(paths: LabPaths, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build.bin_dir() / "kubectl"), "--kubeconfig",
                           str(controlplane.admin_kubeconfig(paths)), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def ca_pin(paths: LabPaths) -> str:
    cert = x509.load_pem_x509_certificate(cluster.ca_file(paths).read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def prepare_node(paths: LabPaths, host: LabHost, port: int) -> None:
    """What the roles do: containerd 2 (systemd cgroup driver) and the Kubernetes packages."""
    root = paths.host_dir(host.name) / "merged"
    version = CONTAINERD_IO[host.os][1]
    ok(paths, host.name, ["sh", "-c", lab_docker_source(port, host.os)
                          + "DEBIAN_FRONTEND=noninteractive apt-get update -qq && "
                          "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                          f"containerd.io={version} containernetworking-plugins >/dev/null"])
    for binary in ("kubelet", "kubeadm"):
        ok(paths, host.name, ["install", "-m", "0755", f"{cluster.BIN_IN_HOST}/{binary}",
                              f"/usr/bin/{binary}"])
    units = root / "usr/lib/systemd/system"
    (units / "kubelet.service.d").mkdir(parents=True, exist_ok=True)
    (units / "kubelet.service").write_text((PACKAGING / "kubelet.service").read_text())
    (units / "kubelet.service.d/10-kubeadm.conf").write_text(
        (PACKAGING / "10-kubeadm.conf").read_text().replace("/etc/sysconfig/kubelet",
                                                            "/etc/default/kubelet"))
    (root / "etc/default/kubelet").write_text((PACKAGING / "kubelet.env").read_text())
    for directory in ("var/lib/kubelet", "etc/kubernetes/manifests", PATCHES.lstrip("/"),
                      "etc/cni/net.d", "etc/containerd"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    # containerd.io's own config.toml disables the CRI plugin: write the default (version 3)
    # with the systemd cgroup driver and Debian's CNI plugins, as the containerd role does.
    ok(paths, host.name, ["sh", "-c", "containerd config default | sed -e "
                          "'s/SystemdCgroup = false/SystemdCgroup = true/' -e "
                          "\"s#'/opt/cni/bin'#'/usr/lib/cni'#\" > /etc/containerd/config.toml"])
    (root / "etc/cni/net.d/10-gpuready-lab.conflist").write_text(json.dumps(CNI_CONFIG))
    ok(paths, host.name, ["systemctl", "daemon-reload"])
    ok(paths, host.name, ["systemctl", "restart", "containerd"])
    ok(paths, host.name, ["systemctl", "enable", "kubelet"])


def write_join_config(paths: LabPaths, host: LabHost, cp: LabHost, token: str, pin: str) -> None:
    root = paths.host_dir(host.name) / "merged"
    config = {
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": f"{cp.address}:{cluster.API_PORT}",
                                         "token": token, "caCertHashes": [pin]}},
        "nodeRegistration": {"name": host.name,
                             "criSocket": "unix:///run/containerd/containerd.sock",
                             "ignorePreflightErrors": LAB_PREFLIGHT_SKIPS},
        "patches": {"directory": PATCHES},
        "timeouts": {"discovery": "30s", "tlsBootstrap": "60s"},
    }
    (root / JOIN_CONFIG.lstrip("/")).write_text(yaml.safe_dump(config))
    # Every kubelet in the lab shares this machine's network namespace: each listens on its
    # own address (kubeadm then waits for the healthz address it is given).
    (root / PATCHES.lstrip("/") / "kubeletconfiguration+merge.yaml").write_text(
        yaml.safe_dump({"address": host.address, "healthzBindAddress": host.address}))


def node_json(paths: LabPaths, name: str) -> dict[str, Any]:
    proc = kubectl(paths, "get", "node", name, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def wait_ready(paths: LabPaths, name: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    conditions: dict[str, str] = {}
    while time.monotonic() < deadline:
        proc = kubectl(paths, "get", "node", name, "-o", "json")
        if proc.returncode == 0:
            node: dict[str, Any] = json.loads(proc.stdout)
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return node
        time.sleep(1)
    journal = run(paths, name, ["journalctl", "-u", "kubelet", "--no-pager", "-n", "30"]).stdout
    raise AssertionError(f"{name} not Ready in {timeout:.0f} s ({conditions}):\n{journal}")


def test_control_plane_is_real_kubernetes_made_by_kubeadm(kube: LabState) -> None:
    paths = LabPaths.default()
    proc = kubectl(paths, "get", "--raw", "/version")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gitVersion"] == VERSION
    assert ok(paths, "cp1", ["kubeadm", "version", "-o", "short"]).strip() == VERSION
    # kubeadm's objects: the kubeadm and kubelet configuration, discovery's cluster-info
    # (readable without credentials, as `kubeadm join` reads it) and the bootstrap RBAC.
    assert kubectl(paths, "-n", "kube-system", "get", "configmap", "kubeadm-config",
                   "kubelet-config").returncode == 0
    kubelet_config = yaml.safe_load(json.loads(kubectl(
        paths, "-n", "kube-system", "get", "configmap", "kubelet-config", "-o", "json").stdout
    )["data"]["kubelet"])
    assert kubelet_config["failCgroupV1"] is False
    assert kubelet_config["cgroupDriver"] == "systemd"  # kubeadm's default
    bindings = kubectl(paths, "get", "clusterrolebinding", "-o", "name").stdout.split()
    for name in ("kubeadm:kubelet-bootstrap", "kubeadm:node-autoapprove-bootstrap",
                 "kubeadm:node-autoapprove-certificate-rotation", "kubeadm:get-nodes",
                 "kubeadm:cluster-admins"):
        assert f"clusterrolebinding.rbac.authorization.k8s.io/{name}" in bindings
    cp = kube.host("cp1")
    context = ssl.create_default_context(cafile=str(cluster.ca_file(paths)))
    with urllib.request.urlopen(f"https://{cp.address}:{cluster.API_PORT}/api/v1/namespaces/"
                                "kube-public/configmaps/cluster-info", context=context) as resp:
        info = json.loads(resp.read())
    assert f"server: https://{cp.address}:{cluster.API_PORT}" in info["data"]["kubeconfig"]
    status = lab_cli("status")
    assert f"kube-apiserver {VERSION} built from source" in status.stdout
    assert "running" in status.stdout


def test_a_wrong_ca_pin_is_refused_and_leaves_no_kubelet_conf(nodes: LabState) -> None:
    paths = LabPaths.default()
    node, cp = nodes.host("node2"), nodes.host("cp1")
    token = ok(paths, "cp1", ["kubeadm", "token", "create", "--ttl", "10m"]).strip()
    write_join_config(paths, node, cp, token, "sha256:" + "0" * 64)
    proc = run(paths, node.name, ["kubeadm", "join", "--config", JOIN_CONFIG], timeout=120)
    assert proc.returncode != 0
    assert f'none of the public keys "{ca_pin(paths)}" are pinned' in proc.stderr
    assert run(paths, node.name, ["test", "-e", "/etc/kubernetes/kubelet.conf"]).returncode == 1


@pytest.mark.parametrize(("name", "containerd"), [("node1", "containerd://2.2.9"),
                                                  ("node2", "containerd://2.2.9")])
def test_real_kubeadm_join_makes_a_ready_node(nodes: LabState, name: str,
                                              containerd: str, tmp_path: Path) -> None:
    paths = LabPaths.default()
    host, cp = nodes.host(name), nodes.host("cp1")
    token = ok(paths, "cp1", ["kubeadm", "token", "create", "--ttl", "10m"]).strip()
    write_join_config(paths, host, cp, token, ca_pin(paths))
    started = time.monotonic()
    proc = run(paths, name, ["kubeadm", "join", "--config", JOIN_CONFIG], timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "This node has joined the cluster" in proc.stdout
    # kubeadm's ContainerRuntimeVersion preflight check is clean on containerd 2.
    assert "RuntimeConfig" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    node = wait_ready(paths, name)
    print(f"{name}: joined and Ready in {time.monotonic() - started:.1f} s")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == VERSION
    assert info["containerRuntimeVersion"] == containerd
    # containerd 2 answers RuntimeConfig: no fallback, no warning, no losing-support series.
    journal = run(paths, name, ["journalctl", "-u", "kubelet", "--no-pager", "-o", "cat"]).stdout
    assert "RuntimeConfig" not in journal and "losing support" not in journal.lower(), journal
    host = next(h for h in nodes.hosts if h.name == name)
    metrics = kube_pods.kubelet_metrics(controlplane.admin_kubeconfig(paths), host.address,
                                        tmp_path)
    assert f'kubelet_node_name{{node="{name}"}} 1' in metrics, metrics[:2000]
    assert "kubelet_cri_losing_support" not in metrics
    # The kubelet's client certificate: its CSR was approved by kube-controller-manager's
    # csrapproving controller, through kubeadm's auto-approve binding.
    csrs = json.loads(kubectl(paths, "get", "csr", "-o", "json").stdout)["items"]
    mine = [c for c in csrs if c["spec"]["username"] == f"system:bootstrap:{token[:6]}"]
    assert mine, [c["spec"]["username"] for c in csrs]
    approved = [cond for c in mine for cond in c["status"].get("conditions", [])
                if cond["type"] == "Approved"]
    assert approved and approved[0]["reason"] == "AutoApproved"
    # The kubelet's cgroups are the host's own, below its cgroup on this machine.
    tag = supervisor.cgroup_tag(paths.host_dir(name), name)
    assert Path(f"/sys/fs/cgroup/cpu/gpuready-lab/{tag}/kubepods.slice").is_dir()
    assert not Path("/sys/fs/cgroup/cpu/kubepods.slice").exists()
    # NodeRestriction and the Node authorizer hold the kubelet to its own Node.
    as_kubelet = ["kubectl", "--kubeconfig", "/etc/kubernetes/kubelet.conf"]
    ok(paths, name, ["install", "-m", "0755", f"{cluster.BIN_IN_HOST}/kubectl",
                     "/usr/bin/kubectl"])
    refused = run(paths, name, [*as_kubelet, "label", "node", name,
                                "node-restriction.kubernetes.io/gpu=ok"])
    assert refused.returncode != 0
    assert "is not allowed to modify labels: node-restriction.kubernetes.io/gpu" in refused.stderr
    other = run(paths, name, [*as_kubelet, "get", "node", "cp1"])
    assert "can only read" in other.stderr or "only its own Node object" in other.stderr


def test_the_device_plugin_registers_with_the_real_kubelet_on_both_releases(
        nodes: LabState) -> None:
    """The SIMULATED NVIDIA device plugin (lab/sim/device_plugin.py, with Debian 12's and
    Debian 13's python3-grpcio and python3-protobuf) registers with each joined kubelet once
    the simulated driver is loaded, and the kubelet's device manager puts one nvidia.com/gpu
    per simulated GPU into the Node's capacity and allocatable."""
    paths = LabPaths.default()
    for name in ("node1", "node2"):
        # No roles run here: load the simulated driver as gpuready-lab-modules.service does at
        # boot once a driver is installed.
        ok(paths, name, ["sh", "-c", "mkdir -p /run/gpuready-lab && "
                         "echo 550.90.07 > /run/gpuready-lab/nvidia-module-version"])
    for name in ("node1", "node2"):
        gpus = str(len(json.loads((paths.host_dir(name) / "hw/hardware.json").read_text())
                       ["gpus"]))
        deadline = time.monotonic() + 120
        seen: tuple[str | None, str | None] = (None, None)
        while seen != (gpus, gpus):
            if time.monotonic() > deadline:
                journal = run(paths, name, ["journalctl", "--no-pager", "-n", "30", "-u",
                                            "gpuready-lab-device-plugin.service"]).stdout
                raise AssertionError(f"{name}: nvidia.com/gpu {seen}, not {gpus}:\n{journal}")
            status = node_json(paths, name)["status"]
            seen = (status["capacity"].get("nvidia.com/gpu"),
                    status["allocatable"].get("nvidia.com/gpu"))
            time.sleep(2)
        journal = run(paths, name, ["journalctl", "--no-pager", "-o", "cat", "-u",
                                    "gpuready-lab-device-plugin.service"]).stdout
        assert "SIMULATED" in journal
        assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in journal


def test_pods_run_ready_and_a_pdb_lets_the_real_api_server_evict_one_at_a_time(
        nodes: LabState, tmp_path: Path) -> None:
    """Issue 33's ground: on each joined node the lab's image (Debian's busybox-static, built on
    this machine, imported as the Pod image and as containerd's sandbox image: no registry) runs
    a Pod that turns Ready through its readiness probe; the real kube-controller-manager's
    disruption controller gives a PodDisruptionBudget with minAvailable N-1 over the N Pods
    one allowed disruption; the real API server accepts one eviction and refuses the next with
    429 while the first Pod is gone and nothing replaces it."""
    paths = LabPaths.default()
    admin = controlplane.admin_kubeconfig(paths)
    archive = images.ensure_archive(paths)
    names = sorted(h.name for h in nodes.hosts if h.kind != "control-plane")
    sandboxes = {}
    for name in names:
        started = time.monotonic()
        loaded = images.load(paths, name)
        print(f"{name}: {loaded} imported in {time.monotonic() - started:.1f} s")
        assert loaded[0] == images.IMAGE
        sandboxes[name] = loaded[1]
    # Both run containerd.io 2.2.9, whose default names pause 3.10.1 (1.6 named 3.6, 1.7 3.8).
    assert sandboxes == {"node1": "registry.k8s.io/pause:3.10.1",
                         "node2": "registry.k8s.io/pause:3.10.1"}
    pods = {name: f"sleep-{name}" for name in names}
    started = time.monotonic()
    try:
        for node, pod in pods.items():
            kube_pods.apply(admin, kube_pods.sleep_pod(pod, node))
        for pod in pods.values():
            kube_pods.wait_ready(admin, pod, archive.image_id)
        print(f"{len(pods)} Pods Ready in {time.monotonic() - started:.1f} s")

        kube_pods.apply(admin, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "gpuready-sleep", "namespace": "default"},
            "spec": {"minAvailable": len(pods) - 1,
                     "selector": {"matchLabels": kube_pods.LABEL}}})

        def budget() -> dict[str, Any] | None:
            proc = kubectl(paths, "get", "pdb", "gpuready-sleep", "-o", "json")
            status: dict[str, Any] = json.loads(proc.stdout).get("status", {})
            return status if status.get("currentHealthy") == len(pods) else None

        status = kube_pods.wait_for("PDB status from the disruption controller", budget)
        assert status["disruptionsAllowed"] == 1, status
        assert status["desiredHealthy"] == len(pods) - 1, status

        first, second = pods[names[0]], pods[names[1]]
        code, body = kube_pods.evict(admin, cluster.ca_file(paths), tmp_path, first)
        assert code == 201, body
        kube_pods.wait_for(f"{first} gone",
                           lambda: "NotFound" in kubectl(paths, "get", "pod", first).stderr,
                           timeout=60)
        code, body = kube_pods.evict(admin, cluster.ca_file(paths), tmp_path, second)
        assert code == 429, body
        assert body["reason"] == "TooManyRequests", body
        assert "disruption budget" in body["message"], body
        assert kube_pods.ready_pod(admin, second) is not None  # refused: still there, Ready
        left = json.loads(kubectl(paths, "get", "pods", "-l", "app=gpuready-sleep", "-o",
                                  "json").stdout)["items"]
        assert [p["metadata"]["name"] for p in left] == [second]  # nothing replaced the first
    finally:
        kubectl(paths, "delete", "pdb", "gpuready-sleep", "--ignore-not-found")
        kubectl(paths, "delete", "pod", *pods.values(), "--ignore-not-found", "--wait=false")


def test_down_stops_the_cluster_and_leaves_nothing(nodes: LabState) -> None:
    """Last: `lab down` halts the hosts and with them etcd, the API server and the kubelets;
    no process, mount or cgroup of theirs (the kubelets' kubepods included) remains."""
    paths = LabPaths.default()
    cgroups = assert_host_cgroups(paths, nodes)
    started = time.monotonic()
    core.down(paths)
    print(f"lab down: {time.monotonic() - started:.1f} s")
    assert core.host_processes(paths) == []
    assert hosts.lab_mounts(paths) == []
    assert not any(c.exists() for c in cgroups)
    cp = nodes.host("cp1")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((cp.address, cluster.API_PORT), timeout=5).close()
