"""Transport interface, command result record and typed transport errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from validate.model import CODE_AUTH, CODE_HOSTKEY, CODE_TIMEOUT, CODE_UNREACHABLE


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did: ``argv`` as run, exit status (``-1`` when killed on timeout),
    decoded stdout/stderr (UTF-8, undecodable bytes replaced), wall-clock seconds and whether
    the wall-clock timeout fired."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True when the command finished in time with exit status 0."""
        return self.rc == 0 and not self.timed_out


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


class CommandTimeout(TransportError):
    """Raised only by callers that want a timeout as an exception (the transports return a
    ``timed_out`` result instead)."""

    code = CODE_TIMEOUT
