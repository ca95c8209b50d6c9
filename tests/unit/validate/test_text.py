"""validate/text.py: what the CLI does to a control character before a terminal sees it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from validate import cli
from validate.text import one_line, printable


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[2J", "\\x1b[2J"),  # ESC: an escape sequence
    ("ring\x07", "ring\\x07"),  # BEL
    ("over\rwrite", "over\\rwrite"),  # CR: back to the start of the line
    ("\x9b31m", "\\x9b31m"),  # C1 CSI, one byte to some terminals
    ("\x7f\x00", "\\x7f\\x00"),
    ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
    ("caf\u00e9 \u2713", "caf\u00e9 \u2713"),  # printable text is left as it is
])
def test_control_characters_are_escaped_and_text_is_not(raw: str, shown: str) -> None:
    assert printable(raw) == one_line(raw) == shown


def test_one_line_also_escapes_line_breaks_printable_keeps_them() -> None:
    assert printable("a\n\tb") == "a\n\tb"
    assert one_line("a\n\tb\u2028c") == "a\\n\\tb\\u2028c"


def test_every_stream_of_the_cli_is_escaped(tmp_path: Path) -> None:
    """An error naming what the operator gave (here a path, said as it is, not quoted):
    escaped on its way out, as everything the CLI writes is."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["run", "-i", str(tmp_path / "inv\x1b[2J\x07")], out, err)
    assert code == 2
    assert f"inventory {tmp_path}/inv\\x1b[2J\\x07 does not exist" in err.getvalue()
    assert "\x1b" not in err.getvalue() and "\x07" not in err.getvalue()
