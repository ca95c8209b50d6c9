"""gpu_kernel_prereqs' running kernel parameters, read by name through the host probe.

runtime.yml runs only where the host owns its kernel (not in the lab's containers), and applying
its sysctls would change this machine's kernel. So this runs the role's own read task (its
`raw` probe, read-only) and its own expressions on this machine, through ansible-playbook: with
wanted values equal to this kernel's real ones the role sees nothing to apply; with one value
different it applies, and its assert would fail naming the parameter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "gpu_kernel_prereqs"
NAMES = ("vm.max_map_count", "net.ipv4.ip_local_port_range")


def _task(path: Path, name: str) -> dict[str, Any]:
    """A task of the role by name (in a block or not)."""
    def walk(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
        for task in tasks:
            if task.get("name") == name:
                return task
            found = walk(task.get("block") or [])
            if found:
                return found
        return None
    task = walk(yaml.safe_load(path.read_text()))
    assert task is not None, f"{path.name} has no task {name!r}"
    return task


def _play(tmp: Path, sysctls: list[dict[str, Any]]) -> dict[str, Any]:
    decide = _task(ROLE / "tasks" / "main.yml", "Decide whether the kernel belongs to this host")
    read = _task(ROLE / "tasks" / "runtime.yml", "Read current kernel parameters")
    apply = _task(ROLE / "tasks" / "runtime.yml", "Apply kernel parameters that differ")
    assert_task = _task(ROLE / "tasks" / "runtime.yml",
                        "Assert modules loaded, kernel parameters applied and swap off")
    sysctl_assert = next(t for t in assert_task["ansible.builtin.assert"]["that"]
                         if "sysctl" in t)
    out = tmp / "out.json"
    inventory = tmp / "inventory_vars.yml"  # after the role's defaults, as an inventory is
    inventory.write_text(yaml.safe_dump({"gpu_kernel_prereqs_sysctls": sysctls,
                                         "gpu_kernel_prereqs_sysctls_extra": []}))
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml"),
                       str(inventory)],
        "vars": {"role_path": str(ROLE)},
        "tasks": [
            decide,
            {**read, "register": "_gpu_kernel_prereqs_sysctl_after"},
            {**read},
            {"name": "Write what the role decides", "ansible.builtin.copy": {
                "dest": str(out), "content": (
                    "{{ {'read': (_gpu_kernel_prereqs_sysctl_now.stdout | from_json).sysctls, "
                    f"'apply': ({apply['when']}), 'in_effect': ({sysctl_assert})}}"
                    " | to_json }}")},
             "vars": assert_task["vars"]},
        ],
    }]
    book = tmp / "play.yml"
    book.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
           "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(book)],
                          capture_output=True, text=True, env=env, check=False, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_role_reads_kernel_parameters_by_name_and_applies_only_a_difference(
        tmp_path: Path) -> None:
    real = subprocess.run(["sysctl", "-n", *NAMES], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    # As an inventory writes them: an int, and a multi-value string with a tab.
    wanted = [{"name": NAMES[0], "value": int(real[0]), "why": "test"},
              {"name": NAMES[1], "value": real[1], "why": "test"}]
    same = _play(tmp_path, wanted)
    assert same == {"read": dict(zip(NAMES, real, strict=True)), "apply": False,
                    "in_effect": True}
    wanted[0]["value"] = int(real[0]) + 1
    differ = _play(tmp_path, wanted)
    assert differ["apply"] is True and differ["in_effect"] is False
