"""A hostile SSH server for tests: many endpoints from one process, each misbehaving on purpose.

Every endpoint listens on its own address/port (``127.0.21.0/24`` in this project's tests) with
its own host key; :meth:`HostileSSHServer.known_hosts` writes them all into one known_hosts
file, so the client under test keeps host key checking on. The server side is paramiko's
(``paramiko.ServerInterface``), driven the way sshd drives a session: an exec request runs
``sh -c <command>`` in a new session with its stdin connected to the channel, and the
command's stdin is closed when the client's channel goes away (sshd sends no SIGHUP to a command
without a pty; what the command does about that EOF is the client's business). A pty request
is granted but no pty is made. A direct-tcpip channel (``ssh -J``: the endpoint as a jump host)
is forwarded to its destination over TCP, as sshd forwards it.

Behaviours (``Endpoint.behaviour``), in the order a conversation meets them:

========================  ======================================================================
``refuse``                the port is bound but not listening: connect() gets a reset
``silent``                accepts TCP, never sends a byte (a hung sshd before its banner)
``garbage``               accepts TCP, sends a non-SSH answer and hangs up
``banner_stall``          sends a valid SSH banner, then nothing (key exchange never completes)
``wrong_key``             presents a host key that is not the one in known_hosts
``auth_reject``           refuses every key
``auth_stall``            never answers the authentication request
``open_stall``            never answers the channel-open request
``exec_stall``            never answers the exec request (the finding of issue 8)
``exec_late``             answers the exec request after ``delay_s``, then behaves as ``ok``
``ok``                    answers from ``responses`` (canned, usually real captures), else runs
                          the command for real (``exec``) when ``run_commands`` is set
``slow``                  as ``ok``, each answer after ``delay_s``
``status_first``          sends the exit status, then (after ``delay_s``) the rest of stdout
``status_no_eof``         sends output and exit status but never EOF or close
``close_no_status``       sends output and closes the channel without an exit status
``flood``                 sends output without end until the client closes the channel
``drop``                  sends part of the output, then resets the TCP connection
``freeze``                sends part of the output, then stops reading and writing entirely
                          (TCP stays up: the kernel still ACKs, only SSH keepalives notice)
``output_stall``          sends part of the output, then holds the channel open forever while
                          the connection itself stays responsive (keepalives are answered)
========================  ======================================================================

The server records what happened as events (``connect``, ``auth``, ``exec``, ``pid``,
``channel_closed``, ``flood_bytes`` ...), in memory and, when run as a program, as JSON lines in
an events file, so that tests wait for a condition instead of sleeping.

Run as a program (a separate process keeps the server's work off the client's GIL)::

    python -m tests.hostile_ssh SPEC.json

SPEC: ``{"client_key": "<public key file>", "known_hosts": "<path to write>",
"events": "<jsonl path>", "endpoints": [{"name": ..., "address": ..., "behaviour": ...,
"delay_s": ..., "responses": [[substring, {"stdout_file"|"stdout", "stderr", "rc"}], ...],
"run_commands": bool, "path_prepend": "<dir>"}]}``. It prints one line ``READY <json>`` (the
endpoints with their ports) when every socket is bound, and serves until SIGTERM.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

BEHAVIOURS = (
    "refuse",
    "silent",
    "garbage",
    "banner_stall",
    "wrong_key",
    "auth_reject",
    "auth_stall",
    "open_stall",
    "exec_stall",
    "exec_late",
    "ok",
    "slow",
    "status_first",
    "status_no_eof",
    "close_no_status",
    "flood",
    "drop",
    "freeze",
    "output_stall",
)
# Behaviours decided before any SSH is spoken: the connection never reaches paramiko.
_RAW = ("silent", "garbage", "banner_stall")
GARBAGE = b"HTTP/1.1 400 Bad Request\r\nServer: not-ssh\r\n\r\n\x00\xff\xfe garbage"
SSH_BANNER = b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"


@dataclass
class Endpoint:
    """One listening address and how it misbehaves. ``port`` 0 picks a free port."""

    name: str
    address: str
    behaviour: str
    port: int = 0
    delay_s: float = 0.0
    # (substring of the exec command, answer): the first match answers. An answer has
    # ``stdout`` or ``stdout_file``, ``stderr`` and ``rc``.
    responses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    run_commands: bool = False
    path_prepend: str = ""
    host_key: paramiko.PKey | None = None
    presented_key: paramiko.PKey | None = None  # wrong_key: what the server shows instead

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port,
                "behaviour": self.behaviour}


class _FreezableSocket:
    """A socket whose reads and writes can be stopped for good (``freeze``), while the TCP
    connection stays open: paramiko's packetizer sees timeouts and keeps waiting."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.frozen = threading.Event()

    def recv(self, n: int) -> bytes:
        if self.frozen.is_set():
            time.sleep(0.1)
            raise TimeoutError
        return self._sock.recv(n)

    def send(self, data: bytes) -> int:
        if self.frozen.is_set():
            time.sleep(0.1)
            raise TimeoutError
        return self._sock.send(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _ReplyingTransport(paramiko.Transport):
    """A server transport that says when it has replied to a channel request.

    paramiko's server sends the reply to an exec request only after
    ``check_channel_exec_request`` returns, from the transport thread; the thread answering the
    command could send its output, exit status and close before that reply, and the client
    then saw the close first and reported "Channel closed." for a healthy endpoint (one run in
    eight of the 64-host test). sshd replies first; so does this server: a channel's answer
    waits for :meth:`replied`."""

    def __init__(self, sock: Any) -> None:
        super().__init__(sock)
        self._replies: dict[int, threading.Event] = {}
        self._replies_lock = threading.Lock()

    def replied(self, remote_chanid: int) -> threading.Event:
        with self._replies_lock:
            return self._replies.setdefault(remote_chanid, threading.Event())

    def forget(self, remote_chanid: int) -> None:
        """The client may reuse a channel number once its channel is closed."""
        with self._replies_lock:
            self._replies.pop(remote_chanid, None)

    def _send_user_message(self, data: Any) -> None:
        super()._send_user_message(data)  # type: ignore[misc]
        raw = data.asbytes()
        if raw[:1] in (paramiko.common.cMSG_CHANNEL_SUCCESS, paramiko.common.cMSG_CHANNEL_FAILURE):
            self.replied(struct.unpack(">I", raw[1:5])[0]).set()


class _Session(paramiko.ServerInterface):
    """paramiko's server callbacks for one connection of one endpoint."""

    def __init__(self, server: HostileSSHServer, ep: Endpoint) -> None:
        self.server = server
        self.ep = ep
        self.commands: dict[int, str] = {}
        self.exec_ready: dict[int, threading.Event] = {}
        self.forwards: dict[int, tuple[str, int]] = {}  # direct-tcpip channels: destination

    def _hold(self) -> None:
        self.server.stopping.wait()

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.server.event(self.ep, "auth", user=username)
        if self.ep.behaviour == "auth_stall":
            self._hold()
            return paramiko.AUTH_FAILED
        if self.ep.behaviour == "auth_reject" or key != self.server.client_key:
            return paramiko.AUTH_FAILED
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if self.ep.behaviour == "open_stall":
            self.server.event(self.ep, "open_stalled")
            self._hold()
        self.exec_ready[chanid] = threading.Event()
        return paramiko.OPEN_SUCCEEDED if kind == "session" else (
            paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED)

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        # A jump host (ssh -J): the channel is a TCP connection the server makes to
        # ``destination``, as sshd makes it (open_stall holds this open request too).
        self.server.event(self.ep, "direct_tcpip", destination=list(destination))
        if self.ep.behaviour == "open_stall":
            self._hold()
        self.forwards[chanid] = (str(destination[0]), int(destination[1]))
        return paramiko.OPEN_SUCCEEDED

    def check_channel_pty_request(self, channel: paramiko.Channel, term: bytes, width: int,
                                  height: int, pixelwidth: int, pixelheight: int,
                                  modes: bytes) -> bool:
        # Granted, as sshd grants it, though no pty is made (the command runs as without one).
        # Refused, an OpenSSH client run with -tt (Ansible's raw module) closes the session
        # when the refusal arrives: exit 255, "unreachable", whenever that beats the command's
        # exit status.
        return True

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode("utf-8", "replace")
        self.server.event(self.ep, "exec", command=text)
        if self.ep.behaviour == "exec_stall":
            self._hold()
            return False
        if self.ep.behaviour == "exec_late":
            time.sleep(self.ep.delay_s)
        self.commands[channel.get_id()] = text
        self.exec_ready.setdefault(channel.get_id(), threading.Event()).set()
        return True

    def check_global_request(self, kind: str, msg: paramiko.Message) -> bool:
        # OpenSSH answers keepalive@openssh.com with a failure reply; so do we.
        return False


class HostileSSHServer:
    """Serves every endpoint from this process; see the module docstring."""

    def __init__(self, endpoints: list[Endpoint], client_key: paramiko.PKey,
                 events_file: Path | None = None) -> None:
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError("endpoint names must be unique")
        for ep in endpoints:
            if ep.behaviour not in BEHAVIOURS:
                raise ValueError(f"{ep.name}: unknown behaviour {ep.behaviour!r}")
            ep.host_key = ep.host_key or paramiko.ECDSAKey.generate()
            if ep.behaviour == "wrong_key":
                ep.presented_key = paramiko.ECDSAKey.generate()
        self.endpoints = {e.name: e for e in endpoints}
        self.client_key = client_key
        self.stopping = threading.Event()
        self._events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._events_file = events_file.open("a", encoding="utf-8") if events_file else None
        self._listeners: list[socket.socket] = []
        self._conns: list[socket.socket] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._open_now = 0
        self.max_open = 0

    # ------------------------------------------------------------------ events

    def event(self, ep: Endpoint, kind: str, **data: Any) -> None:
        record = {"t": time.time(), "endpoint": ep.name, "event": kind, **data}
        with self._cond:
            self._events.append(record)
            if self._events_file is not None:  # None once stopped (a last "disconnect")
                self._events_file.write(json.dumps(record) + "\n")
                self._events_file.flush()
            self._cond.notify_all()

    def events(self, endpoint: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self._events if (endpoint is None or e["endpoint"] == endpoint)
                    and (kind is None or e["event"] == kind)]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool],
                 timeout: float = 10.0) -> bool:
        """Wait until ``predicate(all events)`` holds (a condition, not a sleep)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._events), timeout)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> HostileSSHServer:
        for ep in self.endpoints.values():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ep.address, ep.port))
            ep.port = sock.getsockname()[1]
            self._listeners.append(sock)
            if ep.behaviour == "refuse":
                continue  # bound, never listening: the kernel answers SYN with RST
            sock.listen(64)
            threading.Thread(target=self._accept, args=(ep, sock), daemon=True,
                             name=f"hostile-{ep.name}").start()
        return self

    def known_hosts(self, path: Path) -> Path:
        """Write every endpoint's (real) host key as ``[address]:port type key``."""
        lines = []
        for ep in self.endpoints.values():
            assert ep.host_key is not None
            lines.append(f"[{ep.address}]:{ep.port} {ep.host_key.get_name()} "
                         f"{ep.host_key.get_base64()}")
        path.write_text("\n".join(lines) + "\n")
        return path

    def stop(self) -> None:
        self.stopping.set()
        for sock in (*self._listeners, *self._conns):
            with contextlib.suppress(OSError):
                sock.close()
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with self._cond:
            if self._events_file is not None:
                self._events_file.close()
                self._events_file = None

    def __enter__(self) -> HostileSSHServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ connections

    def _accept(self, ep: Endpoint, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            with self._cond:
                self._open_now += 1
                self.max_open = max(self.max_open, self._open_now)
            self.event(ep, "connect", open_now=self._open_now)
            threading.Thread(target=self._serve, args=(ep, conn), daemon=True).start()

    def _serve(self, ep: Endpoint, conn: socket.socket) -> None:
        try:
            if ep.behaviour in _RAW:
                if ep.behaviour == "garbage":
                    conn.sendall(GARBAGE)  # and hang up, as a web server on port 22 would
                    conn.close()
                    return
                if ep.behaviour == "banner_stall":
                    conn.sendall(SSH_BANNER)
                self.stopping.wait()
                return
            self._serve_ssh(ep, conn)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self._cond:
                self._open_now -= 1
            self.event(ep, "disconnect")

    def _serve_ssh(self, ep: Endpoint, conn: socket.socket) -> None:
        wrapped = _FreezableSocket(conn)
        transport = _ReplyingTransport(wrapped)
        transport.add_server_key(ep.presented_key or ep.host_key)  # type: ignore[arg-type]
        session = _Session(self, ep)
        transport.start_server(server=session)
        try:
            while transport.is_active() and not self.stopping.is_set():
                chan = transport.accept(0.5)
                if chan is None:
                    continue
                if chan.get_id() in session.forwards:
                    threading.Thread(target=self._forward,
                                     args=(ep, chan, session.forwards[chan.get_id()]),
                                     daemon=True).start()
                    continue
                threading.Thread(target=self._channel, args=(ep, session, chan, wrapped, conn),
                                 daemon=True).start()
        finally:
            transport.close()

    def _channel(self, ep: Endpoint, session: _Session, chan: paramiko.Channel,
                 wrapped: _FreezableSocket, conn: socket.socket) -> None:
        ready = session.exec_ready.setdefault(chan.get_id(), threading.Event())
        while not ready.wait(0.2):
            if chan.closed or self.stopping.is_set():
                return
        command = session.commands[chan.get_id()]
        transport = chan.get_transport()
        assert isinstance(transport, _ReplyingTransport)
        replied = transport.replied(chan.remote_chanid)
        while not replied.wait(0.2):
            if chan.closed or self.stopping.is_set():
                return
        try:
            self._answer(ep, chan, command, wrapped, conn)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            transport.forget(chan.remote_chanid)
            if ep.behaviour not in ("status_no_eof", "output_stall", "freeze"):
                with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                    chan.close()
            self.event(ep, "channel_closed", command=command)

    def _forward(self, ep: Endpoint, chan: paramiko.Channel, destination: tuple[str, int]
                 ) -> None:
        """A direct-tcpip channel: bytes both ways between it and a TCP connection to
        ``destination``, until either side ends (then both are closed, as sshd does)."""
        try:
            peer = socket.create_connection(destination, timeout=5)
        except OSError:
            chan.close()
            return
        peer.settimeout(None)

        def to_peer() -> None:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                while data := chan.recv(65536):
                    peer.sendall(data)
            with contextlib.suppress(OSError):
                peer.shutdown(socket.SHUT_WR)

        pump = threading.Thread(target=to_peer, daemon=True)
        pump.start()
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while data := peer.recv(65536):
                chan.sendall(data)
        pump.join(5)
        peer.close()
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            chan.close()
        self.event(ep, "forward_closed", destination=list(destination))

    # ------------------------------------------------------------------ answers

    def _canned(self, ep: Endpoint, command: str) -> tuple[bytes, bytes, int] | None:
        for needle, answer in ep.responses:
            if needle in command:
                if "stdout_file" in answer:
                    out = Path(answer["stdout_file"]).read_bytes()
                else:
                    out = str(answer.get("stdout", "")).encode()
                return out, str(answer.get("stderr", "")).encode(), int(answer.get("rc", 0))
        return None

    def _answer(self, ep: Endpoint, chan: paramiko.Channel, command: str,
                wrapped: _FreezableSocket, conn: socket.socket) -> None:
        b = ep.behaviour
        if b == "flood":
            self._flood(ep, chan)
            return
        canned = self._canned(ep, command)
        if canned is None and ep.run_commands:
            self._exec(ep, chan, command)
            return
        out, err, rc = canned or (b"", b"sh: 1: command not found\n", 127)
        if b == "slow":
            time.sleep(ep.delay_s)
        half = max(1, len(out) // 2)
        if b == "status_first":
            # Exit status first, the last part of stdout afterwards: a client that stops
            # reading when the status arrives loses the end (an Xid line, say).
            chan.sendall(out[:half])
            chan.sendall_stderr(err)
            chan.send_exit_status(rc)
            time.sleep(ep.delay_s)
            chan.sendall(out[half:])
            chan.shutdown_write()
            return
        if b in ("drop", "freeze", "output_stall"):
            chan.sendall(out[:half])
            time.sleep(0.2)  # let the partial output reach the client first
            if b == "drop":
                # An RST, not a FIN: a host that died, a link that went away.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            elif b == "freeze":
                wrapped.frozen.set()
                self.event(ep, "frozen")
                self.stopping.wait()
            else:
                self.event(ep, "output_stalled")
                self.stopping.wait()
            return
        chan.sendall(out)
        chan.sendall_stderr(err)
        if b == "close_no_status":
            return
        chan.send_exit_status(rc)
        if b == "status_no_eof":
            self.stopping.wait()
            return
        chan.shutdown_write()

    def _flood(self, ep: Endpoint, chan: paramiko.Channel) -> None:
        block = b"flood " * 10922 + b"\n"  # 64 KiB lines of text
        sent = 0
        try:
            while not chan.closed and not self.stopping.is_set():
                chan.sendall(block)
                sent += len(block)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        self.event(ep, "flood_bytes", sent=sent)

    def _exec(self, ep: Endpoint, chan: paramiko.Channel, command: str) -> None:
        """Run the command as sshd does: ``sh -c`` in a new session, stdin from the channel."""
        env = dict(os.environ)
        if ep.path_prepend:
            env["PATH"] = f"{ep.path_prepend}:{env['PATH']}"
        proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env=env)
        self._procs.append(proc)
        self.event(ep, "pid", pid=proc.pid, command=command)

        def stdin_pump() -> None:
            assert proc.stdin is not None
            try:
                while True:
                    data = chan.recv(4096)
                    if not data:
                        break
                    proc.stdin.write(data)
                    proc.stdin.flush()
            except (OSError, EOFError):
                pass
            finally:
                # sshd closes the command's stdin when the channel sees EOF or goes away.
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                self.event(ep, "stdin_closed", pid=proc.pid)

        def stderr_pump() -> None:
            assert proc.stderr is not None
            try:
                for chunk in iter(lambda: proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
                    chan.sendall_stderr(chunk)
            except OSError:
                pass

        threading.Thread(target=stdin_pump, daemon=True).start()
        err_thread = threading.Thread(target=stderr_pump, daemon=True)
        err_thread.start()
        assert proc.stdout is not None
        try:
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
                chan.sendall(chunk)
        except OSError:
            pass
        err_thread.join()
        rc = proc.wait()
        self.event(ep, "exited", pid=proc.pid, rc=rc)
        if rc >= 0 and not chan.closed:
            chan.send_exit_status(rc)
            chan.shutdown_write()


# ---------------------------------------------------------------------- as a program


def _endpoint_from(spec: dict[str, Any]) -> Endpoint:
    return Endpoint(
        name=spec["name"], address=spec["address"], behaviour=spec["behaviour"],
        port=int(spec.get("port", 0)), delay_s=float(spec.get("delay_s", 0.0)),
        responses=[(str(n), dict(a)) for n, a in spec.get("responses", [])],
        run_commands=bool(spec.get("run_commands", False)),
        path_prepend=str(spec.get("path_prepend", "")),
    )


@contextlib.contextmanager
def serve(spec: dict[str, Any]) -> Iterator[HostileSSHServer]:
    """The server described by a SPEC (module docstring), started, known_hosts written."""
    client_key = load_public_key(Path(spec["client_key"]))
    server = HostileSSHServer([_endpoint_from(e) for e in spec["endpoints"]], client_key,
                              Path(spec["events"]) if spec.get("events") else None)
    server.start()
    try:
        server.known_hosts(Path(spec["known_hosts"]))
        yield server
    finally:
        server.stop()


def load_public_key(path: Path) -> paramiko.PKey:
    """An OpenSSH ``.pub`` line (``type base64 [comment]``) as a paramiko key."""
    kind, data = path.read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(data))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with serve(spec) as server:
        ready = [e.public() for e in server.endpoints.values()]
        sys.stdout.write("READY " + json.dumps(ready) + "\n")
        sys.stdout.flush()
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
