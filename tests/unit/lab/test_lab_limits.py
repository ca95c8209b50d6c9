"""`lab up` names the machine limit a fleet passes, before it boots anything (issue 13)."""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

import pytest

from lab import cli, fleet, limits
from lab.errors import LabError
from lab.limits import MachineLimits


def _proc_copy(tmp_path: Path, inotify_fds: dict[int, int]) -> Path:
    """A /proc with this machine's real limit files and made-up processes holding
    ``inotify_fds[pid]`` inotify descriptors each (plus one other descriptor)."""
    proc = tmp_path / "proc"
    (proc / "sys/fs/inotify").mkdir(parents=True)
    shutil.copyfile("/proc/sys/fs/inotify/max_user_instances",
                    proc / "sys/fs/inotify/max_user_instances")
    shutil.copyfile("/proc/meminfo", proc / "meminfo")
    (proc / "self").mkdir()  # not a pid: skipped
    for pid, count in inotify_fds.items():
        fd_dir = proc / str(pid) / "fd"
        fd_dir.mkdir(parents=True)
        os.symlink("pipe:[12345]", fd_dir / "0")
        for fd in range(3, 3 + count):
            os.symlink("anon_inode:inotify", fd_dir / str(fd))
    return proc


def _meminfo_available_kib(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise AssertionError(f"no MemAvailable in {path}")


def test_reads_the_real_proc_files(tmp_path: Path) -> None:
    proc = _proc_copy(tmp_path, {101: 5, 102: 1, 103: 0})
    got = limits.read_limits(244, proc, uid=os.geteuid())
    assert got.inotify_max_instances == int(
        Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    assert got.memory_available_kib == _meminfo_available_kib(proc / "meminfo") > 0
    assert got.inotify_in_use == 6
    assert got.addresses == 244
    # Another user's processes do not count against this user's limit.
    assert limits.read_limits(244, proc, uid=os.geteuid() + 1).inotify_in_use == 0


def test_this_machine_reads_without_error() -> None:
    got = limits.read_limits(fleet.MAX_HOSTS)
    assert got.inotify_max_instances > 0 and got.memory_available_kib > 0
    assert got.inotify_in_use >= 0


def test_unreadable_proc_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"cannot read this machine's limits from .*proc"):
        limits.read_limits(244, tmp_path / "proc")


# The machine's default (and CI's): 128 instances; the lead's 3-host lab held 24 of them.
DEFAULT = MachineLimits(inotify_max_instances=128, inotify_in_use=24,
                        memory_available_kib=23 * 2**20, addresses=244)


def test_largest_fleet_is_the_inotify_instances_left_over_eight() -> None:
    assert limits.INOTIFY_PER_HOST == 8
    assert limits.max_hosts(DEFAULT) == (128 - 24) // 8 == 13
    assert limits.max_hosts(MachineLimits(128, 0, 23 * 2**20, 244)) == 16
    assert limits.max_hosts(MachineLimits(128, 200, 23 * 2**20, 244)) == 0
    limits.check_fleet(13, DEFAULT)  # fits: no error


def test_too_many_hosts_names_the_inotify_setting_and_its_value() -> None:
    with pytest.raises(LabError) as err:
        limits.check_fleet(48, DEFAULT)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "48 hosts need 384 inotify instances (8 each) but fs.inotify.max_user_instances is 128 "
        "with 24 in use; raise it with `sysctl -w fs.inotify.max_user_instances=416` or boot "
        "at most 13 hosts")
    # The setting it names is enough: with it the same fleet fits.
    assert limits.max_hosts(MachineLimits(416, 24, 23 * 2**20, 244)) >= 48


def test_memory_and_addresses_are_named_when_they_bind_first() -> None:
    small = MachineLimits(100_000, 0, 10 * limits.MEMORY_PER_HOST_KIB, 244)
    with pytest.raises(LabError, match=r"^11 hosts need 1408 MiB of memory \(128 MiB each\) "
                                       r"but MemAvailable is 1280 MiB; .* at most 10 hosts$"):
        limits.check_fleet(11, small)
    roomy = MachineLimits(100_000, 0, 2**30, 244)
    with pytest.raises(LabError, match=r"^245 hosts need 245 loopback addresses but the lab's "
                                       r"/24 \(GPUREADY_LAB_NET\) offers 244; boot at most 244"):
        limits.check_fleet(245, roomy)


def test_lab_up_refuses_before_starting_anything(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI on this machine's real limits: one more host than fits is refused (exit 2, one
    line naming the limit) before anything of a lab run exists."""
    monkeypatch.setenv("GPUREADY_LAB_DIR", str(tmp_path / "lab"))
    fits = limits.max_hosts(limits.read_limits(fleet.MAX_HOSTS))
    if fits >= fleet.MAX_HOSTS:
        pytest.skip(f"this machine's limits fit the whole address range ({fits} hosts)")
    # Labs booting or stopping beside this test (make test runs two) change what is in use
    # between the two reads: ask for well over what fits, and allow the answer that much slack.
    slack = 32
    wanted = min(fits + slack, fleet.MAX_HOSTS)
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["up", "--nodes", str(wanted)], stdout=out, stderr=err)
    assert rc == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"lab: error: {wanted} hosts need "), lines[0]
    assert "sysctl -w fs.inotify.max_user_instances=" in lines[0] or "MemAvailable" in lines[0]
    said = re.search(r"at most (\d+) hosts", lines[0])
    assert said and abs(int(said[1]) - fits) <= slack and int(said[1]) < wanted, lines[0]
    assert not (tmp_path / "lab" / "run").exists()
    assert list((tmp_path / "lab").iterdir()) == [tmp_path / "lab" / "lab.lock"]
