"""Transport tests: the local transport directly, and the SSH transport against the hostile SSH
server (tests/hostile_ssh.py): peers that refuse, stall at every step of the conversation,
answer late, send the exit status before their output, flood, drop or freeze. Each stall must
end within its budget as the right error; the remote command must die with its session."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tests.hostile_ssh import Endpoint, HostileSSHServer
from validate.model import CODE_DEADLINE
from validate.transport import (
    Aborted,
    AuthFailed,
    CommandResult,
    HostKeyRejected,
    TransportError,
    Unreachable,
    Unresponsive,
)
from validate.transport.local import LocalTransport
from validate.transport.route import Hop
from validate.transport.ssh import SSHConfig, SSHTransport, load_known_hosts

# Every step budget of the SSH conversation in these tests (the product default is 10 s).
STEP_S = 1.0
# Addresses of this module's endpoints (the project's test range is 127.0.21.0/24).
NET = "127.0.21.{}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (the server thread may not have reaped it yet).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # it exited between the two looks
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pids: list[int], within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not any(_pid_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- local transport


def test_local_runs_argv_without_a_shell() -> None:
    t = LocalTransport()
    r = t.run(["printf", "%s|", "a b", "c'd", "$HOME"], timeout=5)
    assert r.ok and r.stdout == "a b|c'd|$HOME|"
    assert r.argv == ("printf", "%s|", "a b", "c'd", "$HOME")


def test_local_nonzero_and_missing_tool() -> None:
    t = LocalTransport()
    r = t.run(["sh", "-c", "echo oops >&2; exit 3"], timeout=5)
    assert (r.rc, r.stderr, r.timed_out, r.ok) == (3, "oops\n", False, False)
    missing = t.run(["gpuready-no-such-tool"], timeout=5)
    assert missing.rc == 127


def test_local_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    t = LocalTransport()
    start = time.monotonic()
    r = t.run(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo $$ >> {pidfile}; echo started; wait"],
        timeout=1,
    )
    assert r.timed_out and r.rc == -1
    assert time.monotonic() - start < 5
    assert "started" in r.stdout
    pids = [int(x) for x in pidfile.read_text().split()]
    assert len(pids) == 2 and _wait_dead(pids)


def test_local_output_cap_kills_the_flood_and_keeps_a_tail() -> None:
    t = LocalTransport(max_output_bytes=1 << 20)
    r = t.run(["sh", "-c", "echo start >&2; yes flood"], timeout=30)
    assert r.truncated and not r.ok and not r.timed_out and r.rc == -1
    assert 0 < len(r.stdout) <= 4096 and r.stdout.endswith("flood\n")
    assert r.stderr == "start\n"


def test_local_reads_output_printed_after_the_command_exits(tmp_path: Path) -> None:
    # The shell exits at once; its background child prints a second later on the same pipe.
    t = LocalTransport()
    r = t.run(["sh", "-c", "(sleep 1; echo late) & echo early"], timeout=10)
    assert r.ok and r.stdout == "early\nlate\n"


def test_local_abort_kills_the_command_and_every_later_run(tmp_path: Path) -> None:
    t = LocalTransport()
    result: list[object] = []

    def worker() -> None:
        try:
            result.append(t.run(["sleep", "60"], timeout=120))
        except TransportError as exc:
            result.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    while t._proc is None:  # the command is running
        time.sleep(0.01)
    t.abort(CODE_DEADLINE, "node deadline of 1 s passed")
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(result[0], Aborted) and result[0].code == CODE_DEADLINE
    with pytest.raises(Aborted):
        t.run(["true"], timeout=5)


# ---------------------------------------------------------------- the hostile SSH server


@pytest.fixture(scope="module")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[paramiko.PKey, Path]:
    d = tmp_path_factory.mktemp("client-key")
    key = paramiko.ECDSAKey.generate()
    key.write_private_key_file(str(d / "id_ecdsa"))
    return key, d / "id_ecdsa"


ENDPOINTS = {
    "ok": {"behaviour": "ok", "run_commands": True},
    "refuse": {"behaviour": "refuse"},
    "silent": {"behaviour": "silent"},
    "garbage": {"behaviour": "garbage"},
    "banner_stall": {"behaviour": "banner_stall"},
    "wrong_key": {"behaviour": "wrong_key"},
    "auth_reject": {"behaviour": "auth_reject"},
    "auth_stall": {"behaviour": "auth_stall"},
    "open_stall": {"behaviour": "open_stall"},
    "exec_stall": {"behaviour": "exec_stall"},
    "exec_late_ok": {"behaviour": "exec_late", "delay_s": STEP_S / 4, "run_commands": True},
    "exec_late": {"behaviour": "exec_late", "delay_s": STEP_S * 4},
    "status_first": {"behaviour": "status_first", "delay_s": 0.5},
    "status_no_eof": {"behaviour": "status_no_eof"},
    "close_no_status": {"behaviour": "close_no_status"},
    "flood": {"behaviour": "flood"},
    "drop": {"behaviour": "drop"},
    "freeze": {"behaviour": "freeze"},
    "output_stall": {"behaviour": "output_stall"},
}


@pytest.fixture(scope="module")
def hostile(
    client_key: tuple[paramiko.PKey, Path], fixtures_dir: Path
) -> Iterator[HostileSSHServer]:
    journal = (
        fixtures_dir / "dmesg-xid/boot-dmesg-decode-iso-mlx5-insufficient-pcie-power.log"
    ).read_bytes()
    answers = [("journalctl", {"stdout": journal.decode()}), ("echo", {"stdout": "hello\n"})]
    endpoints = [
        Endpoint(name=name, address=NET.format(10 + i),
                 responses=[] if spec.get("run_commands") else list(answers), **spec)  # type: ignore[arg-type]
        for i, (name, spec) in enumerate(ENDPOINTS.items())
    ]
    with HostileSSHServer(endpoints, client_key[0]) as server:
        yield server


def _config(server: HostileSSHServer, name: str, key_file: Path, known: Path | None,
            **kw: object) -> SSHConfig:
    ep = server.endpoints[name]
    return SSHConfig.with_step_timeout(
        STEP_S, host=name, address=ep.address, port=ep.port, user="root", key_file=key_file,
        known_hosts=known, **kw)


@pytest.fixture()
def connect(
    hostile: HostileSSHServer, client_key: tuple[paramiko.PKey, Path], tmp_path: Path
) -> Iterator[object]:
    known = hostile.known_hosts(tmp_path / "known_hosts")
    made: list[SSHTransport] = []

    def make(name: str, **kw: object) -> SSHTransport:
        t = SSHTransport(_config(hostile, name, client_key[1], known, **kw))
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def _client_transports() -> list[paramiko.Transport]:
    return [t for t in threading.enumerate()
            if isinstance(t, paramiko.Transport) and not t.server_mode and t.is_alive()]


def test_through_a_jump_host_commands_run_and_close_ends_every_thread_quietly(
        hostile: HostileSSHServer, client_key: tuple[paramiko.PKey, Path],
        tmp_path: Path) -> None:
    """``ok`` as the jump host (ssh -J) to ``ok``: the command runs through the forwarded
    channel (the jump host saw the node's address), and close() ends both connections and all
    of paramiko's client threads without an exception in any thread. The lab's bastion test
    (real sshd) once caught the node's transport thread printing an EOFError traceback after a
    good run; this server has not lost that race, so the lab test is the one that guards it."""
    known = hostile.known_hosts(tmp_path / "known_hosts")
    jump_ep = hostile.endpoints["ok"]
    jump = Hop("ok", jump_ep.address, jump_ep.port, "root", (client_key[1],))
    raised: list[threading.ExceptHookArgs] = []
    hook, threading.excepthook = threading.excepthook, raised.append
    try:
        for _ in range(8):  # eight connections, each torn down: the race was intermittent
            before = len(hostile.events("ok", "forward_closed"))
            t = SSHTransport(_config(hostile, "ok", client_key[1], known, jumps=(jump,)))
            r = t.run(["echo", "through the jump host"], timeout=10)
            assert (r.rc, r.stdout) == (0, "through the jump host\n"), r
            t.close()
            assert hostile.wait_for(lambda ev, n=before: len(
                [e for e in ev if e["endpoint"] == "ok" and e["event"] == "forward_closed"]
            ) > n, 5), "the jump host's forward did not end"
            end = time.monotonic() + 5
            while _client_transports() and time.monotonic() < end:
                time.sleep(0.05)
            assert not _client_transports(), "paramiko's client threads outlived close()"
    finally:
        threading.excepthook = hook
    assert not raised, [f"{a.thread}: {a.exc_type.__name__}: {a.exc_value}" for a in raised]
    destinations = {tuple(e["destination"]) for e in hostile.events("ok", "direct_tcpip")}
    assert destinations == {(jump_ep.address, jump_ep.port)}


def test_ssh_runs_commands_on_one_reused_connection(hostile: HostileSSHServer,
                                                   connect: object) -> None:
    t = connect("ok")  # type: ignore[operator]
    before = len(hostile.events("ok", "connect"))
    r1 = t.run(["printf", "%s|", "a b", "c'd", "$(id)"], timeout=10)
    r2 = t.run(["sh", "-c", "echo err >&2; exit 4"], timeout=10)
    assert r1.ok and r1.stdout == "a b|c'd|$(id)|"
    assert (r2.rc, r2.stderr, r2.timed_out) == (4, "err\n", False)
    assert len(hostile.events("ok", "connect")) - before == 1
    sent = hostile.events("ok", "exec")[-1]["command"]
    assert sent.startswith("exec env LC_ALL=C sh -c ") and sent.endswith(" gpuready 10 sh -c "
                                                                        "'echo err >&2; exit 4'")


def test_ssh_runs_two_commands_at_once_on_one_connection(
    hostile: HostileSSHServer, connect: object, tmp_path: Path
) -> None:
    """Each run has a channel of its own: the first command ends only when the second one has
    run (one command at a time, the first would wait out its timeout)."""
    t = connect("ok")  # type: ignore[operator]
    before = len(hostile.events("ok", "connect"))
    flag = tmp_path / "flag"
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(t.run(
        ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo seen"], timeout=10)))
    waiter.start()
    try:
        assert hostile.wait_for(lambda events: any(
            e["event"] == "exec" and str(flag) in e["command"] for e in events))
        touched = t.run(["touch", str(flag)], timeout=10)
    finally:
        waiter.join(15)
    assert touched.ok
    (first,) = got
    assert isinstance(first, CommandResult)
    assert (first.stdout, first.timed_out, first.rc) == ("seen\n", False, 0)
    assert first.duration_s < 10
    assert len(hostile.events("ok", "connect")) - before == 1


def test_runs_waiting_on_a_failed_connection_attempt_do_not_make_another(
    hostile: HostileSSHServer, connect: object
) -> None:
    """Three runs at once on a host that never sends its banner: one connection attempt,
    and all three get its error (a host that is down costs one timeout, not one per run)."""
    t = connect("silent")  # type: ignore[operator]
    before = len(hostile.events("silent", "connect"))
    errors: list[TransportError] = []

    def run() -> None:
        try:
            t.run(["true"], timeout=10)
        except TransportError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert len(errors) == 3
    assert len({(type(e), str(e)) for e in errors}) == 1, errors
    assert len(hostile.events("silent", "connect")) - before == 1
    # A later run (nobody waiting) tries again, as before.
    with pytest.raises(TransportError):
        t.run(["true"], timeout=10)
    assert len(hostile.events("silent", "connect")) - before == 2


def test_known_hosts_with_markers_hashes_and_junk_still_verifies(
    hostile: HostileSSHServer, client_key: tuple[paramiko.PKey, Path], tmp_path: Path
) -> None:
    ep = hostile.endpoints["ok"]
    assert ep.host_key is not None
    name = f"[{ep.address}]:{ep.port}"
    other = paramiko.ECDSAKey.generate()
    hashed = paramiko.HostKeys.hash_host(name)
    known = tmp_path / "kh"
    known.write_text("\n".join([
        "# comment",
        f"@cert-authority *.example.org {other.get_name()} {other.get_base64()}",
        "garbage-line-without-fields",
        "badb64.example ssh-ed25519 !!!notbase64",
        "weird.example sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t",
        f"{hashed}   {ep.host_key.get_name()} {ep.host_key.get_base64()}",
    ]) + "\n")
    loaded = load_known_hosts(known)
    assert len(loaded.entries) == 1 and loaded.entries[0][0].startswith("|1|")
    assert {n for n, _ in loaded.skipped} == {2, 3, 4, 5}
    t = SSHTransport(_config(hostile, "ok", client_key[1], known))
    try:
        assert t.run(["true"], timeout=5).ok
    finally:
        t.close()


def test_unknown_changed_and_revoked_host_keys_rejected(
    hostile: HostileSSHServer, client_key: tuple[paramiko.PKey, Path], connect: object,
    tmp_path: Path
) -> None:
    elsewhere = tmp_path / "kh-elsewhere"
    ep = hostile.endpoints["ok"]
    assert ep.host_key is not None
    elsewhere.write_text(f"elsewhere {ep.host_key.get_name()} {ep.host_key.get_base64()}\n")
    before = len(hostile.events("ok", "exec"))
    with pytest.raises(HostKeyRejected, match="unknown"):
        SSHTransport(_config(hostile, "ok", client_key[1], elsewhere)).run(["true"], timeout=5)
    opted = SSHTransport(_config(hostile, "ok", client_key[1], elsewhere,
                                 accept_unknown_host_keys=True))
    try:
        assert opted.run(["true"], timeout=5).ok
    finally:
        opted.close()
    with pytest.raises(HostKeyRejected, match="mismatch"):
        connect("wrong_key").run(["true"], timeout=5)  # type: ignore[operator]
    revoked = tmp_path / "kh-revoked"
    revoked.write_text((tmp_path / "known_hosts").read_text()
                       + f"@revoked * {ep.host_key.get_name()} {ep.host_key.get_base64()}\n")
    with pytest.raises(HostKeyRejected, match="revoked"):
        SSHTransport(_config(hostile, "ok", client_key[1], revoked)).run(["true"], timeout=5)
    # only the opted-in connection ran a command
    assert len(hostile.events("ok", "exec")) - before == 1


def test_refused_key_is_auth_failure(connect: object) -> None:
    with pytest.raises(AuthFailed, match="authentication as root failed"):
        connect("auth_reject").run(["true"], timeout=5)  # type: ignore[operator]


# (endpoint, error class, text in the reason): one per step of the conversation.
STALLS = [
    ("refuse", Unreachable, "refused"),
    ("silent", Unreachable, "banner"),
    ("garbage", Unreachable, "protocol"),
    ("banner_stall", Unreachable, ""),
    ("auth_stall", Unresponsive, "authentication"),
    ("open_stall", Unresponsive, "open"),
    ("exec_stall", Unresponsive, "exec request"),
    ("exec_late", Unresponsive, "exec request"),
    ("drop", Unresponsive, "connection lost"),
    ("freeze", Unresponsive, "keepalive"),
]


@pytest.mark.parametrize(("name", "error", "reason"), STALLS, ids=[s[0] for s in STALLS])
def test_every_stall_ends_within_its_budget(connect: object, name: str,
                                            error: type[TransportError], reason: str) -> None:
    t = connect(name)  # type: ignore[operator]
    start = time.monotonic()
    with pytest.raises(error) as caught:
        t.run(["journalctl", "-k"], timeout=60)
    took = time.monotonic() - start
    assert reason.lower() in caught.value.reason.lower(), caught.value.reason
    # Worst case: the handshake budget (connect + banner + auth + 2 s) or two keepalive
    # intervals; never the command's 60 s, never forever.
    assert took < 3 * STEP_S + 3, (name, took)


def test_exec_answered_late_but_within_budget_runs(connect: object) -> None:
    r = connect("exec_late_ok").run(["echo", "hello"], timeout=10)  # type: ignore[operator]
    assert r.ok and r.stdout == "hello\n"


def test_output_after_the_exit_status_is_read(connect: object, fixtures_dir: Path) -> None:
    journal = (
        fixtures_dir / "dmesg-xid/boot-dmesg-decode-iso-mlx5-insufficient-pcie-power.log"
    ).read_text()
    for _ in range(3):
        r = connect("status_first").run(["journalctl", "-k"], timeout=10)  # type: ignore[operator]
        assert r.ok and r.stdout == journal


def test_status_without_eof_is_a_timeout_not_a_hang(connect: object) -> None:
    t = connect("status_no_eof", backstop_s=0.5)  # type: ignore[operator]
    start = time.monotonic()
    r = t.run(["journalctl", "-k"], timeout=1)
    assert r.timed_out and r.rc == -1 and time.monotonic() - start < 4


def test_output_stall_is_a_timeout_and_the_connection_survives(connect: object) -> None:
    t = connect("output_stall", backstop_s=0.5)  # type: ignore[operator]
    r = t.run(["journalctl", "-k"], timeout=1)
    assert r.timed_out and r.stdout  # the half it did send is kept
    # The peer still answers keepalives: a second command on the same connection starts.
    r2 = t.run(["journalctl", "-k"], timeout=1)
    assert r2.timed_out


def test_channel_closed_without_status(connect: object) -> None:
    r = connect("close_no_status").run(["echo", "hi"], timeout=5)  # type: ignore[operator]
    assert (r.rc, r.stdout, r.timed_out) == (-1, "hello\n", False)


def test_flood_is_cut_at_the_cap(hostile: HostileSSHServer, connect: object) -> None:
    t = connect("flood", max_output_bytes=2 << 20)  # type: ignore[operator]
    r = t.run(["journalctl", "-k"], timeout=30)
    assert r.truncated and not r.ok and len(r.stdout) <= 4096
    # The server saw the channel close and stopped; it had sent about the cap, not more.
    assert hostile.wait_for(lambda ev: any(e["endpoint"] == "flood" and e["event"] ==
                                           "flood_bytes" for e in ev), timeout=10)
    sent = hostile.events("flood", "flood_bytes")[-1]["sent"]
    assert 2 << 20 <= sent < 16 << 20


def _flood_through_cut_proxy(hostile: HostileSSHServer, connect: object, tmp_path: Path,
                             cap: int) -> tuple[SSHTransport, Path]:
    """A transport to the flood endpoint with output cap ``cap``, through a ProxyCommand
    (tests/cut_proxy.py) that closes the client's side of the pipe once 16 KiB came back: the
    connection keeps delivering output, but every later write of the client (a window adjust,
    a channel close) fails. Also the proxy's marker file (its pid, once it has cut)."""
    ep = hostile.endpoints["flood"]
    marker = tmp_path / "cut"
    proxy = shlex.join([sys.executable, "-m", "tests.cut_proxy", ep.address, str(ep.port),
                        str(16 << 10), str(marker)])
    return connect("flood", max_output_bytes=cap, proxy_command=proxy), marker  # type: ignore[operator]


def test_flood_over_the_cap_is_the_verdict_when_the_channel_close_fails(
    hostile: HostileSSHServer, connect: object, tmp_path: Path
) -> None:
    # The flood passes the 128 KiB cap before paramiko owes the server a window adjust (its
    # window is 2 MiB, adjusted every ~200 KiB read), so the client's first write after the cut
    # is the channel close at the cap. It fails (EPIPE); the node still printed too much.
    t, marker = _flood_through_cut_proxy(hostile, connect, tmp_path, 128 << 10)
    r = t.run(["journalctl", "-k"], timeout=30)
    assert marker.exists(), "the proxy never cut: the close was not tested"
    assert r.truncated and not r.ok and "flood flood" in r.stdout and len(r.stdout) <= 4096
    # The broken connection was dropped, not kept: its proxy process is gone.
    assert _wait_dead([int(marker.read_text().split()[0])])


def test_a_write_failing_while_output_is_read_is_a_lost_connection(
    hostile: HostileSSHServer, connect: object, tmp_path: Path
) -> None:
    # Under a 4 MiB cap the client owes a window adjust after ~200 KiB: that write fails
    # inside the read loop, before the cap. The command did not finish: the host is
    # unresponsive, not the check broken.
    t, marker = _flood_through_cut_proxy(hostile, connect, tmp_path, 4 << 20)
    with pytest.raises(Unresponsive, match=r"connection lost .* while journalctl was running"):
        t.run(["journalctl", "-k"], timeout=30)
    assert marker.exists()


def test_timeout_kills_remote_command_and_children(
    hostile: HostileSSHServer, connect: object, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    t = connect("ok")  # type: ignore[operator]
    start = time.monotonic()
    r = t.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo $$ >> {pidfile}; wait"],
              timeout=1)
    assert r.timed_out and r.rc == -1
    assert time.monotonic() - start < 4
    pids = [int(x) for x in pidfile.read_text().split()]
    assert len(pids) == 2 and _wait_dead(pids)
    # The connection survives a timed-out command.
    assert t.run(["echo", "after"], timeout=5).stdout == "after\n"


def test_abort_ends_a_blocked_exec_request_at_once(connect: object) -> None:
    """The node deadline's mechanism: abort() from another thread ends a wait paramiko
    itself never ends (exec_command has no timeout)."""
    t = connect("exec_stall", channel_timeout_s=600, keepalive_s=600)  # type: ignore[operator]
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            t.run(["journalctl", "-k"], timeout=60)
        except TransportError as exc:
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(2 * STEP_S)
    assert thread.is_alive()  # stuck in the exec request, as issue 8 found
    t.abort(CODE_DEADLINE, "node deadline of 2 s passed")
    thread.join(3)
    assert not thread.is_alive()
    assert isinstance(caught[0], Aborted) and caught[0].code == CODE_DEADLINE


def test_remote_command_dies_when_the_session_goes(
    hostile: HostileSSHServer, connect: object, tmp_path: Path
) -> None:
    """sshd gives a command without a pty no SIGHUP; the wrapper's stdin watcher ends it."""
    pidfile = tmp_path / "pid"
    t = connect("ok")  # type: ignore[operator]
    threading.Thread(
        target=lambda: _swallow(lambda: t.run(
            ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], timeout=600)),
        daemon=True,
    ).start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pid = int(pidfile.read_text())
    assert _pid_alive(pid)
    t.abort(CODE_DEADLINE, "gone")  # the session goes away (as when the validator dies)
    assert _wait_dead([pid], within_s=5)


# A child that leaves with setsid() and writes "<pid> <session id>" (its own /proc stat).
_SETSID_CHILD = ("setsid sh -c 'read -r pid comm state ppid pgrp sid rest < /proc/self/stat; "
                 "echo \"$pid $sid\" > \"$0\"; exec sleep 300' {pidfile} "
                 "</dev/null >/dev/null 2>&1 &")


def _setsid_child(pidfile: Path) -> int:
    """The child's pid, once it has written it, after checking that it left the command's
    session (it leads its own)."""
    deadline = time.monotonic() + 5
    while not (pidfile.exists() and pidfile.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the setsid child never started"
        time.sleep(0.02)
    pid, sid = pidfile.read_text().split()
    assert pid == sid
    return int(pid)


@pytest.mark.parametrize("ends", ["exits", "times_out"])
def test_a_setsid_child_does_not_outlive_the_command(connect: object, tmp_path: Path,
                                                     ends: str) -> None:
    """A child that calls setsid() leaves the command's process group and session, so no kill
    aimed at the group reaches it (issue 28: it outlived the run). The wrapper kills what
    carries the command's marker once the command has ended, however it ended."""
    pidfile = tmp_path / "pid"
    t = connect("ok")  # type: ignore[operator]
    # the command waits for its child to start, then exits (or hangs past its timeout)
    rest = "exit 0" if ends == "exits" else "exec sleep 60"
    r = t.run(["sh", "-c", _SETSID_CHILD.format(pidfile=pidfile)
               + f" while [ ! -s {pidfile} ]; do sleep 0.02; done; {rest}"], timeout=2)
    assert r.timed_out is (ends == "times_out") and r.rc == (-1 if r.timed_out else 0)
    assert _wait_dead([_setsid_child(pidfile)], within_s=3)


def test_local_a_setsid_child_does_not_outlive_the_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    r = LocalTransport().run(["sh", "-c", _SETSID_CHILD.format(pidfile=pidfile)
                              + f" while [ ! -s {pidfile} ]; do sleep 0.02; done"], timeout=10)
    assert r.ok
    assert _wait_dead([_setsid_child(pidfile)], within_s=3)


def _swallow(fn: object) -> None:
    with contextlib.suppress(TransportError):
        fn()  # type: ignore[operator]


def test_dead_address_is_unreachable_within_the_connect_timeout() -> None:
    # Nothing listens here and nothing answers SYNs quickly on a closed loopback port: refused.
    closed = socket.socket()
    closed.bind((NET.format(250), 0))
    port = closed.getsockname()[1]
    closed.close()
    cfg = dataclasses.replace(SSHConfig.with_step_timeout(1.0, host="dead",
                                                          address=NET.format(250), port=port))
    start = time.monotonic()
    with pytest.raises(Unreachable):
        SSHTransport(cfg).run(["true"], timeout=5)
    assert time.monotonic() - start < 2
