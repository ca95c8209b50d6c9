"""Relative links in the README and docs/ point at files and headings that exist.

Links are read with a CommonMark parser (markdown-it-py, tables on), so a link shown inside a
code block is not a link. A target is a path relative to the page, optionally with a
``#fragment``; a fragment must be the anchor GitHub gives one of the target page's headings
(lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` for repeats). Links with
a scheme (``https:``, ``mailto:``) are not followed.

    .venv/bin/python -m tools.doc_links      # one line per broken link, exit 1 if any

``tests/unit/tools/test_docs.py`` runs the same check.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

REPO_ROOT = Path(__file__).resolve().parent.parent


def pages(root: Path = REPO_ROOT) -> list[Path]:
    """The pages checked: the README and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass(frozen=True, slots=True)
class Link:
    page: Path
    line: int  # 1-based line of the block that holds the link
    target: str


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def _inline_tokens(tokens: Iterable[Token]) -> Iterator[tuple[Token, int]]:
    for token in tokens:
        if token.type == "inline" and token.children:
            line = token.map[0] + 1 if token.map else 0
            for child in token.children:
                yield child, line


def links(page: Path) -> list[Link]:
    """Every link and image target on a page, in order."""
    tokens = _parser().parse(page.read_text(encoding="utf-8"))
    found = []
    for token, line in _inline_tokens(tokens):
        attr = "href" if token.type == "link_open" else "src" if token.type == "image" else None
        target = token.attrGet(attr) if attr else None
        if isinstance(target, str):
            found.append(Link(page, line, target))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, numbered as GitHub numbers repeats."""
    tokens = _parser().parse(page.read_text(encoding="utf-8"))
    seen: Counter[str] = Counter()
    result = set()
    for index, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        inline = tokens[index + 1]
        text = "".join(
            child.content
            for child in inline.children or ()
            if child.type in ("text", "code_inline")
        )
        base = slug(text)
        result.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return result


def problems(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """One line per link on ``page`` whose file or heading does not exist."""
    found = []
    for link in links(page):
        parts = urlsplit(link.target)
        if parts.scheme or parts.netloc:
            continue
        where = f"{page.relative_to(root)}:{link.line}: link {link.target!r}"
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if root.resolve() not in (target, *target.parents):
            found.append(f"{where} leaves the repository")
            continue
        if not target.exists():
            found.append(f"{where}: no such file {target.relative_to(root.resolve())}")
            continue
        fragment = unquote(parts.fragment)
        if fragment and target.suffix == ".md" and fragment not in anchors(target):
            found.append(f"{where}: no heading with anchor #{fragment} in {target.name}")
    return found


def main() -> int:
    found = [line for page in pages() for line in problems(page)]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
