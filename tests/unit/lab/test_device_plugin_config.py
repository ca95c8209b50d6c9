"""The SIMULATED device plugin takes the configuration `cluster apply` writes (issue 43, part 2),
on a real API server (lab.kube.local) with the pinned GPU Operator CRDs: the ClusterPolicy names
the ConfigMap and its default, the Node's ``nvidia.com/device-plugin.config`` label picks a key,
as the operator's config-manager does. What the plugin advertises is held to what the renderer
computed for the lab inventory (pool_l40s_pcie: time-slicing, 4 replicas): GPUs x replicas, the
replica IDs the real plugin makes (``<UUID>::<i>``), each replica's allocation naming its GPU.
The plugin runs as its own process against a real gRPC peer playing the kubelet
(tests/unit/lab/test_device_plugin.py's), and reads the API server with a kubeconfig as the lab
writes one."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.hardware import render_host
from lab.sim import daemons, device_plugin, kubeclient
from tests.kube_helpers import LocalApiServer, core_api, running_apiserver
from tests.unit.lab.test_device_plugin import REGISTERED, M, Node, devices, plugin_node
from tests.unit.validate.cluster_inventories import lab_copy
from tests.unit.validate.test_cluster_apply import CONTROLLERS, install_crds
from validate import cli
from validate.cluster import render
from validate.cluster.spec import load_spec
from validate.model import ExitCode

NODES = ("node1", "node2")  # the default fleet's H100 (full-gpu) and L40S (time-sliced) hosts
L40S = render_host("l40s-pcie-4x", "node2")


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalApiServer, Path]]:
    """`cluster apply` of the lab inventory (default fleet) on a real API server."""
    tmp = tmp_path_factory.mktemp("dp-config")
    with running_apiserver(tmp, 24, CONTROLLERS) as server:
        install_crds(server.kubeconfig)
        api = core_api(server)
        api.create_namespace({"metadata": {"name": "gpu-operator"}})
        for name in NODES:
            api.create_node({"metadata": {"name": name}})
        inv = lab_copy(tmp, "default")
        out, err = io.StringIO(), io.StringIO()
        rc = cli.main(["cluster", "apply", "-i", str(inv), "--kubeconfig",
                       str(server.kubeconfig)], stdout=out, stderr=err)
        assert rc == ExitCode.OK, out.getvalue() + err.getvalue()
        yield server, inv


def rendered(inv: Path, node_name: str) -> tuple[str, int]:
    """What the renderer computed for the Node: its config's name and replicas of each GPU."""
    spec = load_spec(inv)
    name = render.node_labels(spec)[node_name][render.DEVICE_PLUGIN_CONFIG_LABEL]
    text = render.device_plugin_configs(spec)[name]
    return name, device_plugin.replicas_in(text, name)


def client(server: LocalApiServer) -> kubeclient.Client:
    return kubeclient.kubeconfig_client(server.kubeconfig)


def test_each_node_gets_its_pool_s_configuration(applied: tuple[LocalApiServer, Path]) -> None:
    server, inv = applied
    assert rendered(inv, "node1") == ("full-gpu", 1)
    name, replicas = rendered(inv, "node2")
    assert replicas == 4  # inventory/lab/group_vars/pool_l40s_pcie: the renderer read it
    for name_ in NODES:
        chosen = device_plugin.select_config(client(server), name_, "gpu-operator")
        assert (chosen.name, chosen.replicas) == rendered(inv, name_), name_
    assert name.startswith("time-slicing")


def test_a_label_naming_a_missing_configuration_is_an_error_that_names_it(
        applied: tuple[LocalApiServer, Path]) -> None:
    server, _inv = applied
    api = core_api(server)
    api.create_node({"metadata": {"name": "node9", "labels": {
        device_plugin.CONFIG_LABEL: "time-slicing-99"}}})
    with pytest.raises(device_plugin.ConfigError) as caught:
        device_plugin.select_config(client(server), "node9", "gpu-operator")
    message = str(caught.value)
    assert "nvidia.com/device-plugin.config=time-slicing-99" in message
    assert f"gpu-operator/{render.DEVICE_PLUGIN_CONFIG_MAP}" in message and "full-gpu" in message
    # Without the label, the ClusterPolicy's default (what the values set: full-gpu).
    api.patch_node("node9", {"metadata": {"labels": {device_plugin.CONFIG_LABEL: None}}})
    assert device_plugin.select_config(client(server), "node9", "gpu-operator") == \
        device_plugin.Config("full-gpu", 1)


def test_without_the_operator_s_crds_the_plugin_runs_with_its_defaults(tmp_path: Path) -> None:
    with running_apiserver(tmp_path, 25) as bare:
        core_api(bare).create_node({"metadata": {"name": "node1"}})
        assert device_plugin.select_config(client(bare), "node1", "gpu-operator") == \
            device_plugin.DEFAULT_CONFIG


@pytest.mark.parametrize(("text", "problem"), [
    ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
     "      replicas: 0\n", "at least 1, not 0"),
    ("version: v2\n", "version: v1"),
    ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
     "      replicas: 2\n      rename: nvidia.com/gpu.shared\n", "renamed"),
    ("[unclosed", "not YAML"),
])
def test_a_configuration_the_plugin_cannot_run_is_refused(text: str, problem: str) -> None:
    with pytest.raises(device_plugin.ConfigError, match=problem.replace(".", r"\.")):
        device_plugin.replicas_in(text, "ConfigMap gpu-operator/x, key y")


@pytest.fixture
def l40s_node(applied: tuple[LocalApiServer, Path]) -> Iterator[Node]:
    """A plugin node (tests/unit/lab/test_device_plugin.py) as the L40S host node2 of the
    applied cluster: its hardware, its kubelet's name for it, the lab's access kubeconfig."""
    server, _inv = applied
    with plugin_node(L40S) as l40s:
        flags = l40s.root / daemons.FLAGS_ENV.lstrip("/")
        flags.parent.mkdir(parents=True, exist_ok=True)
        flags.write_text('KUBELET_KUBEADM_ARGS="--hostname-override=node2"\n')
        access = l40s.root / device_plugin.ACCESS_KUBECONFIG.lstrip("/")
        access.parent.mkdir(parents=True, exist_ok=True)
        access.write_text(server.kubeconfig.read_text())
        yield l40s


def _stream_devices(plugin: Node) -> list[tuple[str, str, list[int]]]:
    with plugin.kubelet.channel(device_plugin.ENDPOINT) as channel:
        return devices(next(iter(plugin.kubelet.list_and_watch(channel))))


def test_a_time_sliced_node_advertises_gpus_times_replicas(
        l40s_node: Node, applied: tuple[LocalApiServer, Path]) -> None:
    server, inv = applied
    _name, replicas = rendered(inv, "node2")
    uuids = [str(g["uuid"]) for g in L40S["gpus"]]
    node = l40s_node  # the plugin node
    node.kubelet.start()
    node.start_plugin()
    node.kubelet.registration()
    listed = _stream_devices(node)
    assert len(listed) == len(uuids) * replicas == 16
    assert [d[0] for d in listed] == [f"{u}::{i}" for u in uuids for i in range(replicas)]
    assert {d[1] for d in listed} == {"Healthy"}
    # Two replicas of one GPU and one of another: each GPU named once, as the real plugin's
    # AnnotatedID.GetID strips the replica.
    with node.kubelet.channel(device_plugin.ENDPOINT) as channel:
        request = M["AllocateRequest"]()
        request.container_requests.add(devices_ids=[f"{uuids[0]}::0", f"{uuids[0]}::3",
                                                    f"{uuids[1]}::1"])
        answer: Any = node.kubelet.call(channel, "Allocate", request, "AllocateResponse")
        assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == \
            f"{uuids[0]},{uuids[1]}"
    node.wait_said("replicas of each of 4 GPU(s) (time-slicing)")
    # The operator relabels the Node (a pool moved to full GPUs): the plugin restarts with the
    # new configuration and registers again, one device per GPU.
    core_api(server).patch_node("node2", {"metadata": {"labels": {
        device_plugin.CONFIG_LABEL: "full-gpu"}}})
    try:
        node.wait_said("Config changed", timeout=20)
        node.kubelet.registration()
        assert [d[0] for d in _stream_devices(node)] == uuids
        node.wait_said(REGISTERED, times=2)
    finally:
        core_api(server).patch_node("node2", {"metadata": {"labels": {
            device_plugin.CONFIG_LABEL: _name}}})
    assert node.stop_plugin() == 0
