"""The lab's rootfs cache (issue 12): outside the checkout, shared by checkouts, one build per
recipe at a time, and a recipe another checkout may still run hosts on is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import rootfs
from lab.paths import REPO_ROOT, LabPaths

DAY_S = 24 * 3600


def test_cache_is_outside_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUREADY_LAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    paths = LabPaths(tmp_path / "checkout" / ".lab")
    assert paths.cache == tmp_path / "xdg" / "gpuready" / "lab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.cache == Path.home().resolve() / ".cache" / "gpuready" / "lab"
    assert REPO_ROOT not in LabPaths.default().cache.parents
    monkeypatch.setenv("GPUREADY_LAB_CACHE", str(tmp_path / "elsewhere"))
    assert paths.cache == tmp_path / "elsewhere"


def _recipe(cache: Path, name: str, age_s: float | None) -> Path:
    path = cache / name
    path.mkdir(parents=True)
    if age_s is not None:
        marker = path / ".gpuready-lab-complete"
        marker.write_text("{}")
        when = time.time() - age_s
        os.utime(marker, (when, when))
    return path


def test_prune_keeps_recipes_a_checkout_may_still_run_on(tmp_path: Path) -> None:
    target = _recipe(tmp_path, "rootfs-bookworm-new", 0)
    stale = _recipe(tmp_path, "rootfs-bookworm-stale", 8 * DAY_S)
    recent = _recipe(tmp_path, "rootfs-bookworm-recent", 1 * DAY_S)
    unfinished = _recipe(tmp_path, "rootfs-bookworm-unfinished", None)
    building = _recipe(tmp_path, "rootfs-bookworm-other.building", None)
    other_os = _recipe(tmp_path, "rootfs-trixie-old", 30 * DAY_S)
    rootfs._prune(tmp_path, "bookworm", target)
    assert {p for p in tmp_path.iterdir()} == {target, recent, building, other_os}
    assert not stale.exists() and not unfinished.exists()


def test_a_second_checkout_waits_for_the_build_and_uses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Another process holds the recipe's build lock; ensure_rootfs waits on it, and once the
    holder has finished the rootfs, returns it without building one of its own."""
    monkeypatch.setattr(rootfs.shutil, "which", lambda _name: "/usr/sbin/debootstrap")
    built: list[Path] = []
    monkeypatch.setattr(rootfs, "_build", lambda target, *_args: built.append(target))
    target = rootfs.rootfs_path(tmp_path)
    lock = tmp_path / f".{target.name}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         f"f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('held', flush=True); sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        result: list[Path] = []
        waiter = threading.Thread(target=lambda: result.append(rootfs.ensure_rootfs(tmp_path,
                                                                                    log=False)))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not result  # blocked on the holder's lock
        assert f"waiting for another process's build of {target}" in capfd.readouterr().err
        _recipe(tmp_path, target.name, 0)  # the holder's build completes
        holder.stdin.write("\n")
        holder.stdin.flush()
        waiter.join(30)
        assert result == [target] and built == []
    finally:
        holder.kill()
        holder.wait()
