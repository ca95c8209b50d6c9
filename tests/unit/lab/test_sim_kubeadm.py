"""The lab's kubeadm and kubelet simulators (lab/sim/k8s.py, lab/sim/daemons.py) against the API
server stand-in over HTTPS, as a node joins: discovery with the CA pin, TLS bootstrap,
registration with the JoinConfiguration's labels and taints, kubelet.conf only on success; the
failures a join meets (wrong pin, expired token, unreachable API, a refusal); reset; and the
kubelet's status and GPU Feature Discovery labels, compared with real GPU Nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.hardware import render_host, write_faults, write_hardware
from lab.paths import REPO_ROOT
from lab.sim.kubeclient import kubeconfig_text
from tests.apiserver_helpers import StandIn, core_api, running_standin, standin_address

SIM = REPO_ROOT / "lab" / "sim"
TAINT = {"key": "gpu.node-restriction.kubernetes.io/validation", "value": "pending",
         "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    root = tmp_path_factory.mktemp("kubeadm")
    faults = root / "hosts"
    with running_standin(root, 12, faults_dir=faults) as standin:
        yield standin


def run(tool: str, root: Path, *args: str, hw: Path | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "GPUREADY_SIM_TOOL": tool,
           "GPUREADY_SIM_VERSION": "1.30.5", "GPUREADY_LAB_ROOT": str(root)}
    if hw is not None:
        env.update(GPUREADY_LAB_HW=str(hw / "hw"), GPUREADY_LAB_RUN=str(hw / "run"))
    script = "daemons.py" if tool == "kubelet" else "k8s.py"
    return subprocess.run([sys.executable, str(SIM / script), *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


def control_plane(cluster: StandIn, tmp: Path) -> Path:
    root = tmp / "cp"
    (root / "etc/kubernetes").mkdir(parents=True)
    (root / "etc/kubernetes/admin.conf").write_text(kubeconfig_text(
        cluster.url, cluster.ca_pem, "kubernetes-admin", token=cluster.token))
    return root


def new_token(cluster: StandIn, tmp: Path, ttl: str = "15m") -> tuple[str, str]:
    made = run("kubeadm", control_plane(cluster, tmp), "token", "create", "--ttl", ttl,
               "--print-join-command")
    assert made.returncode == 0, made.stderr
    words = made.stdout.split()
    return words[words.index("--token") + 1], words[
        words.index("--discovery-token-ca-cert-hash") + 1]


def join_config(tmp: Path, cluster: StandIn, name: str, token: str, pin: str,
                endpoint: str | None = None, timeout: str = "30s") -> Path:
    doc = {"apiVersion": "kubeadm.k8s.io/v1beta3", "kind": "JoinConfiguration",
           "discovery": {"bootstrapToken": {
               "apiServerEndpoint": endpoint or f"{cluster.address}:6443", "token": token,
               "caCertHashes": [pin]}, "timeout": timeout},
           "nodeRegistration": {"name": name, "taints": [TAINT], "kubeletExtraArgs": {
               "node-labels": "gpu.example.com/pool=h100"}}}
    path = tmp / f"{name}-join.json"
    path.write_text("# JoinConfiguration\n" + json.dumps(doc, indent=2))
    return path


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_join_registers_the_node_tainted_and_writes_kubelet_conf_last(
        cluster: StandIn, tmp_path: Path) -> None:
    token, pin = new_token(cluster, tmp_path)
    node_root = tmp_path / "w1"
    joined = run("kubeadm", node_root, "join", "--config",
                 str(join_config(tmp_path, cluster, "w1", token, pin)))
    assert joined.returncode == 0, joined.stderr
    assert "This node has joined the cluster" in joined.stdout
    assert token not in joined.stdout + joined.stderr
    assert token.split(".")[1] not in joined.stdout + joined.stderr
    assert {"etc/kubernetes/kubelet.conf", "etc/kubernetes/pki/ca.crt",
            "var/lib/kubelet/config.yaml", "var/lib/kubelet/kubeadm-flags.env",
            "var/lib/kubelet/pki/kubelet-client-current.pem"} <= files(node_root)
    assert oct((node_root / "etc/kubernetes/kubelet.conf").stat().st_mode & 0o777) == "0o600"
    node = core_api(cluster).read_node("w1")
    assert node.metadata.labels["gpu.example.com/pool"] == "h100"
    assert node.metadata.labels["kubernetes.io/hostname"] == "w1"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        (TAINT["key"], TAINT["value"], TAINT["effect"])]
    # The kubelet's identity is a client certificate the cluster CA signed via a CSR.
    csrs = [e for e in cluster.audit() if e.get("objectRef", {}).get(
        "resource") == "certificatesigningrequests" and e["verb"] == "create"]
    assert csrs[-1]["user"]["username"] == f"system:bootstrap:{token.split('.')[0]}"
    creates = [e for e in cluster.audit() if e.get("objectRef", {}).get("name") == "w1"
               and e["verb"] == "create"]
    assert creates[-1]["user"]["username"] == "system:node:w1"
    # A second join on a joined host stops at preflight and changes nothing.
    again = run("kubeadm", node_root, "join", "--config",
                str(join_config(tmp_path, cluster, "w1", token, pin)))
    assert again.returncode == 1
    assert "[ERROR FileAvailable--etc-kubernetes-kubelet.conf]" in again.stderr


@pytest.mark.parametrize("case", ["wrong-pin", "expired-token", "unreachable", "refused"])
def test_a_failed_join_leaves_no_kubelet_conf(cluster: StandIn, tmp_path: Path,
                                              case: str) -> None:
    token, pin = new_token(cluster, tmp_path, ttl="1s" if case == "expired-token" else "15m")
    endpoint = None
    name = f"bad-{case}"
    if case == "wrong-pin":
        pin = "sha256:" + "0" * 64
    elif case == "expired-token":
        time.sleep(2.5)  # past its TTL; the token cleaner and bootstrap signer run each second
    elif case == "unreachable":
        endpoint = f"{standin_address(13)}:6443"  # nothing listens there
    else:
        assert cluster.faults_dir is not None
        (cluster.faults_dir / name / "hw").mkdir(parents=True)
        write_faults(cluster.faults_dir / name / "hw", ["join-fails"])
    node_root = tmp_path / name
    started = time.monotonic()
    failed = run("kubeadm", node_root, "join", "--config", str(join_config(
        tmp_path, cluster, name, token, pin, endpoint, timeout="2s")))
    assert failed.returncode == 1
    assert failed.stderr.startswith("error execution phase ")
    expected = {
        "wrong-pin": "cluster CA found in cluster-info ConfigMap is invalid: none of the "
                     "public keys",
        "expired-token": f'token id "{token.split(".")[0]}" is invalid for this cluster or '
                         "it has expired",
        "unreachable": "failed to request the cluster-info ConfigMap",
        "refused": 'admission webhook "join-policy.gpuready-lab.invalid" denied the request',
    }[case]
    assert expected in failed.stderr
    assert token not in failed.stdout + failed.stderr
    assert files(node_root) == set()  # no kubelet.conf, no certificate, nothing
    if case == "unreachable":
        assert time.monotonic() - started < 30  # the discovery timeout holds
    with pytest.raises(Exception, match="404"):
        core_api(cluster).read_node(name)


def test_reset_removes_the_join(cluster: StandIn, tmp_path: Path) -> None:
    token, pin = new_token(cluster, tmp_path)
    node_root = tmp_path / "w2"
    assert run("kubeadm", node_root, "join", "--config",
               str(join_config(tmp_path, cluster, "w2", token, pin))).returncode == 0
    assert run("kubeadm", node_root, "reset").returncode == 1  # asks first; no answer, no reset
    reset = run("kubeadm", node_root, "reset", "--force")
    assert reset.returncode == 0, reset.stderr
    assert not (node_root / "etc/kubernetes/kubelet.conf").exists()
    assert not any((node_root / "var/lib/kubelet").iterdir())


@pytest.fixture
def gpu_host(tmp_path: Path) -> Path:
    host = tmp_path / "gpu-host"
    write_hardware(host / "hw", render_host("h100-sxm5-8x", "w3"))
    write_faults(host / "hw", [])
    (host / "run").mkdir()
    (host / "run" / "nvidia-module-version").write_text("550.90.07\n")
    return host


def _run_kubelet(root: Path, host: Path, seconds: float) -> str:
    env = {"PATH": os.environ["PATH"], "GPUREADY_SIM_TOOL": "kubelet",
           "GPUREADY_SIM_VERSION": "1.30.5", "GPUREADY_LAB_ROOT": str(root),
           "GPUREADY_LAB_HW": str(host / "hw"), "GPUREADY_LAB_RUN": str(host / "run"),
           "GPUREADY_SIM_KUBELET_INTERVAL": "0.3"}
    proc = subprocess.Popen([sys.executable, str(SIM / "daemons.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    return out


def _real_gpu_node(fixtures_dir: Path) -> dict[str, Any]:
    doc = json.loads((fixtures_dir / "k8s-api" /
                      "kubectl-get-nodes-o-json-list-rke2-vgpu-a16-4q-gpu-operator.json"
                      ).read_text())
    node: dict[str, Any] = doc["items"][0]
    return node


@pytest.mark.parametrize("faults", [[], ["gfd-mismatch"]])
def test_kubelet_reports_ready_capacity_and_gfd_labels(
        cluster: StandIn, tmp_path: Path, gpu_host: Path, fixtures_dir: Path,
        faults: list[str]) -> None:
    write_faults(gpu_host / "hw", faults)
    name = "w3" if not faults else "w4"
    token, pin = new_token(cluster, tmp_path)
    node_root = tmp_path / name
    assert run("kubeadm", node_root, "join", "--config",
               str(join_config(tmp_path, cluster, name, token, pin))).returncode == 0
    log = _run_kubelet(node_root, gpu_host, 2.0)
    assert "GPU Feature Discovery labels set" in log
    node = json.loads(core_api(cluster).read_node(name, _preload_content=False).data)
    real = _real_gpu_node(fixtures_dir)
    labels, real_labels = node["metadata"]["labels"], real["metadata"]["labels"]
    gfd = {k for k in labels if k.startswith("nvidia.com/")}
    # Every GFD label the kubelet sets is one the real GPU Operator sets (tests/fixtures).
    assert gfd <= set(real_labels)
    assert {"nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"} <= gfd
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"  # MiB, as NVML reports it
    product = labels["nvidia.com/gpu.product"]
    assert product == ("NVIDIA-H100-80GB-HBM3" if not faults else "NVIDIA-A100-SXM4-80GB")
    assert " " not in product and " " not in real_labels["nvidia.com/gpu.product"]
    # Status in the real shape: the same condition types, nodeInfo fields, capacity names.
    status, real_status = node["status"], real["status"]
    assert status["capacity"]["nvidia.com/gpu"] == "8"
    assert set(status["capacity"]) - {"hugepages-1Gi"} <= set(real_status["capacity"])
    ours = {c["type"]: c for c in status["conditions"]}
    theirs = {c["type"]: c for c in real_status["conditions"]}
    for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
        assert list(ours[kind]) == [k for k in ("type", "status", "lastHeartbeatTime",
                                                "lastTransitionTime", "reason", "message")]
        assert (ours[kind]["status"], ours[kind]["reason"], ours[kind]["message"]) == (
            theirs[kind]["status"], theirs[kind]["reason"], theirs[kind]["message"])
    assert sorted(status["nodeInfo"]) == sorted(real_status["nodeInfo"])
    assert status["daemonEndpoints"] == real_status["daemonEndpoints"]
    assert [a["type"] for a in status["addresses"]] == [a["type"]
                                                         for a in real_status["addresses"]]
    # The kubelet cannot take its own taint off: NodeRestriction.
    assert [t["key"] for t in node["spec"]["taints"]] == [TAINT["key"]]


def test_kubelet_waits_for_the_join(tmp_path: Path, gpu_host: Path) -> None:
    log = _run_kubelet(tmp_path / "unjoined", gpu_host, 1.0)
    assert "kubelet is waiting for kubeadm join" in log
