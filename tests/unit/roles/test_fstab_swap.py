"""gpu_kernel_prereqs' swap lines: the probe's match and the replace task agree.

The role runs "Disable swap at boot" only where its probe (roles/host_probe) finds a swap line
in /etc/fstab. So the probe must find every line the task's regexp would comment out (or a
converged host would keep its swap entries), and nothing once the task has run (or every
converge would run it again). Both use the role's one regexp
(``_gpu_kernel_prereqs_fstab_swap_regexp``); the task's is run by ansible-core's own
``replace`` module, the probe's by the host probe script, each as the role runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "gpu_kernel_prereqs"
PROBE = REPO_ROOT / "roles" / "host_probe" / "files" / "host_probe.py"
TASK = "Disable swap at boot (comment out fstab swap entries)"

# Debian's installer writes the swap line with blanks between fields, tabs in older releases.
FSTAB = """\
# /etc/fstab: static file system information.
# <file system> <mount point>   <type>  <options>       <dump>  <pass>
UUID=0a4f3c1e-8f3e-4b4a-9d5e-1c2b3a4d5e6f /               ext4    errors=remount-ro 0       1
# swap was on /dev/sda5 during installation
UUID=7c2d9e4b-1a3f-4e5d-8b6c-0f1e2d3c4b5a none            swap    sw              0       0
/swapfile\tnone\tswap\tdefaults\t0\t0
  /dev/sdb2 none swap
proc /proc proc defaults 0 0
/dev/sr0        /media/cdrom0   udf,iso9660 user,noauto     0       0
"""
SWAP_LINES = {4, 5, 6}  # 0-based: the three uncommented swap entries


def _regexp() -> str:
    regexp: str = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())[
        "_gpu_kernel_prereqs_fstab_swap_regexp"]
    return regexp


def _task() -> dict[str, str]:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    args: dict[str, str] = next(
        t for t in tasks if t.get("name") == TASK)["ansible.builtin.replace"]
    assert args["regexp"] == "{{ _gpu_kernel_prereqs_fstab_swap_regexp }}"
    return {**args, "regexp": _regexp()}


def _grep_finds(path: Path) -> bool:
    """The host probe's --match, run as the role's raw task runs it."""
    out = subprocess.run([sys.executable, "-c", PROBE.read_text(), "--match", "fstab-swap",
                          _regexp(), str(path)], capture_output=True, text=True, check=True)
    found: bool = json.loads(out.stdout)["matches"]["fstab-swap"]
    return found


def _replace(path: Path, tmp_path: Path) -> dict[str, object]:
    """The real ansible.builtin.replace module, run with the task's arguments."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**_task(), "path": str(path)}}))
    out = subprocess.run([sys.executable, "-m", "ansible.modules.replace", str(args)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_probe_finds_what_the_task_changes_and_nothing_after(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(FSTAB)
    assert _grep_finds(fstab)
    assert _replace(fstab, tmp_path)["changed"] is True
    after = fstab.read_text().splitlines()
    before = FSTAB.splitlines()
    assert len(after) == len(before)
    for i, (was, now) in enumerate(zip(before, after, strict=True)):
        if i in SWAP_LINES:
            assert now == f"# {was}  # disabled by gpuready: kubelet requires swap off", i
        else:
            assert now == was, i  # the proc line after "swap" with no fields is untouched
    assert not _grep_finds(fstab)
    assert _replace(fstab, tmp_path)["changed"] is False


@pytest.mark.parametrize("line", [
    "# UUID=1 none swap sw 0 0",          # commented out
    "UUID=1 /home ext4 defaults 0 2",     # not swap
    "UUID=1 none swapfs defaults 0 0",    # a type that only starts with swap
])
def test_lines_that_are_not_swap_entries_are_left_alone(tmp_path: Path, line: str) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(line + "\n")
    assert not _grep_finds(fstab)
    assert _replace(fstab, tmp_path)["changed"] is False
