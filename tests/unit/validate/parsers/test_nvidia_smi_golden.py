"""Golden-file helpers for the nvidia-smi parser tests.

Expected results live in ``expected/nvidia_smi_<format>/<fixture name>.json``. They were
written by ``python -m tests.unit.parsers.test_nvidia_smi_golden`` and then checked by hand against
the raw fixture text; the tests also pin the facts that matter (faults, edge cases) explicitly,
so a regenerated golden file cannot silently bless a wrong parse.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES
from validate.parsers import nvidia_smi_nvlink, nvidia_smi_q, nvidia_smi_topo, nvidia_smi_xml

EXPECTED = Path(__file__).resolve().parent / "expected"


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_jsonable(v) for v in value]
    return value


def expected_path(fmt: str, fixture: Path) -> Path:
    return EXPECTED / f"nvidia_smi_{fmt}" / f"{fixture.name}.json"


def load_expected(fmt: str, fixture: Path) -> Any:
    return json.loads(expected_path(fmt, fixture).read_text())


def capture_sections(path: Path) -> dict[str, str]:
    """Split an nvidia_gpu_exporter capture into {"<phase> :: <title>": output}."""
    sections: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    bar = "#" * 80
    while i < len(lines):
        if lines[i] == bar and i + 1 < len(lines) and lines[i + 1].startswith("# "):
            title = lines[i + 1][2:].strip()
            j = i + 2
            while j < len(lines) and lines[j] != bar:
                j += 1
            body_start = j + 1
            k = body_start
            while k < len(lines) and lines[k] != bar:
                k += 1
            sections[title] = "\n".join(lines[body_start:k]) + "\n"
            i = k
        else:
            i += 1
    return sections


def _write(fmt: str, pattern: str, parse: Callable[[str], Any]) -> None:
    out = EXPECTED / f"nvidia_smi_{fmt}"
    out.mkdir(parents=True, exist_ok=True)
    for fixture in sorted(FIXTURES.glob(pattern)):
        result = to_jsonable(parse(fixture.read_text()))
        (out / f"{fixture.name}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    targets = {
        "xml": ("nvidia-smi-xml/*.xml", nvidia_smi_xml.parse),
        "q": ("nvidia-smi-q-text/*.txt", nvidia_smi_q.parse),
        "topo": ("nvidia-smi-topo/*.txt", nvidia_smi_topo.parse),
        "nvlink": ("nvidia-smi-nvlink/*.txt", nvidia_smi_nvlink.parse),
    }
    for fmt in sys.argv[1:] or targets:
        pattern, parse = targets[fmt]
        _write(fmt, pattern, parse)


if __name__ == "__main__":
    main()
