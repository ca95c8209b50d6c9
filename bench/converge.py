"""No-op converge of the lab: the project's ansible.cfg against Ansible's defaults, side by side.

    python bench/converge.py [--nodes 8] [--rounds 1]

Boots an N-host lab (root; honours the GPUREADY_LAB_* variables like `python -m lab`),
converges it once with playbooks/bootstrap.yml, then times the second, no-op converge with
each configuration, alternating A/B per round so that load from other work on the machine hits
both alike. Each timed run must report changed=0 and no failure on every host (read from
ansible-runner's stats), or the figure would not be of a no-op converge and the bench fails.
The lab is stopped at the end, also on failure.

The baseline differs from the project only in what ansible.cfg tunes: Ansible's defaults
(forks 5, no pipelining, ...); it keeps roles_path (the playbook cannot run without it) and the
inventory's connection settings (host keys stay verified).

Output: one line per timed run, then `project <s> s, ansible defaults <s> s, ratio <x>` where
ratio = defaults / project (median over rounds; > 1 means the project's settings are faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ansible_runner

# `make bench` runs bench/*.py as scripts: put the repository root on the path for `lab`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab import core
from lab.paths import REPO_ROOT, LabPaths

BOOTSTRAP = REPO_ROOT / "playbooks" / "bootstrap.yml"
PROJECT_CFG = REPO_ROOT / "ansible.cfg"
# Ansible's defaults, plus the one setting without which the playbook cannot find its roles.
DEFAULTS_CFG = f"[defaults]\nroles_path = {REPO_ROOT / 'roles'}\n"


@dataclass(frozen=True)
class Converge:
    """One timed converge: label, wall seconds, per-host changed and failed counts."""

    label: str
    seconds: float
    changed: dict[str, int]
    failed: dict[str, int]

    @property
    def no_op(self) -> bool:
        return not any(self.changed.values()) and not any(self.failed.values())


def converge(label: str, config: Path, inventory: Path, workdir: Path) -> Converge:
    private = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    env = {"ANSIBLE_CONFIG": str(config),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    started = time.monotonic()
    # The project directory is the cwd, as for an SRE's run (the config is explicit anyway).
    runner = ansible_runner.run(private_data_dir=str(private), project_dir=str(REPO_ROOT),
                                playbook=str(BOOTSTRAP), inventory=str(inventory),
                                envvars=env, quiet=True)
    seconds = time.monotonic() - started
    stats = runner.stats or {}
    hosts = set().union(*(stats.get(k, {}) for k in ("ok", "failures", "dark")))
    failed = {h: stats.get("failures", {}).get(h, 0) + stats.get("dark", {}).get(h, 0)
              for h in hosts}
    return Converge(label, seconds, {h: stats.get("changed", {}).get(h, 0) for h in hosts},
                    failed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    paths = LabPaths.default()
    with tempfile.TemporaryDirectory(prefix="gpuready-bench-") as tmp:
        workdir = Path(tmp)
        defaults_cfg = workdir / "ansible-defaults.cfg"
        defaults_cfg.write_text(DEFAULTS_CFG)
        inventory = paths.inventory_dir
        core.down(paths)
        started = time.monotonic()
        state = core.up(paths, nodes=args.nodes, log=False)
        try:
            print(f"lab: {len(state.hosts)} hosts up in {time.monotonic() - started:.0f} s")
            first = converge("first", PROJECT_CFG, inventory, workdir)
            print(f"first converge (project ansible.cfg): {first.seconds:.1f} s")
            if any(first.failed.values()):
                print(f"bench: first converge failed on {first.failed}", file=sys.stderr)
                return 1
            timings: dict[str, list[float]] = {"project": [], "defaults": []}
            for _ in range(args.rounds):
                for label, config in (("project", PROJECT_CFG), ("defaults", defaults_cfg)):
                    run = converge(label, config, inventory, workdir)
                    print(f"no-op converge, {label:8}: {run.seconds:6.1f} s")
                    if not run.no_op:
                        print(f"bench: {label} run was not a no-op: changed {run.changed}, "
                              f"failed {run.failed}", file=sys.stderr)
                        return 1
                    timings[label].append(run.seconds)
        finally:
            core.down(paths)
    project = statistics.median(timings["project"])
    defaults = statistics.median(timings["defaults"])
    print(f"no-op converge of {args.nodes} lab hosts: project {project:.1f} s, "
          f"ansible defaults {defaults:.1f} s, ratio {defaults / project:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
