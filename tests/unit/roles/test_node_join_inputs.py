"""node_join's first task, the assert on its inputs, run by ansible-playbook on this machine
(connection local, nothing else of the role): a Node name that is no Kubernetes name
(``../nodes/x``, which the role would put into ``/api/v1/nodes/<name>``, or an inventory
hostname with capitals and underscores when node_join_node_name is left to its default) fails
the host before anything runs, naming the value; a good one passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "node_join"


def test_a_node_name_that_is_no_kubernetes_name_fails_the_assert(tmp_path: Path) -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    assert_inputs = tasks[0]
    assert assert_inputs["name"] == "Assert the join inputs are well formed"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # The role's defaults as group all's variables: below the hosts' own, as role defaults are.
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"vars": {
        **defaults, "gpuready_label_prefix": "gpu.example.com"}, "children": {
        "gpu_nodes": {"hosts": {
            "gpu-h100-01": local,
            "renamed": {**local, "node_join_node_name": "../nodes/x"},
            "GPU_H100_02": local}},
        "kube_control_plane": {"hosts": {"cp-01": local}}}}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "gpu_nodes", "gather_facts": False,
        "tasks": [assert_inputs]}], sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
           "ANSIBLE_LOCALHOST_WARNING": "false"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                           str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, check=False, cwd=tmp_path,
                          timeout=300)
    failed: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("fatal: [") and "]: FAILED! => " in line:
            host, _, result = line[len("fatal: ["):].partition("]: FAILED! => ")
            failed[host] = json.loads(result)
    assert sorted(failed) == ["GPU_H100_02", "renamed"], proc.stdout[-3000:]
    assert "ok: [gpu-h100-01]" in proc.stdout
    for host, name in (("renamed", "../nodes/x"), ("GPU_H100_02", "GPU_H100_02")):
        assert failed[host]["assertion"] == (
            "node_join_node_name is ansible.builtin.regex(_node_join_subdomain)")
        assert f'node_join_node_name a Kubernetes Node name: lowercase letters, digits, \'-\' ' \
               f'and \'.\', at most 253 (got "{name}";' in failed[host]["msg"]
