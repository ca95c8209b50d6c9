"""How commands reach a node: one interface, an SSH and a local implementation.

``Transport.run(argv, timeout) -> CommandResult``. A command that exits non-zero is a normal
:class:`CommandResult`; a command that outlives its timeout is a result with ``timed_out=True``
(and the remote process is killed). Failures to reach the node at all raise one of the
:class:`TransportError` subclasses, which the runner turns into ``error`` rows.
"""

from __future__ import annotations

from validate.transport.base import (
    AuthFailed,
    CommandResult,
    HostKeyRejected,
    Transport,
    TransportError,
    Unreachable,
)

__all__ = [
    "AuthFailed",
    "CommandResult",
    "HostKeyRejected",
    "Transport",
    "TransportError",
    "Unreachable",
]
