"""The cluster step on the lab (issue 7, "Done when"): site.yml is bootstrap -> join -> validate
-> gate on a fresh lab with a real Kubernetes control plane (cp1: etcd, kube-apiserver and
kube-controller-manager v1.37 built from source, set up by the real kubeadm; lab/kube) and two
GPU hosts whose real kubelets the roles install from the lab repository and join with the real
``kubeadm join``: node1 healthy, node2 failing validation (ECC) with GPU Feature Discovery labels
(SIMULATED GFD beside the real kubelet) that contradict its hardware. One lab serves the
module; the tests run in file order on it:

- the first site.yml admits node1 and keeps node2 out, as kubectl shows;
- a second site.yml changes nothing on the hosts; the gate records the new run on each Node
  (``last-run``, ``validated-at``, ``last-run-time``) and nothing else, and gating that run
  again sends no PATCH; join.yml in check mode changes nothing either;
- drift's labels layer reports a label edited by hand on the admitted node and the taint
  removed by hand from the one kept out, reading the Node and asking the gate's decision,
  writing nothing; once the gate has put them back, drift finds nothing;
- hand-edited and stale labels under the prefix are reported (--dry-run: only reported) and put
  back, a foreign label stays;
- a half-joined host (kubelet.conf, no Node) is reset and joined again;
- bad input on node2, made to not have joined: a wrong CA pin, an expired token, the control
  plane down (the gate then exits 2 and changes nothing);
  each fails that host alone and leaves it without kubelet.conf; then it joins;
- the SIMULATED NVIDIA device plugin has registered with each host's real kubelet (again after
  the kubelet restarts above): the kubelet's device manager puts one ``nvidia.com/gpu`` per
  simulated GPU into the Node's capacity, and an Xid fault takes its GPU out of allocatable;
- no join token appears in runner artifacts, reports, logs, journals or host files.

The validators run every check: the gate admits a node only on a run that covers every check
its profile requires (a run of ``gpu.*`` alone could keep node2 out but never admit node1).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from lab import cluster_layer, controlplane, core, hosts
from lab.kube import acceptance_image, images
from lab.kube.cluster import ca_file
from lab.kueue import install as kueue_install
from lab.paths import REPO_ROOT, LabPaths
from tests.lab import kube_pods
from tests.lab.cluster_helpers import PREFIX, TAINT_KEY, Cluster, PlaybookRun
from tests.lab.conftest import lab_cli, running_lab, ssh
from tests.unit.validate.test_cluster_apply import install_crds
from validate import cli
from validate.cluster import render
from validate.cluster.spec import load_spec
from validate.model import ExitCode

# The join itself is a no_log task (ansible-core 2.19 censors its result, "changed" included);
# the task that removes the JoinConfiguration after it shows that the join ran.
JOINED_TASK = "Remove the JoinConfiguration (it holds the token)"
# The lab inventory's research team (inventory/lab/group_vars/all/cluster.yml).
TEAM = "research"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = time.monotonic()
    paths = LabPaths.default()
    with running_lab(fleet="cluster", converged=True) as state:
        assert [h.name for h in state.hosts] == ["node1", "node2", "cp1"]
        the_cluster = Cluster(state, paths, tmp_path_factory.mktemp("cluster"),
                              tmp_path_factory.mktemp("vault"))
        try:
            yield the_cluster
        finally:
            controlplane.start(paths, state.hosts)  # if a test stopped it, for `lab down`
    summary = (f"test_cluster: {time.monotonic() - started:.0f} s in all "
               f"({'; '.join(the_cluster.log)})")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{summary}")
    else:
        print(summary)


@pytest.fixture(scope="module")
def first_site(cluster: Cluster) -> PlaybookRun:
    return cluster.playbook("site.yml", label="first site.yml")


def _ours(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in node["metadata"].get("labels", {}).items()
            if k.startswith(PREFIX + "/")}


def _taint_keys(node: dict[str, Any]) -> list[str]:
    return [t["key"] for t in node["spec"].get("taints", [])]


def test_site_admits_the_healthy_node_and_keeps_the_faulty_one_out(
        cluster: Cluster, first_site: PlaybookRun) -> None:
    # The gate's verdict (a node stays out) is the play's failure, and the only one.
    assert first_site.rc != 0
    assert set(first_site.stats.get("failures", {})) == {"localhost"}
    for host in ("node1", "node2"):
        assert first_site.failures(host) == [], host
        assert JOINED_TASK in first_site.changed_tasks(host)
        assert cluster.joined(host)
        gone = ssh(cluster.state.host(host).address, "test ! -e /etc/kubernetes/gpuready-join.json")
        assert gone.returncode == 0, "the JoinConfiguration (it holds the token) is removed"
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    ready = {c["type"]: c["status"] for c in node1["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert _ours(node1) == {
        f"{PREFIX}/pool": "pool_h100_sxm", f"{PREFIX}/profile": "h100-sxm5-80gb-8x",
        f"{PREFIX}/accelerator": "h100-80gb", f"{PREFIX}/gpu-count": "8",
        f"{PREFIX}/gpu-memory-gib": "80", f"{PREFIX}/form-factor": "sxm",
        f"{PREFIX}/topology": "8gpu-sxm-nvlink", f"{PREFIX}/nvlink": "nvswitch",
        f"{PREFIX}/fabric": "infiniband", f"{PREFIX}/workload": "distributed-training",
        f"{PREFIX}/sharing": "full-gpu", f"{PREFIX}/validation": "passed",
        f"{PREFIX}/validated-at": _ours(node1)[f"{PREFIX}/last-run"],
        f"{PREFIX}/last-run": _ours(node1)[f"{PREFIX}/last-run"]}
    assert TAINT_KEY not in _taint_keys(node1)
    assert node1["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert _taint_keys(node2) == [TAINT_KEY]
    assert _ours(node2)[f"{PREFIX}/validation"] == "failed"
    assert node2["metadata"]["annotations"][f"{PREFIX}/failed-checks"] == (
        "gate.gfd_mismatch,gpu.ecc.uncorrectable")
    # The gate said what it did, and wrote it into the run directory.
    shown = first_site.debug_lines("Show what the gate did")
    # A kubelet status update between the gate's read and its patch is a conflict the gate
    # answers by reading the Node again (seen in CI: node2 in 2 attempts); any count up to the
    # gate's limit is right, a missing "patched" is not.
    patched = r"; patched in [1-5] attempt\(s\)"
    assert any(re.fullmatch(r"node1: passed" + patched, line) for line in shown), shown
    assert any(re.fullmatch(r"node2: failed \(gate\.gfd_mismatch, gpu\.ecc\.uncorrectable\)"
                            + patched, line) for line in shown), shown
    record = json.loads((REPO_ROOT / "reports" / "latest" / "gate.json").read_text())
    assert {n["node"]: n["verdict"] for n in record["nodes"]} == {"node1": "passed",
                                                                   "node2": "failed"}
    # What an SRE sees with a real kubectl.
    shown_nodes = cluster.kubectl("get", "nodes", "--show-labels")
    assert shown_nodes.returncode == 0, shown_nodes.stderr
    rows = {line.split()[0]: line for line in shown_nodes.stdout.splitlines()[1:]}
    assert rows["node1"].split()[1] == "Ready" and rows["node2"].split()[1] == "Ready"
    assert f"{PREFIX}/validation=passed" in rows["node1"]
    assert f"{PREFIX}/validation=failed" in rows["node2"]
    status = lab_cli("status")
    assert "built from source, set up by kubeadm; running" in status.stdout


def _snapshot(cluster: Cluster) -> dict[str, Any]:
    out = {}
    for name in ("node1", "node2"):
        node = cluster.node(name)
        out[name] = (node["metadata"].get("labels"), node["metadata"].get("annotations"),
                     node["spec"].get("taints"))
    return out


def test_second_site_changes_nothing(cluster: Cluster, first_site: PlaybookRun) -> None:
    del first_site  # ordering only
    before, patches_before = _snapshot(cluster), cluster.admin_patches()
    run = cluster.playbook("site.yml", label="second site.yml")
    patches = cluster.admin_patches() - patches_before
    for host in ("node1", "node2"):
        assert run.changed_tasks(host) == set(), host
        assert run.count("changed", host) == 0, host
    # The new validation run judged both nodes again: the gate records it on each Node (one
    # PATCH each) and changes nothing else.
    assert patches == 2
    run_keys = {f"{PREFIX}/last-run", f"{PREFIX}/validated-at", f"{PREFIX}/last-run-time"}
    after = _snapshot(cluster)
    for name in ("node1", "node2"):
        (labels, notes, taints), (labels0, notes0, taints0) = after[name], before[name]
        assert taints == taints0
        assert {k: v for k, v in labels.items() if k not in run_keys} == \
            {k: v for k, v in labels0.items() if k not in run_keys}
        assert {k: v for k, v in notes.items() if k not in run_keys} == \
            {k: v for k, v in notes0.items() if k not in run_keys}
        assert labels[f"{PREFIX}/last-run"] != labels0[f"{PREFIX}/last-run"]
    # That run gated again: nothing to change, no PATCH.
    latest = str((REPO_ROOT / "reports" / "latest").resolve())
    rc, out, _ = cluster.gate("--run", latest)
    assert rc == 1 and "nothing to change" in out  # node2 stays out
    assert cluster.admin_patches() - patches_before == 2
    check = cluster.playbook("join.yml", cmdline="--check --diff", label="join.yml --check")
    assert check.rc == 0
    for host in ("node1", "node2"):
        assert check.count("changed", host) == 0, (host, check.changed_tasks(host))


def _drift_labels(cluster: Cluster) -> tuple[int, str, pd.DataFrame]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["drift", "-i", str(cluster.paths.inventory_dir), "--layers", "labels",
                   "--out", str(cluster.artifacts / "drift"),
                   "--history", str(REPO_ROOT / "reports")], stdout=out, stderr=err)
    run = next(Path(line[8:]) for line in out.getvalue().splitlines()
               if line.startswith("report: "))
    return rc, out.getvalue() + err.getvalue(), pd.read_parquet(run / "drift.parquet")


def test_drift_reports_a_hand_edited_label_and_a_removed_taint(
        cluster: Cluster, first_site: PlaybookRun) -> None:
    del first_site
    for edit in (("label", "node", "node1", f"{PREFIX}/pool=pool_a100_sxm", "--overwrite"),
                 ("label", "node", "node1", "team=ml"),  # not the gate's: never drift
                 ("taint", "node", "node2", f"{TAINT_KEY}-")):
        done = cluster.kubectl(*edit)
        assert done.returncode == 0, done.stderr
    patches = cluster.admin_patches()
    rc, said, table = _drift_labels(cluster)
    assert rc == 1, said
    assert set(zip(table["node"], table["item"], table["declared"], table["actual"],
                   table["status"], strict=True)) == {
        ("node1", f"label {PREFIX}/pool", "pool_h100_sxm", "pool_a100_sxm", "drift"),
        ("node2", f"taint {TAINT_KEY}", "failed:NoSchedule", "absent", "drift")}
    assert "the gate decides failed" in table.set_index("node").loc["node2", "detail"]
    assert cluster.admin_patches() == patches  # drift only read
    rc, out, _ = cluster.gate("--run", str((REPO_ROOT / "reports" / "latest").resolve()))
    assert rc == 1 and "node2: failed" in out  # put back; node2 stays out
    rc, said, table = _drift_labels(cluster)
    assert (rc, len(table)) == (0, 0), said
    assert cluster.kubectl("label", "node", "node1", "team-").returncode == 0


def test_hand_edited_labels_are_reported_and_restored(cluster: Cluster,
                                                      first_site: PlaybookRun) -> None:
    del first_site
    run_dir = str((REPO_ROOT / "reports" / "latest").resolve())
    edits = [("label", "node", "node1", f"{PREFIX}/gpu-count=4", "--overwrite"),
             ("label", "node", "node1", f"{PREFIX}/fabric-"),
             ("label", "node", "node1", "team=ml", f"{PREFIX}/retired=yes")]
    for edit in edits:
        done = cluster.kubectl(*edit)
        assert done.returncode == 0, done.stderr
    patches = cluster.admin_patches()
    rc, out, _ = cluster.gate("--run", run_dir, "--dry-run")
    assert rc == 1  # node2 stays out
    expected = [f"  label {PREFIX}/fabric: <none> -> infiniband",
                f"  label {PREFIX}/gpu-count: 4 -> 8",
                f"  label {PREFIX}/retired: yes -> <none>"]
    assert "node1: passed; would change" in out
    assert all(line in out.splitlines() for line in expected), out
    assert cluster.admin_patches() == patches  # the dry run sent no PATCH
    assert _ours(cluster.node("node1"))[f"{PREFIX}/gpu-count"] == "4"
    rc, out, _ = cluster.gate("--run", run_dir)
    assert "node1: passed; patched in 1 attempt(s)" in out
    assert all(line in out.splitlines() for line in expected), out
    assert cluster.admin_patches() == patches + 1
    labels = cluster.node("node1")["metadata"]["labels"]
    assert labels[f"{PREFIX}/gpu-count"] == "8" and labels[f"{PREFIX}/fabric"] == "infiniband"
    assert f"{PREFIX}/retired" not in labels
    assert labels["team"] == "ml"  # outside the prefix: never touched


def test_a_half_joined_host_is_reset_and_joined_again(cluster: Cluster,
                                                      first_site: PlaybookRun) -> None:
    del first_site
    deleted = cluster.kubectl("delete", "node", "node1")
    assert deleted.returncode == 0, deleted.stderr
    assert cluster.joined("node1")  # kubelet.conf, but no Node: half-joined
    run = cluster.playbook("join.yml", label="join.yml (node1 half-joined)")
    assert run.rc == 0, run.failures("node1")
    assert {"Reset the half-joined host before joining again", JOINED_TASK} <= \
        run.changed_tasks("node1")
    assert run.changed_tasks("node2") == set()
    node1 = cluster.node("node1")
    assert _taint_keys(node1) == [TAINT_KEY]  # back in, tainted until the gate admits it
    rc, out, _ = cluster.gate("--run", str((REPO_ROOT / "reports" / "latest").resolve()))
    assert rc == 1  # node2 stays out
    assert "node1: passed; patched in 1 attempt(s)" in out
    assert TAINT_KEY not in _taint_keys(cluster.node("node1"))


def _unjoin(cluster: Cluster, host: str) -> None:
    """Make ``host`` a host that has not joined (its Node deleted, kubeadm reset)."""
    assert cluster.kubectl("delete", "node", host).returncode == 0
    reset = ssh(cluster.state.host(host).address, "kubeadm reset --force")
    assert reset.returncode == 0, reset.stderr
    assert not cluster.joined(host)


def test_bad_input_fails_the_host_alone_and_leaves_it_not_joined(
        cluster: Cluster, first_site: PlaybookRun) -> None:
    del first_site
    _unjoin(cluster, "node2")
    # A wrong CA pin.
    wrong_pin = cluster.playbook("join.yml", limit="node2", label="join.yml (wrong CA pin)",
                                 cmdline=cluster.extra_inventory("node2", {
                                     "node_join_ca_cert_hashes": ["sha256:" + "0" * 64]}))
    assert any("none of the public keys" in f and "are pinned" in f
               for f in wrong_pin.failures("node2")), wrong_pin.failures("node2")
    assert not cluster.joined("node2")
    # An expired token (made with a 1 s TTL on the control plane, as from a stale vault).
    made = ssh(cluster.state.host("cp1").address, "kubeadm token create --ttl 1s")
    assert made.returncode == 0, made.stderr
    expired = made.stdout.strip()
    cluster.tokens.add(expired)
    time.sleep(3)
    stale = cluster.playbook("join.yml", limit="node2", label="join.yml (expired token)",
                             cmdline=cluster.extra_inventory("node2",
                                                             {"node_join_token": expired}))
    # The real kubeadm (1.37) polls cluster-info for the token's signature until its discovery
    # timeout (the bootstrap signer removed it when the token expired), then says so. (The
    # simulator said "is invalid for this cluster or it has expired", kubeadm's words for a
    # signature that vanishes between its two reads.)
    token_id = expired.split(".")[0]
    assert any("could not find a JWS signature in the cluster-info ConfigMap for token ID "
               f'"{token_id}"' in f
               for f in stale.failures("node2")), stale.failures("node2")
    assert not cluster.joined("node2")
    # A kubelet that cannot start: a setting it refuses (the lab's own per-host settings kept;
    # extra vars, since the lab inventory sets this variable per host), with kubeadm told to
    # wait 20 s for its health check instead of 4 minutes. The failure names the kubelet's own
    # reason; kubeadm reset undoes what the join began, so the host is left without
    # kubelet.conf and no kubelet running, and the next run joins it.
    address = cluster.state.host("node2").address
    refused = cluster.playbook("join.yml", limit="node2", label="join.yml (kubelet refuses)",
                               extravars={
                                   "node_join_kubelet_configuration": {
                                       "address": address, "healthzBindAddress": address,
                                       "maxPods": -1},
                                   "node_join_kubelet_health_timeout": "20s"})
    assert any("The kubelet did not start:" in f and "failed to validate kubelet configuration"
               in f and "maxPods (--max-pods) -1 must not be a negative number" in f
               and "kubeadm reset undid the unfinished join" in f
               for f in refused.failures("node2")), refused.failures("node2")
    assert not cluster.joined("node2")
    kubelet = ssh(address, "systemctl is-active kubelet; test -e /var/lib/kubelet/config.yaml"
                  " && echo config-left || echo no-config")
    assert kubelet.stdout.split()[-1] == "no-config", kubelet.stdout
    assert kubelet.stdout.split()[0] == "inactive", kubelet.stdout  # reset stopped it
    # The control plane down: no token can be made, the join fails with that reason, and the
    # gate exits 2 having changed nothing.
    labels_before = cluster.node("node1")["metadata"]["labels"]
    assert controlplane.stop(cluster.paths, cluster.state.hosts)
    try:
        down = cluster.playbook("join.yml", limit="node2", label="join.yml (control plane down)")
        # At once: the role asks the API server's /readyz before kubeadm token create, which
        # would retry for kubeadm's 1-minute API-call timeout (64 s of this module before).
        assert any("Could not make a join token on cp1" in f and "not ready" in f
                   and "connection refused" in f.lower()
                   for f in down.failures("node2")), down.failures("node2")
        assert not cluster.joined("node2")
        rc, out, err = cluster.gate("--run", str((REPO_ROOT / "reports" / "latest").resolve()))
        assert rc == 2
        assert "cannot reach the Kubernetes API" in err and "nothing was changed" in err
        assert out == ""
    finally:
        controlplane.start(cluster.paths, cluster.state.hosts)
    # The cluster's state (etcd's) survived the API server's restart.
    assert cluster.node("node1")["metadata"]["labels"] == labels_before
    # With the cause gone, the host joins.
    joined = cluster.playbook("join.yml", label="join.yml (node2 again)")
    assert joined.rc == 0, joined.failures("node2")
    assert cluster.joined("node2") and _taint_keys(cluster.node("node2")) == [TAINT_KEY]


DEVICE_PLUGIN_UNIT = "gpuready-lab-device-plugin.service"


def _wait_gpus(cluster: Cluster, name: str, capacity: int, allocatable: int,
               timeout: float = 120) -> None:
    """Wait for the kubelet's status update to show these nvidia.com/gpu counts."""
    deadline = time.monotonic() + timeout
    seen: tuple[str | None, str | None] = (None, None)
    while time.monotonic() < deadline:
        status = cluster.node(name)["status"]
        seen = (status.get("capacity", {}).get("nvidia.com/gpu"),
                status.get("allocatable", {}).get("nvidia.com/gpu"))
        if seen == (str(capacity), str(allocatable)):
            return
        time.sleep(2)
    journal = hosts.host_exec(cluster.paths, name, ["journalctl", "--no-pager", "-n", "30",
                                                    "-u", DEVICE_PLUGIN_UNIT, "-u", "kubelet"])
    raise AssertionError(f"{name}: nvidia.com/gpu capacity/allocatable {seen}, not "
                         f"({capacity}, {allocatable}) in {timeout:.0f} s:\n{journal.stdout}")


def test_the_device_plugin_puts_each_node_s_gpus_into_its_capacity(
        cluster: Cluster, first_site: PlaybookRun) -> None:
    del first_site
    gpus = {}
    for name in ("node1", "node2"):
        hardware = cluster.paths.host_dir(name) / "hw" / "hardware.json"
        gpus[name] = len(json.loads(hardware.read_text())["gpus"])
        # node2's ecc-uncorrectable (counters) raises no Xid event: every GPU stays allocatable.
        _wait_gpus(cluster, name, capacity=gpus[name], allocatable=gpus[name])
        journal = hosts.host_exec(cluster.paths, name, ["journalctl", "--no-pager", "-o", "cat",
                                                        "-u", DEVICE_PLUGIN_UNIT]).stdout
        assert "SIMULATED" in journal
        # Each kubelet start (kubeadm join's, and the resets and joins above) makes a new
        # kubelet.sock: the plugin registers again only when it sees one.
        assert journal.count("Registered device plugin for 'nvidia.com/gpu' with Kubelet") >= 2
    # An Xid (GPU 0's double bit ECC error) makes the plugin report that GPU Unhealthy: the
    # kubelet keeps it in capacity and takes it out of allocatable.
    core.set_faults(cluster.paths, "node1", add=["xid-48"], remove=[], clear=False)
    try:
        _wait_gpus(cluster, "node1", capacity=gpus["node1"], allocatable=gpus["node1"] - 1)
    finally:
        core.set_faults(cluster.paths, "node1", add=[], remove=["xid-48"], clear=False)


def test_a_pod_runs_ready_on_each_node_the_roles_made(cluster: Cluster,
                                                     first_site: PlaybookRun,
                                                     tmp_path: Path) -> None:
    """Pods run under what the roles installed: their containerd (config.toml with its drop-in
    directory, the container toolkit's CRI runtimes) and kubelet, with the lab's locally built
    image (lab/kube/images.py, imported whenever containerd starts; no registry). node2 was
    kept out by the gate (tainted NoSchedule), which a Pod bound by spec.nodeName passes; one
    eviction of an unbudgeted Pod goes through the real API server."""
    del first_site
    archive = images.ensure_archive(cluster.paths)
    started = time.monotonic()
    pods = {name: f"sleep-{name}" for name in ("node1", "node2")}
    try:
        for name, pod in pods.items():
            assert images.load(cluster.paths, name)[0] == images.IMAGE
            kube_pods.apply(cluster.kubeconfig, kube_pods.sleep_pod(pod, name))
        for pod in pods.values():
            kube_pods.wait_ready(cluster.kubeconfig, pod, archive.image_id)
        cluster.log.append(f"{len(pods)} Pods Ready: {time.monotonic() - started:.0f} s")
        code, body = kube_pods.evict(cluster.kubeconfig, ca_file(cluster.paths),
                                     tmp_path, pods["node2"])
        assert code == 201, body
    finally:
        cluster.kubectl("delete", "pod", *pods.values(), "--ignore-not-found", "--wait=false")


def _files(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path


def test_the_cluster_layer_applies_on_the_lab_control_plane(cluster: Cluster,
                                                            first_site: PlaybookRun) -> None:
    """`validate cluster apply` from the lab's own inventory, on its real control plane with
    the pinned GPU Operator and Kueue CRDs (no controller of theirs runs: no images): every
    object accepted, each joined Node labelled with its pool's device plugin configuration, and
    a second apply changes nothing."""
    del first_site
    started = time.monotonic()
    install_crds(cluster.kubeconfig)
    api = cluster.api()
    api.create_namespace({"metadata": {"name": "gpu-operator"}})
    inv = str(cluster.paths.inventory_dir)
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["cluster", "apply", "-i", inv], stdout=out, stderr=err)
    assert (rc, err.getvalue()) == (ExitCode.OK, ""), out.getvalue() + err.getvalue()
    summary = out.getvalue().splitlines()[-1]
    assert re.match(r"cluster: \d+ created, 2 configured, 0 deleted, 0 unchanged; ", summary), \
        summary
    for host in ("node1", "node2"):
        labels = cluster.node(host)["metadata"]["labels"]
        assert labels["nvidia.com/device-plugin.config"] == "full-gpu", labels
    out = io.StringIO()
    assert cli.main(["cluster", "apply", "-i", inv], stdout=out, stderr=err) == ExitCode.OK
    assert re.match(r"cluster: 0 created, 0 configured, 0 deleted, \d+ unchanged; ",
                    out.getvalue().splitlines()[-1]), out.getvalue()
    cluster.log.append(f"cluster apply (CRDs, two applies): {time.monotonic() - started:.0f} s")


def test_a_time_sliced_pool_s_nodes_advertise_gpus_times_replicas(
        cluster: Cluster, first_site: PlaybookRun, tmp_path: Path) -> None:
    """Issue 43: the SIMULATED device plugin takes what `cluster apply` writes, as the real one
    does under the operator (the ClusterPolicy's devicePlugin.config, the ConfigMap, the Node's
    nvidia.com/device-plugin.config label). A site moves the H100 pool to time-slicing with two
    replicas: after the apply, each of its Nodes advertises GPUs x replicas through the real
    kubelet, the figure the renderer computed; the apply of the unchanged inventory brings one
    device per GPU back."""
    del first_site
    inv = tmp_path / "inventory"
    shutil.copytree(cluster.paths.inventory_dir, inv)
    pool_file = inv / "group_vars" / "pool_h100_sxm" / "pool.yml"
    pool = yaml.safe_load(pool_file.read_text())
    pool["gpu_pool"]["sharing"] = "time-slicing"
    pool["gpuready_cluster_time_slicing_replicas"] = 2
    pool_file.write_text(yaml.safe_dump(pool, sort_keys=False))
    spec = load_spec(inv)
    gpus = {name: len(json.loads((cluster.paths.host_dir(name) / "hw" / "hardware.json")
                                 .read_text())["gpus"]) for name in ("node1", "node2")}
    started = time.monotonic()
    out, err = io.StringIO(), io.StringIO()
    try:
        assert cli.main(["cluster", "apply", "-i", str(inv)], stdout=out, stderr=err) == \
            ExitCode.OK, out.getvalue() + err.getvalue()
        for name, count in gpus.items():
            config = render.node_labels(spec)[name][render.DEVICE_PLUGIN_CONFIG_LABEL]
            body = yaml.safe_load(render.device_plugin_configs(spec)[config])
            replicas = body["sharing"]["timeSlicing"]["resources"][0]["replicas"]
            assert replicas == 2, body
            assert cluster.node(name)["metadata"]["labels"][
                render.DEVICE_PLUGIN_CONFIG_LABEL] == config
            _wait_gpus(cluster, name, capacity=count * replicas, allocatable=count * replicas)
    finally:
        rc = cli.main(["cluster", "apply", "-i", str(cluster.paths.inventory_dir)],
                      stdout=out, stderr=err)
    assert rc == ExitCode.OK, out.getvalue() + err.getvalue()
    for name, count in gpus.items():
        _wait_gpus(cluster, name, capacity=count, allocatable=count)
        journal = hosts.host_exec(cluster.paths, name, ["journalctl", "--no-pager", "-o", "cat",
                                                        "-u", DEVICE_PLUGIN_UNIT]).stdout
        # The plugin saw the new configuration, and the old one again, as they were applied
        # (within 5 s; whether it read full-gpu before depends on how soon this test ran
        # after the first apply).
        assert "-> time-slicing-2), restarting." in journal, journal[-2000:]
        assert "Config changed (time-slicing-2 -> full-gpu), restarting." in journal, \
            journal[-2000:]
    cluster.log.append(f"time-slicing and back: {time.monotonic() - started:.0f} s")


def _job(name: str, queue: str | None, gpus: int, command: str = "echo done",
         namespace: str = TEAM) -> dict[str, Any]:
    """A Job of the lab's image in a team's namespace (the research team's unless told; host
    network, image never pulled: lab/kube/images.py), with the queue label a team's job carries
    when it has one."""
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    resources = {"requests": {"nvidia.com/gpu": str(gpus)},
                 "limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "hostNetwork": True,
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "work", "image": images.IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", command], "resources": resources,
                            "securityContext": {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}}]}}},
    }


def _events(cluster: Cluster) -> str:
    return kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "get", "events",
                             "--sort-by=.lastTimestamp").stdout[-3000:]


def _create(cluster: Cluster, doc: dict[str, Any]) -> dict[str, Any]:
    """Create the object; the object as the API server stored it (after the webhooks)."""
    proc = kube_pods.kubectl(cluster.kubeconfig, "create", "-o", "json", "-f", "-",
                             stdin=json.dumps(doc))
    assert proc.returncode == 0, proc.stderr
    created: dict[str, Any] = json.loads(proc.stdout)
    return created


def _get(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    proc = kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "get", kind, name, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def _workload_of(cluster: Cluster, job: str, namespace: str = TEAM) -> dict[str, Any] | None:
    proc = kube_pods.kubectl(cluster.kubeconfig, "-n", namespace, "get",
                             "workloads.kueue.x-k8s.io", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    for item in json.loads(proc.stdout)["items"]:
        if any(o.get("kind") == "Job" and o.get("name") == job
               for o in item["metadata"].get("ownerReferences", [])):
            found: dict[str, Any] = item
            return found
    return None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in obj.get("status", {}).get("conditions", [])
                                  if c["type"] == kind), {})
    return found


def _completed(cluster: Cluster, job: str) -> bool:
    found = _get(cluster, "job", job)
    failed = _condition(found, "Failed")
    assert failed.get("status") != "True", (failed, _events(cluster))
    return _condition(found, "Complete").get("status") == "True"


def test_kueue_admits_queued_jobs_onto_admitted_nodes_only(cluster: Cluster,
                                                          first_site: PlaybookRun) -> None:
    """Kueue v0.19.2 for real (its manager built from source, installed from its release's
    own manifests, webhooks working: lab/kueue/install.py) on the queues `validate cluster
    apply` made from the lab's inventory: a Job without a queue name is left alone; a queued
    Job is created suspended, admitted within its team's quota, unsuspended, and its Pod
    lands on the node the gate admitted (the flavor's node labels), not on the one it kept out;
    a Job over the team's quota but within what its cohort lends is admitted, borrowing (the
    ClusterQueue counts it); a Job over what the team's ClusterQueue can ever lend it stays
    suspended, and its Workload says why."""
    del first_site
    started = time.monotonic()
    took = kueue_install.install(cluster.paths, cluster.state)
    cluster.log.append(f"Kueue installed and ready: {took:.0f} s")
    for name in ("node1", "node2"):
        images.load(cluster.paths, name)
    with cluster_layer.host_network_allowed(cluster.paths, [TEAM]):
        _run_jobs(cluster)
    cluster.log.append(f"Kueue Jobs: {time.monotonic() - started - took:.0f} s")


def _run_jobs(cluster: Cluster) -> None:
    jobs = ("unqueued", "queued", "borrows", "too-big")
    try:
        # Without a queue name: Kueue's webhook lets it through unsuspended, no Workload.
        unqueued = _create(cluster, _job("unqueued", None, 0))
        assert unqueued["spec"].get("suspend") is not True, unqueued["spec"]
        kube_pods.wait_for("unqueued Complete", lambda: _completed(cluster, "unqueued"))
        assert _workload_of(cluster, "unqueued") is None

        # Queued, 1 GPU: created suspended by Kueue's mutating webhook (the Job asked for
        # nothing of the kind), then admitted and unsuspended by the manager.
        queued = _create(cluster, _job("queued", TEAM, 1))
        assert queued["spec"]["suspend"] is True, queued["spec"]
        workload = kube_pods.wait_for(
            "queued admitted",
            lambda: (w := _workload_of(cluster, "queued"))
            and _condition(w, "Admitted").get("status") == "True" and w)
        admission = workload["status"]["admission"]
        assert admission["clusterQueue"] == TEAM, admission
        assert admission["podSetAssignments"][0]["flavors"] == {"nvidia.com/gpu": "pool-h100-sxm"}
        kube_pods.wait_for("queued Complete", lambda: _completed(cluster, "queued"))
        pods = json.loads(kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "get", "pods", "-l",
                                            "job-name=queued", "-o", "json").stdout)["items"]
        assert [p["spec"]["nodeName"] for p in pods] == ["node1"], pods
        selector = pods[0]["spec"]["nodeSelector"]
        assert selector[f"{PREFIX}/validation"] == "passed", selector
        assert selector[f"{PREFIX}/pool"] == "pool_h100_sxm", selector

        # 6 GPUs: over the research queue's 4 nominal, within what it may borrow (4) from
        # the platform team's unused quota in their cohort: admitted, 2 GPUs borrowed while
        # it runs, and placed on the admitted node like any other.
        _create(cluster, _job("borrows", TEAM, 6, "sleep 30"))
        kube_pods.wait_for(
            "borrows admitted",
            lambda: (w := _workload_of(cluster, "borrows"))
            and _condition(w, "Admitted").get("status") == "True" and w)
        # The ClusterQueue's status follows admissions within a moment (the finished "queued"
        # Job's 1 GPU may still show first).
        seen: list[dict[str, str] | None] = []
        wanted = {"total": "6", "borrowed": "2"}
        try:
            kube_pods.wait_for("research using 6 GPUs, 2 borrowed", lambda: seen.append(
                _gpu_usage(cluster, TEAM)) or seen[-1] == wanted, 25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the ClusterQueue's usage: {seen[-3:]}") from None
        kube_pods.wait_for("borrows Complete", lambda: _completed(cluster, "borrows"), 120)
        pods = json.loads(kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "get", "pods", "-l",
                                            "job-name=borrows", "-o", "json").stdout)["items"]
        assert [p["spec"]["nodeName"] for p in pods] == ["node1"], pods

        # 9 GPUs: over the research queue's 4 nominal + 4 it may borrow from its cohort.
        too_big = _create(cluster, _job("too-big", TEAM, 9))
        assert too_big["spec"]["suspend"] is True
        pending = kube_pods.wait_for(
            "too-big evaluated",
            lambda: (w := _workload_of(cluster, "too-big"))
            and _condition(w, "QuotaReserved").get("status") == "False" and w)
        message = _condition(pending, "QuotaReserved")["message"]
        assert "insufficient quota for nvidia.com/gpu" in message, message
        assert _get(cluster, "job", "too-big")["spec"]["suspend"] is True
        assert _condition(pending, "Admitted").get("status") != "True"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nevents in {TEAM}:\n{_events(cluster)}") from exc
    finally:
        kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "delete", "job", *jobs,
                          "--ignore-not-found", "--wait=false")


def _gpu_usage(cluster: Cluster, queue: str) -> dict[str, str] | None:
    """The ClusterQueue's nvidia.com/gpu usage in the H100 flavor ({total, borrowed}), once
    Kueue reports one above zero."""
    status = _get(cluster, "clusterqueue", queue).get("status", {})
    for flavor in status.get("flavorsUsage", []):
        for resource in flavor.get("resources", []):
            if (flavor["name"], resource["name"]) == ("pool-h100-sxm", "nvidia.com/gpu") \
                    and str(resource.get("total", "0")) != "0":
                return {"total": str(resource["total"]),
                        "borrowed": str(resource.get("borrowed", "0"))}
    return None


def test_validate_acceptance_runs_through_kueue_on_the_admitted_node(
        cluster: Cluster, first_site: PlaybookRun, tmp_path: Path) -> None:
    """`validate acceptance` on the lab's real cluster, Kueue running (the test above): the H100
    pool's acceptance Job, 8 GPUs, goes through the research team's LocalQueue (4 GPUs of its
    own, 4 borrowed from its cohort), Kueue admits it, the scheduler puts its Pod on node1 (the
    node the gate admitted; node2, kept out, has the same GPUs idle), the kubelet runs the lab's
    acceptance image (Debian's Python and busybox, the SIMULATED nccl-tests) with the GPUs the
    lab's device plugin allocated, and the report holds every acceptance row, passed, under
    node1."""
    del first_site
    started = time.monotonic()
    for name in ("node1", "node2"):
        assert acceptance_image.load(cluster.paths, name) == acceptance_image.IMAGE
    loaded = time.monotonic() - started
    reports = tmp_path / "reports"
    out, err = io.StringIO(), io.StringIO()
    with cluster_layer.host_network_allowed(cluster.paths, [TEAM]):
        rc = cli.main(["acceptance", "-i", str(cluster.paths.inventory_dir), "--timeout", "240",
                       "--checkpoint-mib", "16", "--out", str(reports), "--run-id", "lab-acc",
                       "--validation-run", str(REPO_ROOT / "reports" / "latest")],
                      stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    if rc != ExitCode.OK:
        logs = kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "logs", "--tail=20",
                                 "-l", "gpuready.io/acceptance-run=lab-acc")
        raise AssertionError(f"{text}\nkubectl logs: {logs.stdout[-2000:]} {logs.stderr}\n"
                             f"events in {TEAM}:\n{_events(cluster)}")
    assert "admitted by Kueue (ClusterQueue research, flavor pool-h100-sxm)" in text, text
    rows = pd.read_parquet(reports / "lab-acc" / "results.parquet")
    assert set(rows["node"]) == {"node1"}, rows
    judged = rows[rows["check"] != "acceptance.cost"]
    assert set(judged["status"]) == {"pass"}, judged[["check", "metric", "status", "detail"]]
    # The cost per accepted GPU-hour of the gate's validation run against the lab's declared
    # baseline: node2 out doubles it, a warning (exit 0).
    cost = rows[rows["check"] == "acceptance.cost"].iloc[0]
    assert cost["status"] in ("pass", "warn") and cost["value"] > 0, cost["detail"]
    assert "USD per accepted GPU-hour" in cost["detail"], cost["detail"]
    assert sorted(zip(rows["check"], rows["metric"], strict=True)) == [
        ("acceptance.checkpoint", "read_mbps"), ("acceptance.checkpoint", "verified"),
        ("acceptance.checkpoint", "write_mbps"), ("acceptance.cost", "cost_per_gpu_hour"),
        ("acceptance.gpus", "gpus"),
        ("acceptance.job", "duration_s"), ("acceptance.nccl", "busbw_gbps"),
        ("acceptance.nccl", "wrong_results"), ("acceptance.placement", "validated"),
        ("acceptance.queue", "queue_wait_s")]
    gpus = rows[rows["check"] == "acceptance.gpus"].iloc[0]
    assert gpus["value"] == 8, gpus["detail"]
    assert "on node1" in gpus["detail"], gpus["detail"]
    metrics = (reports / "lab-acc" / "metrics.prom").read_text()
    assert ('gpuready_acceptance_passed{pool="pool_h100_sxm",team="research",queue="research"} 1'
            in metrics), metrics
    # Kueue's own record: the run's Workload admitted, its Job complete.
    workloads = json.loads(kube_pods.kubectl(
        cluster.kubeconfig, "-n", TEAM, "get", "workloads.kueue.x-k8s.io", "-o", "json").stdout)
    mine = [w for w in workloads["items"] if any(
        o.get("name", "").startswith("acceptance-pool-h100-sxm-lab-acc")
        for o in w["metadata"].get("ownerReferences", []))]
    assert [_condition(w, "Admitted").get("status") for w in mine] == ["True"], mine
    cluster.log.append(f"validate acceptance: image into 2 nodes {loaded:.0f} s, run "
                       f"{time.monotonic() - started - loaded:.0f} s")


def test_validate_acceptance_shows_why_a_team_over_its_quota_waits(
        cluster: Cluster, first_site: PlaybookRun, tmp_path: Path) -> None:
    """The platform team takes its 4 H100 GPUs (a Job through its own queue); the research
    team's acceptance (8 GPUs: its 4 and 4 it could borrow in the cohort, now in use) cannot be
    admitted: `validate acceptance` fails the pool under `pool:pool-h100-sxm`, with Kueue's own
    reason, and the Job stays suspended. Borrowing stops where the lender's use begins."""
    del first_site
    started = time.monotonic()
    platform = "platform"
    with cluster_layer.host_network_allowed(cluster.paths, [TEAM, platform]):
        try:
            _create(cluster, _job("hold", platform, 4, "sleep 120", namespace=platform))
            kube_pods.wait_for("platform's Job admitted", lambda: (
                w := _workload_of(cluster, "hold", platform))
                and _condition(w, "Admitted").get("status") == "True")
            reports = tmp_path / "reports"
            out, err = io.StringIO(), io.StringIO()
            rc = cli.main(["acceptance", "-i", str(cluster.paths.inventory_dir), "--timeout",
                           "15", "--checkpoint-mib", "16", "--out", str(reports), "--run-id",
                           "lab-over"], stdout=out, stderr=err)
        finally:
            kube_pods.kubectl(cluster.kubeconfig, "-n", platform, "delete", "job", "hold",
                              "--ignore-not-found", "--wait=false")
    text = out.getvalue() + err.getvalue()
    assert rc == ExitCode.CHECK_FAILED, text
    rows = pd.read_parquet(reports / "lab-over" / "results.parquet")
    assert rows[["node", "check", "status", "code"]].values.tolist() == [
        ["pool:pool-h100-sxm", "acceptance.queue", "fail", "acceptance.not_admitted"],
        ["pool:pool-h100-sxm", "acceptance.cost", "skip", "acceptance.no_cost_view"]], text
    detail = rows.iloc[0]["detail"]
    assert "not admitted: QuotaReserved=False" in detail, detail
    assert "insufficient unused quota for nvidia.com/gpu in flavor pool-h100-sxm" in detail, \
        detail
    jobs = json.loads(kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "get", "jobs", "-l",
                                        "gpuready.io/acceptance-run=lab-over", "-o",
                                        "json").stdout)["items"]
    assert [j["spec"]["suspend"] for j in jobs] == [True]
    kube_pods.kubectl(cluster.kubeconfig, "-n", TEAM, "delete", "jobs", "-l",
                      "gpuready.io/acceptance-run=lab-over", "--wait=false")
    cluster.log.append(f"validate acceptance over quota: {time.monotonic() - started:.0f} s")


def test_the_join_token_appears_nowhere(cluster: Cluster, first_site: PlaybookRun) -> None:
    del first_site
    cluster.collect_tokens()
    assert cluster.tokens, "no bootstrap token was seen"
    needles = [t.encode() for t in cluster.tokens] + [t.split(".")[1].encode()
                                                      for t in cluster.tokens]
    places: list[Path] = [cluster.artifacts, REPO_ROOT / "reports", cluster.paths.inventory_dir]
    places += [cluster.paths.host_dir(h.name) / "upper" for h in cluster.state.hosts]
    # Where the cluster keeps its tokens (etcd's data: bootstrap token Secrets) is no leak.
    etcd = cluster.paths.host_dir("cp1") / "upper/var/lib/etcd"
    found = []
    for place in places:
        for path in ([place] if place.is_file() else _files(place)):
            if path.is_relative_to(etcd):
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n.decode()}" for n in needles if n in data]
    for host in cluster.state.hosts:  # the hosts' journals (volatile, under /run)
        journal = hosts.host_exec(cluster.paths, host.name,
                                  ["journalctl", "--no-pager", "-o", "cat"], timeout=60)
        found += [f"{host.name} journal: {n.decode()}" for n in needles
                  if n.decode() in journal.stdout]
    assert found == []


def test_lab_is_still_the_one_this_module_started(cluster: Cluster) -> None:
    state = core.running_state(cluster.paths)
    assert state is not None and state.started == cluster.state.started
