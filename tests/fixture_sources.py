"""The third-party data policy: one table of real captures, and the REUSE metadata made from it.

Every real capture the tests read lives under ``tests/fixtures/`` with one row in
``tests/fixtures/SOURCES.tsv`` (tab-separated, columns ``COLUMNS``): where it was published,
the commit or date, its licence as an SPDX identifier, the GPU or tool version, notes, and
the copyright holder named by the source's licence. Only licences that let this project
redistribute the file are accepted (``ALLOWED_LICENSES``); each has its text in ``LICENSES/``.

``REUSE.toml`` carries the same facts for ``reuse lint`` (``make lint``). Its fixture section
is generated from the table, so a contributor edits one place:

    .venv/bin/python -m tests.fixture_sources      # rewrite REUSE.toml's generated section

``tests/unit/tools/test_fixture_sources.py`` fails, naming the file or row, when the table, the
folder, the licence texts and what the reuse tool reads disagree.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
TABLE = FIXTURES / "SOURCES.tsv"
REUSE_TOML = REPO_ROOT / "REUSE.toml"
LICENSES_DIR = REPO_ROOT / "LICENSES"

COLUMNS = (
    "file",
    "source",
    "commit_or_date",
    "license",
    "gpu_model_or_tool_version",
    "notes",
    "copyright",
)
# Licences under which this project may redistribute a capture (tests/fixtures/README.md says
# why). GPL and CC-BY-SA data stays in its own files under its own licence; it is not linked
# into the product. Unknown licences, non-commercial terms and copied issue or forum text are
# not here on purpose.
ALLOWED_LICENSES = frozenset(
    {
        "Apache-2.0",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "CC-BY-4.0",
        "CC-BY-SA-4.0",
        "GPL-2.0-only",
        "GPL-2.0-or-later",
        "GPL-3.0-only",
        "GPL-3.0-or-later",
        "MIT",
        "MIT-0",
        "MPL-2.0",
    }
)
# The project's own files in the fixtures folder: they describe the captures and are covered
# by the project's licence (REUSE.toml's first annotation), so they need no row.
OWN_FILE_NAMES = frozenset({"README.md", "SOURCES.tsv"})

BEGIN = (
    "# BEGIN fixtures: generated from tests/fixtures/SOURCES.tsv"
    " by `python -m tests.fixture_sources`"
)
END = "# END fixtures"


@dataclass(frozen=True)
class Source:
    """One row of SOURCES.tsv; ``line`` is its line number in the file, for messages."""

    line: int
    file: str
    source: str
    commit_or_date: str
    license: str
    gpu_model_or_tool_version: str
    notes: str
    copyright: str


def read_table(table: Path = TABLE) -> tuple[list[Source], list[str]]:
    """The rows of the table, and what is wrong with its shape (header, column counts)."""
    problems: list[str] = []
    rows: list[Source] = []
    with table.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, [])
        if tuple(header) != COLUMNS:
            problems.append(f"{table.name}: header is {header}, expected {list(COLUMNS)}")
            return rows, problems
        for number, cells in enumerate(reader, start=2):
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(COLUMNS):
                name = cells[0] if cells else "?"
                problems.append(
                    f"{table.name} line {number} ({name}): {len(cells)} columns, expected "
                    f"{len(COLUMNS)} ({', '.join(COLUMNS)})"
                )
                continue
            rows.append(Source(number, *cells))
    return rows, problems


def captures(fixtures: Path = FIXTURES) -> set[str]:
    """Every file under the fixtures folder that needs a row (paths relative to it)."""
    return {
        path.relative_to(fixtures).as_posix()
        for path in fixtures.rglob("*")
        if path.is_file() and path.name not in OWN_FILE_NAMES and "__pycache__" not in path.parts
    }


def table_problems(
    rows: list[Source], fixtures: Path = FIXTURES, licenses_dir: Path = LICENSES_DIR
) -> list[str]:
    """Everything that breaks the policy, one message per file or row, each naming it."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for row in rows:
        where = f"SOURCES.tsv line {row.line} ({row.file})"
        if row.file in seen:
            problems.append(f"{where}: second row for this file (first on line {seen[row.file]})")
        seen.setdefault(row.file, row.line)
        if not (fixtures / row.file).is_file():
            problems.append(f"{where}: no such file under tests/fixtures/")
        for column in ("source", "commit_or_date", "copyright"):
            if not getattr(row, column).strip():
                problems.append(f"{where}: empty {column}")
        if row.license not in ALLOWED_LICENSES:
            problems.append(
                f"{where}: licence {row.license!r} does not allow redistribution here; use an "
                f"SPDX id from {sorted(ALLOWED_LICENSES)}, or remove or replace the capture"
            )
        elif not (licenses_dir / f"{row.license}.txt").is_file():
            problems.append(f"{where}: no licence text LICENSES/{row.license}.txt")
    for name in sorted(captures(fixtures) - seen.keys()):
        problems.append(f"tests/fixtures/{name}: no row in SOURCES.tsv")
    return problems


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def reuse_section(rows: list[Source]) -> str:
    """REUSE.toml annotations for the captures: one per (licence, copyright holder)."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        groups[(row.license, row.copyright)].append(f"tests/fixtures/{row.file}")
    lines = [BEGIN]
    for (license_id, holder), paths in sorted(groups.items()):
        lines += [
            "",
            "[[annotations]]",
            "path = [",
            *(f"  {_toml_string(path)}," for path in sorted(paths)),
            "]",
            # The table, not a tag that happens to sit in a copied file, says what it is.
            'precedence = "override"',
            f"SPDX-FileCopyrightText = {_toml_string(holder)}",
            f"SPDX-License-Identifier = {_toml_string(license_id)}",
        ]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def current_section(text: str) -> str | None:
    """The generated section of a REUSE.toml text, or None when its markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start : end + len(END)] + "\n"


def write_reuse(rows: list[Source], reuse_toml: Path = REUSE_TOML) -> bool:
    """Rewrite the generated section in place; True when the file changed."""
    text = reuse_toml.read_text(encoding="utf-8")
    old = current_section(text)
    if old is None:
        raise SystemExit(f"{reuse_toml}: markers {BEGIN!r} ... {END!r} not found")
    new_text = text.replace(old, reuse_section(rows))
    if new_text == text:
        return False
    reuse_toml.write_text(new_text, encoding="utf-8")
    return True


def main() -> int:
    rows, problems = read_table()
    problems += table_problems(rows)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("REUSE.toml left as it is: fix the table first.", file=sys.stderr)
        return 1
    print("REUSE.toml updated" if write_reuse(rows) else "REUSE.toml already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
