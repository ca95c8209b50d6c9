"""Free text from an operator or a remote peer, made safe to print on a terminal.

A release reason, a label a kubelet set, a version string a node printed or an API server's
error message can carry control characters: ESC starts a terminal escape sequence (clear the
screen, move the cursor, rewrite a line: a fake "all nodes passed"), BEL rings, CR returns to
the start of the line and overwrites it, and bidirectional-text overrides reorder what is
shown. :func:`printable` writes each such character as a visible escape (``\\x1b``,
``\\u202e``), the way Python's ``repr`` does, so what is printed is what was sent, and nothing
it sends acts on the terminal. :func:`one_line` does the same to line breaks and tabs, for a
value printed inside a line of its own (a reason, a finding's actual value).

``python -m validate`` escapes everything it writes to stdout and stderr with
:func:`printable` (validate/cli.py), whatever the command; the callers that echo a peer's
value inside a line use :func:`one_line` so that a value cannot start a line of its own.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI to some terminals),
# and the bidirectional overrides and isolates (the "Trojan source" characters).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_BREAK = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as an escape."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def one_line(text: str) -> str:
    """``text`` with every control character, newline and tab included, written as an escape:
    a peer's value printed inside a line stays inside it."""
    return _CONTROL_OR_BREAK.sub(_escape, text) if _CONTROL_OR_BREAK.search(text) else text
