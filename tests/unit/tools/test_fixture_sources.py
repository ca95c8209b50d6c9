"""The third-party data policy holds: every capture has its row, licence and REUSE metadata.

A failure names the file or the SOURCES.tsv line and says what to do (tests/fixtures/README.md).
These tests read the repository's own tests/fixtures/, never a GPUREADY_FIXTURES override.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reuse.project import Project

from tests import fixture_sources as fs


@pytest.fixture(scope="module")
def rows() -> list[fs.Source]:
    rows, problems = fs.read_table()
    assert problems == [], "\n".join(problems)
    return rows


def test_every_capture_has_a_row_with_a_redistributable_licence(rows: list[fs.Source]) -> None:
    problems = fs.table_problems(rows)
    assert problems == [], "\n".join(problems)
    assert len(rows) == len(fs.captures()) > 100


def test_reuse_toml_section_is_the_one_the_table_makes(rows: list[fs.Source]) -> None:
    current = fs.current_section(fs.REUSE_TOML.read_text(encoding="utf-8"))
    assert current == fs.reuse_section(rows), (
        "REUSE.toml is out of date with tests/fixtures/SOURCES.tsv: "
        "run `.venv/bin/python -m tests.fixture_sources` and commit REUSE.toml"
    )


def test_reuse_reads_each_capture_as_the_table_says(rows: list[fs.Source]) -> None:
    # What the reuse tool (and so `reuse lint` and `reuse spdx`) concludes for each file,
    # not what we meant to write: a stray in-file tag or a later annotation would show here.
    project = Project.from_directory(fs.REPO_ROOT)
    disagreements = []
    for row in rows:
        infos = project.reuse_info_of(fs.FIXTURES / row.file)
        licences = {str(e) for info in infos for e in info.spdx_expressions}
        holders = {
            str(notice).removeprefix("SPDX-FileCopyrightText:").strip()
            for info in infos
            for notice in info.copyright_notices
        }
        if (licences, holders) != ({row.license}, {row.copyright}):
            disagreements.append(f"{row.file}: reuse reads {licences} / {holders}")
    assert disagreements == [], "\n".join(disagreements)


def test_project_files_are_apache_2_0() -> None:
    project = Project.from_directory(fs.REPO_ROOT)
    for path in ("validate/model.py", "tests/fixtures/README.md", "tests/fixtures/SOURCES.tsv"):
        (info,) = project.reuse_info_of(fs.REPO_ROOT / path)
        assert {str(e) for e in info.spdx_expressions} == {"Apache-2.0"}, path


def test_every_licence_text_in_licenses_is_used(rows: list[fs.Source]) -> None:
    texts = {path.stem for path in fs.LICENSES_DIR.glob("*.txt")}
    assert texts == {row.license for row in rows} | {"Apache-2.0"}
    apache = (fs.LICENSES_DIR / "Apache-2.0.txt").read_text()
    assert (fs.REPO_ROOT / "LICENSE").read_text() == apache


# --- the checks themselves catch what the policy forbids ------------------------------------


def _table(tmp_path: Path, *lines: str) -> Path:
    table = tmp_path / "SOURCES.tsv"
    table.write_text("\n".join(["\t".join(fs.COLUMNS), *lines]) + "\n", encoding="utf-8")
    return table


def _row(file: str, licence: str, copyright_holder: str = "Someone") -> str:
    cells = [file, "github.com/o/r/blob/c/f", "c", licence, "tool 1.0", "", copyright_holder]
    return "\t".join(cells)


def test_checks_name_unlisted_missing_and_forbidden_captures(tmp_path: Path) -> None:
    fixtures = tmp_path / "fixtures"
    (fixtures / "nccl-tests").mkdir(parents=True)
    for name in ("listed.txt", "issue.txt", "unknown.txt", "unlisted.txt"):
        (fixtures / "nccl-tests" / name).write_text("real output\n")
    (fixtures / "README.md").write_text("ours\n")
    table = _table(
        tmp_path,
        _row("nccl-tests/listed.txt", "MIT"),
        _row("nccl-tests/issue.txt", "n/a (issue text)"),
        _row("nccl-tests/unknown.txt", "unknown", copyright_holder=""),
        _row("nccl-tests/gone.txt", "Apache-2.0"),
        _row("nccl-tests/listed.txt", "MIT"),
    )
    rows, shape = fs.read_table(table)
    assert shape == []
    problems = fs.table_problems(rows, fixtures, fs.LICENSES_DIR)
    assert problems == [
        "SOURCES.tsv line 3 (nccl-tests/issue.txt): licence 'n/a (issue text)' does not allow "
        f"redistribution here; use an SPDX id from {sorted(fs.ALLOWED_LICENSES)}, or remove or "
        "replace the capture",
        "SOURCES.tsv line 4 (nccl-tests/unknown.txt): empty copyright",
        "SOURCES.tsv line 4 (nccl-tests/unknown.txt): licence 'unknown' does not allow "
        f"redistribution here; use an SPDX id from {sorted(fs.ALLOWED_LICENSES)}, or remove or "
        "replace the capture",
        "SOURCES.tsv line 5 (nccl-tests/gone.txt): no such file under tests/fixtures/",
        "SOURCES.tsv line 6 (nccl-tests/listed.txt): second row for this file (first on line 2)",
        "tests/fixtures/nccl-tests/unlisted.txt: no row in SOURCES.tsv",
    ]


def test_checks_name_a_row_without_the_new_column_or_licence_text(tmp_path: Path) -> None:
    # A row written before the copyright column existed (6 cells), and a licence whose text
    # nobody put in LICENSES/.
    old_row = "\t".join(["fio/a.json", "github.com/o/r/blob/c/a.json", "c", "MIT", "fio-3", ""])
    rows, shape = fs.read_table(_table(tmp_path, old_row, _row("fio/b.json", "BSD-2-Clause")))
    assert shape == [
        "SOURCES.tsv line 2 (fio/a.json): 6 columns, expected 7 "
        "(file, source, commit_or_date, license, gpu_model_or_tool_version, notes, copyright)"
    ]
    (tmp_path / "fio").mkdir()
    (tmp_path / "fio" / "b.json").write_text("{}\n")
    assert fs.table_problems(rows, tmp_path, fs.LICENSES_DIR) == [
        "SOURCES.tsv line 3 (fio/b.json): no licence text LICENSES/BSD-2-Clause.txt"
    ]


def test_reuse_section_groups_by_licence_and_holder_and_escapes(tmp_path: Path) -> None:
    table = _table(
        tmp_path,
        _row("b.txt", "MIT", 'Jane "J" Doe'),
        _row("a.txt", "MIT", 'Jane "J" Doe'),
        _row("c.txt", "Apache-2.0", "Acme"),
    )
    rows, _ = fs.read_table(table)
    section = fs.reuse_section(rows)
    assert section.count("[[annotations]]") == 2
    assert '  "tests/fixtures/a.txt",\n  "tests/fixtures/b.txt",\n' in section
    assert 'SPDX-FileCopyrightText = "Jane \\"J\\" Doe"' in section
    assert fs.current_section("x\n" + section + "y\n") == section
