"""SSH transport on paramiko: verified host keys, bounded timeouts, one connection per host.

Why not ``SSHClient.load_host_keys``: paramiko's loader aborts on lines it cannot read
(``@cert-authority``/``@revoked`` markers, unknown key types, several spaces between fields),
while real known_hosts files carry them. :func:`load_known_hosts` reads line by line, keeps what
paramiko can verify (plain and hashed ``|1|`` names), remembers ``@revoked`` keys so that they
are refused, and logs a warning for each line it skips.

Remote commands run as ``exec env LC_ALL=C timeout --signal=KILL <s> <argv...>`` (argv joined
with :func:`shlex.join`): GNU timeout puts the command in its own process group and kills the
whole group when the wall clock runs out, so nothing the tool forked keeps running on the node.
A local backstop closes the channel a few seconds later in case the node itself stalls.
"""

from __future__ import annotations

import base64
import binascii
import logging
import select
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from validate.transport.base import (
    AuthFailed,
    CommandResult,
    HostKeyRejected,
    TransportError,
    Unreachable,
)

LOG = logging.getLogger(__name__)

# Seconds the local side waits beyond the remote `timeout` before giving up on the channel.
BACKSTOP_S = 5.0
# GNU timeout exits 124 after TERM and 128+9 when the signal was KILL; since it also signals its
# own process group, sshd usually reports an exit *signal*, which paramiko shows as -1.
_TIMEOUT_RCS = (124, 137, -1)


@dataclass(frozen=True, slots=True)
class KnownHosts:
    """Host keys paramiko can verify, plus keys marked ``@revoked``.

    ``skipped`` lists ``(lineno, reason)`` for each line not loaded."""

    entries: tuple[tuple[str, paramiko.PKey], ...]  # (hostname or |1| hash, key)
    revoked: tuple[paramiko.PKey, ...]
    skipped: tuple[tuple[int, str], ...]


def load_known_hosts(path: Path) -> KnownHosts:
    """Read an OpenSSH known_hosts file tolerantly (see module docstring)."""
    entries: list[tuple[str, paramiko.PKey]] = []
    revoked: list[paramiko.PKey] = []
    skipped: list[tuple[int, str]] = []
    text = path.read_text(encoding="utf-8", errors="replace")
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            skipped.append((lineno, "too few fields"))
            continue
        names, key_type, key_b64 = fields[0], fields[1], fields[2]
        if marker == "@cert-authority":
            # paramiko cannot check host certificates; hosts trusted only through a CA are
            # rejected unless unknown keys are accepted explicitly.
            skipped.append((lineno, "@cert-authority (host certificates not supported)"))
            continue
        if marker and marker != "@revoked":
            skipped.append((lineno, f"unknown marker {marker}"))
            continue
        try:
            key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
        except (binascii.Error, ValueError) as exc:
            skipped.append((lineno, f"bad key data: {exc}"))
            continue
        except Exception as exc:  # paramiko raises UnknownKeyType (a bare Exception)
            skipped.append((lineno, f"unsupported key type {key_type}: {exc}"))
            continue
        if marker == "@revoked":
            revoked.append(key)
            continue
        entries.extend((name, key) for name in names.split(","))
    for lineno, reason in skipped:
        LOG.warning("%s:%d skipped: %s", path, lineno, reason)
    return KnownHosts(tuple(entries), tuple(revoked), tuple(skipped))


@dataclass(frozen=True, slots=True)
class SSHConfig:
    """Connection settings for one host, normally read from the inventory."""

    host: str  # inventory name, used in rows and errors
    address: str  # ansible_host
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None
    accept_unknown_host_keys: bool = False
    connect_timeout_s: float = 10.0
    banner_timeout_s: float = 10.0
    auth_timeout_s: float = 10.0
    extra: dict[str, str] = field(default_factory=dict)


class _RecordingPolicy(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key only when the user opted in; always remember what was seen."""

    def __init__(self, accept: bool) -> None:
        self.accept = accept

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self.accept:
            raise HostKeyRejected(
                hostname,
                f"unknown {key.get_name()} host key {key.fingerprint}; add it to known_hosts "
                "or accept unknown host keys explicitly",
            )
        LOG.warning("%s: accepting unknown host key %s (opt-in)", hostname, key.fingerprint)


class SSHTransport:
    """One paramiko connection to one host, opened on first use and reused for every command.

    Thread-safe for sequential use by one worker; the runner gives each host its own worker."""

    def __init__(self, config: SSHConfig) -> None:
        self.config = config
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    @property
    def host(self) -> str:
        return self.config.host

    def _connect(self) -> paramiko.SSHClient:
        cfg = self.config
        client = paramiko.SSHClient()
        if cfg.known_hosts is not None:
            try:
                known = load_known_hosts(cfg.known_hosts)
            except OSError as exc:
                raise HostKeyRejected(cfg.host, f"cannot read known_hosts: {exc}") from exc
            store = client.get_host_keys()
            for name, key in known.entries:
                store.add(name, key.get_name(), key)
            revoked = known.revoked
        else:
            revoked = ()
        client.set_missing_host_key_policy(_RecordingPolicy(cfg.accept_unknown_host_keys))
        pkey: paramiko.PKey | None = None
        if cfg.key_file is not None:
            try:
                pkey = paramiko.PKey.from_path(cfg.key_file)
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise AuthFailed(cfg.host, f"cannot load key {cfg.key_file}: {exc}") from exc
        try:
            client.connect(
                cfg.address,
                port=cfg.port,
                username=cfg.user,
                pkey=pkey,
                timeout=cfg.connect_timeout_s,
                banner_timeout=cfg.banner_timeout_s,
                auth_timeout=cfg.auth_timeout_s,
                channel_timeout=cfg.connect_timeout_s,
                allow_agent=False,
                look_for_keys=cfg.key_file is None,
            )
        except HostKeyRejected:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(
                cfg.host,
                f"host key mismatch: got {exc.key.fingerprint}, "
                f"known_hosts has {exc.expected_key.fingerprint}",
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthFailed(cfg.host, f"authentication as {cfg.user} failed: {exc}") from exc
        except (OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            reason = str(exc) or type(exc).__name__
            raise Unreachable(cfg.host, f"{cfg.address}:{cfg.port}: {reason}") from exc
        transport = client.get_transport()
        server_key = transport.get_remote_server_key() if transport else None
        if server_key is not None and any(server_key == r for r in revoked):
            client.close()
            raise HostKeyRejected(cfg.host, f"host key {server_key.fingerprint} is @revoked")
        return client

    def _client_for_run(self) -> paramiko.SSHClient:
        client = self._client
        transport = client.get_transport() if client else None
        if client is None or transport is None or not transport.is_active():
            if client is not None:
                client.close()
            self._client = self._connect()
        assert self._client is not None
        return self._client

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run argv under a remote wall-clock kill; raise :class:`TransportError` subclasses
        only when the host cannot be asked at all."""
        args = tuple(argv)
        remote = shlex.join(
            ["exec", "env", "LC_ALL=C", "timeout", "--signal=KILL", f"{timeout:g}", *args]
        )
        with self._lock:
            client = self._client_for_run()
            start = time.monotonic()
            transport = client.get_transport()
            if transport is None:
                raise Unreachable(self.host, "connection lost")
            try:
                chan = transport.open_session(timeout=self.config.connect_timeout_s)
                chan.exec_command(remote)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                client.close()
                self._client = None
                raise Unreachable(self.host, f"cannot open a session: {exc}") from exc
            return self._collect(chan, args, timeout, start)

    def _collect(
        self, chan: paramiko.Channel, args: tuple[str, ...], timeout: float, start: float
    ) -> CommandResult:
        out: list[bytes] = []
        err: list[bytes] = []
        deadline = start + timeout + BACKSTOP_S
        backstop_fired = False
        chan.shutdown_write()
        while True:
            while chan.recv_ready():
                out.append(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                backstop_fired = True
                break
            # The channel's fileno becomes readable on data, stderr data or close.
            try:
                select.select([chan], [], [], min(remaining, 1.0))
            except (OSError, ValueError):
                time.sleep(0.01)
        duration = time.monotonic() - start
        if backstop_fired:
            chan.close()
            return CommandResult(
                args,
                -1,
                _dec(out),
                _dec(err) + "\n[gpuready: channel closed by backstop]",
                duration,
                True,
            )
        rc = chan.recv_exit_status()
        chan.close()
        timed_out = rc in _TIMEOUT_RCS and duration >= timeout - 0.5
        return CommandResult(
            args, -1 if timed_out else rc, _dec(out), _dec(err), duration, timed_out
        )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def _dec(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", "replace")


__all__ = ["KnownHosts", "SSHConfig", "SSHTransport", "TransportError", "load_known_hosts"]
