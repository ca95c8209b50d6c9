"""One reboot for the whole bootstrap play (issue 9): a converge that changes both the kernel
prerequisites and the NVIDIA driver reboots the node once, after GRUB and the initramfs.

Two layers:

- the roles' task files: every task that notifies a role's own reboot topic (the one that
  records the reason or reports a pending reboot) also notifies the play's one topic,
  ``Reboot node``; gpu_kernel_prereqs flushes no handlers of its own (a flush there would reboot
  before the driver is installed);
- Ansible itself runs the real handler files (ansible-runner, localhost, check mode; the
  ``ansible.builtin.reboot`` action refuses a local connection and says it would have
  rebooted) in a play built from
  playbooks/bootstrap.yml's bootstrap play: its roles in its order (their handlers and
  defaults only; their tasks would need a node) and its ``force_handlers``. Probe tasks notify
  exactly what the roles' tasks notify (read from the task files).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
import yaml

from tests.conftest import REPO_ROOT

ROLES = REPO_ROOT / "roles"
TOPIC = "Reboot node"
KERNEL_TOPIC = "Reboot node for kernel prerequisites"
DRIVER_TOPIC = "Reboot node for NVIDIA driver"


def _tasks(node: Any) -> list[dict[str, Any]]:
    """Every task mapping in a task file, blocks, rescues and always sections included."""
    out: list[dict[str, Any]] = []
    for task in node or []:
        out.append(task)
        for section in ("block", "rescue", "always"):
            out += _tasks(task.get(section))
    return out


def _notified(task: dict[str, Any]) -> list[str]:
    notify = task.get("notify", [])
    notify = [notify] if isinstance(notify, str) else list(notify)
    # nvidia_driver hands its topics to vendor_apt_repo, which notifies them on a change.
    notify += task.get("vars", {}).get("vendor_apt_repo_notify", [])
    return [str(n) for n in notify]


def _role_notifications() -> dict[str, list[list[str]]]:
    """role -> the notify lists of its tasks that name one of the reboot topics."""
    found: dict[str, list[list[str]]] = {}
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            notify = _notified(task)
            if any(n.startswith(TOPIC) for n in notify):
                found.setdefault(path.parts[-3], []).append(notify)
    return found


def _bootstrap_play() -> dict[str, Any]:
    plays = yaml.safe_load((REPO_ROOT / "playbooks" / "bootstrap.yml").read_text())
    (play,) = [p for p in plays if any(
        r["role"] == "nvidia_driver" for r in p.get("roles", []))]
    return dict(play)


def test_every_reboot_notification_names_the_one_topic() -> None:
    found = _role_notifications()
    assert set(found) == {"gpu_kernel_prereqs", "nvidia_driver"}
    for role, lists in found.items():
        for notify in lists:
            assert TOPIC in notify, (role, notify)


def test_kernel_prereqs_leaves_the_flush_to_the_driver() -> None:
    tasks = _tasks(yaml.safe_load((ROLES / "gpu_kernel_prereqs/tasks/main.yml").read_text()))
    assert [t for t in tasks if t.get("ansible.builtin.meta") == "flush_handlers"] == []
    driver = _tasks(yaml.safe_load((ROLES / "nvidia_driver/tasks/main.yml").read_text()))
    assert [t for t in driver if t.get("ansible.builtin.meta") == "flush_handlers"] != []


def test_only_node_reboot_reboots() -> None:
    rebooting = {}
    for path in sorted(ROLES.glob("*/handlers/*.yml")):
        for handler in yaml.safe_load(path.read_text()) or []:
            if "ansible.builtin.reboot" in handler:
                rebooting[path.parts[-3]] = handler
    assert list(rebooting) == ["node_reboot"]
    assert rebooting["node_reboot"]["listen"] == TOPIC
    play = _bootstrap_play()
    assert play["roles"][-1]["role"] == "node_reboot"
    assert play["force_handlers"] is True


def _converge(tmp_path: Path, notify: dict[str, list[list[str]]], **play_vars: Any) -> Any:
    """Run the bootstrap play's handlers for probe tasks that notify like the roles do."""
    bootstrap = _bootstrap_play()
    roles = tmp_path / "roles"
    for entry in bootstrap["roles"]:
        name = entry["role"]
        (roles / name).mkdir(parents=True)
        for part in ("handlers", "defaults"):
            if (ROLES / name / part).is_dir():
                (roles / name / part).symlink_to(ROLES / name / part)
    probes = [{"name": f"Probe: {role} changes", "ansible.builtin.debug": {"msg": role},
               "changed_when": True, "notify": topics}
              for role, lists in notify.items() for topics in lists]
    play = [{
        "name": "bootstrap handlers", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "force_handlers": bootstrap["force_handlers"],
        "vars": {"_gpu_kernel_prereqs_in_container": False,
                 "_gpu_kernel_prereqs_initramfs_command": ["true"],
                 "_gpu_kernel_prereqs_grub_command": ["true"],
                 "_nvidia_driver_packages": ["nvidia-kernel-dkms"],
                 "nvidia_driver_version": "550.90.07", **play_vars},
        "roles": [{"role": r["role"]} for r in bootstrap["roles"]],
        "tasks": [*probes, {"name": "A later role fails", "ansible.builtin.fail": {"msg": "x"},
                            "when": play_vars.get("fail_after", False)}],
    }]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "runner").mkdir()
    return ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), playbook=str(tmp_path / "play.yml"),
        inventory=f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}",
        quiet=True, cmdline="--check",
        envvars={"ANSIBLE_ROLES_PATH": str(roles),
                 "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )


def _handlers_run(run: Any, skipped: bool = False) -> list[tuple[str, Any]]:
    """(task name, result) of every handler (and the failing task) that ran, in order; with
    skipped, those skipped too (a command handler is skipped in check mode)."""
    events = {"runner_on_ok", "runner_on_failed"} | ({"runner_on_skipped"} if skipped else set())
    return [(e["event_data"]["task"], e["event_data"].get("res", {})) for e in run.events
            if e.get("event") in events and not e["event_data"]["task"].startswith("Probe")]


@pytest.mark.parametrize("changed", [("gpu_kernel_prereqs", "nvidia_driver"),
                                     ("gpu_kernel_prereqs",), ("nvidia_driver",)])
def test_a_converge_reboots_once_after_grub(tmp_path: Path,
                                            changed: tuple[str, ...]) -> None:
    notify = {r: n for r, n in _role_notifications().items() if r in changed}
    run = _converge(tmp_path, notify, gpu_kernel_prereqs_reboot_allowed=True,
                    nvidia_driver_reboot_allowed=True, gpu_kernel_prereqs_reboot_timeout=600,
                    nvidia_driver_reboot_timeout=1800)
    ran = _handlers_run(run)
    names = [name for name, _ in ran]
    reboots = [res for name, res in ran if name == "Reboot node"]
    assert len(reboots) == 1, names
    # The reboot action refuses a local connection (it would reboot this machine) and says so:
    # the handler got as far as rebooting.
    assert "would reboot the control node" in reboots[0]["msg"]
    if "gpu_kernel_prereqs" in changed:
        order = [name for name, _ in _handlers_run(run, skipped=True)]
        assert order.index("Update GRUB configuration") < order.index("Reboot node")
    reasons = {"gpu_kernel_prereqs": "kernel prerequisites",
               "nvidia_driver": "NVIDIA driver 550.90.07"}
    asked = [res["ansible_facts"]["_node_reboot_reasons"] for name, res in ran
             if name.startswith("Ask for the node reboot")]
    assert asked[-1] == [reasons[r] for r in changed]


def test_a_role_that_may_not_reboot_reports_instead(tmp_path: Path) -> None:
    run = _converge(tmp_path, {"gpu_kernel_prereqs": _role_notifications()["gpu_kernel_prereqs"]},
                    gpu_kernel_prereqs_reboot_allowed=False, nvidia_driver_reboot_allowed=True)
    names = [name for name, _ in _handlers_run(run)]
    assert "Reboot node" not in names
    assert "Record pending reboot for kernel prerequisites" in names
    assert "Warn that a reboot is pending for kernel prerequisites" in names


def test_a_later_failure_still_runs_the_handlers(tmp_path: Path) -> None:
    run = _converge(tmp_path, {"gpu_kernel_prereqs": _role_notifications()["gpu_kernel_prereqs"]},
                    gpu_kernel_prereqs_reboot_allowed=True, gpu_kernel_prereqs_reboot_timeout=600,
                    fail_after=True)
    assert run.status == "failed"
    names = [name for name, _ in _handlers_run(run)]
    assert names.index("A later role fails") < names.index("Reboot node")
    order = [name for name, _ in _handlers_run(run, skipped=True)]
    assert order.index("Update GRUB configuration") < order.index("Reboot node")
