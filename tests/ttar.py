"""Unpack a ttar archive (the text tree format of prometheus/procfs's test fixtures) into a
directory: ``Directory: <path>`` and ``Path: <path>`` / ``Lines: <n>`` / <n> lines (a last line
ending in ``EOF`` has no newline) / ``Mode: <octal>`` blocks, separated by ``# ttar`` lines."""

from __future__ import annotations

from pathlib import Path


def unpack(archive: Path, into: Path, strip: str = "") -> Path:
    """Write the archive's tree under ``into`` (each path with the prefix ``strip`` removed);
    returns ``into``."""
    lines = archive.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Directory: "):
            (into / line[len("Directory: "):].removeprefix(strip)).mkdir(parents=True,
                                                                       exist_ok=True)
        elif line.startswith("Path: "):
            target = into / line[len("Path: "):].removeprefix(strip)
            count = int(lines[i + 1].removeprefix("Lines: "))
            body = lines[i + 2:i + 2 + count]
            text = "".join(f"{b}\n" for b in body)
            if body and body[-1].endswith("EOF"):
                text = text[:-len("EOF\n")]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            i += 1 + count
        i += 1
    return into
