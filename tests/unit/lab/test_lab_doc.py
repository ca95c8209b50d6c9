"""docs/lab.md's "Real and simulated" table against the lab itself, so it cannot go stale again
(issue 41: it listed kubelet, kubeadm and kubectl as simulated long after the lab built them):
every file of lab/sim/ is named in a SIMULATED row, every component lab/kube/build.py builds
in a real row, and neither side claims the other's."""

from __future__ import annotations

import re
from pathlib import Path

from lab.kube import build
from lab.kueue import build as kueue_build
from lab.runtime import build as runtime_build

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "lab.md"
SIM = REPO / "lab" / "sim"


def table() -> list[tuple[str, str, str]]:
    """(component, kind, where) per row of the section's table."""
    text = DOC.read_text()
    section = text[text.index("## Real and simulated\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("component", "---"):
            continue
        rows.append((cells[0], cells[1], cells[2]))
    return rows


def names(cell: str) -> set[str]:
    """The `backticked` names of a cell."""
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_table_has_rows_of_both_kinds_and_no_other() -> None:
    kinds = {kind for _, kind, _ in table()}
    assert kinds == {"real", "SIMULATED"}


def test_every_simulator_is_a_simulated_row_and_only_there() -> None:
    files = {f"lab/sim/{p.name}" for p in SIM.iterdir()
             if p.is_file() and p.suffix in (".py", ".binpb")}
    assert files, "lab/sim has no simulators?"
    simulated = set().union(*(names(where) for _, kind, where in table() if kind == "SIMULATED"))
    real = set().union(*(names(c) | names(w) for c, kind, w in table() if kind == "real"))
    assert files - simulated == set(), "simulators the table does not list as SIMULATED"
    assert files & real == set(), "simulators the table calls real"
    named = {n for n in simulated | real if n.startswith("lab/sim/")}
    assert named - files == set(), "the table names simulators that do not exist"


def test_every_built_component_is_a_real_row_and_never_simulated() -> None:
    real = set().union(*(names(c) for c, kind, _ in table() if kind == "real"))
    simulated = set().union(*(names(c) for c, kind, _ in table() if kind == "SIMULATED"))
    for builder, binaries in (("lab/kube/build.py", build.BINARIES),
                              ("lab/runtime/build.py", (*runtime_build.CONTAINERD_BINARIES,
                                                        *runtime_build.RUNC_BINARIES)),
                              ("lab/kueue/build.py", kueue_build.BINARIES)):
        built = {b.name for b in binaries}
        assert built - real == set(), f"components {builder} builds that no real row names"
        assert built & simulated == set(), "built components the table calls SIMULATED"
        assert all(builder in w for c, kind, w in table()
                   if kind == "real" and names(c) & built)
    assert {"kubelet", "kubeadm", "kubectl", "kube-scheduler", "containerd", "runc",
            "kueue"} <= real


def test_the_prose_calls_no_built_component_simulated() -> None:
    """The page's other sections say the same as the table (the old list of simulated vendor
    packages named the kubelet)."""
    text = DOC.read_text()
    for match in re.finditer(r"SIMULATED[^.]*\.", text):
        sentence = match.group(0)
        for name in ("kubelet", "kubeadm", "kubectl", "kube-apiserver", "kube-scheduler"):
            assert f"SIMULATED {name}" not in sentence, sentence
    assert "kubelet/kubeadm/kubectl" not in text
