"""What CI costs: `bash .ci/run` in a fresh clone of each revision, one after another.

    python -m bench.ci REV [REV ...] [--workdir DIR] [--accounting] [--keep]

For each revision (a commit, or `WORKTREE` for the checkout's uncommitted state as a commit
on a throwaway branch), clones this repository into ``DIR/<rev>`` (no hard links: a fresh
clone, as CI makes), runs `bash .ci/run` there with its output in ``DIR/<rev>.log``, and
measures:

- wall time;
- the machine's CPU time over the run, user + system, from /proc/stat (every process on the
  machine: the lab hosts' processes run in other cgroups and sessions and are not this
  process's children, so rusage would miss them; on a quiet machine this is the run's cost);
- the CPU of this process's waited-for descendants (rusage), for comparison;
- with ``--accounting``, process accounting (`accton`, Debian's acct) over the run, summed per
  command name, so that the figure says where the CPU went;
- each lab module's and the unit suite's wall time, from the run's own table (``make test``
  prints it at its end; older revisions print `<module>: N s in all` lines instead).

The machine's speed is measured before each run with the pure-Python loop docs/performance.md
uses (10^7 additions, user CPU), so runs on different machines can be told apart.

Revisions run one after another, never at once: the lab hosts of two runs would share loopback
addresses, and two runs on two cores would measure each other. Caches outside the checkout
(the rootfs, the Kubernetes build, uv's and Go's) are the machine's: say whether they were warm.
Output: one JSON line per revision (also in ``DIR/results.jsonl``), then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.paths import REPO_ROOT

TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(user + nice, system + irq + softirq) seconds of every CPU since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice) / TICKS, (system + irq + softirq) / TICKS


def speed_loop_s() -> float:
    """User CPU of 10^7 additions in a fresh interpreter (docs/performance.md's yardstick)."""
    code = "s=0\nfor i in range(10**7): s+=i"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime


def resolve(rev: str, workdir: Path) -> str:
    """The commit to clone; WORKTREE commits the checkout's state on a throwaway ref."""
    if rev != "WORKTREE":
        return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
                              cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    index = workdir / "worktree.index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "read-tree", "HEAD"], cwd=REPO_ROOT, env=env, check=True)
    subprocess.run(["git", "add", "-A"], cwd=REPO_ROOT, env=env, check=True)
    tree = subprocess.run(["git", "write-tree"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.strip()
    commit = subprocess.run(["git", "commit-tree", tree, "-p", "HEAD", "-m", "bench.ci worktree"],
                            cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run(["git", "update-ref", "refs/bench/worktree", commit], cwd=REPO_ROOT,
                   check=True)
    return commit


MODULE_LINE = re.compile(r"^(test_\w+|unit tests?|tests/unit)\s*[:|]\s*(\d+(?:\.\d+)?) s\b")
TABLE_LINE = re.compile(r"^\|\s*(\S+)\s*\|\s*(\d+(?:\.\d+)?)\s*s?\s*\|")


def module_times(log: str) -> dict[str, float]:
    """Per-module wall seconds the run printed (its table, or older `X: N s in all` lines)."""
    times: dict[str, float] = {}
    for raw in log.splitlines():
        line = raw.strip()
        match = TABLE_LINE.match(line) or MODULE_LINE.match(line)
        if match:
            times[match.group(1)] = float(match.group(2))
    return times


def accounting_summary(acct_file: Path, top: int = 15) -> list[tuple[str, float, int]]:
    """(command, CPU seconds, processes) from a process accounting file, most CPU first."""
    # -j: seconds per call (the default is minutes in all, too coarse for short commands).
    proc = subprocess.run(["sa", "-a", "-j", str(acct_file)], capture_output=True, text=True,
                          check=False)
    rows = []
    for line in proc.stdout.splitlines()[1:]:  # the first line is the total
        parts = line.split()
        cpu = next((p for p in parts if p.endswith("cp")), None)
        if len(parts) < 3 or not parts[0].isdigit() or cpu is None:
            continue
        calls = int(parts[0])
        rows.append((parts[-1], round(calls * float(cpu[:-2]), 1), calls))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def run_one(rev: str, workdir: Path, accounting: bool, keep: bool) -> dict[str, object]:
    commit = resolve(rev, workdir)
    clone = workdir / commit[:12]
    subprocess.run(["rm", "-rf", str(clone)], check=True)
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO_ROOT), str(clone)],
                   check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    speed = speed_loop_s()
    log_path = workdir / f"{commit[:12]}.log"
    acct_file = workdir / f"{commit[:12]}.acct"
    if accounting:
        acct_file.unlink(missing_ok=True)
        acct_file.touch()
        subprocess.run(["accton", str(acct_file)], check=True)
    user0, sys0 = machine_cpu_s()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        with log_path.open("w") as log:
            rc = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=log,
                                stderr=subprocess.STDOUT, check=False).returncode
    finally:
        wall = time.monotonic() - started
        user1, sys1 = machine_cpu_s()
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if accounting:
            subprocess.run(["accton", "off"], check=False)
    log_text = log_path.read_text(errors="replace")
    result: dict[str, object] = {
        "rev": rev, "commit": commit, "rc": rc, "date": time.strftime("%Y-%m-%d"),
        "speed_loop_s": round(speed, 2), "wall_s": round(wall, 1),
        "machine_cpu_s": round((user1 - user0) + (sys1 - sys0), 1),
        "machine_user_s": round(user1 - user0, 1), "machine_sys_s": round(sys1 - sys0, 1),
        "children_cpu_s": round((children1.ru_utime - children0.ru_utime)
                                + (children1.ru_stime - children0.ru_stime), 1),
        "modules_s": module_times(log_text), "log": str(log_path),
    }
    if accounting:
        result["top_commands"] = [{"command": c, "cpu_s": s, "processes": n}
                                  for c, s, n in accounting_summary(acct_file)]
    if not keep:
        subprocess.run(["rm", "-rf", str(clone)], check=False)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs="+", help="commits to run, in order (WORKTREE: uncommitted)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the clones and logs go (default: a new directory under /tmp)")
    p.add_argument("--accounting", action="store_true",
                   help="process accounting over each run (root; Debian's acct)")
    p.add_argument("--keep", action="store_true", help="keep the clones")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpuready-bench-ci-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for rev in args.revs:
        result = run_one(rev, workdir, args.accounting, args.keep)
        results.append(result)
        line = json.dumps(result)
        print(line, flush=True)
        with (workdir / "results.jsonl").open("a") as out:
            out.write(line + "\n")
    print(f"\n{'commit':12}  {'rc':>3}  {'wall':>8}  {'machine CPU':>11}  {'speed loop':>10}")
    for r in results:
        print(f"{str(r['commit'])[:12]:12}  {r['rc']:>3}  {float(r['wall_s']) / 60:7.1f}m  "
              f"{float(r['machine_cpu_s']) / 60:10.1f}m  {r['speed_loop_s']:>9}s")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
