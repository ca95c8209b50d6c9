"""Issue 8 on a real sshd (one lab host, nothing installed): a remote command dies with its SSH
session, and a storage run first removes stale scratch directories of earlier runs (only ours).

sshd gives a command without a pty no SIGHUP when its session goes away: the control case
(OpenSSH's own client killed) shows the command running on. The validator's transport runs
commands under a wrapper whose stdin watcher ends them; killing the validator with SIGKILL (no
cleanup of its own) must leave nothing running on the node.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import running_lab, ssh
from validate import cli
from validate.model import ExitCode

SCRATCH = "/var/tmp"  # the profiles' checkpoint path


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[LabState]:
    started = time.monotonic()
    with running_lab(nodes=1) as state:
        yield state
    summary = f"test_reliability (lab): {time.monotonic() - started:.0f} s in all"
    # Shown even without -s: the runtime of this module is a CI budget item.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{summary}")
    else:
        print(summary)


def _wait(condition: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout} s")


def _pid_file(address: str, path: str) -> int | None:
    proc = ssh(address, f"cat {path} 2>/dev/null")
    return int(proc.stdout) if proc.stdout.strip() else None


def _alive(address: str, pid: int) -> bool:
    return ssh(address, f"kill -0 {pid}").returncode == 0


def test_sshd_alone_leaves_a_command_running_when_the_client_dies(lab: LabState) -> None:
    """The control case: OpenSSH's client killed, sshd keeps the command (no pty, no HUP)."""
    address = lab.hosts[0].address
    paths = LabPaths.default()
    pidfile = "/tmp/gpuready-control.pid"
    ssh(address, f"rm -f {pidfile}")
    client = subprocess.Popen(
        ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={paths.known_hosts}", "-i", str(paths.ssh_key),
         f"root@{address}", f"echo $$ > {pidfile}; exec sleep 301"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _pid_file(address, pidfile), 30, "the command's pid file")
        pid = _pid_file(address, pidfile)
        assert pid is not None
    finally:
        client.kill()
        client.wait()
    try:
        # Proving that something does not happen takes a wait: sshd has seen the TCP close
        # long before 5 s.
        time.sleep(5)
        assert _alive(address, pid), "sshd ended the command itself"
    finally:
        ssh(address, f"kill {pid}; rm -f {pidfile}")


KILLED_CLIENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from validate.transport.ssh import SSHConfig, SSHTransport
    t = SSHTransport(SSHConfig(host="node1", address=sys.argv[1], key_file=Path(sys.argv[2]),
                               known_hosts=Path(sys.argv[3])))
    t.run(["sh", "-c", "echo $$ > " + sys.argv[4] + "; exec sleep 302"], timeout=600)
""")


def test_a_killed_validator_leaves_no_command_running(lab: LabState) -> None:
    address = lab.hosts[0].address
    paths = LabPaths.default()
    pidfile = "/tmp/gpuready-killed.pid"
    ssh(address, f"rm -f {pidfile}")
    validator = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, address, str(paths.ssh_key),
         str(paths.known_hosts), pidfile], cwd=REPO_ROOT)
    try:
        _wait(lambda: _pid_file(address, pidfile), 30, "the command's pid file")
        pid = _pid_file(address, pidfile)
        assert pid is not None and _alive(address, pid)
    finally:
        validator.kill()  # SIGKILL: the validator closes nothing itself
        validator.wait()
    try:
        _wait(lambda: not _alive(address, pid), 15, "the remote command's death")
    finally:
        ssh(address, f"kill {pid} 2>/dev/null; rm -f {pidfile}")


STALE_SETUP = f"""set -e
cd {SCRATCH}
mkdir -p gpuready-checkpoint-20250101T000000Z-dead-deadbeef
echo old > gpuready-checkpoint-20250101T000000Z-dead-deadbeef/checkpoint.bin
mkdir -p gpuready-checkpoint-20261202T120000Z-live-cafebabe
mkdir -p gpuready-fio-20250101T000000Z-dead-0badcafe
mkdir -p gpuready-checkpoint-notes
mkdir -p gpuready-victim && echo keep > gpuready-victim/keep
ln -sfn {SCRATCH}/gpuready-victim gpuready-checkpoint-20250101T000000Z-link-12345678
touch -d '2 hours ago' gpuready-checkpoint-20250101T000000Z-dead-deadbeef \\
  gpuready-fio-20250101T000000Z-dead-0badcafe gpuready-checkpoint-notes gpuready-victim
touch -h -d '2 hours ago' gpuready-checkpoint-20250101T000000Z-link-12345678
"""


def test_a_storage_run_removes_only_stale_scratch_of_its_own(lab: LabState,
                                                             tmp_path: Path) -> None:
    address = lab.hosts[0].address
    setup = ssh(address, STALE_SETUP)
    assert setup.returncode == 0, setup.stderr
    out, err = io.StringIO(), io.StringIO()
    try:
        code = cli.main(["run", "-i", str(LabPaths.default().inventory_dir), "--limit",
                         lab.hosts[0].name, "--checks", "storage.checkpoint", "--out",
                         str(tmp_path)], out, err)
        assert code == ExitCode.OK, out.getvalue() + err.getvalue()
        left = set(ssh(address, f"cd {SCRATCH} && ls -d gpuready-*").stdout.split())
        assert left == {
            "gpuready-checkpoint-20261202T120000Z-live-cafebabe",  # too young: maybe live
            "gpuready-fio-20250101T000000Z-dead-0badcafe",  # another check's: its own run
            "gpuready-checkpoint-notes",  # not our name
            "gpuready-victim",
            "gpuready-checkpoint-20250101T000000Z-link-12345678",  # a symlink, never followed
        }
        assert ssh(address, f"cat {SCRATCH}/gpuready-victim/keep").stdout == "keep\n"
        rows = pd.read_parquet(next(tmp_path.glob("*/results.parquet")))
        assert set(rows["status"]) == {"pass"}
    finally:
        ssh(address, f"cd {SCRATCH} && rm -rf gpuready-checkpoint-* gpuready-fio-* "
                     "gpuready-victim")
