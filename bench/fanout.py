"""The same GPU health sweep over N lab hosts three ways, side by side; then what DCGM's level-1
diagnostic adds to it.

    python -m bench.fanout [--nodes 16] [--rounds 3]

1. this suite: `validate.runner.run` with the gpu.* checks (paramiko, one connection per host,
   each tool once per node), parse and evaluate;
2. Ansible ad hoc: `ansible gpu_nodes -m ansible.builtin.command -a <tool> -f N` once per tool
   the checks need, results read from the json callback, then the SAME parse and evaluate;
3. plain OpenSSH in parallel (`xargs -P N ssh ...`, one ssh per host running every tool), the
   practical floor, then the SAME parse and evaluate.

Parse and evaluate are shared: the baselines' captured outputs are replayed into the suite's
checks through a transport that answers from the capture, so only the fan-out differs. Rounds
alternate the three so that other load on the machine hits all alike. Prints per-way median
wall seconds, ratios against the suite, and client CPU seconds per host (this process plus its
children).

Then the suite alone, with and without ``dcgm.diag`` (``dcgmi diag -r 1`` against the SIMULATED
host engine the lab's DCGM package runs), rounds alternating: per node, the commands it runs
and its round trips (the longest chain of commands that did not overlap: a prefetch running
beside another command on the same connection adds a command, not a round trip), and the
median wall time. Goal (issue 31): the diagnostic costs at most one extra round trip per node.
Boots its own lab (root) and stops it at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab import core
from lab.paths import REPO_ROOT, LabPaths
from validate import inventory, runner
from validate.checks import select
from validate.model import CheckResult, Status
from validate.transport import CommandResult, Transport

CHECKS = "gpu.*"
MARK = "@@gpuready-bench@@"
INSTALL = """set -e
install -d /etc/apt/keyrings
python3 -c 'import urllib.request,sys; sys.stdout.buffer.write(urllib.request.urlopen(
  "http://127.0.0.1:{port}/keyring.gpg").read())' > /etc/apt/keyrings/gpuready-lab.gpg
echo "deb [signed-by=/etc/apt/keyrings/gpuready-lab.gpg]" \
  "http://127.0.0.1:{port}/compute/cuda/repos/debian12/x86_64/ /" \
  > /etc/apt/sources.list.d/gpuready-lab.list
# The driver branch's packages at one release, as the driver role pins them (the repository
# also carries a newer one, which apt would otherwise take for the dependencies; a version pin
# needs package names or patterns: apt ignores one for `Package: *`).
printf 'Package: nvidia-* libcuda* libnvidia-* firmware-nvidia-*\nPin: version %s\n%s\n' \
  550.90.07-1 'Pin-Priority: 1001' \
  > /etc/apt/preferences.d/gpuready-bench-driver
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  nvidia-driver-cuda=550.90.07-1 nvidia-kernel-dkms=550.90.07-1 \
  nvidia-persistenced=550.90.07-1 datacenter-gpu-manager=1:3.3.6 >/dev/null
systemctl enable --now nvidia-persistenced nvidia-dcgm >/dev/null 2>&1
"""
DCGM_CHECKS = f"{CHECKS},dcgm.diag"


class Recording:
    """Wraps a transport and remembers which argv the checks ran (to replay them later) and,
    given ``calls``, when each ran (host, start, end)."""

    def __init__(self, inner: Transport, seen: set[tuple[str, ...]],
                 calls: list[tuple[str, float, float]] | None = None) -> None:
        self.inner, self.seen, self.calls = inner, seen, calls
        # The checks start their prefetches beside each other only on a transport that says it
        # can (as the suite's SSH transport does): say what the wrapped one says.
        self.concurrent_runs = bool(getattr(inner, "concurrent_runs", False))

    @property
    def host(self) -> str:
        return self.inner.host

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self.seen.add(tuple(argv))
        start = time.monotonic()
        try:
            return self.inner.run(argv, timeout)
        finally:
            if self.calls is not None:
                self.calls.append((self.host, start, time.monotonic()))

    def close(self) -> None:
        self.inner.close()

    def abort(self, code: str, reason: str) -> None:
        self.inner.abort(code, reason)


class Replay:
    """A transport that answers from outputs captured by a baseline fan-out."""

    def __init__(self, host: str, outputs: dict[tuple[str, ...], tuple[int, str]]) -> None:
        self.host = host
        self.outputs = outputs

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        rc, out = self.outputs[tuple(argv)]
        return CommandResult(argv=tuple(argv), rc=rc, stdout=out, stderr="", duration_s=0.0,
                             timed_out=False)

    def close(self) -> None:
        pass

    def abort(self, code: str, reason: str) -> None:
        pass


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def suite(nodes: Sequence[inventory.Node]) -> list[CheckResult]:
    return runner.run(nodes, select(CHECKS), run_id="bench", concurrency=len(nodes))


def _evaluate(nodes: Sequence[inventory.Node],
              captured: dict[str, dict[tuple[str, ...], tuple[int, str]]]) -> list[CheckResult]:
    return runner.run(nodes, select(CHECKS), run_id="bench", concurrency=len(nodes),
                      transport_for=lambda n: Replay(n.name, captured[n.name]))


def ansible_adhoc(nodes: Sequence[inventory.Node], argvs: list[tuple[str, ...]],
                  inv: Path) -> list[CheckResult]:
    """`ansible gpu_nodes -m ansible.builtin.command` per tool; per-host JSON from --tree."""
    captured: dict[str, dict[tuple[str, ...], tuple[int, str]]] = {n.name: {} for n in nodes}
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with tempfile.TemporaryDirectory(prefix="gpuready-fanout-tree-") as tree:
        for argv in argvs:
            proc = subprocess.run(
                [str(Path(sys.executable).parent / "ansible"), "gpu_nodes", "-i", str(inv),
                 "-f", str(len(nodes)), "-m", "ansible.builtin.command",
                 "-a", shlex.join(argv), "--tree", tree],
                capture_output=True, text=True, env=env, cwd=REPO_ROOT, check=False)
            for n in nodes:
                path = Path(tree) / n.name
                if not path.exists():
                    raise SystemExit(f"ansible wrote no result for {n.name}: {proc.stderr}")
                res = json.loads(path.read_text())
                captured[n.name][argv] = (int(res.get("rc", 255)), res.get("stdout", ""))
    return _evaluate(nodes, captured)


def openssh(nodes: Sequence[inventory.Node], argvs: list[tuple[str, ...]]) -> list[CheckResult]:
    script = "".join(f"{shlex.join(a)}; printf '\\n%s %s\\n' {MARK} $?\n" for a in argvs)
    node = nodes[0]
    ssh = (f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
           f"-o UserKnownHostsFile={node.known_hosts} -i {node.key_file} -l {node.user}")
    addresses = "\n".join(f"{n.address} {n.name}" for n in nodes)
    cmd = (f"xargs -P {len(nodes)} -L 1 sh -c "
           f"'{ssh} \"$0\" sh -s < \"$OUT/script\" > \"$OUT/$1\" 2>/dev/null'")
    outdir = Path(tempfile.mkdtemp(prefix="gpuready-fanout-"))
    (outdir / "script").write_text(script)
    subprocess.run(["sh", "-c", cmd], input=addresses, text=True,
                   env={**os.environ, "OUT": str(outdir)}, check=False)
    captured: dict[str, dict[tuple[str, ...], tuple[int, str]]] = {}
    for n in nodes:
        text = (outdir / n.name).read_text()
        parts = re.split(rf"\n{MARK} (\d+)\n", text)
        if len(parts) != 2 * len(argvs) + 1:
            raise SystemExit(f"{n.name}: ssh output has {len(parts) // 2} of {len(argvs)} tools")
        outputs = {argv: (int(parts[2 * i + 1]), parts[2 * i]) for i, argv in enumerate(argvs)}
        captured[n.name] = outputs
    shutil.rmtree(outdir)
    return _evaluate(nodes, captured)


def measure(label: str, fn: Callable[[], list[CheckResult]], nodes: int
            ) -> tuple[float, float, list[CheckResult]]:
    cpu, wall = _cpu(), time.monotonic()
    rows = fn()
    wall, cpu = time.monotonic() - wall, _cpu() - cpu
    print(f"  {label:<14} {wall:6.2f} s wall, {cpu / nodes * 1000:6.1f} ms client CPU/host, "
          f"{len(rows)} rows", flush=True)
    return wall, cpu / nodes, rows


def _summary(rows: list[CheckResult]) -> set[tuple[str, str, str, str]]:
    return {(r.node, r.check, r.metric, r.status.value) for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = LabPaths.default()
    state = core.up(paths, nodes=args.nodes, log=True)
    try:
        with ThreadPoolExecutor(8) as pool:
            for host, proc in zip(state.hosts, pool.map(lambda h: subprocess.run(
                    ["ssh", "-o", "BatchMode=yes", "-o",
                     f"UserKnownHostsFile={paths.known_hosts}", "-i", str(paths.ssh_key),
                     f"root@{h.address}", INSTALL.format(port=state.repo_port)],
                    capture_output=True, text=True, check=False), state.hosts), strict=True):
                if proc.returncode != 0:
                    raise SystemExit(f"{host.name}: provisioning failed: {proc.stderr[-500:]}")
        inv = paths.inventory_dir
        nodes = inventory.load(inv)
        seen: set[tuple[str, ...]] = set()
        runner.run(nodes, select(CHECKS), run_id="warmup", concurrency=len(nodes),
                   transport_for=lambda n: Recording(runner.default_transport(n), seen))
        argvs = sorted(seen)
        print(f"{len(nodes)} lab hosts, checks {CHECKS}, {len(argvs)} commands per host")
        ways: dict[str, Callable[[], list[CheckResult]]] = {
            "suite": lambda: suite(nodes),
            "ansible ad hoc": lambda: ansible_adhoc(nodes, argvs, inv),
            "openssh xargs": lambda: openssh(nodes, argvs),
        }
        walls: dict[str, list[float]] = {k: [] for k in ways}
        cpus: dict[str, list[float]] = {k: [] for k in ways}
        verdicts: dict[str, set[tuple[str, str, str, str]]] = {}
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}")
            order = list(ways)[rnd % 3:] + list(ways)[:rnd % 3]
            for label in order:
                wall, cpu, rows = measure(label, ways[label], len(nodes))
                walls[label].append(wall)
                cpus[label].append(cpu)
                verdicts[label] = _summary(rows)
        if len({frozenset(v) for v in verdicts.values()}) != 1:
            raise SystemExit("the three ways reached different verdicts: not the same sweep")
        base = statistics.median(walls["suite"])
        print("median over rounds:")
        for label in ways:
            med = statistics.median(walls[label])
            print(f"  {label:<14} {med:6.2f} s  ({med / base:4.2f}x the suite's time), "
                  f"{statistics.median(cpus[label]) * 1000:6.1f} ms client CPU/host")
        print(f"suite vs ansible ad hoc: {statistics.median(walls['ansible ad hoc']) / base:.1f}x "
              f"faster; vs plain OpenSSH: "
              f"{statistics.median(walls['openssh xargs']) / base:.2f}x")
        ok = dcgm_cost(nodes, args.rounds)
    finally:
        core.down(paths)
    return 0 if ok else 1


def _recording(seen: set[tuple[str, ...]], calls: list[tuple[str, float, float]]
               ) -> Callable[[inventory.Node], Transport]:
    return lambda n: Recording(runner.default_transport(n), seen, calls)


def round_trips(calls: list[tuple[str, float, float]]) -> float:
    """Per node, the most commands that ran one after another (none overlapping: greedy by
    end time), averaged over the nodes."""
    chains: dict[str, int] = {}
    for host in {c[0] for c in calls}:
        last_end = float("-inf")
        for _, start, end in sorted((c for c in calls if c[0] == host), key=lambda c: c[2]):
            if start >= last_end:
                chains[host] = chains.get(host, 0) + 1
                last_end = end
    return statistics.mean(chains.values()) if chains else 0.0


def dcgm_cost(nodes: Sequence[inventory.Node], rounds: int) -> bool:
    """The suite with and without dcgm.diag: round trips per node and median wall time."""
    trips: dict[str, float] = {}
    commands: dict[str, float] = {}
    argvs: dict[str, set[tuple[str, ...]]] = {}
    walls: dict[str, list[float]] = {CHECKS: [], DCGM_CHECKS: []}
    for rnd in range(rounds):
        for checks in (CHECKS, DCGM_CHECKS)[::1 if rnd % 2 == 0 else -1]:
            calls: list[tuple[str, float, float]] = []
            seen: set[tuple[str, ...]] = set()
            start = time.monotonic()
            rows = runner.run(nodes, select(checks), run_id="bench-dcgm",
                              concurrency=len(nodes),
                              transport_for=_recording(seen, calls))
            walls[checks].append(time.monotonic() - start)
            trips[checks], argvs[checks] = round_trips(calls), seen
            commands[checks] = len(calls) / len(nodes)
            if checks == DCGM_CHECKS:
                diag = {r.status for r in rows if r.check == "dcgm.diag"}
                if diag != {Status.PASS}:
                    raise SystemExit(f"dcgm.diag did not pass on the healthy hosts: {diag}")
    extra = trips[DCGM_CHECKS] - trips[CHECKS]
    added = sorted(" ".join(a[:3]) for a in argvs[DCGM_CHECKS] - argvs[CHECKS])
    base, with_diag = statistics.median(walls[CHECKS]), statistics.median(walls[DCGM_CHECKS])
    print(f"dcgm.diag (level 1) beside {CHECKS}, median of {rounds} rounds each:")
    print(f"  commands per node: {commands[CHECKS]:.1f} without, {commands[DCGM_CHECKS]:.1f} "
          f"with (new: {'; '.join(added) or 'nothing'})")
    print(f"  round trips per node: {trips[CHECKS]:.1f} without, {trips[DCGM_CHECKS]:.1f} with "
          f"(+{extra:.1f})")
    print(f"  wall: {base:.2f} s without, {with_diag:.2f} s with ({with_diag / base:.2f}x)")
    ok = extra <= 1.0
    print(f"goal (at most one extra round trip per node): {'met' if ok else 'MISSED'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
