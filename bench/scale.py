"""`validate run` with the gpu.* checks over 16, 100, 300 and 1,000 scale harness endpoints,
beside the same commands through OpenSSH (`xargs -P`), side by side.

    python -m bench.scale [--sizes 16,100,300,1000] [--concurrency 64] [--timeout 10]
                          [--failure-rate 0.02] [--no-baseline]

For each size a fresh harness (`python -m lab.scale serve`, SIMULATED endpoints on this
checkout's GPUREADY_LAB_NET) serves the endpoints, 2% of them failing in each of its ways
(refuse, stall, slow, drop), then:

1. this suite: `python -m validate run -i <harness inventory> --checks 'gpu.*'` as a child
   process, whole (inventory, fan-out, parse, evaluate, report): wall seconds, its CPU per host
   (user + system, from wait4), its peak RSS; every node's rows are checked against what each
   failure mode must report (tests/scale_expect.py);
2. OpenSSH: `xargs -P <concurrency>` running, per endpoint, the same four commands as four
   `ssh` calls under `timeout <timeout>` (host key checking on, the harness's known_hosts), the
   outputs kept in files: transport only (no parsing, no report), the practical floor of a
   shell-script sweep. Its CPU counts every ssh it ran.

Prints a row per size and the 1,000/100 time ratio of both, and the issue's goals (1,000
endpoints under 60 s with every node right, RSS under 1 GiB, CPU per host at 1,000 no higher
than at 16). The harness's own CPU is printed apart: on this machine it shares the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.paths import REPO_ROOT
from lab.scale.inventory import read_plan
from lab.scale.plan import Endpoint
from tests.scale_expect import problems, rows_by_node

CHECKS = 11  # the gpu.* checks
COMMANDS = ("nvidia-smi -q -x", "nvidia-smi topo -m", "nvidia-smi nvlink -s",
            "journalctl --no-pager -o short-iso SYSLOG_IDENTIFIER=kernel --since -24h")


@dataclass
class Measure:
    wall_s: float
    cpu_s: float
    rss_mib: float
    harness_cpu_s: float
    wrong: list[str]


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(argv: list[str], harness_pid: int, feed: str = "", env: dict[str, str] | None = None
           ) -> tuple[float, float, float, float, int]:
    """wall s, CPU s (the child and everything it waited for), peak RSS MiB, harness CPU s,
    exit status."""
    harness_before = _cpu_of(harness_pid)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(feed)
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            _cpu_of(harness_pid) - harness_before, proc.returncode)


def _harness(endpoints: int, rate: float, directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.scale", "serve", "--endpoints", str(endpoints),
         "--failure-rate", str(rate), "--dir", str(directory)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "ready" not in line:
        proc.terminate()
        raise SystemExit(f"harness did not start: {line.strip() or proc.wait()}")
    return proc


def _suite(directory: Path, out: Path, args: argparse.Namespace, harness_pid: int) -> Measure:
    argv = [sys.executable, "-m", "validate", "run", "-i", str(directory / "inventory"),
            "--checks", "gpu.*", "--out", str(out), "--timeout", str(args.timeout),
            "--concurrency", str(args.concurrency)]
    wall, cpu, rss, hcpu, _ = _timed(argv, harness_pid)
    by_node = rows_by_node(out / "latest" / "results.csv")
    return Measure(wall, cpu, rss, hcpu, problems(read_plan(directory), by_node, CHECKS))


def _openssh(directory: Path, out: Path, args: argparse.Namespace, harness_pid: int) -> Measure:
    endpoints = read_plan(directory)
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={directory / 'known_hosts'}",
           "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={args.timeout:g}",
           "-i", str(directory / "id_ed25519"), "-l", "root"]
    script = (
        'o="$OUT/$1"; mkdir -p "$o"; i=0\n'
        f"for c in {' '.join(shlex.quote(c) for c in COMMANDS)}; do\n"
        '  i=$((i+1))\n'
        f'  timeout {args.timeout:g} {shlex.join(ssh)} -p "$3" "$2" $c > "$o/$i" 2>/dev/null\n'
        '  echo $? >> "$o/rc"\n'
        "done\n")
    listing = "".join(f"{e.name} {e.address} {e.port}\n" for e in endpoints)
    argv = ["xargs", "-P", str(args.concurrency), "-n", "3", "sh", "-c", script, "sweep"]
    wall, cpu, rss, hcpu, _ = _timed(argv, harness_pid, listing, {**os.environ, "OUT": str(out)})
    return Measure(wall, cpu, rss, hcpu, _openssh_wrong(endpoints, out))


def _openssh_wrong(endpoints: list[Endpoint], out: Path) -> list[str]:
    """Endpoints whose four outputs all came (or did not) against what their failure mode
    allows."""
    wrong = []
    for e in endpoints:
        try:
            rcs = (out / e.name / "rc").read_text().split()
        except FileNotFoundError:
            rcs = []
        all_ok = rcs == ["0"] * len(COMMANDS)
        if all_ok != (e.failure in ("", "slow")):
            wrong.append(f"{e.name} ({e.failure or 'healthy'}): rcs {rcs}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="16,100,300,1000")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--failure-rate", type=float, default=0.02)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"scale bench: validate run --checks 'gpu.*' over SIMULATED scale harness endpoints, "
          f"{args.failure_rate:.0%} each refuse/stall/slow/drop, --timeout {args.timeout:g}, "
          f"--concurrency {args.concurrency} (xargs -P {args.concurrency} for OpenSSH)")
    print(f"{'nodes':>6} | {'suite s':>8} {'CPU/host ms':>11} {'RSS MiB':>8} {'wrong':>5} "
          f"{'harness CPU s':>13} | {'openssh s':>9} {'CPU/host ms':>11} {'wrong':>5} "
          f"{'harness CPU s':>13}")
    suite: dict[int, Measure] = {}
    base: dict[int, Measure] = {}
    with tempfile.TemporaryDirectory(prefix="gpuready-scale-") as tmp:
        for n in sizes:
            directory = Path(tmp) / f"h{n}"
            harness = _harness(n, args.failure_rate, directory)
            try:
                suite[n] = s = _suite(directory, Path(tmp) / f"r{n}", args, harness.pid)
                line = (f"{n:>6} | {s.wall_s:>8.1f} {s.cpu_s / n * 1000:>11.1f} "
                        f"{s.rss_mib:>8.0f} {len(s.wrong):>5} {s.harness_cpu_s:>13.1f} |")
                if not args.no_baseline:
                    base[n] = b = _openssh(directory, Path(tmp) / f"o{n}", args, harness.pid)
                    line += (f" {b.wall_s:>9.1f} {b.cpu_s / n * 1000:>11.1f} {len(b.wrong):>5} "
                             f"{b.harness_cpu_s:>13.1f}")
                print(line, flush=True)
                for problem in s.wrong[:10]:
                    print(f"       suite reported wrongly: {problem}")
                for problem in base[n].wrong[:5] if n in base else []:
                    print(f"       openssh got wrongly: {problem}")
            finally:
                harness.terminate()
                harness.wait()
    if 100 in suite and 1000 in suite:
        ratio = suite[1000].wall_s / suite[100].wall_s
        extra = (f", openssh {base[1000].wall_s / base[100].wall_s:.1f}"
                 if 100 in base and 1000 in base else "")
        print(f"1000/100 time ratio: suite {ratio:.1f} (goal <= 11){extra}")
    if 1000 in suite:
        big = suite[1000]
        print(f"goals at 1000: every node right {not big.wrong}; under 60 s "
              f"{big.wall_s < 60} ({big.wall_s:.1f} s); RSS < 1 GiB {big.rss_mib < 1024} "
              f"({big.rss_mib:.0f} MiB)"
              + (f"; CPU/host <= at 16 {big.cpu_s / 1000 <= suite[16].cpu_s / 16}"
                 if 16 in suite else ""))
    print(json.dumps({"suite": {n: vars(m) | {"wrong": len(m.wrong)} for n, m in suite.items()},
                      "openssh": {n: vars(m) | {"wrong": len(m.wrong)}
                                  for n, m in base.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
