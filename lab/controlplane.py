"""The lab's Kubernetes control plane: control-plane hosts (inventory group
``kube_control_plane``) and the API server that answers on the first one's address.

A fleet with control-plane hosts runs real Kubernetes there: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from Kubernetes' sources (lab.kube.build), set
up by the real kubeadm in the booted host (lab.kube.cluster), on the host's own address, port 6443.
Its GPU hosts get what a real kubelet needs of an nspawn host (lab.kube.node). The admin
kubeconfig for this machine is ``.lab/run/kube/admin.conf``; the cluster's state lives in the
control-plane host and goes with ``lab down``.
"""

from __future__ import annotations

import time
from pathlib import Path

from lab.fleet import CONTROL_PLANE, REAL, LabHost
from lab.hosts import leader_pid
from lab.kube import build, cluster, images, node
from lab.paths import LabPaths

API_PORT = cluster.API_PORT
BOOT_TIMEOUT_S = cluster.START_TIMEOUT_S


def admin_kubeconfig(paths: LabPaths) -> Path:
    return paths.run / "kube" / "admin.conf"


def audit_log(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> Path:
    """The API server's audit log, in the control-plane host (given the fleet's ``hosts``)."""
    cp = _real(hosts)
    if cp is None:
        raise ValueError("the fleet has no control plane")
    return cluster.audit_log(paths, cp)


def running(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> bool:
    """Whether the fleet's API server is up."""
    cp = _real(hosts)
    return cp is not None and hosts_running(paths, cp) and cluster.is_active(paths, cp)


def control_plane(hosts: list[LabHost] | tuple[LabHost, ...]) -> LabHost | None:
    """The host the API server answers on: the first of the control plane."""
    return next((h for h in hosts if h.kind == CONTROL_PLANE), None)


def _real(hosts: list[LabHost] | tuple[LabHost, ...]) -> LabHost | None:
    """The control-plane host, when the fleet runs the real control plane."""
    cp = control_plane(hosts)
    return cp if cp is not None and cp.kubernetes == REAL else None


def nspawn_args(paths: LabPaths, host: LabHost) -> tuple[str, ...]:
    """What a host of a real-Kubernetes fleet needs of systemd-nspawn: the built binaries
    (read-only; the control plane runs them, nodes install them), and on a kubelet host what
    its containers need (lab.kube.node.nspawn_args)."""
    if host.kubernetes != REAL:
        return ()
    args = cluster.nspawn_args(build.ensure_built())
    if host.kind != CONTROL_PLANE:
        args += node.nspawn_args(paths.host_dir(host.name))
    return tuple(args)


def provision(paths: LabPaths, hosts: list[LabHost]) -> None:
    """Before first boot: the control-plane host's binaries and kubeadm configuration, and
    what each GPU host needs for a kubelet."""
    cp = _real(hosts)
    if cp is None:
        return
    cluster.provision(paths.host_dir(cp.name) / "merged", cp,
                      build.read_go_mod().kubernetes_version)
    # The API server reaches a kubelet (a Pod's log, exec) at the Node's hostname: each
    # kubelet listens on its host's loopback address only, and the Node's InternalIP is this
    # machine's default-route address (a kubelet refuses a loopback --node-ip), where no
    # kubelet listens (cluster.kubeadm_config, kubelet-preferred-address-types).
    with (paths.host_dir(cp.name) / "merged/etc/hosts").open("a") as etc_hosts:
        etc_hosts.writelines(f"{h.address}\t{h.name}\n" for h in hosts
                             if h.kind != CONTROL_PLANE and h.kubernetes == REAL)
    for host in hosts:
        if host.kind != CONTROL_PLANE:
            node.provision(paths.host_dir(host.name) / "merged", host.address)
            images.provision(paths, paths.host_dir(host.name) / "merged")


def boot(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...],
         deadline: float) -> dict[str, float]:
    """Once the hosts have booted: the real control plane's kubeadm init phases and units."""
    cp = _real(hosts)
    if cp is None:
        return {}
    times = cluster.init(paths, cp, deadline)
    for host in hosts:
        if host.kind != CONTROL_PLANE:
            cluster.write_device_plugin_access(paths, host)
    return times


def start(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> None:
    """Start the API server again after ``stop`` (before ``boot`` there is nothing to start)."""
    cp = _real(hosts)
    if cp is None:
        return
    if admin_kubeconfig(paths).exists() and not cluster.is_active(paths, cp):
        cluster.systemctl(paths, cp, "start", "kube-apiserver")
        cluster.wait_ready(paths, cp, time.monotonic() + BOOT_TIMEOUT_S)


def stop(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> bool:
    """Stop the API server's unit; True if it was running. etcd keeps the cluster's state for
    the next start; all of it goes with the control-plane host."""
    cp = _real(hosts)
    if cp is not None and hosts_running(paths, cp) and cluster.is_active(paths, cp):
        cluster.systemctl(paths, cp, "stop", "kube-apiserver")
        return True
    return False


def hosts_running(paths: LabPaths, host: LabHost) -> bool:
    return leader_pid(paths, host.name) is not None


def status_lines(paths: LabPaths, hosts: tuple[LabHost, ...]) -> list[str]:
    cp = _real(hosts)
    if cp is None:
        return []
    up = hosts_running(paths, cp) and cluster.is_active(paths, cp)
    version = build.read_go_mod().kubernetes_version
    return [f"kubernetes: https://{cp.address}:{API_PORT} on {cp.name} (kube-apiserver "
            f"{version} built from source, set up by kubeadm; "
            f"{'running' if up else 'stopped'}); kubeconfig: {admin_kubeconfig(paths)}"]
