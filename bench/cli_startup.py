"""Start-up cost of `python -m validate`: this checkout against a baseline commit, side by side.

    python -m bench.cli_startup [--baseline REV] [--rounds 5]

For each command below, runs ``python -m validate ARGS`` in a fresh interpreter from this
checkout and from the baseline's tree (``git archive REV``, run with the same interpreter and
venv: ``-m`` puts the tree first on sys.path), alternating A/B per round so that other load hits
both alike, and measures the CPU (user + system) each process used, from rusage. Prints the
median per command and side, and the ratio baseline / this checkout (> 1: this checkout starts
faster). The commands are the ones a user or a roll starts without needing the data libraries:
help, the check list, and ``upgrade mark``'s own argument parsing.

Default baseline: fa6dae4, the last commit before the command line imported per subcommand.
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lab.paths import REPO_ROOT

COMMANDS = (
    ("--help",),
    ("gate", "--help"),
    ("checks",),
    ("upgrade", "mark", "--help"),
    ("history", "--help"),
)


def cpu_of(argv: list[str], cwd: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} in {cwd}: exit {proc.returncode}: "
                         f"{proc.stderr.decode(errors='replace')[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def extract(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev], cwd=REPO_ROOT, capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="fa6dae4", help="git revision to compare against")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuready-cli-bench-") as tmp:
        base = extract(args.baseline, Path(tmp))
        sides = {"this": REPO_ROOT, args.baseline: base}
        cpu: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for command in COMMANDS:
                for side, tree in sides.items():
                    argv_ = [sys.executable, "-m", "validate", *command]
                    cpu.setdefault((" ".join(command), side), []).append(cpu_of(argv_, tree))
    print(f"{'command':22} {'this':>8} {args.baseline:>10} {'ratio':>6}")
    for command in COMMANDS:
        name = " ".join(command)
        this = statistics.median(cpu[(name, "this")])
        then = statistics.median(cpu[(name, args.baseline)])
        print(f"{name:22} {this:7.2f}s {then:9.2f}s {then / this:5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
