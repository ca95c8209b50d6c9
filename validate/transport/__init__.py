"""How commands reach a node: one interface, an SSH and a local implementation.

``Transport.run(argv, timeout) -> CommandResult``. A command that exits non-zero is a normal
:class:`CommandResult`; a command that outlives its timeout is a result with ``timed_out=True``,
one that prints more than the output cap a result with ``truncated=True`` (in both cases the
process is killed). Failures to ask the node at all raise one of the :class:`TransportError`
subclasses (unreachable, auth, host key, unresponsive mid-conversation, aborted), which the
runner turns into ``error`` rows. ``Transport.abort(code, reason)`` ends every blocked wait from
another thread (the runner's node deadline and interrupt).
"""

from __future__ import annotations

from validate.transport.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    Aborted,
    AuthFailed,
    CommandResult,
    HostKeyRejected,
    Transport,
    TransportError,
    Unreachable,
    Unresponsive,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "Aborted",
    "AuthFailed",
    "CommandResult",
    "HostKeyRejected",
    "Transport",
    "TransportError",
    "Unreachable",
    "Unresponsive",
]
