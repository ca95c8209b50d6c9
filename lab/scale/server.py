"""The harness's SSH server: every endpoint of a plan from one asyncio event loop (asyncssh).

Why asyncssh: 1,000 endpoints in one process need an SSH server that does not spend a thread
per connection; asyncssh serves each connection as a coroutine, and measured here it answered
1,000 endpoints' handshakes and commands at a fraction of the validators' own CPU
(docs/lab.md, "The scale harness"). paramiko's server mode needs a thread (and a transport
thread) per connection, and 1,000 OpenSSH ``sshd -i`` processes would cost the machine more
than the validators under test.

Each endpoint listens on its own address:port with its own ed25519 host key; the client key is
the harness's (``<dir>/id_ed25519``), the only one authorized. ``refuse`` endpoints do not
listen at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from lab.scale.answers import Host, parse_command
from lab.scale.plan import Endpoint

LOG = logging.getLogger(__name__)
# GNU timeout --signal=KILL kills its own process group: the wrapper's shell exits 137.
TIMEOUT_KILLED_RC = 137
# Time for a drop's partial output to leave before the connection is cut.
_DROP_FLUSH_S = 0.05


@dataclass
class Listening:
    acceptors: list[asyncssh.SSHAcceptor]
    known_hosts: str  # OpenSSH known_hosts lines, one per endpoint (refused ones too)


class _Server(asyncssh.SSHServer):
    def __init__(self, host: Host) -> None:
        self.host = host
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True  # public key only (the acceptor's authorized_client_keys)


async def _serve_command(server: _Server, process: asyncssh.SSHServerProcess[str]) -> None:
    host, endpoint = server.host, server.host.endpoint
    command = parse_command(process.command or "")
    try:
        if endpoint.latency_s:
            await asyncio.sleep(endpoint.latency_s)
        answer = host.answer(command.argv)
        if endpoint.failure == "stall" or answer.hang:
            if command.timeout_s is None:
                await process.wait_closed()  # hangs until the client gives up
                return
            await asyncio.sleep(command.timeout_s)
            process.stdout.write_eof()
            process.exit(TIMEOUT_KILLED_RC)
            return
        if endpoint.failure == "drop":
            process.stdout.write(answer.stdout[: len(answer.stdout) // 2])
            await process.stdout.drain()
            await asyncio.sleep(_DROP_FLUSH_S)
            if server.conn is not None:
                server.conn.abort()  # cut TCP: no EOF, no exit status, no disconnect message
            return
        process.stdout.write(answer.stdout)
        # OpenSSH's order: output, EOF, exit status, close (the validators read EOF first).
        process.stdout.write_eof()
        process.exit(answer.rc)
    except (asyncssh.BreakReceived, asyncssh.SignalReceived, asyncssh.TerminalSizeChanged,
            BrokenPipeError, ConnectionError):
        process.close()


def _host_key_line(endpoint: Endpoint, key: asyncssh.SSHKey) -> str:
    public = key.export_public_key().decode().split()
    return f"[{endpoint.address}]:{endpoint.port} {public[0]} {public[1]}\n"


def client_key(directory: Path) -> asyncssh.SSHKey:
    """The harness's client key (made once, kept in ``directory``), in OpenSSH format so that
    paramiko and ``ssh -i`` read it."""
    path = directory / "id_ed25519"
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuready-scale-harness")
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.export_private_key("openssh"))
        path.with_suffix(".pub").write_bytes(key.export_public_key())
    return asyncssh.read_private_key(str(path))


async def listen(endpoints: list[Endpoint], hosts: dict[str, Host],
                 authorized: asyncssh.SSHKey) -> Listening:
    """Start every endpoint's listener (not the ``refuse`` ones); return them and the
    known_hosts lines."""
    auth = asyncssh.import_authorized_keys(authorized.export_public_key().decode())
    acceptors = []
    lines = []
    for endpoint in endpoints:
        key = asyncssh.generate_private_key("ssh-ed25519")
        lines.append(_host_key_line(endpoint, key))
        if endpoint.failure == "refuse":
            continue
        host = hosts[endpoint.name]

        def factory(host: Host = host) -> _Server:
            return _Server(host)

        def process_factory(process: asyncssh.SSHServerProcess[str]) -> asyncio.Task[None]:
            server = process.channel.get_connection().get_owner()
            assert isinstance(server, _Server)
            return asyncio.ensure_future(_serve_command(server, process))

        acceptors.append(await asyncssh.create_server(
            factory, endpoint.address, endpoint.port, server_host_keys=[key],
            authorized_client_keys=auth, process_factory=process_factory,
            encoding="utf-8", reuse_address=True, backlog=1024,
            # No login banner, no agent/X11/port forwarding: only exec requests.
            allow_pty=False, agent_forwarding=False, x11_forwarding=False,
            keepalive_interval=0))
    return Listening(acceptors, "".join(lines))


async def close(listening: Listening) -> None:
    for acceptor in listening.acceptors:
        acceptor.close()
    for acceptor in listening.acceptors:
        with contextlib.suppress(Exception):
            await acceptor.wait_closed()
