"""gpu_kernel_prereqs' GRUB drop-in: kernel arguments are data, never shell code.

The drop-in is sourced by update-grub (sh), and its value is pasted into grub.cfg's ``linux``
line. Two layers, both run for real through Ansible (ansible-runner, localhost, nothing
outside the test's tmp directory is touched):

- the role's input check (tasks/validate.yml) refuses an argument with anything but letters,
  digits and ``_ . , : / = + @ % -``, naming it;
- the template quotes the arguments as one single-quoted shell word, so even an argument that
  got past the check is text: sourcing the rendered file runs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible_runner

from tests.conftest import REPO_ROOT

HOSTILE = ['iommu=pt', 'a"b', "$(touch {pwned})", "x'y", "`touch {pwned}`", "c;d", "e\\f",
           "g h"]


def _play(tmp_path: Path, tasks: list[dict[str, Any]], cmdline: list[str]) -> Any:
    play = [{
        "name": "gpu_kernel_prereqs inputs", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "vars": {"gpu_kernel_prereqs_kernel_cmdline": cmdline},
        "tasks": tasks,
    }]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "runner").mkdir(exist_ok=True)
    return ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), playbook=str(tmp_path / "play.yml"),
        inventory=f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}",
        quiet=True,
        envvars={"ANSIBLE_ROLES_PATH": str(REPO_ROOT / "roles"),
                 "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )


def _failures(run: Any) -> list[str]:
    out = []
    for e in run.events:
        if e.get("event") == "runner_on_failed":
            res = e["event_data"]["res"]
            out += [str(r.get("msg")) for r in res.get("results", []) if r.get("failed")]
            out.append(str(res.get("msg", "")))
    return out


VALIDATE = [{"name": "Check", "ansible.builtin.include_role": {
    "name": "gpu_kernel_prereqs", "tasks_from": "validate"}}]


def test_plain_kernel_arguments_pass_the_check(tmp_path: Path) -> None:
    run = _play(tmp_path, VALIDATE, ["iommu=pt", "pci=realloc=off", "isolcpus=managed_irq,2-5",
                                     "console=ttyS0,115200n8", "rd.lvm.lv=vg/root",
                                     "default_hugepagesz=1G"])
    assert run.status == "successful", _failures(run)


def test_hostile_kernel_arguments_are_refused_by_name(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    args = [a.format(pwned=pwned) for a in HOSTILE]
    run = _play(tmp_path, VALIDATE, args)
    assert run.status == "failed"
    messages = " ".join(_failures(run))
    for bad in args[1:]:
        assert json.dumps(bad) in messages, bad
    assert "gpu_kernel_prereqs_kernel_cmdline item" in messages
    assert json.dumps("iommu=pt") not in messages


def test_the_rendered_drop_in_keeps_every_argument_as_text(tmp_path: Path) -> None:
    """Defense in depth: render the real template with arguments the check would refuse and
    source the result as update-grub does."""
    pwned = tmp_path / "pwned"
    args = [a.format(pwned=pwned) for a in HOSTILE]
    dropin = tmp_path / "90-gpuready.cfg"
    run = _play(tmp_path, [{"name": "Render", "ansible.builtin.template": {
        "src": str(REPO_ROOT / "roles/gpu_kernel_prereqs/templates/grub.cfg.j2"),
        "dest": str(dropin), "mode": "0644"}}], args)
    assert run.status == "successful", _failures(run)
    sourced = subprocess.run(
        ["sh", "-c", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"; . "$1"; '
                     'printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"', "sh", str(dropin)],
        capture_output=True, text=True, timeout=30, check=True)
    assert sourced.stdout == "quiet splash " + " ".join(args)
    assert not pwned.exists()
