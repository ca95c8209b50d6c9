"""Multi-node fabric validation of N lab hosts with two faulty ones: suspect/confirm against
testing every pair, side by side.

    python -m bench.fabric [--nodes 16] [--rounds 1]

1. suspect/confirm: `validate.fabric.run_fabric` (pass 1: disjoint pairs; pass 2: each suspect
   with a node that passed), about n/2 + 2 per faulty node pair runs;
2. all pairs: every one of the n(n-1)/2 pairs, scheduled as a round-robin tournament (n-1
   rounds of n/2 disjoint pairs, the same parallelism), a node called bad when most of its
   pairs fail; the baseline a site without a plan would run.

Both run through the same pair executor (mpirun over SSH with a per-run key, the simulated
all_reduce_perf as a real MPI program on the lab hosts), at the same concurrency. Prints pair
runs, wall seconds, the most runs any node took part in, and the nodes each way found bad
(they must agree and be the two faulty hosts). Rounds alternate the two ways. Boots its own
lab of one RDMA pool (root), provisions it from the lab repository and stops it at the end,
also on failure. The SIMULATED bandwidths make the verdicts; the launches, SSH hops and MPI
exchanges are real, so the wall times are what the orchestration costs on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from lab import core
from lab.paths import LabPaths
from tests.lab.conftest import ssh
from tests.lab.test_fabric import PROVISION
from validate import fabric, inventory, runner
from validate.fabric import PairExecutor, PairRun
from validate.fabric_launch import PairSettings
from validate.model import Status
from validate.profiles import load_profile

FAULTY = {"ib-link-degraded": 5, "ib-rail-down": 12}  # fault -> host number


def round_robin(names: list[str]) -> list[list[tuple[str, str]]]:
    """Every pair exactly once, in n-1 rounds of disjoint pairs (the circle method)."""
    ring = list(names) + ([""] if len(names) % 2 else [])
    rounds = []
    for _ in range(len(ring) - 1):
        half = len(ring) // 2
        pairs = [(ring[i], ring[-1 - i]) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a and b])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


Way = Callable[[list[inventory.Node], int], tuple[list[PairRun], set[str]]]


def suspect_confirm(nodes: list[inventory.Node], concurrency: int
                    ) -> tuple[list[PairRun], set[str]]:
    """The check's own plan: its pair runs and the nodes it failed."""
    outcome = fabric.run_fabric(nodes, run_id=f"bench-sc-{time.time_ns()}",
                                transport_for=runner.default_transport, concurrency=concurrency)
    if outcome.leftovers:
        raise SystemExit(f"run keys left behind: {outcome.leftovers}")
    return list(outcome.runs), {r.node for r in outcome.rows if r.status is Status.FAIL}


def all_pairs(nodes: list[inventory.Node], concurrency: int) -> tuple[list[PairRun], set[str]]:
    """Every pair once; a node is bad when most of its pairs fail."""
    settings: dict[str, PairSettings] = {}
    for node in nodes:
        found = fabric.pair_settings(node, load_profile(
            node.profile, node.vars.get("gpu_thresholds"), inventory_vars=node.vars))
        assert isinstance(found, PairSettings), found
        settings[node.name] = found
    executor = PairExecutor({n.name: n for n in nodes}, f"bench-all-{time.time_ns()}",
                            runner.default_transport)
    runs: list[PairRun] = []
    try:
        for pairs in round_robin([n.name for n in nodes]):
            runs += executor.run_wave([(a, b, settings[a]) for a, b in pairs], 1, concurrency)
    finally:
        left = executor.sweep()
        executor.close()
    if left:
        raise SystemExit(f"run keys left behind: {left}")
    failing: dict[str, int] = {}
    for r in runs:
        for name in (r.launcher, r.peer):
            failing[name] = failing.get(name, 0) + (r.status is Status.FAIL)
    return runs, {n for n, count in failing.items() if count > (len(nodes) - 1) / 2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8, help="pair runs at a time")
    args = parser.parse_args()
    paths = LabPaths.default()
    faults = [f"node{number}={fault}" for fault, number in FAULTY.items()]
    state = core.up(paths, fleet="fabric", nodes=args.nodes, faults=faults, log=True)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda h: (h.name, ssh(
                h.address, PROVISION.format(port=state.repo_port), timeout=900)), state.hosts))
        for name, proc in results:
            if proc.returncode != 0:
                raise SystemExit(f"{name}: provisioning failed: {proc.stderr[-500:]}")
        print(f"{args.nodes} lab hosts of one RDMA pool provisioned in "
              f"{time.monotonic() - started:.0f} s; faulty: "
              + ", ".join(f"node{n} ({f})" for f, n in FAULTY.items()), flush=True)
        nodes = list(inventory.load(paths.inventory_dir))
        ways: dict[str, Way] = {
            "suspect/confirm": suspect_confirm, "all pairs": all_pairs}
        walls: dict[str, list[float]] = {k: [] for k in ways}
        counts: dict[str, int] = {}
        found: dict[str, set[str]] = {}
        for rnd in range(args.rounds):
            order = list(ways)[rnd % 2:] + list(ways)[:rnd % 2]
            for label in order:
                wall = time.monotonic()
                runs, found[label] = ways[label](nodes, args.concurrency)
                wall = time.monotonic() - wall
                per_node: dict[str, int] = {}
                for r in runs:
                    for name in (r.launcher, r.peer):
                        per_node[name] = per_node.get(name, 0) + 1
                walls[label].append(wall)
                counts[label] = len(runs)
                print(f"  {label:<16} {len(runs):4d} pair runs, {wall:7.1f} s wall, at most "
                      f"{max(per_node.values())} runs per node; bad: "
                      f"{', '.join(sorted(found[label])) or 'none'}", flush=True)
        expected = {f"node{n}" for n in FAULTY.values()}
        if any(bad != expected for bad in found.values()):
            raise SystemExit(f"the ways disagree or missed a faulty host: {found}")
        base = statistics.median(walls["all pairs"])
        mine = statistics.median(walls["suspect/confirm"])
        n = args.nodes
        print(f"median over {args.rounds} round(s): suspect/confirm {counts['suspect/confirm']} "
              f"runs in {mine:.1f} s; all pairs {counts['all pairs']} runs "
              f"(n(n-1)/2 = {n * (n - 1) // 2}) in {base:.1f} s: "
              f"{counts['all pairs'] / counts['suspect/confirm']:.1f}x the runs, "
              f"{base / mine:.1f}x the wall time")
    finally:
        core.down(paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
