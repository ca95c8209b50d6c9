"""The README and docs/ hold together: relative links resolve, the check table is complete."""

from __future__ import annotations

import re
from pathlib import Path

from tools import doc_links, lab_scenarios
from validate import checks


def test_readme_and_docs_links_resolve() -> None:
    pages = doc_links.pages()
    assert doc_links.REPO_ROOT / "README.md" in pages
    assert len(pages) > 5, "docs/ pages are missing"
    problems = [line for page in pages for line in doc_links.problems(page)]
    assert problems == [], "broken links (fix the link or the heading):\n" + "\n".join(problems)


def test_the_readme_links_every_docs_page() -> None:
    readme = doc_links.REPO_ROOT / "README.md"
    targets = {
        (readme.parent / link.target.split("#")[0]).resolve()
        for link in doc_links.links(readme)
        if link.target and not link.target.startswith(("#", "http"))
    }
    orphans = [
        p.name
        for p in sorted((doc_links.REPO_ROOT / "docs").glob("*.md"))
        if p.resolve() not in targets
    ]
    assert orphans == [], f"docs pages the README does not link: {orphans}"


def test_broken_files_anchors_and_escapes_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text(
        "# Other page\n\n## The `make` target: run it\n\n## Repeat\n\n## Repeat\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n"
        "[ok](docs/other.md) [ok](docs/other.md#the-make-target-run-it) [ok](#title)\n"
        "[ok](docs/other.md#repeat-1) [ok](https://example.com/missing)\n\n"
        "| a | b |\n|---|---|\n| [gone](docs/gone.md) | x |\n\n"
        "[bad anchor](docs/other.md#nope) [out](../outside.md) [self](#missing)\n\n"
        "```\n[in code](docs/not-a-link.md)\n```\n"
    )
    problems = doc_links.problems(readme, root=tmp_path)
    assert problems == [
        "README.md:8: link 'docs/gone.md': no such file docs/gone.md",
        "README.md:10: link 'docs/other.md#nope': no heading with anchor #nope in other.md",
        "README.md:10: link '../outside.md' leaves the repository",
        "README.md:10: link '#missing': no heading with anchor #missing in README.md",
    ]


def test_slug_is_githubs() -> None:
    assert doc_links.slug("Exit codes") == "exit-codes"
    assert doc_links.slug("Join and gate: `node_join`, labels") == "join-and-gate-node_join-labels"
    assert (
        doc_links.slug("CI time per test module (2026-12-04)")
        == "ci-time-per-test-module-2026-12-04"
    )


def test_the_validators_page_lists_every_check() -> None:
    page = (doc_links.REPO_ROOT / "docs" / "validators.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z_]+\.[a-z0-9_.]+)` \|", page, flags=re.MULTILINE))
    assert listed == set(checks.REGISTRY) | set(checks.MULTI_NODE), (
        "docs/validators.md's table of checks differs from `python -m validate checks`"
    )


def test_the_lab_scenario_list_is_what_pytest_collects() -> None:
    """docs/testing.md lists every lab test (tools/lab_scenarios.py): a faster CI that lost a
    scenario shows it there."""
    page = lab_scenarios.PAGE.read_text()
    assert lab_scenarios.current(page) == lab_scenarios.render(lab_scenarios.collected()), (
        "docs/testing.md's lab scenarios differ from tests/lab: run "
        "`.venv/bin/python -m tools.lab_scenarios --write` and commit the page")
