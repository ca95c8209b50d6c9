"""No-op converge of the lab: the project's ansible.cfg against Ansible's defaults, side by side.

    python -m bench.converge [--nodes 8] [--rounds 1] [--top 15] [--layout-of REV]

Boots an N-host lab (root; honours the GPUREADY_LAB_* variables like `python -m lab`),
converges it once with playbooks/bootstrap.yml, then times the second, no-op converge with
each configuration, alternating A/B per round so that load from other work on the machine hits
both alike. Each timed run must report changed=0 and no failure on every host (read from
ansible-runner's stats), or the figure would not be of a no-op converge and the bench fails.
The lab is stopped at the end, also on failure.

The baseline differs from the project only in what ansible.cfg tunes: Ansible's defaults
(forks 5, no pipelining, ...); it keeps roles_path (the playbook cannot run without it) and the
inventory's connection settings (host keys stay verified).

When the `mitogen` package is importable (it is not a dependency: `pip install mitogen`), a
third configuration runs too: the project's ansible.cfg with Mitogen's `mitogen_linear`
strategy, the candidate issue 12 asks to decide on with data.

With `--layout-of REV` (a git revision, e.g. the commit before a task-layout change), a fourth
configuration runs the project's ansible.cfg with the roles and playbook as they were at REV
(the tree at REV, extracted with `git archive`): today's task layout against that one, on the
same hosts. It must be a no-op too, which also shows both layouts converge to the same state.

Output: one line per timed run, then `project <s> s, ansible defaults <s> s, ratio <x>` where
ratio = defaults / project (median over rounds; > 1 means the project's settings are faster),
and the same for Mitogen when it ran. Then where a no-op converge spends its time with the
project's settings: task executions per host, and the tasks with the most host-seconds (summed
over hosts, from ansible-runner's per-task durations), so that task-layout work aims at them.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ansible_runner

from lab import core
from lab.paths import REPO_ROOT, LabPaths
from validate.ansible_ssh import runner_settings

BOOTSTRAP = REPO_ROOT / "playbooks" / "bootstrap.yml"
PROJECT_CFG = REPO_ROOT / "ansible.cfg"
# Ansible's defaults, plus the one setting without which the playbook cannot find its roles.
DEFAULTS_CFG = f"[defaults]\nroles_path = {REPO_ROOT / 'roles'}\n"


def mitogen_cfg(workdir: Path) -> Path | None:
    """The project's ansible.cfg with Mitogen's linear strategy, or None without mitogen."""
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or spec.origin is None:
        return None
    strategies = Path(spec.origin).parent / "plugins" / "strategy"
    text = PROJECT_CFG.read_text().replace(
        "[defaults]\n", f"[defaults]\nstrategy_plugins = {strategies}\n"
                        "strategy = mitogen_linear\n", 1)
    # The project's relative paths (inventory, roles) are relative to the checkout.
    text = text.replace("roles_path = roles", f"roles_path = {REPO_ROOT / 'roles'}")
    path = workdir / "ansible-mitogen.cfg"
    path.write_text(text)
    return path


def layout_of(rev: str, workdir: Path) -> tuple[Path, Path]:
    """(ansible.cfg, playbook) running the roles and playbooks as they were at git ``rev``."""
    # The whole tree: roles read files beside them (preflight reads validate/profiles).
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"bench: cannot read the tree at {rev!r}: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    tree = workdir / "layout"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    text = PROJECT_CFG.read_text().replace("roles_path = roles", f"roles_path = {tree / 'roles'}")
    config = workdir / "ansible-layout.cfg"
    config.write_text(text)
    return config, tree / "playbooks" / "bootstrap.yml"


@dataclass(frozen=True)
class Converge:
    """One timed converge: label, wall seconds, per-host changed and failed counts, and each
    task's host-seconds and executions per host."""

    label: str
    seconds: float
    changed: dict[str, int]
    failed: dict[str, int]
    task_seconds: dict[str, float]
    executions: dict[str, int]

    @property
    def no_op(self) -> bool:
        return not any(self.changed.values()) and not any(self.failed.values())


def converge(label: str, config: Path, inventory: Path, workdir: Path,
             playbook: Path = BOOTSTRAP) -> Converge:
    private = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    env = {"ANSIBLE_CONFIG": str(config),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    started = time.monotonic()
    # The project directory is the cwd, as for an SRE's run (the config is explicit anyway).
    runner = ansible_runner.run(private_data_dir=str(private), project_dir=str(REPO_ROOT),
                                playbook=str(playbook), inventory=str(inventory), quiet=True,
                                # Host keys verified as the validators verify them.
                                **runner_settings(inventory, private, envvars=env,
                                                  config=config))
    seconds = time.monotonic() - started
    stats = runner.stats or {}
    hosts = set().union(*(stats.get(k, {}) for k in ("ok", "failures", "dark")))
    failed = {h: stats.get("failures", {}).get(h, 0) + stats.get("dark", {}).get(h, 0)
              for h in hosts}
    task_seconds: dict[str, float] = collections.defaultdict(float)
    executions: dict[str, int] = collections.Counter()
    for event in runner.events:
        if event.get("event") not in ("runner_on_ok", "runner_on_skipped", "runner_on_failed"):
            continue
        data = event.get("event_data") or {}
        name = f"{data.get('role') or 'play'}: {data.get('task', '?')}"
        task_seconds[name] += float(data.get("duration") or 0.0)
        executions[str(data.get("host"))] += 1
    return Converge(label, seconds, {h: stats.get("changed", {}).get(h, 0) for h in hosts},
                    failed, dict(task_seconds), dict(executions))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--top", type=int, default=15, help="tasks to list by host-seconds")
    parser.add_argument("--layout-of", metavar="REV",
                        help="also time the roles and playbook as they were at this git revision")
    args = parser.parse_args(argv)
    paths = LabPaths.default()
    with tempfile.TemporaryDirectory(prefix="gpuready-bench-") as tmp:
        workdir = Path(tmp)
        defaults_cfg = workdir / "ansible-defaults.cfg"
        defaults_cfg.write_text(DEFAULTS_CFG)
        configs = [("project", PROJECT_CFG, BOOTSTRAP), ("defaults", defaults_cfg, BOOTSTRAP)]
        with_mitogen = mitogen_cfg(workdir)
        if with_mitogen is not None:
            configs.append(("mitogen", with_mitogen, BOOTSTRAP))
        else:
            print("mitogen not installed: its strategy is not compared (pip install mitogen)")
        if args.layout_of:
            configs.append(("layout", *layout_of(args.layout_of, workdir)))
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
            timings: dict[str, list[float]] = {label: [] for label, _, _ in configs}
            profile: Converge | None = None
            for _ in range(args.rounds):
                for label, config, playbook in configs:
                    run = converge(label, config, inventory, workdir, playbook)
                    if label == "project":
                        profile = run
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
    if timings.get("mitogen"):
        mitogen = statistics.median(timings["mitogen"])
        print(f"no-op converge of {args.nodes} lab hosts: project {project:.1f} s, "
              f"project + mitogen_linear {mitogen:.1f} s, ratio {project / mitogen:.2f}x")
    if timings.get("layout"):
        layout = statistics.median(timings["layout"])
        print(f"no-op converge of {args.nodes} lab hosts: project {project:.1f} s, "
              f"task layout of {args.layout_of} {layout:.1f} s, ratio {layout / project:.2f}x")
    if profile is not None:
        per_host = sorted(set(profile.executions.values()))
        print(f"task executions per host (project, no-op): {per_host}")
        total = sum(profile.task_seconds.values())
        print(f"host-seconds in tasks: {total:.0f}; the {args.top} largest:")
        ranked = sorted(profile.task_seconds.items(), key=lambda kv: -kv[1])[:args.top]
        for name, secs in ranked:
            print(f"  {secs:7.1f} s  {100 * secs / total:4.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
