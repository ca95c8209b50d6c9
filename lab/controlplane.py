"""The lab's Kubernetes control plane: control-plane hosts (inventory group
``kube_control_plane``) and the API server that answers on the first one's address.

A fleet says which (``kubernetes:`` in its file): ``real`` runs etcd, kube-apiserver and
kube-controller-manager built from Kubernetes' sources in the control-plane host, set up by the
real kubeadm (lab.kube.cluster); ``stand-in``, the default until the join role and the gate
move to the real one, runs the SIMULATED API server described below.

For the stand-in, ``lab up`` leaves the first control-plane host as
``kubeadm init`` would have, with the parts the join needs: the cluster CA
(``/etc/kubernetes/pki/ca.crt``), ``/etc/kubernetes/admin.conf`` and ``kubeadm``; and it runs
the stand-in (``python -m lab.apiserver serve``) on this machine, listening on that host's
address, port 6443, where the lab hosts reach it as they would a real control plane. The
cluster (its PKI, objects and audit log) lives in ``.lab/run/apiserver/`` and goes with
``lab down``; the admin kubeconfig for this machine is ``.lab/run/kube/admin.conf``.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab.apiserver import server
from lab.errors import LabError
from lab.fleet import CONTROL_PLANE, REAL, LabHost
from lab.hosts import leader_pid, pid_alive
from lab.kube import build, cluster, node
from lab.paths import REPO_ROOT, LabPaths

API_PORT = 6443
KUBE_VERSION = server.KUBE_VERSION
START_TIMEOUT_S = 20.0
BOOT_TIMEOUT_S = cluster.START_TIMEOUT_S


def state_dir(paths: LabPaths) -> Path:
    return paths.run / "apiserver"


def admin_kubeconfig(paths: LabPaths) -> Path:
    return paths.run / "kube" / "admin.conf"


def audit_log(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...] = ()) -> Path:
    """The API server's audit log: the real one's in its host (given the fleet's ``hosts``),
    else the stand-in's."""
    cp = _real(hosts)
    if cp is not None:
        return cluster.audit_log(paths, cp)
    return state_dir(paths) / "audit.log"


def running(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> bool:
    """Whether the fleet's API server (real or stand-in) is up."""
    cp = _real(hosts)
    if cp is not None:
        return hosts_running(paths, cp) and cluster.is_active(paths, cp)
    return pid(paths) is not None


def control_plane(hosts: list[LabHost] | tuple[LabHost, ...]) -> LabHost | None:
    """The host the API server answers on: the first of the control plane."""
    return next((h for h in hosts if h.kind == CONTROL_PLANE), None)


def _real(hosts: list[LabHost] | tuple[LabHost, ...]) -> LabHost | None:
    """The control-plane host, when the fleet runs the real control plane."""
    cp = control_plane(hosts)
    return cp if cp is not None and cp.kubernetes == REAL else None


def nspawn_args(host: LabHost) -> tuple[str, ...]:
    """What a host of a real-Kubernetes fleet needs of systemd-nspawn: the built binaries
    (read-only; the control plane runs them, nodes install them)."""
    if host.kubernetes == REAL:
        return tuple(cluster.nspawn_args(build.ensure_built()))
    return ()


def kubeconfig(server_url: str, ca_pem: bytes, token: str) -> str:
    ca = base64.b64encode(ca_pem).decode()
    return ("apiVersion: v1\nclusters:\n- cluster:\n"
            f"    certificate-authority-data: {ca}\n    server: {server_url}\n"
            "  name: gpuready-lab\ncontexts:\n- context:\n    cluster: gpuready-lab\n"
            "    user: kubernetes-admin\n  name: kubernetes-admin@gpuready-lab\n"
            "current-context: kubernetes-admin@gpuready-lab\nkind: Config\npreferences: {}\n"
            f"users:\n- name: kubernetes-admin\n  user:\n    token: {token}\n")


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def init(paths: LabPaths, hosts: list[LabHost]) -> None:
    """A new cluster for a fleet with a control plane: PKI, objects, admin kubeconfig."""
    cp = control_plane(hosts)
    if cp is None or cp.kubernetes == REAL:  # the real one is made in its booted host
        return
    state = state_dir(paths)
    state.mkdir(parents=True, exist_ok=True)
    token = server.init_state(state, cp.address, API_PORT, (cp.name,))
    ca_pem = (state / "pki" / "ca.crt").read_bytes()
    _write_private(admin_kubeconfig(paths),
                   kubeconfig(f"https://{cp.address}:{API_PORT}", ca_pem, token))


def provision(paths: LabPaths, hosts: list[LabHost]) -> None:
    """Put on each control-plane host what kubeadm init leaves there (before it boots)."""
    cp = control_plane(hosts)
    if cp is None:
        return
    if cp.kubernetes == REAL:
        cluster.provision(paths.host_dir(cp.name) / "merged", cp,
                          build.read_go_mod().kubernetes_version)
        for host in hosts:
            if host.kind != CONTROL_PLANE:
                node.provision(paths.host_dir(host.name) / "merged", host.address)
        return
    ca_pem = (state_dir(paths) / "pki" / "ca.crt").read_bytes()
    admin = admin_kubeconfig(paths).read_text()
    for host in hosts:
        if host.kind != CONTROL_PLANE:
            continue
        root = paths.host_dir(host.name) / "merged"
        pki = root / "etc/kubernetes/pki"
        pki.mkdir(parents=True, exist_ok=True)
        (pki / "ca.crt").write_bytes(ca_pem)
        _write_private(root / "etc/kubernetes/admin.conf", admin)
        kubeadm = root / "usr/bin/kubeadm"
        kubeadm.write_text(
            "#!/bin/bash\n"
            f"# kubeadm: gpuready lab simulator (the control plane's, version {KUBE_VERSION})\n"
            f"export GPUREADY_SIM_TOOL=kubeadm GPUREADY_SIM_VERSION={KUBE_VERSION}\n"
            'exec -a kubeadm /usr/bin/python3 /opt/gpuready-lab/sim/k8s.py "$@"\n')
        kubeadm.chmod(0o755)


def _pid_file(paths: LabPaths) -> Path:
    return state_dir(paths) / "apiserver.pid"


def pid(paths: LabPaths) -> int | None:
    try:
        found = int(_pid_file(paths).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return found if pid_alive(found) else None


def boot(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...],
         deadline: float) -> dict[str, float]:
    """Once the hosts have booted: the real control plane's kubeadm init phases and units."""
    cp = _real(hosts)
    if cp is None:
        return {}
    return cluster.init(paths, cp, deadline)


def start(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...]) -> int | None:
    """Start the API server (if the fleet has a control plane); the stand-in's pid."""
    cp = control_plane(hosts)
    if cp is None:
        return None
    if cp.kubernetes == REAL:  # again, after stop(); before `boot` there is nothing to start
        if admin_kubeconfig(paths).exists() and not cluster.is_active(paths, cp):
            cluster.systemctl(paths, cp, "start", "kube-apiserver")
            cluster.wait_ready(paths, cp, time.monotonic() + BOOT_TIMEOUT_S)
        return None
    running = pid(paths)
    if running is not None:
        return running
    state = state_dir(paths)
    log = (state / "apiserver.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.apiserver", "serve", "--state", str(state),
         "--address", cp.address, "--port", str(API_PORT), "--faults-dir",
         str(paths.run / "hosts")],
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True)
    _pid_file(paths).write_text(f"{proc.pid}\n")
    if not server.wait_listening(cp.address, API_PORT, START_TIMEOUT_S) or proc.poll() is not None:
        stop(paths)
        tail = (state / "apiserver.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise LabError(f"the API server stand-in did not start on {cp.address}:{API_PORT}: "
                       + " | ".join(tail))
    return proc.pid


def stop(paths: LabPaths, hosts: list[LabHost] | tuple[LabHost, ...] = ()) -> bool:
    """Stop the API server; True if one was running. Its state stays for the next start.
    The real one (given the fleet's ``hosts``) stops its unit, and goes with its host."""
    cp = _real(hosts)
    if cp is not None:
        if hosts_running(paths, cp) and cluster.is_active(paths, cp):
            cluster.systemctl(paths, cp, "stop", "kube-apiserver")
            return True
        return False
    found = pid(paths)
    if found is None:
        return False
    os.kill(found, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while pid_alive(found) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(found):
        os.kill(found, signal.SIGKILL)
    _pid_file(paths).unlink(missing_ok=True)
    return True


def hosts_running(paths: LabPaths, host: LabHost) -> bool:
    return leader_pid(paths, host.name) is not None


def status_lines(paths: LabPaths, hosts: tuple[LabHost, ...]) -> list[str]:
    cp = control_plane(hosts)
    if cp is None:
        return []
    if cp.kubernetes == REAL:
        up = hosts_running(paths, cp) and cluster.is_active(paths, cp)
        version = build.read_go_mod().kubernetes_version
        return [f"kubernetes: https://{cp.address}:{API_PORT} on {cp.name} (kube-apiserver "
                f"{version} built from source, set up by kubeadm; "
                f"{'running' if up else 'stopped'}); kubeconfig: {admin_kubeconfig(paths)}"]
    running = pid(paths)
    state = f"running, pid {running}" if running else "stopped"
    return [f"kubernetes: https://{cp.address}:{API_PORT} on {cp.name} (SIMULATED "
            f"kube-apiserver stand-in v{KUBE_VERSION}, {state}); kubeconfig: "
            f"{admin_kubeconfig(paths)}"]
