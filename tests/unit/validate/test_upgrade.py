"""validate/upgrade.py's Kubernetes side against a real kube-apiserver and the real
kube-controller-manager's disruption controller (tests/kube_helpers.py): the API server enforces
the PodDisruptionBudget on every eviction, the controller counts what it allows.

No kubelet runs here, so the test plays the kubelet's one part the drain depends on: it reports
the pods Running and Ready (their status, as a kubelet writes it) so that the disruption
controller counts them healthy. The pods have a termination grace period of 0, so an accepted
eviction deletes them at once, as a kubelet would confirm it. The lab test
(tests/lab/test_upgrade.py) rolls real nodes with real kubelets.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_helpers import LocalApiServer, core_api, running_apiserver
from tests.unit.validate.gate_runs import write_inventory
from tests.unit.validate.test_checks_runner import _node, _out
from tests.unit.validate.test_drift_probes import _probe
from validate import cli, upgrade
from validate import upgrade_cli as upgrade_args
from validate.drift import pins, probes
from validate.model import ExitCode
from validate.parsers import dpkg_query

P = "gpu.example.com.node-restriction.kubernetes.io"
NODES = ("u1", "u2", "u3", "u4", "u5")
NS = "train"
CONTROLLERS = ("disruption", "serviceaccount", "serviceaccount-token")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("upgrade"), 20, CONTROLLERS) as server:
        api = core_api(server)
        for name in NODES:
            api.create_node({"metadata": {"name": name}})
        api.create_namespace({"metadata": {"name": NS}})
        _wait(lambda: _default_sa(api), "the namespace's default ServiceAccount")
        yield server


@pytest.fixture(scope="module")
def inventory(cluster: LocalApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_inventory(tmp_path_factory.mktemp("inv"), NODES, prefix=P,
                           kubeconfig=cluster.kubeconfig)


def _default_sa(api: Any) -> bool:
    return any(sa.metadata.name == "default"
               for sa in api.list_namespaced_service_account(NS).items)


def _wait(ok: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def ready_pod(api: Any, name: str, node: str, app: str, *, bare: bool = False,
              volumes: list[dict[str, Any]] | None = None, phase: str = "Running",
              **meta: Any) -> None:
    """A pod on ``node``, Running and Ready as its kubelet would report it; owned by a
    ReplicaSet (as a Deployment's pods are) unless ``bare`` or ``meta`` names its owners."""
    if not bare:
        meta.setdefault("ownerReferences", [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-rs",
            "uid": f"rs-{app}", "controller": True}])
    spec: dict[str, Any] = {"nodeName": node, "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "c", "image": "gpuready.lab/sleep:1"}]}
    if volumes:
        spec["volumes"] = volumes
    api.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": {"app": app}, **meta},
                                   "spec": spec})
    now = "2026-12-06T00:00:00Z"
    api.patch_namespaced_pod_status(name, NS, {"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "True",
                        "lastTransitionTime": now}]}})


def pdb(api: Any, app: str, min_available: int) -> None:
    from kubernetes import client  # noqa: PLC0415

    client.PolicyV1Api(api.api_client).create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": app},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}})


def allowed(api: Any, app: str, expected: int) -> None:
    """Wait until the disruption controller has counted the app's pods."""
    from kubernetes import client  # noqa: PLC0415

    policy = client.PolicyV1Api(api.api_client)

    def counted() -> bool:
        status = policy.read_namespaced_pod_disruption_budget(app, NS).status
        return bool(status and status.observed_generation is not None
                    and status.disruptions_allowed == expected)
    _wait(counted, f"PDB {app} to allow {expected}")


def upgrade_cli(inventory: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["upgrade", args[0], "-i", str(inventory), *args[1:]], stdout=out,
                  stderr=err)
    return rc, out.getvalue(), err.getvalue()


def node(api: Any, name: str) -> Any:
    return api.read_node(name)


def our_taints(n: Any) -> list[tuple[str, str]]:
    return [(t.value, t.effect) for t in n.spec.taints or [] if t.key == f"{P}/validation"]


def test_the_pdb_lets_one_node_drain_and_holds_the_next(cluster: LocalApiServer,
                                                        inventory: Path) -> None:
    api = core_api(cluster)
    for i, n in enumerate(NODES[:4]):  # u5 is the guards' test's
        ready_pod(api, f"web-{i}", n, "web")
    ready_pod(api, "agent-u1", "u1", "agent", ownerReferences=[{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d1",
        "controller": True}])
    pdb(api, "web", 3)
    allowed(api, "web", 1)
    # The dry run says what the drain would do and changes nothing.
    before = node(api, "u1").metadata.resource_version
    rc, out, _ = upgrade_cli(inventory, "drain", "--node", "u1", "--dry-run")
    assert rc == ExitCode.OK
    assert f"evict {NS}/web-0" in out and f"leave {NS}/agent-u1" in out
    assert node(api, "u1").metadata.resource_version == before
    # u1 drains: its web pod goes through the Eviction API; the DaemonSet's pod stays.
    rc, out, err = upgrade_cli(inventory, "drain", "--node", "u1", "--timeout", "20")
    assert rc == ExitCode.OK, (out, err)
    assert f"evicted {NS}/web-0" in out
    pods = {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    assert "web-0" not in pods and "agent-u1" in pods
    u1 = node(api, "u1")
    assert u1.spec.unschedulable is True
    assert our_taints(u1) == [("upgrading", "NoSchedule")]
    assert u1.metadata.annotations[f"{P}/upgrade-state"] == "drained"
    # The PDB now allows nothing: u2's drain is refused by the API server until the timeout;
    # the node is left cordoned and tainted, the state says who is in the way.
    allowed(api, "web", 0)
    rc, out, err = upgrade_cli(inventory, "drain", "--node", "u2", "--timeout", "3")
    assert rc == ExitCode.CHECK_FAILED, (out, err)
    assert f"refused {NS}/web-1" in out and "disruption budget" in out
    assert "web-1" in {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    u2 = node(api, "u2")
    assert u2.spec.unschedulable is True and our_taints(u2) == [("upgrading", "NoSchedule")]
    state = u2.metadata.annotations
    assert state[f"{P}/upgrade-state"] == "drain-timeout"
    assert f"{NS}/web-1" in state[f"{P}/upgrade-detail"]
    # The plan's view of the same: web-1's eviction is blocked by the PDB now.
    from kubernetes import client  # noqa: PLC0415

    as_json = api.api_client.sanitize_for_serialization
    pdbs = [as_json(p) for p in
            client.PolicyV1Api(api.api_client).list_pod_disruption_budget_for_all_namespaces()
            .items]
    web1 = upgrade.pod_on_node(as_json(api.read_namespaced_pod("web-1", NS)))
    assert upgrade.blocking(web1, pdbs) == [f"PDB {NS}/web allows 0 disruption(s)"]
    # Once u1's pod is back (Ready on u1 again), the budget allows one more and u2 drains.
    ready_pod(api, "web-0b", "u1", "web")
    allowed(api, "web", 1)
    rc, out, err = upgrade_cli(inventory, "drain", "--node", "u2", "--timeout", "20")
    assert rc == ExitCode.OK, (out, err)
    assert node(api, "u2").metadata.annotations[f"{P}/upgrade-state"] == "drained"


def test_force_delete_only_when_asked(cluster: LocalApiServer, inventory: Path) -> None:
    api = core_api(cluster)
    ready_pod(api, "db-0", "u3", "db")
    pdb(api, "db", 1)
    allowed(api, "db", 0)
    rc, out, _ = upgrade_cli(inventory, "drain", "--node", "u3", "--timeout", "2")
    assert rc == ExitCode.CHECK_FAILED
    assert "db-0" in {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    rc, out, err = upgrade_cli(inventory, "drain", "--node", "u3", "--timeout", "2",
                               "--force-delete")
    assert rc == ExitCode.OK, (out, err)
    assert f"deleted {NS}/db-0 (gpuready_upgrade_force_delete)" in out
    assert "db-0" not in {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    detail = node(api, "u3").metadata.annotations[f"{P}/upgrade-detail"]
    assert "deleted by force" in detail and f"{NS}/db-0" in detail


def test_drain_refuses_bare_and_emptydir_pods_as_kubectl_does(cluster: LocalApiServer,
                                                             inventory: Path) -> None:
    """kubectl drain's guards: a bare pod needs --force, a pod with emptyDir data needs
    --delete-emptydir-data (the inventory's variables); a refusal names every pod and changes
    nothing on the Node. DaemonSet pods are left as before, finished pods pass."""
    api = core_api(cluster)
    scratch = [{"name": "scratch", "emptyDir": {}}]
    ready_pod(api, "solo", "u5", "solo", bare=True)
    ready_pod(api, "cache-0", "u5", "cache", volumes=scratch)
    ready_pod(api, "plain-0", "u5", "plain")
    ready_pod(api, "done-0", "u5", "done", bare=True, volumes=scratch, phase="Succeeded")
    ready_pod(api, "agent-u5", "u5", "agent", volumes=scratch, ownerReferences=[{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d1",
        "controller": True}])
    solo = (f"{NS}/solo: a bare pod (no controller recreates it); "
            "gpuready_upgrade_drain_force: true evicts it (kubectl drain --force)")
    cache = (f"{NS}/cache-0: emptyDir data (scratch) is lost with it; "
             "gpuready_upgrade_drain_delete_emptydir_data: true evicts it "
             "(kubectl drain --delete-emptydir-data)")
    before = node(api, "u5").metadata.resource_version
    for extra in ((), ("--dry-run",)):
        rc, out, err = upgrade_cli(inventory, "drain", "--node", "u5", "--timeout", "5",
                                   *extra)
        assert rc == ExitCode.CHECK_FAILED, (out, err)
        assert out.splitlines() == [  # in the API server's order (by name)
            f"drain u5{' (dry run)' if extra else ''}: refused, as kubectl drain refuses; "
            "nothing changed on Node u5:", f"  {cache}", f"  {solo}"]
    # Nothing changed: not cordoned, no taint, no upgrade state; every pod still there.
    u5 = node(api, "u5")
    assert u5.metadata.resource_version == before
    assert not u5.spec.unschedulable and our_taints(u5) == []
    assert f"{P}/upgrade-state" not in (u5.metadata.annotations or {})
    on_u5 = {"solo", "cache-0", "plain-0", "done-0", "agent-u5"}
    assert on_u5 <= {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    # One of the two allowed: the other pod is still refused, and only it is named.
    rc, out, _ = upgrade_cli(inventory, "drain", "--node", "u5", "--force")
    assert rc == ExitCode.CHECK_FAILED
    assert solo not in out and cache in out
    assert node(api, "u5").metadata.resource_version == before
    # The plan says the same before any drain.
    pods = [upgrade.pod_on_node(api.api_client.sanitize_for_serialization(p))
            for p in api.list_namespaced_pod(NS, field_selector="spec.nodeName=u5").items]
    needs = {p.ref: upgrade.guard_vars(p) for p in pods}
    assert needs == {f"{NS}/solo": ["gpuready_upgrade_drain_force"],
                     f"{NS}/cache-0": ["gpuready_upgrade_drain_delete_emptydir_data"],
                     f"{NS}/plain-0": [], f"{NS}/done-0": [], f"{NS}/agent-u5": []}
    # Both allowed: the drain goes ahead and says which pods went by which variable.
    rc, out, err = upgrade_cli(inventory, "drain", "--node", "u5", "--timeout", "20",
                               "--force", "--delete-emptydir-data")
    assert rc == ExitCode.OK, (out, err)
    assert (f"  evicted {NS}/solo (bare pod: nothing recreates it; "
            "gpuready_upgrade_drain_force)") in out.splitlines()
    assert (f"  evicted {NS}/cache-0 (emptyDir data: scratch; "
            "gpuready_upgrade_drain_delete_emptydir_data)") in out.splitlines()
    assert f"  evicted {NS}/plain-0" in out.splitlines()
    left = {p.metadata.name for p in api.list_namespaced_pod(NS).items} & on_u5
    assert left == {"agent-u5"}  # the DaemonSet's pod stays; the finished pod was evicted
    assert node(api, "u5").metadata.annotations[f"{P}/upgrade-state"] == "drained"


def test_finish_uncordons_only_what_the_gate_admitted(cluster: LocalApiServer,
                                                      inventory: Path) -> None:
    api = core_api(cluster)
    assert node(api, "u1").spec.unschedulable is True  # drained above
    # Not admitted: the upgrading taint is still on; finish leaves it cordoned, failed.
    rc, out, _ = upgrade_cli(inventory, "finish", "--node", "u1")
    assert rc == ExitCode.CHECK_FAILED
    u1 = node(api, "u1")
    assert u1.spec.unschedulable is True
    assert u1.metadata.annotations[f"{P}/upgrade-state"] == "failed"
    assert "taint upgrading" in u1.metadata.annotations[f"{P}/upgrade-detail"]
    # As the gate admits a node: label passed, taint lifted; and its kubelet reports the pinned
    # release (finish compares what runs with the pins). Then finish uncordons it.
    kubelet_pin = upgrade.running_pins(upgrade.load(inventory, "u1")[0])[0]
    assert kubelet_pin
    version = "v" + ".".join(map(str, upgrade.release(kubelet_pin) or ()))
    api.patch_node_status("u1", {"status": {"nodeInfo": {"kubeletVersion": version}}})
    api.patch_node("u1", {"metadata": {"labels": {f"{P}/validation": "passed"}},
                          "spec": {"taints": [t for t in api.api_client
                                              .sanitize_for_serialization(u1.spec.taints)
                                              if t["key"] != f"{P}/validation"]}})
    rc, out, _ = upgrade_cli(inventory, "finish", "--node", "u1")
    assert rc == ExitCode.OK, out
    u1 = node(api, "u1")
    assert not u1.spec.unschedulable
    assert u1.metadata.annotations[f"{P}/upgrade-state"] == "done"
    # mark records the steps between (the playbook's), keeping the taint on.
    rc, _, _ = upgrade_cli(inventory, "mark", "--node", "u2", "--state", "upgrading",
                           "--detail", "driver library 550.90.07 -> 550.90.12")
    assert rc == ExitCode.OK
    u2 = node(api, "u2").metadata.annotations
    assert u2[f"{P}/upgrade-state"] == "upgrading"
    assert u2[f"{P}/upgrade-detail"].endswith("driver library 550.90.07 -> 550.90.12")


def test_an_api_server_that_is_down_is_exit_3(tmp_path: Path) -> None:
    with running_apiserver(tmp_path, 21) as server:
        inv = write_inventory(tmp_path / "inv", ("u1",), prefix=P, kubeconfig=server.kubeconfig)
    rc, _, err = upgrade_cli(inv, "drain", "--node", "u1")
    assert rc == ExitCode.UNREACHABLE
    assert "cannot reach the Kubernetes API" in err


def test_batches_and_serial_as_ansible_reads_them() -> None:
    hosts = ["n1", "n2", "n3", "n4", "n5"]
    assert upgrade.batches(hosts, "2") == [["n1", "n2"], ["n3", "n4"], ["n5"]]
    assert upgrade.batches(hosts, "40%") == [["n1", "n2"], ["n3", "n4"], ["n5"]]
    assert upgrade.batches(hosts, "10%") == [[h] for h in hosts]  # at least one
    assert upgrade.batches([], "1") == []
    for bad in ("0", "-1", "1.5", "150%", "nan", "x", "0%"):
        with pytest.raises(Exception, match="whole number of nodes or a percentage"):
            upgrade_args.serial_arg(bad)


def test_selectors_as_the_api_server_matches_them() -> None:
    labels = {"app": "web", "tier": "gpu"}
    assert upgrade.selector_matches({}, labels)  # empty: every pod of the namespace
    assert not upgrade.selector_matches(None, labels)
    assert upgrade.selector_matches({"matchLabels": {"app": "web"}}, labels)
    assert not upgrade.selector_matches({"matchLabels": {"app": "db"}}, labels)
    exprs = [({"key": "tier", "operator": "In", "values": ["gpu"]}, True),
             ({"key": "tier", "operator": "NotIn", "values": ["gpu"]}, False),
             ({"key": "zone", "operator": "Exists"}, False),
             ({"key": "zone", "operator": "DoesNotExist"}, True)]
    for expr, expected in exprs:
        assert upgrade.selector_matches({"matchExpressions": [expr]}, labels) is expected


def test_the_plan_reads_driver_versions_from_real_captures(fixtures_dir: Path) -> None:
    """drift's probes on real captures (nvidia-smi -q -x of driver 535.54.03, dpkg-query of a
    node with nvidia-utils-550 550.90.07): a pin of 535.54.03 finds the library off it."""
    node = _node(nvidia_driver_version="535.54.03")
    reasons, unreadable = upgrade.versions_from(node, _probe(fixtures_dir))
    assert unreadable == ""
    assert "driver library 550.90.07 -> 535.54.03" in reasons


def test_a_node_whose_driver_cannot_be_read_is_unreadable_not_at_the_pins(
        fixtures_dir: Path) -> None:
    """No package owns nvidia-smi, no module version, nvidia-smi not found: no driver finding
    at all, which must not read as "at the pins"."""
    seen = _probe(fixtures_dir, over={
        ("dpkg-query", "--search"): _out("dpkg-query: no path found matching pattern\n", rc=1),
        ("cat", "/sys/module/nvidia/version"): _out("", rc=1),
        ("nvidia-smi", "-q", "-x"): _out("sh: 1: nvidia-smi: not found\n", rc=127)})
    node = _node(nvidia_driver_version="535.54.03")
    reasons, unreadable = upgrade.versions_from(node, seen)
    assert reasons == []
    assert "neither the library" in unreadable and "nvidia-smi exited 127" in unreadable


# -- package pins (DCGM, containerd, container toolkit, Kubernetes) against dpkg ----------------
# The converged lab node's dpkg database (real dpkg output; its vendor packages are the lab's
# simulated ones): containerd 1.6.20~ds1-1+deb12u3, the toolkit at 1.17.3-1, kubelet, kubeadm
# and kubectl at 1.30.5-1.1, no DCGM; its driver packages at 550.90.07.
# The captured host ran the distribution's containerd (Debian 12's 1.6).
AT_CAPTURE = {"nvidia_driver_version": "550.90.07", "containerd_version": "1.6.20~ds1-1+deb12u3",
              "containerd_source": "distribution",
              "nvidia_container_toolkit_version": "1.17.3-1", "kubelet_version": "1.30.5-1.1"}
MODULE_550 = {("cat", "/sys/module/nvidia/version"): _out("550.90.07\n")}
HALF_CONFIGURED = "dpkg-query/dpkg-1.21.22-debian12-kubelet-half-configured-held.txt"


def _role_default(role: str, var: str) -> Any:
    path = Path(__file__).resolve().parents[3] / "roles" / role / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text())[var]


def test_a_node_at_every_pin_is_at_the_pins_and_not_drained(fixtures_dir: Path) -> None:
    seen = _probe(fixtures_dir, pin="550.90.07", over=MODULE_550)
    plan = upgrade.NodePlan("n1", "n1")
    plan.reasons, plan.unreadable = upgrade.versions_from(_node(**AT_CAPTURE), seen)
    assert (plan.reasons, plan.unreadable, plan.pending) == ([], "", False)
    assert upgrade.plan_lines([plan], "1")[-1] == "n1: at the pins, not drained"


def test_each_package_pin_the_node_is_off_is_a_reason_in_the_plan(fixtures_dir: Path) -> None:
    """Moved pins, one per role, on the converged node's real dpkg database: each package off
    its pin is named with what dpkg has, packages at the same version together, after the
    driver's reasons (whose text is unchanged)."""
    seen = _probe(fixtures_dir, over=MODULE_550)  # the driver pinned at 535.54.03
    node = _node(**{**AT_CAPTURE, "nvidia_driver_version": "535.54.03",
                    "nvidia_dcgm_version": "3.3.6", "containerd_version": "1.7.24~ds1-1",
                    "nvidia_container_toolkit_version": "1.17.4-1",
                    "kubelet_version": "1.31.1-1.1"})
    reasons, unreadable = upgrade.versions_from(node, seen)
    assert unreadable == ""
    assert reasons == [
        "driver library 550.90.07 -> 535.54.03", "driver module 550.90.07 -> 535.54.03",
        "datacenter-gpu-manager absent -> 1:3.3.6",
        "containerd 1.6.20~ds1-1+deb12u3 -> 1.7.24~ds1-1",
        "nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools, "
        "libnvidia-container1 1.17.3-1 -> 1.17.4-1",
        "kubelet, kubeadm, kubectl 1.30.5-1.1 -> 1.31.1-1.1"]
    plan = upgrade.NodePlan("n1", "n1", reasons)
    assert upgrade.plan_lines([plan], "1")[2] == "  n1: " + "; ".join(reasons)


def test_unset_pins_are_the_roles_defaults_and_an_empty_containerd_pin_pins_nothing(
        fixtures_dir: Path) -> None:
    """No toolkit or Kubernetes pin in the inventory: the roles' defaults/main.yml apply, as
    in Ansible (the capture's kubelet is older than the role's default, its toolkit may be at
    it); containerd_version "" is the role's "the distribution's, unheld"."""
    seen = _probe(fixtures_dir, pin="550.90.07", over=MODULE_550)
    node = _node(nvidia_driver_version="550.90.07", containerd_version="")
    expected = []
    for role, have in (("nvidia_container_toolkit", "1.17.3-1"), ("kubelet", "1.30.5-1.1")):
        version = _role_default(role, f"{role}_version")
        if version != have:
            names = ", ".join(_role_default(role, f"{role}_packages"))
            expected.append(f"{names} {have} -> {version}")
    assert _role_default("kubelet", "kubelet_version") != "1.30.5-1.1"
    assert upgrade.versions_from(node, seen) == (expected, "")
    # Packages named in the inventory replace the role's list.
    only = _node(**{**AT_CAPTURE, "kubelet_packages": ["kubelet"],
                    "kubelet_version": "1.31.1-1.1"})
    assert upgrade.versions_from(only, seen) == (["kubelet 1.30.5-1.1 -> 1.31.1-1.1"], "")


def test_a_dcgm_pin_takes_the_packages_of_its_series_from_the_role(fixtures_dir: Path) -> None:
    """DCGM 4 is the core package and the diagnostics of one CUDA major (the driver's branch
    picks it, so any installed one counts), both at the role's 1:<release>-1."""
    seen = _probe(fixtures_dir, pin="550.90.07", over=MODULE_550)
    node = _node(**AT_CAPTURE, nvidia_dcgm_version="4.6.0")
    assert upgrade.versions_from(node, seen) == (
        ["datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda* absent -> 1:4.6.0-1"],
        "")
    unknown = _node(**AT_CAPTURE, nvidia_dcgm_version="9.0.0")
    reasons, unreadable = upgrade.versions_from(unknown, seen)
    assert reasons == [] and "no roles/nvidia_dcgm/vars/<OS>.yml carries DCGM 9" in unreadable


def test_a_package_dpkg_did_not_finish_installing_is_not_at_its_pin(fixtures_dir: Path) -> None:
    """A real dpkg database in which kubelet's postinst failed: at the pinned version, held,
    half-configured. The role would install it again, so the node is upgraded."""
    installed = dpkg_query.parse((fixtures_dir / HALF_CONFIGURED).read_text())
    pin = pins.PackagePin("kubelet", ("kubelet", "kubeadm", "kubectl"), "1.37.2-1.1")
    assert pins.differences(pin, installed) == [
        "kubelet 1.37.2-1.1 (half-configured) -> 1.37.2-1.1"]
    # A name with "*" (as DCGM 4's diagnostics are named) judges every package it matches.
    assert pins.differences(pins.PackagePin("kubelet", ("kube*",), "1.37.2-1.1"),
                            installed) == ["kubelet 1.37.2-1.1 (half-configured) -> 1.37.2-1.1"]


def test_a_node_whose_dpkg_database_cannot_be_read_is_unreadable(fixtures_dir: Path) -> None:
    node = _node(**AT_CAPTURE)
    seen = _probe(fixtures_dir, pin="550.90.07",
                  over={**MODULE_550, probes.DPKG_ARGV: _out("", rc=2)})
    reasons, unreadable = upgrade.versions_from(node, seen)
    assert reasons == [] and unreadable.startswith("packages: ")
    # However the probe came to have no database, package pins are never "at the pins".
    at_pins = _probe(fixtures_dir, pin="550.90.07", over=MODULE_550)
    at_pins.packages = None
    assert upgrade.versions_from(node, at_pins) == (
        [], "packages: the dpkg database could not be read")


def test_the_vendor_source_pins_docker_s_containerd_io(fixtures_dir: Path) -> None:
    """containerd_source vendor (the role's default): the pin is containerd.io's, which the
    captured host (the distribution's containerd) does not have."""
    seen = _probe(fixtures_dir, pin="550.90.07", over=MODULE_550)
    node = _node(**{**AT_CAPTURE, "containerd_source": "vendor",
                    "containerd_version": "2.2.9-1~debian.12~bookworm"})
    assert upgrade.versions_from(node, seen) == (
        ["containerd.io absent -> 2.2.9-1~debian.12~bookworm"], "")


def test_what_a_node_runs_is_read_beside_what_it_has() -> None:
    """A package at its pin does not make it run: the kubelet and containerd the Node reports
    (status.nodeInfo) are compared with the pins' releases."""
    node = _node(**{**AT_CAPTURE, "containerd_source": "vendor",
                    "containerd_version": "2.2.9-1~debian.12~bookworm",
                    "kubelet_version": "1.37.2-1.1"})
    pins_ = upgrade.running_pins(node)
    assert pins_ == ("1.37.2-1.1", "2.2.9-1~debian.12~bookworm")
    new = upgrade.Running("v1.37.2", "containerd://2.2.9")
    assert upgrade.running_differences(*pins_, new) == []
    old = upgrade.Running("v1.37.1", "containerd://2.2.8")
    assert upgrade.running_differences(*pins_, old) == [
        "kubelet running v1.37.1 -> v1.37.2",
        "containerd running 2.2.8 -> 2.2.9"]
    assert upgrade.running_differences(*pins_, upgrade.Running()) == [
        "kubelet running unknown -> v1.37.2",
        "containerd running unknown -> 2.2.9"]


def test_the_version_skew_policy_refuses_a_pin_before_anything_changes(
        cluster: LocalApiServer, tmp_path: Path) -> None:
    """On a real kube-apiserver (v1.37.2): a kubelet pin newer than it, or more than three
    minors older, is refused by the plan before any node is probed, drained or patched; three
    minors older is allowed."""
    api = core_api(cluster)
    before = {n: node(api, n).metadata.resource_version for n in NODES}
    for pin, why in (("1.38.0-1.1", "is newer than the API server (v1.37.2): the kubelet "
                                    "must not be newer than kube-apiserver"),
                     ("1.37.3-1.1", "is newer than the API server (v1.37.2)"),
                     ("1.33.9-1.1", "is more than 3 minor versions older than the API server "
                                    "(v1.37.2)")):
        inv = write_inventory(tmp_path / pin, ("u1",), prefix=P, kubeconfig=cluster.kubeconfig,
                              extra={"kubelet_kubernetes_minor": pin[:4],
                                     "kubelet_version": pin})
        rc, out, err = upgrade_cli(inv, "plan")
        assert rc == ExitCode.USAGE_OR_TOOL_ERROR, (pin, out, err)
        assert "the version skew policy refuses these pins (nothing was changed)" in err, err
        assert f"u1: kubelet_version {pin} {why}" in err, err
        assert out == ""
    assert upgrade.skew_refusals(
        [_node(kubelet_version="1.34.0-1.1")], "v1.37.2") == []  # three minors: allowed
    assert {n: node(api, n).metadata.resource_version for n in NODES} == before


def test_finish_keeps_out_a_node_whose_kubelet_still_runs_the_old_release(
        cluster: LocalApiServer, inventory: Path) -> None:
    """The gate admitted the node, but its kubelet reports the old release (the package was
    upgraded, the process not restarted): finish waits a moment for the kubelet to report,
    then records it failed and leaves it cordoned; once the Node reports the pin, it is done."""
    api = core_api(cluster)
    api.patch_node("u4", {"metadata": {"labels": {f"{P}/validation": "passed"}},
                          "spec": {"unschedulable": True}})
    api.patch_node_status("u4", {"status": {"nodeInfo": {"kubeletVersion": "v1.37.1"}}})
    uapi = upgrade.UpgradeApi(cluster.kubeconfig)
    out = io.StringIO()
    rc = upgrade.finish(uapi, "u4", P, out, expect=("1.37.2-1.1", None), wait_s=1.0,
                        sleep=lambda _s: None)
    assert rc == ExitCode.CHECK_FAILED
    assert "u4: kubelet running v1.37.1 -> v1.37.2" in out.getvalue()
    u4 = node(api, "u4")
    assert u4.spec.unschedulable is True
    assert u4.metadata.annotations[f"{P}/upgrade-state"] == "failed"
    api.patch_node_status("u4", {"status": {"nodeInfo": {"kubeletVersion": "v1.37.2"}}})
    out = io.StringIO()
    assert upgrade.finish(uapi, "u4", P, out, expect=("1.37.2-1.1", None)) == ExitCode.OK
    assert not node(api, "u4").spec.unschedulable
