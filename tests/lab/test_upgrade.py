"""Rolling upgrades on the lab (issue 33): playbooks/upgrade.yml moves a pool of four GPU hosts
(lab/fleets/upgrade.yml) from driver 550.90.07 to 550.90.12 against the lab's real control plane
(kube-apiserver, kube-controller-manager, real kubelets joined by the real kubeadm). The driver
packages are the lab repository's SIMULATED ones; the upgrade, the reboot it needs (the lab's
simulated kernel keeps the old module loaded until one), the drain, the validation and the gate
are the real code paths. Work runs on the pool as a Deployment of four Pods, one per node
(required anti-affinity; the lab's locally built image, real kubelets, placed by the real
kube-scheduler) under a PodDisruptionBudget that allows one disruption at a time: the real API
server refuses an eviction while a Pod is missing, and the replacement for a drained node's Pod
waits Pending until that node is admitted and uncordoned. A watcher counts the Ready Pods all
along: never fewer than three. One lab serves the module; the tests run in file order on it:

- site.yml admits the four nodes at the old pin; the Deployment and its PDB go on; the pin
  changes in the inventory;
- the dry run (--check) lists the batches and the drains (each node's Pod) and changes nothing;
- a roll, one node at a time, with a fault (an uncorrectable ECC error) put into node3 while
  it is being upgraded: node1 and node2 are upgraded, rebooted, validated and admitted; node3
  fails validation and stays cordoned and tainted with its code; the roll stops there (budget
  0) and node4 keeps the old pin, never drained;
- with node3 repaired, a roll interrupted after node4's drain leaves node4 cordoned with its
  state on the Node; the next roll skips the nodes already at the pin (nothing drained or
  patched there) and takes node3 and node4 through;
- a last roll has nothing to do: it changes nothing and drains nothing;
- (issue 40) the nodes started on the previous Kubernetes and containerd releases (the lab
  builds both): a roll of the kubelet pin runs kubeadm's node upgrade on each node in turn
  (drain, packages, `kubeadm upgrade node`, the kubelet restarted), and every Node then
  reports the new kubeletVersion from a kubelet started after its package changed, the
  workload never below its budget; the dry run shows each node's installed and running
  kubelet;
- a containerd pin rolled on one node restarts containerd on the new release, keeping its
  images, and leaves the others as they were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from lab import core
from lab.kube import images
from lab.paths import LabPaths
from tests.lab import kube_pods
from tests.lab.cluster_helpers import PREFIX, TAINT_KEY, Cluster, PlaybookRun
from tests.lab.conftest import print_past_capture, running_lab, ssh

OLD, NEW = "550.90.07", "550.90.12"  # both in the lab's Debian 12 CUDA repository
# Kubernetes and containerd.io: the previous releases the nodes start on, the current ones the
# later rolls move them to (the lab builds both of each: lab/kube/build.py, lab/runtime/build.py).
KUBE_OLD, KUBE_NEW = "1.37.1-1.1", "1.37.2-1.1"
CONTAINERD_OLD, CONTAINERD_NEW = "2.2.8-1~debian.12~bookworm", "2.2.9-1~debian.12~bookworm"
# What each Node reports running (status.nodeInfo).
KUBELET_OLD, KUBELET_NEW = "v1.37.1", "v1.37.2"
RUNTIME_OLD, RUNTIME_NEW = "containerd://2.2.8", "containerd://2.2.9"
KUBEADM_TASK = "Run kubeadm upgrade node"
NODES = ("node1", "node2", "node3", "node4")
STATE, DETAIL = f"{PREFIX}/upgrade-state", f"{PREFIX}/upgrade-detail"
UPGRADING_TASK = "Record that the node is being upgraded"
DRAIN_TASK = "Drain the node (cordon, taint, evict through the Eviction API)"
APP = "workers"  # the Deployment (one Pod per node) and its PodDisruptionBudget
POOL = {"upgrade_limit": "pool_h100_sxm"}  # the roll of one named pool, as the README runs it


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = time.monotonic()
    paths = LabPaths.default()
    with running_lab(fleet="upgrade", converged=True) as state:
        cluster = Cluster(state, paths, tmp_path_factory.mktemp("upgrade"),
                          tmp_path_factory.mktemp("vault"))
        # The pool starts on the previous Kubernetes and containerd releases (the converged
        # snapshot has the current ones: this site.yml moves the packages back before the join).
        set_pins(cluster, NODES, kubelet_version=KUBE_OLD, containerd_version=CONTAINERD_OLD)
        site = cluster.playbook("site.yml", label="site.yml")
        assert site.rc == 0, {h: site.failures(h) for h in (*NODES, "localhost")}
        for host in NODES:
            assert images.load(paths, host)[0] == images.IMAGE
        kube_pods.apply(cluster.kubeconfig, kube_pods.spread_deployment(APP, len(NODES)))
        kube_pods.apply(cluster.kubeconfig, kube_pods.disruption_budget(APP, 1))
        kube_pods.wait_for("one Ready Pod per node", lambda: sorted(
            kube_pods.ready_pods(cluster.kubeconfig, APP).values()) == list(NODES), 180)
        yield cluster
    print_past_capture(request, f"test_upgrade: {time.monotonic() - started:.0f} s in all "
                                f"({'; '.join(cluster.log)})")


def set_pins(cluster: Cluster, hosts: tuple[str, ...], **pins: str) -> None:
    """Change pins in the inventory, as an SRE does before a roll (the lab's generated
    hosts.yml: host variables beat the pool's group_vars)."""
    path = cluster.paths.inventory_dir / "hosts.yml"
    doc = yaml.safe_load(path.read_text())
    pool = doc["all"]["children"]["gpu_nodes"]["children"]["pool_h100_sxm"]["hosts"]
    for host in hosts:
        pool[host].update(pins)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def set_pin(cluster: Cluster, version: str) -> None:
    """The driver pin of the pool's every node."""
    set_pins(cluster, NODES, nvidia_driver_version=version)


def driver(cluster: Cluster, host: str) -> str:
    """The user-space driver the host runs (nvidia-smi's library) and the loaded module."""
    proc = ssh(cluster.state.host(host).address,
               "nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; "
               "cat /run/gpuready-lab/nvidia-module-version")
    assert proc.returncode == 0, proc.stderr
    library, module = proc.stdout.split()
    assert library == module, proc.stdout  # rebooted where needed: no mismatch
    return library


def boots(cluster: Cluster, host: str) -> int:
    return int((cluster.paths.host_dir(host) / "boots").read_text())


def nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {n: cluster.node(n) for n in NODES}


def view(node: dict[str, Any]) -> tuple[Any, ...]:
    """What a roll may change on a Node: labels, annotations, taints, cordon."""
    meta, spec = node["metadata"], node["spec"]
    return (meta.get("labels"), meta.get("annotations"), spec.get("taints"),
            spec.get("unschedulable"))


def admitted(node: dict[str, Any]) -> bool:
    return (node["metadata"]["labels"].get(f"{PREFIX}/validation") == "passed"
            and TAINT_KEY not in [t["key"] for t in node["spec"].get("taints", [])]
            and not node["spec"].get("unschedulable"))


def order(run: PlaybookRun, task: str) -> list[str]:
    return [e["event_data"]["host"] for e in run.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task]


def plan_lines(run: PlaybookRun) -> list[str]:
    return run.debug_lines("Show the plan")


def shown(run: PlaybookRun, task: str, host: str) -> list[str]:
    """The lines a debug task showed for the host."""
    for e in run.events:
        data = e.get("event_data", {})
        if (e.get("event") == "runner_on_ok" and data.get("task") == task
                and data.get("host") == host):
            return [str(line) for line in data.get("res", {}).get("msg", [])]
    return []


def drain_lines(run: PlaybookRun, host: str) -> list[str]:
    """What ``validate upgrade drain`` printed for the host."""
    return shown(run, "Show the drain", host)


def gate_lines(run: PlaybookRun, host: str) -> list[str]:
    """What the gate printed for the host's validation run."""
    return shown(run, "Show the gate's decision", host)


def pods_on(cluster: Cluster) -> dict[str, str]:
    """{node: the name of its Ready Pod of the Deployment}."""
    return {node: pod for pod, node in kube_pods.ready_pods(cluster.kubeconfig, APP).items()}


@contextmanager
def fewest_ready(cluster: Cluster) -> Iterator[list[int]]:
    """Counts the Deployment's Ready Pods every half second while the block runs; yields a list
    whose one item is the fewest seen (the PDB allows one of four to be missing). A read that
    fails stops the watch and fails the test: an unwatched roll proves nothing."""
    seen = [len(NODES)]
    reads: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                ready = len(kube_pods.ready_pods(cluster.kubeconfig, APP))
            except BaseException as exc:  # reported by the test below
                errors.append(exc)
                return
            reads.append(ready)
            seen[0] = min(seen[0], ready)
            stop.wait(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
    assert not errors, f"the Ready-Pod watch failed: {errors[0]!r}"
    assert reads, "the Ready-Pod watch read nothing"


def test_the_dry_run_lists_batches_and_drains_and_changes_nothing(lab: Cluster) -> None:
    assert all(admitted(n) for n in nodes(lab).values())
    assert {driver(lab, h) for h in NODES} == {OLD}
    set_pin(lab, NEW)
    before, patches, boots0 = nodes(lab), lab.admin_patches(), {h: boots(lab, h) for h in NODES}
    run = lab.playbook("upgrade.yml", extravars=POOL, cmdline="--check",
                       label="upgrade.yml --check")
    assert run.rc == 0, {h: run.failures(h) for h in NODES}
    lines = plan_lines(run)
    assert lines[0] == ("upgrade plan: 4 of 4 node(s) to upgrade in 4 batch(es) (serial 1); "
                        "0 at the pins; 0 unreadable"), lines
    assert f"  node1: driver library {OLD} -> {NEW}; driver module {OLD} -> {NEW}" in lines
    assert [line for line in lines if line.startswith("batch")] == [
        "batch 1: node1", "batch 2: node2", "batch 3: node3", "batch 4: node4"]
    assert order(run, DRAIN_TASK) == list(NODES)
    pods = pods_on(lab)
    for host in NODES:
        assert drain_lines(run, host) == [
            f"drain {host} (dry run): would cordon, taint and evict 1 pod(s)",
            f"  evict default/{pods[host]}"], host  # the PDB allows one: nothing blocked now
        assert run.count("changed", host) == 0, (host, run.changed_tasks(host))
    assert lab.admin_patches() == patches
    assert {h: view(n) for h, n in nodes(lab).items()} == {h: view(n) for h, n in before.items()}
    assert {driver(lab, h) for h in NODES} == {OLD}
    assert {h: boots(lab, h) for h in NODES} == boots0


def test_a_fault_during_the_roll_keeps_the_node_out_and_stops_the_roll(lab: Cluster) -> None:
    boots0 = {h: boots(lab, h) for h in NODES}

    def fault_node3(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if (event.get("event") == "runner_on_ok" and data.get("host") == "node3"
                and data.get("task") == UPGRADING_TASK):
            core.set_faults(lab.paths, "node3", add=["ecc-uncorrectable"], remove=[],
                            clear=False)
        return True

    pods = pods_on(lab)
    with fewest_ready(lab) as fewest:
        run = lab.playbook("upgrade.yml", extravars=POOL, label="roll (node3 faulted)",
                           event_handler=fault_node3)
    assert run.rc != 0
    assert fewest[0] >= len(NODES) - 1, fewest  # the PDB held: one Pod missing at a time
    assert order(run, DRAIN_TASK) == ["node1", "node2", "node3"]  # one at a time, then stop
    after = nodes(lab)
    for host in ("node1", "node2"):
        assert run.failures(host) == [], host
        assert admitted(after[host]), view(after[host])
        assert after[host]["metadata"]["annotations"][STATE] == "done"
        assert driver(lab, host) == NEW
        assert boots(lab, host) == boots0[host] + 1  # the new module needs the reboot
        assert f"  evicted default/{pods[host]}" in drain_lines(run, host)
        decision = gate_lines(run, host)
        assert decision[0] == f"{host}: passed; patched in 1 attempt(s)", decision
        assert not any(STATE in line or DETAIL in line for line in decision), decision
    node3 = after["node3"]
    assert run.failures("node3"), "node3 fails the roll"
    decision = gate_lines(run, "node3")
    assert decision[0].startswith("node3: failed (") and "gpu.ecc.uncorrectable" in decision[0]
    assert node3["spec"]["unschedulable"] is True
    assert [(t["key"], t["value"]) for t in node3["spec"]["taints"]
            if t["key"] == TAINT_KEY] == [(TAINT_KEY, "failed")]
    assert "gpu.ecc.uncorrectable" in node3["metadata"]["annotations"][
        f"{PREFIX}/failed-checks"]
    assert node3["metadata"]["annotations"][STATE] == "failed"
    assert "the gate did not admit it" in node3["metadata"]["annotations"][DETAIL]
    assert driver(lab, "node3") == NEW  # upgraded; it is the GPU that failed
    node4 = after["node4"]
    assert STATE not in node4["metadata"].get("annotations", {})
    assert admitted(node4)
    assert driver(lab, "node4") == OLD and boots(lab, "node4") == boots0["node4"]
    # node1's and node2's Pods came back once they were admitted (new Pods, placed by the
    # scheduler); node3's waits Pending while node3 is cordoned; node4's never moved.
    def back() -> dict[str, str] | None:
        placed = pods_on(lab)
        return placed if {"node1", "node2"} <= placed.keys() else None

    now = kube_pods.wait_for("node1 and node2 running Pods again", back, 120)
    assert sorted(now) == ["node1", "node2", "node4"], now
    assert now["node4"] == pods["node4"]
    assert now["node1"] != pods["node1"] and now["node2"] != pods["node2"]


def test_an_interrupted_roll_resumes_and_skips_the_nodes_at_the_pin(lab: Cluster) -> None:
    core.set_faults(lab.paths, "node3", add=[], remove=["ecc-uncorrectable"], clear=False)
    drained: list[str] = []

    def watch(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == DRAIN_TASK:
            drained.append(str(data.get("host")))
        return True

    with fewest_ready(lab) as fewest:
        run = lab.playbook("upgrade.yml", extravars=POOL,
                           label="roll (interrupted after node4's drain)",
                           event_handler=watch, cancel_callback=lambda: "node4" in drained)
    assert run.rc != 0
    assert fewest[0] >= len(NODES) - 1, fewest
    lines = plan_lines(run)
    assert lines[0].startswith("upgrade plan: 2 of 4 node(s) to upgrade"), lines
    assert "  node3: its last roll stopped at failed" in lines
    assert (f"node1: at the pins (runs kubelet {KUBELET_OLD}, "
            f"{RUNTIME_OLD}), not drained") in lines
    node4 = lab.node("node4")
    assert node4["spec"]["unschedulable"] is True
    assert node4["metadata"]["annotations"][STATE] in ("drained", "upgrading")
    assert admitted(lab.node("node3"))
    # The next roll picks node4 up where it stopped; node1-3 are not drained or patched.
    before = nodes(lab)
    with fewest_ready(lab) as fewest:
        run = lab.playbook("upgrade.yml", extravars=POOL, label="roll (resumed)")
    assert run.rc == 0, {h: run.failures(h) for h in NODES}
    assert fewest[0] >= len(NODES) - 1, fewest
    assert order(run, DRAIN_TASK) == ["node4"]
    after = nodes(lab)
    for host in ("node1", "node2", "node3"):
        assert view(after[host]) == view(before[host]), host
    assert admitted(after["node4"]) and after["node4"]["metadata"]["annotations"][STATE] == "done"
    assert {driver(lab, h) for h in NODES} == {NEW}
    kube_pods.wait_for("one Ready Pod per node again",
                       lambda: sorted(pods_on(lab)) == list(NODES), 120)


def test_a_roll_with_nothing_to_do_changes_nothing(lab: Cluster) -> None:
    before, patches, pods = nodes(lab), lab.admin_patches(), pods_on(lab)
    run = lab.playbook("upgrade.yml", extravars=POOL, label="roll (nothing to do)")
    assert run.rc == 0
    assert plan_lines(run)[0] == ("upgrade plan: 0 of 4 node(s) to upgrade in 0 batch(es) "
                                  "(serial 1); 4 at the pins; 0 unreadable")
    assert order(run, DRAIN_TASK) == []
    assert all(run.count("changed", h) == 0 for h in NODES)
    assert lab.admin_patches() == patches
    assert {h: view(n) for h, n in nodes(lab).items()} == {h: view(n) for h, n in before.items()}
    assert all(admitted(n) for n in nodes(lab).values())
    assert pods_on(lab) == pods  # the same Pods: nothing evicted


def running(cluster: Cluster, host: str) -> tuple[str, str]:
    info = cluster.node(host)["status"]["nodeInfo"]
    return info["kubeletVersion"], info["containerRuntimeVersion"]


def started_after_install(cluster: Cluster, host: str, unit: str, package: str) -> bool:
    """Whether ``unit``'s main process started after dpkg last unpacked ``package`` (its
    file list's mtime): the running binary is the installed one."""
    proc = ssh(cluster.state.host(host).address,
               f"systemctl show -p ExecMainStartTimestampMonotonic --value {unit}; "
               f"stat -c %Y /var/lib/dpkg/info/{package}.list; cat /proc/uptime; date +%s")
    assert proc.returncode == 0, proc.stderr
    start_us, installed, uptime, now = proc.stdout.split("\n")[:4]
    boot = int(now) - float(uptime.split()[0])
    return boot + int(start_us) / 1e6 > int(installed)


def test_a_kubernetes_patch_roll_runs_the_new_kubelet_on_every_node(lab: Cluster) -> None:
    """Issue 40: a new kubelet pin is a node upgrade (drain, packages, `kubeadm upgrade node`,
    the kubelet restarted, validation, the gate), not a package swap under a running kubelet:
    the plan reads what each Node's kubelet reports besides what dpkg has, and after the roll
    every Node reports the new kubeletVersion from a kubelet that started after its package
    changed, the workload never below its budget."""
    assert {running(lab, h)[0] for h in NODES} == {KUBELET_OLD}
    set_pins(lab, NODES, kubelet_version=KUBE_NEW)
    check = lab.playbook("upgrade.yml", extravars=POOL, cmdline="--check",
                         label="upgrade.yml --check (kubelet)")
    assert check.rc == 0, {h: check.failures(h) for h in NODES}
    lines = plan_lines(check)
    assert lines[0].startswith("upgrade plan: 4 of 4 node(s) to upgrade"), lines
    # What is installed and what runs, per node (the earlier rolls' state follows).
    wanted = (f"  node1: kubelet, kubeadm, kubectl {KUBE_OLD} -> {KUBE_NEW}; "
              f"kubelet running {KUBELET_OLD} -> {KUBELET_NEW}")
    assert any(line == wanted or line.startswith(wanted + " (") for line in lines), lines
    boots0 = {h: boots(lab, h) for h in NODES}
    with fewest_ready(lab) as fewest:
        run = lab.playbook("upgrade.yml", extravars=POOL, label="roll (kubelet)")
    assert run.rc == 0, {h: run.failures(h) for h in NODES}
    assert fewest[0] >= len(NODES) - 1, fewest
    assert order(run, DRAIN_TASK) == list(NODES)
    assert order(run, KUBEADM_TASK) == list(NODES)  # kubeadm's node upgrade, node by node
    for host in NODES:
        assert running(lab, host)[0] == KUBELET_NEW, host
        assert started_after_install(lab, host, "kubelet", "kubelet"), host
        assert boots(lab, host) == boots0[host]  # a kubelet upgrade needs no reboot
        node = lab.node(host)
        assert admitted(node) and node["metadata"]["annotations"][STATE] == "done", host
    kube_pods.wait_for("one Ready Pod per node again",
                       lambda: sorted(pods_on(lab)) == list(NODES), 120)


def test_a_containerd_roll_on_one_node_restarts_containerd_on_the_new_release(
        lab: Cluster) -> None:
    """Issue 40: a containerd pin rolled on one node: drained, containerd.io upgraded and
    containerd restarted as its package does, the Node reporting the new runtime; the node's
    images and containerd state kept; the other nodes untouched."""
    before = nodes(lab)
    set_pins(lab, ("node1",), containerd_version=CONTAINERD_NEW)
    with fewest_ready(lab) as fewest:
        run = lab.playbook("upgrade.yml", extravars={"upgrade_limit": "node1"},
                           label="roll (containerd, node1)")
    assert run.rc == 0, run.failures("node1")
    assert fewest[0] >= len(NODES) - 1, fewest
    assert order(run, DRAIN_TASK) == ["node1"]
    assert running(lab, "node1")[1] == RUNTIME_NEW
    assert started_after_install(lab, "node1", "containerd", "containerd.io")
    # The lab's image, imported before the upgrade, is still in containerd's store.
    listed = ssh(lab.state.host("node1").address, "ctr -n k8s.io images ls -q")
    assert images.IMAGE in listed.stdout.split(), listed.stdout
    after = nodes(lab)
    assert admitted(after["node1"]) and after["node1"]["metadata"]["annotations"][STATE] == "done"
    for host in ("node2", "node3", "node4"):
        assert view(after[host]) == view(before[host]), host
        assert running(lab, host)[1] == RUNTIME_OLD, host
