"""`make demo`: the whole pipeline on the lab, ending with the cluster and the report.

Boots the demo fleet (one healthy host per pool, one with three injected faults, and the control
plane cp1: real Kubernetes built from source, set up by the real kubeadm), runs
`playbooks/site.yml` on it (bootstrap, join the cluster tainted, validate, gate), shows the
Nodes as `kubectl get nodes --show-labels` lists them and prints where the report is. The lab
stays up so you can look around; `make lab-down` stops it. Run again while that lab is up, it
runs the pipeline on the same hosts: a converged host has nothing to change, and the validators
and the gate judge it again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from lab import controlplane, core
from lab.errors import LabError
from lab.paths import REPO_ROOT, LabPaths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.demo", description=__doc__)
    parser.add_argument("--fleet", default="demo")
    parser.add_argument("--down", action="store_true", help="stop the lab at the end")
    args = parser.parse_args(argv)
    paths = LabPaths.default()
    try:
        state = core.running_state(paths)
        if state is None:
            print(f"demo: booting the '{args.fleet}' lab fleet (SIMULATED GPUs, real Debian "
                  "hosts)")
            state = core.up(paths, fleet=args.fleet)
        elif state.fleet == args.fleet:
            # The lab an earlier demo left up: the pipeline runs on it again, and a converged
            # host shows it has nothing to change.
            print(f"demo: the '{args.fleet}' lab fleet is already up (an earlier demo left it); "
                  "running the pipeline on it again (`make lab-down` first for new hosts)")
        else:
            raise LabError(f"the lab is already running the '{state.fleet}' fleet: "
                           "`make lab-down` first (the demo boots its own fleet)")
    except LabError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    print(f"demo: {len(state.hosts)} hosts up; running playbooks/site.yml (bootstrap, join "
          "the cluster tainted, validate, gate)")
    inventory = paths.inventory_dir
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    play = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         "playbooks/site.yml"], cwd=REPO_ROOT, env=env, check=False)
    latest = REPO_ROOT / "reports" / "latest"
    print()
    print(f"demo: site.yml exited {play.returncode} (hosts with injected faults fail on purpose)")
    kubeconfig = controlplane.admin_kubeconfig(paths)
    if shutil.which("kubectl") and kubeconfig.exists():
        print(f"demo: the cluster (kubectl --kubeconfig {kubeconfig} get nodes --show-labels; "
              "healthy nodes are labelled validation=passed and untainted, faulty ones stay "
              "tainted with validation=failed):")
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes",
                        "--show-labels"], check=False)
        prefix = yaml.safe_load((inventory / "group_vars" / "all" / "cluster.yml").read_text(
            ))["gpuready_label_prefix"].replace(".", "\\.")
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes", "-o",
                        "custom-columns=NAME:.metadata.name,TAINTS:.spec.taints[*].key,"
                        f"FAILED-CHECKS:.metadata.annotations.{prefix}/failed-checks,"
                        # The kubelet's device manager, from the SIMULATED device plugin.
                        "GPU-CAPACITY:.status.capacity.nvidia\\.com/gpu,"
                        "GPU-ALLOCATABLE:.status.allocatable.nvidia\\.com/gpu"],
                       check=False)
    if latest.exists():
        print(f"demo: report: {latest.resolve()}/summary.md (and index.html, results.parquet, "
              "junit.xml, metrics.prom)")
    else:
        print("demo: no report was written; see the play output above", file=sys.stderr)
    if args.down:
        core.down(paths)
        print("demo: lab stopped")
    else:
        print("demo: the lab is still up (`python -m lab status`); `make lab-down` stops it")
    return 0 if latest.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
