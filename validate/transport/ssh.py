"""SSH transport on paramiko: verified host keys, every step bounded, one connection per host.

Why not ``SSHClient.load_host_keys``: paramiko's loader aborts on lines it cannot read
(``@cert-authority``/``@revoked`` markers, unknown key types, several spaces between fields),
while real known_hosts files carry them. :func:`load_known_hosts` reads line by line, keeps what
paramiko can verify (plain and hashed ``|1|`` names), remembers ``@revoked`` keys so that they
are refused, and logs a warning for each line it skips.

Every step of a node's SSH conversation has a budget, because a node can stall at any of them
and paramiko waits forever at some (``Channel.exec_command`` has no timeout at all):

- TCP connect (``connect_timeout_s``), banner (``banner_timeout_s``), key exchange
  (``connect_timeout_s``), authentication (``auth_timeout_s``): paramiko's own timeouts, with a
  watchdog over the whole handshake as a backstop;
- channel open and exec request (``channel_timeout_s`` each): the watchdog;
- reading: the command's wall clock plus :data:`BACKSTOP_S`, the output cap
  (``max_output_bytes``), and keepalives: every ``keepalive_s`` an
  ``keepalive@openssh.com`` request that must be answered within ``keepalive_s`` (a peer that
  died or froze is noticed within about twice that; TCP keepalive and ``TCP_USER_TIMEOUT``
  cover a host that vanished from the network);
- close: never waits for the peer.

The watchdog (one thread per transport) enforces a budget by shutting the socket and closing
the paramiko transport, which ends every blocked paramiko wait; :meth:`SSHTransport.abort` does
the same from the runner (node deadline, interrupt). A stalled step raises
:class:`~validate.transport.Unresponsive` (``host.unresponsive``).

Remote commands run under :data:`REMOTE_WRAPPER` (see :func:`remote_command`): GNU ``timeout``
bounds the wall clock and kills the command's process group, and a watcher kills it as soon as
the SSH session goes away (sshd sends no SIGHUP to a command without a pty, so without it a
killed validator would leave fio or NCCL running). When the command has ended, whatever it
left running, in its process group or not (a ``setsid`` child), is killed too: nothing a check
started outlives it. Output is read to EOF on both streams before
the exit status is taken: a server may send data after the status.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import logging
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import paramiko

from validate.transport.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    Aborted,
    AuthFailed,
    CommandResult,
    HostKeyRejected,
    TransportError,
    Unreachable,
    Unresponsive,
)
from validate.transport.capture import Capture
from validate.transport.route import Hop

LOG = logging.getLogger(__name__)

# Seconds the local side waits beyond the remote `timeout` before giving up on the channel.
BACKSTOP_S = 5.0
# GNU timeout with --signal=KILL kills its own process group, itself included: the wrapper sees
# 137 (128+9); sshd reports a signal death as exit-signal, which paramiko shows as -1.
_TIMEOUT_RCS = (124, 137, -1)
# How often the watchdog looks at the budgets (a budget may be overrun by this much).
_TICK_S = 0.2

# The remote side of every command (POSIX sh; $1 is the timeout, the rest the argv). The
# command gets /dev/null as stdin; the session's stdin is kept on fd 3 for a watcher, which
# reads it until EOF: sshd closes it when the channel closes or the connection dies. The watcher
# then sends TERM to GNU timeout, which passes it to the command's process group and sends KILL
# 5 s later (--kill-after). The client never sends EOF itself, so EOF means "session gone".
#
# A process group is not the whole command: a child that calls setsid() leaves it (and its
# session), and outlives every kill aimed at the group. So the command runs with a marker in
# its environment, GPUREADY_SESSION=<this wrapper's pid and start time>, which every
# descendant inherits through setsid and double forks (Jenkins' ProcessTreeKiller finds a
# build's processes the same way). When the command has ended, by itself, by its timeout or
# with the session, the wrapper KILLs every process still carrying the marker (a few rounds,
# for one that forked meanwhile). Processes that clear their environment, or run through sudo
# (which resets it), are out of its reach.
REMOTE_WRAPPER = (
    'tok="$$.$(date +%s%N 2>/dev/null)"\n'
    "exec 3<&0 </dev/null\n"
    'GPUREADY_SESSION="$tok" timeout --signal=KILL --kill-after=5 "$@" 3<&- &\n'
    "cmd=$!\n"
    '{ cat <&3; kill -TERM "$cmd"; } >/dev/null 2>&1 &\n'
    "watch=$!\n"
    "exec 3<&-\n"
    'wait "$cmd"\n'
    "rc=$?\n"
    'kill "$watch" 2>/dev/null\n'
    "n=0\n"
    "while [ $n -lt 5 ]; do\n"
    '  left=$(grep -lzxF "GPUREADY_SESSION=$tok" /proc/[0-9]*/environ 2>/dev/null '
    "| sed -n 's|^/proc/\\([0-9]*\\)/environ$|\\1|p')\n"
    '  [ -n "$left" ] || break\n'
    "  kill -KILL $left 2>/dev/null\n"
    "  n=$((n+1))\n"
    "done 2>/dev/null\n"
    'exit "$rc"\n'
)


def remote_command(argv: Sequence[str], timeout: float) -> str:
    """The exec request for ``argv`` under :data:`REMOTE_WRAPPER` with a ``timeout`` s wall
    clock (argv is quoted with :func:`shlex.join`, never interpolated into the script)."""
    return shlex.join(
        ["exec", "env", "LC_ALL=C", "sh", "-c", REMOTE_WRAPPER, "gpuready", f"{timeout:g}",
         *argv]
    )


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


# Parsed known_hosts files by (path, mtime, size): a fleet's workers share one file, and
# parsing every key of it once per node made the parse quadratic in the fleet size.
_KNOWN_HOSTS: dict[tuple[str, int, int], KnownHosts] = {}
_KNOWN_HOSTS_LOCK = threading.Lock()


def _known_hosts_cached(path: Path) -> KnownHosts:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _KNOWN_HOSTS_LOCK:  # the others wait for one parse instead of each doing it
        known = _KNOWN_HOSTS.get(key)
        if known is None:
            known = _KNOWN_HOSTS[key] = load_known_hosts(path)
    return known


def _name_matches(entry: str, lookup: str) -> bool:
    """A known_hosts name (plain or OpenSSH-hashed ``|1|salt|hash``) against a host name."""
    if entry == lookup:
        return True
    return entry.startswith("|1|") and hmac.compare_digest(
        paramiko.HostKeys.hash_host(lookup, entry), entry
    )


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
    channel_timeout_s: float = 10.0
    keepalive_s: float = 10.0
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    backstop_s: float = BACKSTOP_S
    extra: dict[str, str] = field(default_factory=dict)
    # The way there (validate/transport/route.py): jump hosts in order, or a proxy command; and
    # more known_hosts files trusted besides ``known_hosts`` (for every hop).
    jumps: tuple[Hop, ...] = ()
    proxy_command: str | None = None
    more_known_hosts: tuple[Path, ...] = ()

    @property
    def known_hosts_files(self) -> tuple[Path, ...]:
        first = (self.known_hosts,) if self.known_hosts is not None else ()
        return first + tuple(p for p in self.more_known_hosts if p != self.known_hosts)

    @classmethod
    def with_step_timeout(cls, step_timeout_s: float, **kwargs: object) -> SSHConfig:
        """Every step budget (connect, banner, auth, channel, keepalive) set to one value."""
        steps = ("connect", "banner", "auth", "channel")
        budgets: dict[str, object] = {f"{s}_timeout_s": step_timeout_s for s in steps}
        budgets["keepalive_s"] = step_timeout_s
        return cls(**{**budgets, **kwargs})  # type: ignore[arg-type]


class _RecordingPolicy(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key only when the user opted in; always remember what was seen."""

    def __init__(self, accept: bool, label: str = "") -> None:
        self.accept = accept
        self.label = label  # "jump host user@addr:port: " for a hop in front of the node

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self.accept:
            raise HostKeyRejected(
                hostname,
                f"{self.label}unknown {key.get_name()} host key {key.fingerprint}; add it to "
                "known_hosts or accept unknown host keys explicitly",
            )
        LOG.warning("%s: accepting unknown host key %s (opt-in)", hostname, key.fingerprint)


class _HopChannel:
    """The next hop's "socket" through a jump host: a channel of the jump host's connection.

    paramiko's transport thread for the next hop closes its socket on its way out. When the
    jump host's connection is already gone (the run is over, or was torn down), closing the
    channel has to send a message on a dead connection, and the EOFError it raises in that
    thread would reach stderr as a traceback after a run that went fine. Closing never raises
    here; everything else is the channel's own."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def close(self) -> None:
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            self._channel.close()


@dataclass(frozen=True, slots=True)
class _Step:
    what: str
    budget_s: float
    deadline: float
    error: Callable[[str, str], TransportError]


class SSHTransport:
    """One paramiko connection to one host, opened on first use and reused for every command.

    ``run`` may be called from several threads at once: each command has its own channel of
    the one connection (OpenSSH allows 10 sessions per connection), and a connection attempt
    serves every run waiting for it (one that failed is not made again by a run that waited
    for it). ``abort`` and ``close`` may come from any thread."""

    # Two commands of one node may run at once (validate.checks.NodeContext.prefetch).
    concurrent_runs = True

    def __init__(self, config: SSHConfig) -> None:
        self.config = config
        self._connecting = threading.Lock()  # one connection attempt at a time
        self._state = threading.Lock()  # guards the fields below (never held while blocking)
        self._client: paramiko.SSHClient | None = None
        # The first hop's socket (or the proxy command); jump clients in front of the node.
        self._sock: socket.socket | paramiko.ProxyCommand | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._connection_done: threading.Event | None = None  # stops that connection's keepalive
        self._steps: dict[int, _Step] = {}  # the step each thread is in, by thread id
        self._attempts = 0  # connection attempts made
        self._attempting = False  # one is under way
        self._attempt_failed: TransportError | None = None  # why the latest attempt failed
        self._keepalive_since: float | None = None
        self._failure: TransportError | None = None  # why the watchdog dropped the connection
        self._aborted: Aborted | None = None
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def host(self) -> str:
        return self.config.host

    # ------------------------------------------------------------------ from any thread

    def abort(self, code: str, reason: str) -> None:
        with self._state:
            if self._aborted is None:
                self._aborted = Aborted(self.host, reason, code)
        self._drop()

    def close(self) -> None:
        self._closed.set()
        self._drop()

    def _drop(self) -> None:
        """Tear the connection down without waiting for the peer: shutting the socket wakes
        every paramiko wait on it, closing the transport closes its channels."""
        with self._state:
            client, sock, done = self._client, self._sock, self._connection_done
            jumps, self._jumps = self._jumps, []
            self._client = self._sock = self._connection_done = None
            self._keepalive_since = None
        if done is not None:
            done.set()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        # Through a jump host the node's "socket" is a channel of the jump's connection, which
        # the shutdown above has already ended: closing it can only fail, and must not raise.
        for each in ([client] if client is not None else []) + jumps[::-1]:
            with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
                each.close()
        if sock is not None:
            sock.close()

    def _fail(self, error: TransportError) -> None:
        with self._state:
            if self._failure is None:
                self._failure = error
            self._steps.clear()
        LOG.warning("%s: %s; dropping the connection", self.host, error.reason)
        self._drop()

    def _broken(self) -> TransportError | None:
        """Why the connection was torn down from outside (abort or watchdog), if it was."""
        with self._state:
            return self._aborted or self._failure

    def _why(self, default: TransportError) -> TransportError:
        """The real reason a wait ended: an abort, then a watchdog verdict, else ``default``."""
        with self._state:
            return self._aborted or self._failure or default

    # ------------------------------------------------------------------ watchdog

    def _ensure_watchdog(self) -> None:
        # Started on the first step; started again for a run() after close() (which ends it).
        if self._watchdog is None or not self._watchdog.is_alive():
            self._closed.clear()
            self._watchdog = threading.Thread(
                target=self._watch, name=f"ssh-watchdog-{self.host}", daemon=True
            )
            self._watchdog.start()

    def _watch(self) -> None:
        ka = self.config.keepalive_s
        while not self._closed.wait(_TICK_S):
            now = time.monotonic()
            with self._state:
                late = [s for s in self._steps.values() if now >= s.deadline]
                step, since = (late[0] if late else None), self._keepalive_since
            if step is not None:
                self._fail(step.error(self.host, f"no answer to the {step.what} "
                                                 f"within {step.budget_s:g} s"))
            elif since is not None and now - since >= ka:
                self._fail(Unresponsive(self.host, f"no answer to an SSH keepalive within "
                                                   f"{ka:g} s (peer dead or frozen)"))

    @contextlib.contextmanager
    def _stepping(
        self,
        what: str,
        budget_s: float,
        error: Callable[[str, str], TransportError] = Unresponsive,
    ) -> Iterator[None]:
        self._ensure_watchdog()
        me = threading.get_ident()
        with self._state:
            self._steps[me] = _Step(what, budget_s, time.monotonic() + budget_s, error)
        try:
            yield
        finally:
            with self._state:
                self._steps.pop(me, None)

    def _keepalive(self, transport: paramiko.Transport, done: threading.Event) -> None:
        """Probe the peer every ``keepalive_s``; the watchdog judges unanswered probes."""
        while not done.wait(self.config.keepalive_s):
            if not transport.is_active():
                return
            with self._state:
                if done.is_set():
                    return
                self._keepalive_since = time.monotonic()
            # Returns on the peer's reply (OpenSSH answers with a failure reply) or when the
            # transport closes; never on its own.
            transport.global_request("keepalive@openssh.com", wait=True)
            with self._state:
                if not done.is_set():
                    self._keepalive_since = None

    # ------------------------------------------------------------------ connecting

    def _open_socket(self, address: str, port: int, label: str) -> socket.socket:
        cfg = self.config
        try:
            infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Unreachable(cfg.host, f"{label}cannot resolve {address}: {exc}") from exc
        last: OSError | None = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(cfg.connect_timeout_s)
            _tcp_keepalive(sock, cfg.keepalive_s)
            try:
                sock.connect(addr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            return sock
        reason = str(last) or type(last).__name__ if last else "no address"
        raise Unreachable(cfg.host, f"{label}{address}:{port}: {reason}")

    def _first_hop(self) -> None:
        """Connect to the first hop (the node, the first jump host, or the proxy command) and
        keep it as ``self._sock`` for :meth:`_drop`."""
        cfg = self.config
        sock: socket.socket | paramiko.ProxyCommand
        if cfg.proxy_command is not None:
            try:
                sock = paramiko.ProxyCommand(cfg.proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise Unreachable(cfg.host, f"ProxyCommand {cfg.proxy_command!r}: {exc}") from exc
        else:
            first = cfg.jumps[0] if cfg.jumps else None
            sock = (self._open_socket(first.address, first.port, f"jump host {first}: ")
                    if first else self._open_socket(cfg.address, cfg.port, ""))
        with self._state:
            if self._aborted is not None:
                sock.close()
                raise self._aborted
            self._sock, self._failure = sock, None

    def _connect(self) -> paramiko.SSHClient:
        cfg = self.config
        self._first_hop()
        with self._state:
            sock = self._sock
        assert sock is not None
        hops = [*cfg.jumps, Hop(cfg.host, cfg.address, cfg.port, cfg.user,
                                (cfg.key_file,) if cfg.key_file else ())]
        channel: socket.socket | paramiko.ProxyCommand | paramiko.Channel = sock
        for i, hop in enumerate(hops):
            last = i == len(hops) - 1
            label = "" if last else f"jump host {hop}: "
            client = self._handshake(hop, channel, label)
            if last:
                break
            with self._state:
                self._jumps.append(client)
            nxt = hops[i + 1]
            transport = client.get_transport()
            try:
                with self._stepping(f"{label}channel to {nxt.address}:{nxt.port}",
                                    cfg.channel_timeout_s, Unreachable):
                    if transport is None:
                        raise EOFError("connection closed")
                    # Duck-typed as the channel it wraps (paramiko takes any socket-like).
                    channel = cast(paramiko.Channel, _HopChannel(transport.open_channel(
                        "direct-tcpip", (nxt.address, nxt.port), ("127.0.0.1", 0),
                        timeout=cfg.channel_timeout_s)))
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop()
                reason = str(exc) or type(exc).__name__
                raise self._why(Unreachable(
                    cfg.host, f"{label}cannot reach {nxt.address}:{nxt.port}: {reason}")) from exc
        transport = client.get_transport()
        if transport is None:
            raise self._why(Unreachable(cfg.host, "connection closed during the handshake"))
        done = threading.Event()
        with self._state:
            if self._aborted is not None:
                client.close()
                raise self._aborted
            self._client, self._connection_done = client, done
        threading.Thread(
            target=self._keepalive, args=(transport, done), name=f"ssh-keepalive-{cfg.host}",
            daemon=True,
        ).start()
        return client

    def _trusted_keys(self, client: paramiko.SSHClient, hop: Hop,
                      label: str) -> tuple[paramiko.PKey, ...]:
        """Load the keys known for ``hop`` from every known_hosts file into the client's
        store; return the keys marked @revoked."""
        cfg = self.config
        # paramiko looks a host up under "addr" (port 22) or "[addr]:port"; only those entries
        # go into this connection's store (HostKeys.add is linear per entry).
        lookup = hop.address if hop.port == 22 else f"[{hop.address}]:{hop.port}"
        store = client.get_host_keys()
        revoked: list[paramiko.PKey] = []
        for path in cfg.known_hosts_files:
            try:
                known = _known_hosts_cached(path)
            except OSError as exc:
                raise HostKeyRejected(cfg.host, f"{label}cannot read known_hosts: {exc}") from exc
            for name, key in known.entries:
                if _name_matches(name, lookup):
                    store.add(name, key.get_name(), key)
            revoked += known.revoked
        return tuple(revoked)

    def _handshake(self, hop: Hop, sock: socket.socket | paramiko.ProxyCommand | paramiko.Channel,
                   label: str) -> paramiko.SSHClient:
        """SSH handshake with one hop over ``sock``: host key verified against every
        known_hosts file, authenticated with the hop's key or the ssh-agent."""
        cfg = self.config
        client = paramiko.SSHClient()
        revoked = self._trusted_keys(client, hop, label)
        client.set_missing_host_key_policy(_RecordingPolicy(cfg.accept_unknown_host_keys, label))
        pkey: paramiko.PKey | None = None
        key_file = hop.key_files[0] if hop.key_files else None
        if key_file is not None:
            try:
                pkey = paramiko.PKey.from_path(key_file)
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise AuthFailed(cfg.host, f"{label}cannot load key {key_file}: {exc}") from exc
        # paramiko bounds each handshake step itself; the watchdog bounds their sum.
        budget = cfg.connect_timeout_s + cfg.banner_timeout_s + cfg.auth_timeout_s + 2.0
        try:
            with self._stepping(f"{label}SSH handshake", budget, Unreachable):
                client.connect(
                    hop.address,
                    port=hop.port,
                    username=hop.user,
                    pkey=pkey,
                    sock=sock,
                    timeout=cfg.connect_timeout_s,
                    banner_timeout=cfg.banner_timeout_s,
                    auth_timeout=cfg.auth_timeout_s,
                    channel_timeout=cfg.channel_timeout_s,
                    # As OpenSSH: keys from an ssh-agent (SSH_AUTH_SOCK) are offered too.
                    allow_agent=True,
                    look_for_keys=key_file is None,
                )
        except HostKeyRejected:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(
                cfg.host,
                f"{label}host key mismatch: got {exc.key.fingerprint}, "
                f"known_hosts has {exc.expected_key.fingerprint}",
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            if "timeout" in str(exc).lower():
                raise self._why(Unresponsive(
                    cfg.host, f"{label}no answer to authentication within {cfg.auth_timeout_s:g} s"
                )) from exc
            raise AuthFailed(
                cfg.host, f"{label}authentication as {hop.user} failed: {exc}") from exc
        except (OSError, paramiko.SSHException, EOFError) as exc:
            # When its key-exchange timeout passes, paramiko's start_client returns without an
            # error and connect() fails later with "No existing session"; the transport thread
            # may hold the real cause (a bad banner).
            failed = client.get_transport()
            cause = failed.get_exception() if failed is not None else None
            client.close()
            reason = str(cause or exc) or type(cause or exc).__name__
            if cause is None and "No existing session" in reason:
                reason = (f"no SSH banner and key exchange within "
                          f"{cfg.connect_timeout_s:g} s")
            raise self._why(Unreachable(
                cfg.host, f"{label}{hop.address}:{hop.port}: {reason}")) from exc
        transport = client.get_transport()
        server_key = transport.get_remote_server_key() if transport else None
        if server_key is not None and any(server_key == r for r in revoked):
            client.close()
            raise HostKeyRejected(cfg.host, f"{label}host key {server_key.fingerprint} is @revoked")
        if transport is None:
            client.close()
            raise self._why(Unreachable(cfg.host, f"{label}connection closed during the handshake"))
        return client

    def _client_for_run(self) -> paramiko.SSHClient:
        """The live connection, made now when there is none. A run that waited while another
        thread's attempt failed raises that failure instead of trying again (a host that is
        down costs one connect timeout, not one per waiting run)."""
        with self._state:
            # An attempt under way when this run arrived is one it waits for.
            seen = self._attempts - (1 if self._attempting else 0)
        with self._connecting:
            with self._state:
                client, failed = self._client, self._attempt_failed
                if self._attempts != seen and failed is not None:
                    raise failed
            transport = client.get_transport() if client else None
            if client is not None and transport is not None and transport.is_active():
                return client
            self._drop()
            with self._state:
                self._attempts += 1
                self._attempting, self._attempt_failed = True, None
            try:
                return self._connect()
            except TransportError as exc:
                with self._state:
                    self._attempt_failed = exc
                raise
            finally:
                with self._state:
                    self._attempting = False

    # ------------------------------------------------------------------ commands

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run argv under the remote wrapper; raise :class:`TransportError` subclasses only
        when the host cannot be asked (or stops answering, or the run is aborted)."""
        args = tuple(argv)
        remote = remote_command(args, timeout)
        cfg = self.config
        with self._state:
            if self._aborted is not None:
                raise self._aborted
        client = self._client_for_run()
        start = time.monotonic()
        transport = client.get_transport()
        tool = args[0] if args else "?"
        try:
            if transport is None:
                raise EOFError("connection lost")
            with self._stepping("channel open request", cfg.channel_timeout_s):
                chan = transport.open_session(timeout=cfg.channel_timeout_s)
            with self._stepping("exec request", cfg.channel_timeout_s):
                chan.exec_command(remote)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop()
            reason = str(exc) or type(exc).__name__
            raise self._why(Unresponsive(self.host, f"cannot start {tool}: {reason}")) from exc
        return self._collect(chan, transport, args, timeout, start)

    def _collect(
        self,
        chan: paramiko.Channel,
        transport: paramiko.Transport,
        args: tuple[str, ...],
        timeout: float,
        start: float,
    ) -> CommandResult:
        capture = Capture(self.config.max_output_bytes)
        deadline = start + timeout + self.config.backstop_s
        backstop_fired = False
        tool = args[0] if args else "?"
        # No shutdown_write(): the remote wrapper takes EOF on stdin to mean "session gone".
        try:
            while True:
                # Reading writes too: paramiko sends the server a window adjust every ~200 KiB
                # read, and that write fails when the way back is broken (a reset the reader
                # thread has not seen yet, a proxy that stopped taking bytes).
                while chan.recv_ready() and not capture.over:
                    capture.out(chan.recv(65536))
                while chan.recv_stderr_ready() and not capture.over:
                    capture.err(chan.recv_stderr(65536))
                if capture.over:
                    break
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                # Both streams at EOF (or the channel closed) and the status in: the command is
                # over. The status alone is not the end: a server may send output after it.
                if drained and (chan.closed or (chan.eof_received and _has_status(chan))):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    backstop_fired = True
                    break
                # The channel's fileno becomes readable on data, stderr data, EOF or close.
                try:
                    select.select([chan], [], [], min(remaining, 0.2))
                except (OSError, ValueError):
                    time.sleep(0.01)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop()
            reason = str(exc) or type(exc).__name__
            raise self._why(Unresponsive(
                self.host, f"connection lost after {time.monotonic() - start:.1f} s while "
                f"{tool} was running ({reason})"
            )) from exc
        duration = time.monotonic() - start
        if capture.over:
            # The wrapper on the node kills the command when the channel goes. The verdict is
            # the output cap even when the close cannot be sent: the node printed too much.
            self._close_channel(chan)
            return CommandResult(args, -1, capture.stdout(), capture.stderr(), duration,
                                 False, True)
        if backstop_fired:
            self._close_channel(chan)
            failed = self._broken()
            if failed is not None:
                raise failed
            return CommandResult(
                args,
                -1,
                capture.stdout(),
                capture.stderr() + "\n[gpuready: channel closed by backstop]",
                duration,
                True,
            )
        # Ended without EOF: the connection dropped or was torn down (an abort, the
        # watchdog), even when the status had come. sshd sends EOF before it closes, also for
        # a command killed by a signal (which has no status).
        if not chan.eof_received or self._broken() or (
            not _has_status(chan) and not transport.is_active()
        ):
            self._drop()
            raise self._why(Unresponsive(
                self.host, f"connection lost after {duration:.1f} s while {tool} was running"
            ))
        rc = chan.exit_status
        self._close_channel(chan)  # the command is over, its status and output are in
        timed_out = rc in _TIMEOUT_RCS and duration >= timeout - 0.5
        return CommandResult(
            args, -1 if timed_out else rc, capture.stdout(), capture.stderr(), duration, timed_out
        )

    def _close_channel(self, chan: paramiko.Channel) -> None:
        """Close a command's channel. Sending the close can fail when the way back is broken
        (the reset is in, paramiko's reader has not seen it yet): the connection is then
        dropped, and the next command on it learns that as a transport error."""
        try:
            chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            LOG.warning("%s: cannot close a channel (%s); dropping the connection",
                        self.host, str(exc) or type(exc).__name__)
            self._drop()


def _has_status(chan: paramiko.Channel) -> bool:
    """Whether the exit status arrived. paramiko's ``exit_status_ready()`` (and its
    ``status_event``) are also true on any close; ``exit_status`` stays -1 until a status
    comes (SSH sends it as an unsigned int, so a real one is never negative)."""
    return chan.exit_status >= 0


def _tcp_keepalive(sock: socket.socket, interval_s: float) -> None:
    """TCP keepalive and a bound on unacknowledged data: a host that vanished from the
    network (no FIN, no RST) ends the connection in about three intervals."""
    seconds = max(1, round(interval_s))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", seconds), ("TCP_KEEPINTVL", seconds), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", seconds * 3 * 1000)):
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


__all__ = [
    "REMOTE_WRAPPER",
    "KnownHosts",
    "SSHConfig",
    "SSHTransport",
    "TransportError",
    "load_known_hosts",
    "remote_command",
]
