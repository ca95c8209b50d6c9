"""make test's lab tests as two labs at once: the critical path of CI, cut in two.

    python -m tools.lab_tests [--times PREFIX] [PYTEST_ARG ...]
    python -m tools.lab_tests --down      stop the second session's lab (make clean)

The lab tests boot hosts, converge and roll them; one lab alone leaves much of this machine's
two cores idle (Ansible's controller waits on SSH, apt, kubelets and reboots). So ``make test``
runs them as two pytest sessions side by side, each with a lab of its own:

- the **first** in this checkout: ``test_roles.py`` (which makes the converged snapshots) and
  the modules that boot from them, and any module not named in :data:`SECOND`;
- the **second** (:data:`SECOND`: the rolls of ``test_upgrade.py`` and the short modules that
  need no snapshot) in a copy of this checkout's files at ``.lab/second/checkout``, so
  everything a lab test writes beside its code (the lab directory, ``reports/``, the generated
  lab inventory, artifacts) is its own and never the first session's. Its hosts live on
  :data:`SECOND_NET` and its package repository on port :data:`SECOND_PORT`
  (``GPUREADY_LAB_NET``, ``GPUREADY_LAB_REPO_PORT``: the lab's own settings for a second lab);
  its Python imports the copy (``PYTHONPATH``), Ansible and the validators included.

No test is dropped or repeated: every module under tests/lab runs in exactly one session (a
new one runs in the first unless it is added to :data:`SECOND`). Each session writes its
module times to ``PREFIX-first.json`` and ``PREFIX-second.json`` (tests/conftest.py), and its
output goes to this process's output line by line, each line prefixed with its session's name.
The exit status is 0 only if both sessions passed; a session that could not start is an error
that names it. ``make lab-test`` still runs every lab module in one session, in this checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_TESTS = REPO_ROOT / "tests" / "lab"
# The second session's modules: test_upgrade.py (the longest module; it converges its fleet
# from the bare rootfs, having no snapshot in its lab) and modules that never boot from one.
SECOND = ("test_upgrade.py", "test_kube.py", "test_lab_faults.py", "test_lab.py",
          "test_reliability.py", "test_dcgm_exporter.py", "test_bastion.py")
SECOND_NET = "127.0.2.0/24"
SECOND_PORT = 18081
COPY = REPO_ROOT / ".lab" / "second" / "checkout"
# What a copy keeps from one run to the next: its own lab state (hosts, keys, snapshots), which
# `lab down` in the copy cleans up first; never deleted from outside (a lab left running by an
# interrupted run has mounts under it).
KEPT = (".lab",)
NO_TESTS = 5  # pytest's exit status when no test was selected


def modules() -> tuple[list[str], list[str]]:
    """(first, second): tests/lab's modules by session, by file name."""
    found = sorted(p.name for p in LAB_TESTS.glob("test_*.py"))
    missing = [m for m in SECOND if m not in found]
    if missing:
        raise SystemExit(f"tools/lab_tests.py: SECOND names {', '.join(missing)}, "
                         f"which {LAB_TESTS} does not have")
    return [m for m in found if m not in SECOND], [m for m in found if m in SECOND]


def checkout_files(root: Path = REPO_ROOT) -> list[str]:
    """The checkout's files as git sees them: tracked and untracked but not ignored (what the
    working tree's tests run), relative to the root."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=root, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"tools/lab_tests.py: git ls-files failed in {root}: "
                         f"{proc.stderr.decode(errors='replace').strip()}")
    return [f for f in proc.stdout.decode().split("\0") if f and (root / f).is_file()]


def sync_copy(copy: Path = COPY, root: Path = REPO_ROOT) -> int:
    """Make ``copy`` hold exactly the checkout's files (kept: :data:`KEPT`, and what git
    ignores there, such as reports); returns how many files were written."""
    files = checkout_files(root)
    copy.mkdir(parents=True, exist_ok=True)
    wanted = set(files)
    manifest = copy / ".lab-tests-manifest"
    if manifest.exists():  # files an earlier sync wrote that the checkout no longer has
        for old in manifest.read_text().splitlines():
            if old not in wanted and not old.startswith(tuple(k + "/" for k in KEPT)):
                (copy / old).unlink(missing_ok=True)
    written = 0
    for name in files:
        source, target = root / name, copy / name
        if target.is_file() and not target.is_symlink() and _same(source, target):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        shutil.copy2(source, target, follow_symlinks=False)
        written += 1
    manifest.write_text("\n".join(files) + "\n")
    return written


def _same(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()
    return sa.st_size == sb.st_size and a.read_bytes() == b.read_bytes()


def second_env(copy: Path = COPY) -> dict[str, str]:
    env = dict(os.environ)
    if env.get("GPUREADY_LAB_NET") == SECOND_NET or env.get("GPUREADY_LAB_REPO_PORT") == str(
            SECOND_PORT):
        raise SystemExit(f"tools/lab_tests.py: GPUREADY_LAB_NET or GPUREADY_LAB_REPO_PORT in this "
                         f"environment is the second lab's ({SECOND_NET}, port {SECOND_PORT})")
    for name in ("GPUREADY_LAB_DIR", "GPUREADY_LAB_INVENTORY"):  # the copy's own, by default
        env.pop(name, None)
    env.update(GPUREADY_LAB_NET=SECOND_NET, GPUREADY_LAB_REPO_PORT=str(SECOND_PORT),
               PYTHONPATH=os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")])))
    return env


def _relay(name: str, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        with lock:
            out.write(f"[{name}] {raw.decode(errors='replace')}")
            out.flush()


def run(pytest_args: list[str], times: str, out: IO[str] = sys.stdout) -> int:
    first, second = modules()
    written = sync_copy()
    out.write(f"lab tests: two labs at once; first (this checkout): {', '.join(first)}; "
              f"second ({COPY.relative_to(REPO_ROOT)}, {SECOND_NET}, {written} file(s) "
              f"copied): {', '.join(second)}\n")
    out.flush()
    # A lab the copy's last run left (interrupted) goes first, as running_lab does for its own.
    down(quiet=True)
    sessions = {
        "first": (REPO_ROOT, dict(os.environ), first),
        "second": (COPY, second_env(), second),
    }
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    relays = []
    for name, (cwd, base_env, mods) in sessions.items():
        env = {**base_env, "GPUREADY_TEST_TIMES": str(Path(f"{times}-{name}.json").resolve())}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *[f"tests/lab/{m}" for m in mods], "-q",
             *pytest_args], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs[name] = proc
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(name, proc.stdout, out, lock))
        relay.start()
        relays.append(relay)
    try:
        codes = {name: proc.wait() for name, proc in procs.items()}
    except KeyboardInterrupt:  # each session stops its own labs on the way out
        for proc in procs.values():
            proc.send_signal(2)
        codes = {name: proc.wait() for name, proc in procs.items()}
    for relay in relays:
        relay.join()
    # pytest's 5: no test selected in that session (PYTEST_ARGS='-k ...' chose the other's).
    said = {n: f"exit {c}" + (" (no test selected)" if c == NO_TESTS else "")
            for n, c in codes.items()}
    out.write("lab tests: " + "; ".join(f"{n} session {s}" for n, s in said.items()) + "\n")
    ran = [c for c in codes.values() if c != NO_TESTS]
    return 0 if ran and all(c == 0 for c in ran) else 1


def down(quiet: bool = False) -> int:
    """Stop the second session's lab, if a copy is there (make clean, and before a run)."""
    if not (COPY / "lab").is_dir():
        return 0
    sink = subprocess.DEVNULL if quiet else None
    return subprocess.run([sys.executable, "-m", "lab", "down"], cwd=COPY, env=second_env(),
                          stdout=sink, stderr=sink, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab_tests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--times", default=".lab/test-times-lab",
                        help="each session's module times go to TIMES-first.json and "
                             "TIMES-second.json (default %(default)s)")
    parser.add_argument("--down", action="store_true",
                        help="only stop the second session's lab (make clean)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.down:
        return down()
    return run(pytest_args, args.times)


if __name__ == "__main__":
    sys.exit(main())
