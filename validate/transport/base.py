"""Transport interface, command result record and typed transport errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from validate.model import (
    CODE_AUTH,
    CODE_HOSTKEY,
    CODE_TIMEOUT,
    CODE_UNREACHABLE,
    CODE_UNRESPONSIVE,
)

# Captured output per command (stdout and stderr together). The largest real outputs the checks
# read are a day of kernel log and ``nvidia-smi -q -x`` of 8 GPUs (hundreds of KiB); a node that
# prints far more is broken, and holding its output would let one node exhaust the validator's
# memory (a 512 MB flood once took it to 2.8 GB RSS).
DEFAULT_MAX_OUTPUT_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did: ``argv`` as run, exit status (``-1`` when killed on timeout or
    for too much output), decoded stdout/stderr (UTF-8, undecodable bytes replaced),
    wall-clock seconds, whether the wall-clock timeout fired, and whether the output passed
    the cap (``truncated``: the command was killed and stdout/stderr keep only their last
    bytes, for the error message)."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command finished in time with exit status 0 and all its output."""
        return self.rc == 0 and not self.timed_out and not self.truncated


class Transport(Protocol):
    """Runs argv on one node. Implementations must enforce ``timeout`` as wall-clock seconds."""

    @property
    def host(self) -> str:
        """The node name this transport talks to."""
        ...

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run ``argv`` (never a shell string) and return its result."""
        ...

    def close(self) -> None:
        """Release connections; safe to call twice."""
        ...

    def abort(self, code: str, reason: str) -> None:
        """From any thread: end every blocked wait now (kill the running command, drop the
        connection); the running and every later :meth:`run` raise :class:`Aborted` with
        ``code`` and ``reason``. The runner calls it at a node's deadline and on interrupt."""
        ...


class TransportError(Exception):
    """The node could not be asked at all. ``code`` is the row code the runner reports."""

    code: str = CODE_UNREACHABLE

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class Unreachable(TransportError):
    """TCP connect, banner or SSH negotiation failed or timed out."""

    code = CODE_UNREACHABLE


class AuthFailed(TransportError):
    """The node answered but refused our key/user."""

    code = CODE_AUTH


class HostKeyRejected(TransportError):
    """The node's host key is unknown or does not match known_hosts."""

    code = CODE_HOSTKEY


class Unresponsive(TransportError):
    """The node answered SSH, then stopped: a step of the conversation (authentication,
    channel open, exec request) overran its budget, a keepalive went unanswered, or the
    connection dropped in the middle of a command."""

    code = CODE_UNRESPONSIVE


class Aborted(TransportError):
    """:meth:`Transport.abort` was called (node deadline, interrupted run); ``code`` says
    which."""

    def __init__(self, host: str, reason: str, code: str) -> None:
        super().__init__(host, reason)
        self.code = code


class CommandTimeout(TransportError):
    """Raised only by callers that want a timeout as an exception (the transports return a
    ``timed_out`` result instead)."""

    code = CODE_TIMEOUT
