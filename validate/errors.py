"""Errors that mean "the input is wrong", shared by every command without importing them.

``python -m validate`` prints an :class:`InputError` as one line, ``error: <message>``, and
exits 2 (usage or tool error). The classes that raise it live with what they check (the
inventory, a profile, a check id, a run directory, the run history); they derive from this
module's base so that the command line can catch them before, or without, importing their
modules: ``validate --help`` loads none of the suite.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input the user can correct; the message names what is wrong and where."""


class CommandFailed(InputError):
    """An unexpected exception, with what the command was doing when it came."""

    def __init__(self, doing: str, exc: BaseException) -> None:
        super().__init__(f"{doing} failed: {type(exc).__name__}: {exc}")
