"""Transport tests: the local transport directly, and the SSH transport against a paramiko SSH
server started in-process on 127.0.0.1 that runs commands with ``sh -c`` in a new session, as
sshd does (so killing the remote command is the transport's job, not the server's)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from validate.transport import AuthFailed, HostKeyRejected, Unreachable
from validate.transport.local import LocalTransport
from validate.transport.ssh import SSHConfig, SSHTransport, load_known_hosts


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (the server thread may not have reaped it yet).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pids: list[int], within_s: float = 3.0) -> bool:
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


# ---------------------------------------------------------------- SSH test server


class _Server(paramiko.ServerInterface):
    def __init__(self, user: str, client_key: paramiko.PKey) -> None:
        self.user = user
        self.client_key = client_key
        self.command: bytes = b""
        self.ready = threading.Event()

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return (
            paramiko.OPEN_SUCCEEDED
            if kind == "session"
            else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        )

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username == self.user and key == self.client_key:
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.command = command
        self.ready.set()
        return True


class SSHServer:
    """Minimal sshd stand-in: publickey auth, exec requests run via ``sh -c``."""

    def __init__(self, host_key: paramiko.PKey, user: str, client_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.user = user
        self.client_key = client_key
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self.commands: list[str] = []
        self._stop = False
        self._transports: list[paramiko.Transport] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        t = paramiko.Transport(conn)
        self._transports.append(t)
        t.add_server_key(self.host_key)
        try:
            t.start_server(server=_ServerFactory(self))
        except (paramiko.SSHException, EOFError):
            return
        while t.is_active():
            try:
                chan = t.accept(1)
            except (paramiko.SSHException, EOFError, OSError):
                return
            if chan is None:
                continue
            threading.Thread(target=self._exec, args=(chan,), daemon=True).start()

    def _exec(self, chan: paramiko.Channel) -> None:
        server = chan.transport.server_object  # type: ignore[union-attr]
        if not server.ready.wait(5):
            chan.close()
            return
        command = server.command.decode()
        server.ready.clear()
        self.commands.append(command)
        proc = subprocess.Popen(
            ["sh", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.append(proc)

        def pump_err() -> None:
            assert proc.stderr is not None
            try:
                for chunk in iter(lambda: proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
                    chan.sendall_stderr(chunk)
            except OSError:  # the client closed the channel first
                pass

        err_thread = threading.Thread(target=pump_err, daemon=True)
        err_thread.start()
        assert proc.stdout is not None
        try:
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
                chan.sendall(chunk)
            err_thread.join()
            rc = proc.wait()
            # sshd reports a signal death as exit-signal (no exit-status), which paramiko's
            # client shows as -1; closing without a status gives the client the same view.
            if rc >= 0:
                chan.send_exit_status(rc)
        except OSError:
            pass
        finally:
            chan.close()

    def stop(self) -> None:
        self._stop = True
        self.sock.close()
        for t in self._transports:
            t.close()
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class _ServerFactory(_Server):
    def __init__(self, outer: SSHServer) -> None:
        super().__init__(outer.user, outer.client_key)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("keys")
    client = paramiko.RSAKey.generate(2048)
    client.write_private_key_file(str(d / "id_rsa"))
    return {
        "host": paramiko.RSAKey.generate(2048),
        "other_host": paramiko.RSAKey.generate(2048),
        "client": client,
        "client_file": d / "id_rsa",
        "wrong_client": paramiko.RSAKey.generate(2048),
        "dir": d,
    }


@pytest.fixture()
def server(keys: dict[str, object]) -> Iterator[SSHServer]:
    srv = SSHServer(keys["host"], "root", keys["client"])  # type: ignore[arg-type]
    yield srv
    srv.stop()


def _known_hosts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _entry(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}"


def _cfg(server: SSHServer, keys: dict[str, object], known: Path | None, **kw: object) -> SSHConfig:
    return SSHConfig(
        host="node1",
        address="127.0.0.1",
        port=server.port,
        user="root",
        key_file=keys["client_file"],
        known_hosts=known,  # type: ignore[arg-type]
        connect_timeout_s=3,
        banner_timeout_s=3,
        auth_timeout_s=3,
        **kw,  # type: ignore[arg-type]
    )


def test_ssh_runs_commands_on_one_reused_connection(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    name = f"[127.0.0.1]:{server.port}"
    known = _known_hosts(tmp_path / "kh", [_entry(name, keys["host"])])  # type: ignore[arg-type]
    t = SSHTransport(_cfg(server, keys, known))
    try:
        r1 = t.run(["printf", "%s|", "a b", "c'd", "$(id)"], timeout=10)
        r2 = t.run(["sh", "-c", "echo err >&2; exit 4"], timeout=10)
    finally:
        t.close()
    assert r1.ok and r1.stdout == "a b|c'd|$(id)|"
    assert (r2.rc, r2.stderr, r2.timed_out) == (4, "err\n", False)
    assert server.connections == 1
    assert server.commands[0].startswith("exec env LC_ALL=C timeout --signal=KILL 10 printf")


def test_known_hosts_with_markers_hashes_and_junk_still_verifies(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    name = f"[127.0.0.1]:{server.port}"
    other: paramiko.PKey = keys["other_host"]  # type: ignore[assignment]
    hashed = paramiko.HostKeys.hash_host(name)
    known = _known_hosts(
        tmp_path / "kh",
        [
            "# comment",
            f"@cert-authority *.example.org {other.get_name()} {other.get_base64()}",
            "garbage-line-without-fields",
            "badb64.example ssh-ed25519 !!!notbase64",
            "weird.example sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t",
            _entry(hashed, keys["host"]).replace(" ", "   ", 1),  # type: ignore[arg-type]
        ],
    )
    loaded = load_known_hosts(known)
    assert len(loaded.entries) == 1 and loaded.entries[0][0].startswith("|1|")
    assert {n for n, _ in loaded.skipped} == {2, 3, 4, 5}
    t = SSHTransport(_cfg(server, keys, known))
    try:
        assert t.run(["true"], timeout=5).ok
    finally:
        t.close()


def test_unknown_host_key_rejected_unless_opted_in(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    known = _known_hosts(tmp_path / "kh", [_entry("elsewhere", keys["host"])])  # type: ignore[arg-type]
    with pytest.raises(HostKeyRejected, match="unknown"):
        SSHTransport(_cfg(server, keys, known)).run(["true"], timeout=5)
    assert server.commands == []
    t = SSHTransport(_cfg(server, keys, known, accept_unknown_host_keys=True))
    try:
        assert t.run(["true"], timeout=5).ok
    finally:
        t.close()


def test_changed_and_revoked_host_keys_rejected(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    name = f"[127.0.0.1]:{server.port}"
    changed = _known_hosts(tmp_path / "kh1", [_entry(name, keys["other_host"])])  # type: ignore[arg-type]
    with pytest.raises(HostKeyRejected, match="mismatch"):
        SSHTransport(_cfg(server, keys, changed)).run(["true"], timeout=5)
    revoked = _known_hosts(
        tmp_path / "kh2",
        [
            _entry(name, keys["host"]),  # type: ignore[arg-type]
            "@revoked " + _entry("*", keys["host"]),  # type: ignore[arg-type]
        ],
    )
    with pytest.raises(HostKeyRejected, match="revoked"):
        SSHTransport(_cfg(server, keys, revoked)).run(["true"], timeout=5)
    assert server.commands == []


def test_wrong_client_key_is_auth_failure(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    wrong: paramiko.PKey = keys["wrong_client"]  # type: ignore[assignment]
    key_file = tmp_path / "wrong"
    wrong.write_private_key_file(str(key_file))  # type: ignore[attr-defined]
    name = f"[127.0.0.1]:{server.port}"
    known = _known_hosts(tmp_path / "kh", [_entry(name, keys["host"])])  # type: ignore[arg-type]
    cfg = dataclasses.replace(_cfg(server, keys, known), key_file=key_file)
    with pytest.raises(AuthFailed):
        SSHTransport(cfg).run(["true"], timeout=5)


def test_refused_and_silent_hosts_are_unreachable_within_timeouts(tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    cfg = SSHConfig(
        host="dead",
        address="127.0.0.1",
        port=port,
        connect_timeout_s=2,
        banner_timeout_s=1,
        auth_timeout_s=1,
    )
    with pytest.raises(Unreachable):
        SSHTransport(cfg).run(["true"], timeout=5)
    # A host that accepts TCP but never speaks SSH (a hung sshd) must not block for minutes.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        cfg = SSHConfig(
            host="hung",
            address="127.0.0.1",
            port=silent.getsockname()[1],
            connect_timeout_s=1,
            banner_timeout_s=1,
            auth_timeout_s=1,
        )
        start = time.monotonic()
        with pytest.raises(Unreachable):
            SSHTransport(cfg).run(["true"], timeout=5)
        assert time.monotonic() - start < 4
    finally:
        silent.close()


def test_ssh_timeout_kills_remote_command_and_children(
    server: SSHServer, keys: dict[str, object], tmp_path: Path
) -> None:
    name = f"[127.0.0.1]:{server.port}"
    known = _known_hosts(tmp_path / "kh", [_entry(name, keys["host"])])  # type: ignore[arg-type]
    pidfile = tmp_path / "pids"
    t = SSHTransport(_cfg(server, keys, known))
    try:
        start = time.monotonic()
        r = t.run(
            ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo $$ >> {pidfile}; wait"], timeout=1
        )
        assert r.timed_out and r.rc == -1
        assert time.monotonic() - start < 4
        pids = [int(x) for x in pidfile.read_text().split()]
        assert len(pids) == 2 and _wait_dead(pids)
        # The connection survives a timed-out command.
        assert t.run(["echo", "after"], timeout=5).stdout == "after\n"
        assert server.connections == 1
    finally:
        t.close()
