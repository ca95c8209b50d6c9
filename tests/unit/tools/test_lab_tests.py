"""make test's two lab sessions (tools/lab_tests.py): every module in one, the copy exact."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools import lab_tests


def test_every_lab_module_runs_in_exactly_one_session() -> None:
    first, second = lab_tests.modules()
    on_disk = sorted(p.name for p in lab_tests.LAB_TESTS.glob("test_*.py"))
    assert sorted(first + second) == on_disk
    assert not set(first) & set(second)
    assert "test_roles.py" in first  # it makes the snapshots the first session's modules boot
    assert sorted(second) == sorted(lab_tests.SECOND)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_the_copy_holds_exactly_the_checkout_s_files_and_keeps_its_lab(tmp_path: Path) -> None:
    root, copy = tmp_path / "repo", tmp_path / "copy"
    root.mkdir()
    _git(root, "init", "-q")
    (root / ".gitignore").write_text("/.lab/\n/reports/\n")
    (root / "a.py").write_text("A = 1\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "b.py").write_text("B = 2\n")
    _git(root, "add", ".")
    (root / "new.py").write_text("untracked, not ignored: the working tree runs it\n")
    (root / ".lab").mkdir()
    (root / ".lab" / "state").write_text("ignored: never copied\n")
    assert lab_tests.sync_copy(copy, root) == 4
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*")
                  if p.is_file() and p.name != ".lab-tests-manifest") == [
        ".gitignore", "a.py", "new.py", "pkg/b.py"]
    # The copy's own lab state and reports stay; a file gone from the checkout goes; a changed
    # one is written again, an unchanged one is not.
    (copy / ".lab").mkdir()
    (copy / ".lab" / "lab.lock").write_text("")
    (copy / "reports").mkdir()
    (copy / "reports" / "run.json").write_text("{}")
    (root / "new.py").unlink()
    (root / "a.py").write_text("A = 3\n")
    assert lab_tests.sync_copy(copy, root) == 1
    assert (copy / "a.py").read_text() == "A = 3\n"
    assert not (copy / "new.py").exists()
    assert (copy / ".lab" / "lab.lock").exists() and (copy / "reports" / "run.json").exists()


def test_the_second_lab_has_its_own_addresses_port_and_code(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setenv("GPUREADY_LAB_DIR", "/somewhere/else")
    env = lab_tests.second_env(tmp_path)
    assert env["GPUREADY_LAB_NET"] == lab_tests.SECOND_NET
    assert env["GPUREADY_LAB_REPO_PORT"] == str(lab_tests.SECOND_PORT)
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert "GPUREADY_LAB_DIR" not in env  # the copy's own .lab, never the first session's
    monkeypatch.setenv("GPUREADY_LAB_NET", lab_tests.SECOND_NET)
    with pytest.raises(SystemExit, match="second lab's"):
        lab_tests.second_env(tmp_path)
