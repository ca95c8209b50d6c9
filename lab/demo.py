"""`make demo`: the whole pipeline on the lab, ending with a workload through the queue.

Boots the demo fleet (one healthy host per pool, one with three injected faults, and the control
plane cp1: real Kubernetes built from source, set up by the real kubeadm), runs
`playbooks/site.yml` on it (bootstrap, join the cluster tainted, validate, gate), shows the
Nodes as `kubectl get nodes --show-labels` lists them and prints where the report is. Then the
cluster layer and the acceptance (lab/cluster_layer.py): Kueue installed for real,
`playbooks/cluster.yml`, `playbooks/acceptance.yml`, and Kueue's Workloads, the Jobs and the
nodes their Pods ran on. The lab
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

from lab import cluster_layer, controlplane, core
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
    accepted = True
    if controlplane.control_plane(state.hosts) is not None and kubeconfig.exists():
        try:
            accepted = _acceptance(paths, state, env)
        except LabError as exc:
            print(f"demo: error: {exc}", file=sys.stderr)
            accepted = False
    if args.down:
        core.down(paths)
        print("demo: lab stopped")
    else:
        print("demo: the lab is still up (`python -m lab status`); `make lab-down` stops it")
    return 0 if latest.exists() and accepted else 1


def _acceptance(paths: LabPaths, state: core.LabState, env: dict[str, str]) -> bool:
    """The cluster layer and the acceptance through Kueue: playbooks/cluster.yml and
    playbooks/acceptance.yml, then what Kueue and the scheduler did (lab/cluster_layer.py)."""
    from validate.cluster.render import acceptance_team  # noqa: PLC0415 (Ansible: slow)
    from validate.cluster.spec import load_spec  # noqa: PLC0415

    inventory = paths.inventory_dir
    print("\ndemo: the cluster layer: the GPU Operator's ClusterPolicy CRD (no operator runs "
          "here: its device plugin is SIMULATED and reads what cluster.yml writes) and Kueue "
          "v0.19.2 (built from source, running for real)")
    took = cluster_layer.prepare(paths, state)
    print(f"demo: Kueue ready ({took:.0f} s); running playbooks/cluster.yml")
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    cluster = subprocess.run([playbook, "-i", str(inventory), "playbooks/cluster.yml"],
                             cwd=REPO_ROOT, env=env, check=False)
    if cluster.returncode != 0:
        print(f"demo: cluster.yml exited {cluster.returncode}", file=sys.stderr)
        return False
    spec = load_spec(inventory)
    namespaces = sorted({team.namespace for pool in spec.pools
                         if (team := acceptance_team(spec, pool)) is not None})
    cluster_layer.load_acceptance_image(paths, cluster_layer.gpu_kubelet_hosts(state))
    print("demo: running playbooks/acceptance.yml: each pool's acceptance Job through its team's "
          "Kueue queue, on the lab's acceptance image (SIMULATED nccl-tests; the lab's Pods use "
          "the host network, so Pod Security in namespace(s) "
          f"{', '.join(namespaces)} allows it while they run)")
    with cluster_layer.host_network_allowed(paths, namespaces):
        run = subprocess.run([playbook, "-i", str(inventory), "playbooks/acceptance.yml",
                              "-e", "acceptance_checkpoint_mib=64",
                              "-e", "acceptance_timeout_s=180"],
                             cwd=REPO_ROOT, env=env, check=False)
    selector = "gpuready.io/acceptance-run"
    for title, args in (
            ("Kueue's Workloads (kubectl get workloads -A)", ("get", "workloads", "-A")),
            ("the acceptance Jobs (kubectl get jobs -A -l gpuready.io/acceptance-run)",
             ("get", "jobs", "-A", "-l", selector)),
            ("where their Pods ran (kubectl get pods -A -o wide -l ...)",
             ("get", "pods", "-A", "-l", selector, "-o",
              "custom-columns=NAMESPACE:.metadata.namespace,POD:.metadata.name,"
              "NODE:.spec.nodeName,STATUS:.status.phase,"
              "GPUS:.spec.containers[0].resources.limits.nvidia\\.com/gpu"))):
        print(f"demo: {title}:")
        print(cluster_layer.kubectl(paths, *args, check=False).stdout, end="")
    report = REPO_ROOT / "reports" / "latest-acceptance"
    if report.exists():
        print(f"demo: acceptance report: {report.resolve()}/summary.md")
    print(f"demo: acceptance.yml exited {run.returncode}")
    return run.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
