"""Playbooks run on a lab with a real control plane, as the cluster tests run them: one
ansible-playbook run through ansible-runner (host keys verified as the validators verify them),
its stats and events; the API server read with the official client, kubectl, the gate in
process, the API server's audit log. tests/lab/test_cluster.py and test_upgrade.py share it."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from lab import controlplane
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import ssh
from validate import cli
from validate.ansible_ssh import runner_settings

PREFIX = "gpuready.node-restriction.kubernetes.io"  # inventory/lab/group_vars/all/cluster.yml
TAINT_KEY = f"{PREFIX}/validation"
PLAYBOOKS = REPO_ROOT / "playbooks"
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run, as ansible-runner recorded it (stats and events)."""

    rc: int
    stats: dict[str, dict[str, int]]
    events: tuple[dict[str, Any], ...]

    def count(self, kind: str, host: str) -> int:
        return self.stats.get(kind, {}).get(host, 0)

    def changed_tasks(self, host: str) -> set[str]:
        return {e["event_data"]["task"] for e in self.events
                if e.get("event") == "runner_on_ok" and e["event_data"].get("host") == host
                and e["event_data"].get("res", {}).get("changed")}

    def failures(self, host: str) -> list[str]:
        return [f"{e['event_data'].get('task')}: {e['event_data'].get('res', {}).get('msg', '')}"
                for e in self.events if e.get("event") in ("runner_on_failed",
                                                           "runner_on_unreachable")
                and e["event_data"].get("host") == host]

    def debug_lines(self, task: str) -> list[str]:
        for e in self.events:
            data = e.get("event_data", {})
            if e.get("event") == "runner_on_ok" and data.get("task") == task:
                return [str(line) for line in data.get("res", {}).get("msg", [])]
        return []


class Cluster:
    def __init__(self, state: LabState, paths: LabPaths, artifacts: Path, vault: Path) -> None:
        self.state = state
        self.paths = paths
        self.artifacts = artifacts
        self.vault = vault  # host variables a site would keep in its vault (not artifacts)
        self.kubeconfig = controlplane.admin_kubeconfig(paths)
        self.runs = 0
        self.log: list[str] = []
        self.tokens: set[str] = set()  # every bootstrap token the cluster has held

    def playbook(self, name: str, *, limit: str | None = None, cmdline: str = "",
                 extravars: dict[str, Any] | None = None, label: str = "",
                 **callbacks: Any) -> PlaybookRun:
        """``callbacks``: ansible-runner's ``event_handler``/``cancel_callback``."""
        self.runs += 1
        private = self.artifacts / f"run{self.runs}"
        private.mkdir(parents=True)
        started = time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=str(private), project_dir=str(REPO_ROOT),
            playbook=str(PLAYBOOKS / name), inventory=str(self.paths.inventory_dir),
            limit=limit, cmdline=cmdline or None, quiet=True, **callbacks,
            # Host keys verified as the validators verify them (validate/ansible_ssh.py).
            **runner_settings(self.paths.inventory_dir, private, extravars=extravars, envvars={
                "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}))
        self.log.append(f"{label or name}: {time.monotonic() - started:.0f} s")
        self.collect_tokens()
        return PlaybookRun(rc=runner.rc, stats=runner.stats or {}, events=tuple(runner.events))

    def api(self) -> Any:
        from kubernetes import client, config  # noqa: PLC0415

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig),
                                client_configuration=configuration)
        return client.CoreV1Api(client.ApiClient(configuration))

    def node(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.api().read_node(name, _preload_content=False).data)
        return data

    def collect_tokens(self) -> None:
        if not controlplane.running(self.paths, self.state.hosts):
            return
        secrets = self.api().list_namespaced_secret("kube-system", _preload_content=False)
        for item in json.loads(secrets.data)["items"]:
            data = item.get("data") or {}
            if item.get("type") == "bootstrap.kubernetes.io/token":
                token_id = base64.b64decode(data["token-id"]).decode()
                secret = base64.b64decode(data["token-secret"]).decode()
                self.tokens.add(f"{token_id}.{secret}")

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "HOME": str(self.artifacts / "kubectl-home")}
        return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    def gate(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = cli.main(["gate", "-i", str(self.paths.inventory_dir), *args], stdout=out,
                      stderr=err)
        return rc, out.getvalue(), err.getvalue()

    def admin_patches(self) -> int:
        """PATCH calls on Nodes by the admin (the gate's credentials) in the API server's
        audit log (lab/kube/cluster.py's policy: writes to Nodes, not their status)."""
        log = controlplane.audit_log(self.paths, self.state.hosts)
        events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return sum(1 for e in events
                   if e["verb"] == "patch" and e["user"]["username"] == "kubernetes-admin"
                   and e.get("objectRef", {}).get("resource") == "nodes")

    def joined(self, host: str) -> bool:
        return ssh(self.state.host(host).address, f"test -e {KUBELET_CONF}").returncode == 0

    def extra_inventory(self, host: str, variables: dict[str, Any]) -> str:
        """A second inventory source setting host variables (as host_vars would)."""
        path = self.vault / f"extra-{self.runs}.yml"
        path.write_text(yaml.safe_dump({"all": {"hosts": {host: variables}}}))
        return f"-i {path}"
