"""lab/sim/device_plugin.py, the SIMULATED NVIDIA device plugin, run as its own process against a
real gRPC peer playing the kubelet: the kubelet's Registration service on kubelet.sock in a temp
device-plugins directory, and the kubelet's calls on the plugin's socket, with the messages of
Kubernetes' api.proto (the committed descriptor set, itself checked against protoc)."""

from __future__ import annotations

import contextlib
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from lab import rootfs
from lab.hardware import render_host, write_faults, write_hardware
from lab.kube import deviceplugin
from lab.kube import node as node_mod
from lab.paths import LabPaths
from lab.sim import device_plugin

SIM = Path(device_plugin.__file__)
M = device_plugin.message_classes()
HW = render_host("h100-sxm5-8x", "gpu-h100-01")
UUIDS = [str(g["uuid"]) for g in HW["gpus"]]
NUMA = [int(g["numa_node"]) for g in HW["gpus"]]
REGISTERED = "Registered device plugin for 'nvidia.com/gpu' with Kubelet"


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


class Kubelet:
    """The kubelet's side: the Registration server on kubelet.sock (restartable, removing the
    directory's sockets the way the kubelet does when it starts) and a client of the plugin."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.requests: queue.Queue[Any] = queue.Queue()
        self.server: grpc.Server | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            entry.unlink()

        def register(request: Any, context: grpc.ServicerContext) -> Any:
            del context
            self.requests.put(request)
            return M["Empty"]()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "v1beta1.Registration", {"Register": grpc.unary_unary_rpc_method_handler(
                register, request_deserializer=M["RegisterRequest"].FromString,
                response_serializer=_serialize)}),))
        assert self.server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait(5)
            self.server = None

    def registration(self, timeout: float = 15) -> Any:
        return self.requests.get(timeout=timeout)

    def channel(self, endpoint: str) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{self.directory / endpoint}")

    def call(self, channel: grpc.Channel, method: str, request: Any, response: str) -> Any:
        return channel.unary_unary(f"/v1beta1.DevicePlugin/{method}",
                                   request_serializer=_serialize,
                                   response_deserializer=M[response].FromString)(request,
                                                                                  timeout=10)

    def list_and_watch(self, channel: grpc.Channel) -> Iterator[Any]:
        stream: Iterator[Any] = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch", request_serializer=_serialize,
            response_deserializer=M["ListAndWatchResponse"].FromString)(M["Empty"](), timeout=30)
        return stream


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.hw = root / "hw"
        self.log = root / "plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet = Kubelet(root / "var/lib/kubelet/device-plugins")

    def faults(self, *names: str) -> None:
        write_faults(self.hw, list(names))

    def driver(self) -> None:
        (self.root / "run" / "nvidia-module-version").write_text("550.90.07\n")

    def start_plugin(self) -> None:
        env = {"GPUREADY_LAB_HW": str(self.hw), "GPUREADY_LAB_RUN": str(self.root / "run"),
               "GPUREADY_LAB_ROOT": str(self.root), "GPUREADY_SIM_DP_INTERVAL": "0.2",
               "PATH": "/usr/bin:/bin"}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(SIM)], env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    def stop_plugin(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)

    def said(self) -> str:
        return self.log.read_text()

    def wait_said(self, text: str, times: int = 1, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while self.said().count(text) < times:
            assert time.monotonic() < deadline, f"no {text!r} {times}x in:\n{self.said()}"
            time.sleep(0.05)


@contextlib.contextmanager
def plugin_node(hw: dict[str, Any] = HW) -> Iterator[Node]:
    """A node's root for the plugin (its hardware, a loaded driver, no fault), removed after;
    the plugin and the kubelet's side stopped if they still run."""
    # A short directory: a unix socket's path has at most 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    write_hardware(root / "hw", hw)
    (root / "run").mkdir()
    the_node = Node(root)
    the_node.faults()
    the_node.driver()
    try:
        yield the_node
    finally:
        if the_node.proc is not None and the_node.proc.poll() is None:
            the_node.proc.kill()
            the_node.proc.wait()
        the_node.kubelet.stop()
        shutil.rmtree(root)


@pytest.fixture
def node() -> Iterator[Node]:
    with plugin_node() as the_node:
        yield the_node


def devices(response: Any) -> list[tuple[str, str, list[int]]]:
    return [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in response.devices]


def test_the_committed_descriptor_set_is_protoc_s_output_for_the_real_api_proto() -> None:
    assert deviceplugin.DESCRIPTOR_SET.read_bytes() == deviceplugin.descriptor_set(), (
        "run `.venv/bin/python -m lab.kube.deviceplugin`")
    assert deviceplugin.DESCRIPTOR_SET == device_plugin.DESCRIPTOR_SET


def test_registers_and_lists_one_healthy_device_per_gpu(node: Node) -> None:
    node.kubelet.start()
    node.start_plugin()
    request = node.kubelet.registration()
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1", "nvidia-gpu.sock", "nvidia.com/gpu")
    assert request.options.get_preferred_allocation_available is True
    assert request.options.pre_start_required is False
    with node.kubelet.channel(request.endpoint) as channel:
        options = node.kubelet.call(channel, "GetDevicePluginOptions", M["Empty"](),
                                    "DevicePluginOptions")
        assert options.get_preferred_allocation_available is True
        first = next(node.kubelet.list_and_watch(channel))
    assert devices(first) == [(uuid, "Healthy", [numa]) for uuid, numa in zip(UUIDS, NUMA,
                                                                              strict=True)]
    assert node.stop_plugin() == 0
    assert not (node.kubelet.directory / "nvidia-gpu.sock").exists()
    said = node.said()
    assert "SIMULATED" in said.splitlines()[0]
    assert REGISTERED in said


def test_device_ids_are_the_uuids_nvidia_smi_lists(node: Node) -> None:
    node.faults("gpu-missing")  # the last GPU fell off the bus before the plugin started
    node.kubelet.start()
    node.start_plugin()
    node.kubelet.registration()
    with node.kubelet.channel("nvidia-gpu.sock") as channel:
        first = next(node.kubelet.list_and_watch(channel))
    smi = subprocess.run([sys.executable, str(SIM.with_name("nvidia_smi.py")), "-L"],
                         env={"GPUREADY_LAB_HW": str(node.hw), "GPUREADY_LAB_RUN":
                              str(node.root / "run"), "GPUREADY_SIM_VERSION": "550.90.07",
                              "GPUREADY_SIM_TOOL": "nvidia-smi", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30, check=True)
    listed = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", smi.stdout)
    assert [d.ID for d in first.devices] == listed == UUIDS[:-1]


def test_xid_faults_turn_their_gpu_unhealthy_in_the_stream(node: Node) -> None:
    node.kubelet.start()
    node.start_plugin()
    node.kubelet.registration()
    with node.kubelet.channel("nvidia-gpu.sock") as channel:
        stream = node.kubelet.list_and_watch(channel)
        assert {d.health for d in next(stream).devices} == {"Healthy"}
        node.faults("xid-48")  # lab_kmsg: GPU 0's double bit ECC error
        assert [d.health for d in next(stream).devices] == ["Unhealthy"] + ["Healthy"] * 7
        node.faults("xid-48", "xid-79")  # the last GPU fell off the bus
        assert [d.health for d in next(stream).devices] == (
            ["Unhealthy"] + ["Healthy"] * 6 + ["Unhealthy"])
        node.faults()
        assert {d.health for d in next(stream).devices} == {"Healthy"}
    said = node.said()
    assert f"'nvidia.com/gpu' device marked unhealthy: {UUIDS[0]}" in said
    assert f"'nvidia.com/gpu' device marked unhealthy: {UUIDS[-1]}" in said


def test_health_follows_the_real_plugin_s_xid_rule() -> None:
    gpus = device_plugin.enumerate_gpus(HW, set())
    # Faults NVML raises no XidCriticalError for (or the real check skips) leave GPUs healthy.
    quiet = {"ecc-uncorrectable", "row-remap-pending", "pcie-degraded", "nvlink-down",
             "gpu-memory-fail", "gpu-busy", "gfd-mismatch"}
    assert set(device_plugin.health(gpus, HW, quiet).values()) == {"Healthy"}
    assert device_plugin.xid_events(HW, {"xid-79", "xid-48"}) == {UUIDS[-1]: 79, UUIDS[0]: 48}
    # gpu-missing takes the GPU that fell off the bus out of the list altogether.
    missing = device_plugin.enumerate_gpus(HW, {"gpu-missing"})
    assert set(device_plugin.health(missing, HW, {"gpu-missing", "xid-79"}).values()) == {
        "Healthy"}


def test_allocate_answers_with_nvidia_visible_devices(node: Node) -> None:
    node.kubelet.start()
    node.start_plugin()
    node.kubelet.registration()
    with node.kubelet.channel("nvidia-gpu.sock") as channel:
        request = M["AllocateRequest"]()
        request.container_requests.add(devices_ids=[UUIDS[3], UUIDS[1]])
        request.container_requests.add(devices_ids=[UUIDS[7]])
        response = node.kubelet.call(channel, "Allocate", request, "AllocateResponse")
        assert [dict(c.envs) for c in response.container_responses] == [
            {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"},
            {"NVIDIA_VISIBLE_DEVICES": UUIDS[7]}]
        # The simulated driver, mounted read-only where the simulators in an image read it.
        assert [(m.host_path, m.container_path, m.read_only)
                for m in response.container_responses[0].mounts] == [
            (str(node.hw), "/opt/gpuready-lab/hw", True),
            (str(node.root / "run"), "/run/gpuready-lab", True)]
        bad = M["AllocateRequest"]()
        bad.container_requests.add(devices_ids=["GPU-00000000-0000-0000-0000-000000000000"])
        with pytest.raises(grpc.RpcError) as refused:
            node.kubelet.call(channel, "Allocate", bad, "AllocateResponse")
        assert refused.value.code() == grpc.StatusCode.UNKNOWN
        assert "unknown device: GPU-00000000-0000-0000-0000-000000000000" in (
            refused.value.details() or "")
        preferred = M["PreferredAllocationRequest"]()
        preferred.container_requests.add(available_deviceIDs=list(reversed(UUIDS)),
                                         must_include_deviceIDs=[UUIDS[5]], allocation_size=3)
        answer = node.kubelet.call(channel, "GetPreferredAllocation", preferred,
                                   "PreferredAllocationResponse")
        chosen = list(answer.container_responses[0].deviceIDs)
        assert chosen[0] == UUIDS[5] and len(set(chosen)) == 3
        assert {NUMA[UUIDS.index(d)] for d in chosen} == {NUMA[5]}
        started = node.kubelet.call(channel, "PreStartContainer",
                                    M["PreStartContainerRequest"](devices_ids=[UUIDS[0]]),
                                    "PreStartContainerResponse")
        assert started.ByteSize() == 0


def test_registers_again_when_the_kubelet_restarts(node: Node) -> None:
    node.kubelet.start()
    node.start_plugin()
    node.kubelet.registration()
    node.wait_said(REGISTERED)  # the kubelet has answered
    node.kubelet.stop()
    node.kubelet.start()  # removes the plugin's socket and makes a new kubelet.sock
    again = node.kubelet.registration()
    assert again.endpoint == "nvidia-gpu.sock"
    node.wait_said(REGISTERED, times=2)
    with node.kubelet.channel(again.endpoint) as channel:
        assert len(next(node.kubelet.list_and_watch(channel)).devices) == 8
    assert "restarting." in node.said()
    assert "Could not register" not in node.said()


def test_waits_for_the_driver_and_the_kubelet(node: Node) -> None:
    (node.root / "run" / "nvidia-module-version").unlink()
    node.start_plugin()
    deadline = time.monotonic() + 10
    while "driver is not loaded" not in node.said():
        assert time.monotonic() < deadline, node.said()
        time.sleep(0.1)
    node.kubelet.start()
    time.sleep(1)  # five polls: no registration without a driver
    assert node.kubelet.requests.empty()
    node.driver()
    assert node.kubelet.registration().resource_name == "nvidia.com/gpu"


def test_real_kubernetes_hosts_get_the_plugin_as_a_unit(tmp_path: Path) -> None:
    node_mod.provision(tmp_path, "127.0.41.10")
    units = tmp_path / "etc/systemd/system"
    unit = (units / node_mod.DEVICE_PLUGIN_UNIT_NAME).read_text()
    assert "SIMULATED" in unit.split("Description=", 1)[1].splitlines()[0]
    assert "ExecStart=/usr/bin/python3 /opt/gpuready-lab/sim/device_plugin.py" in unit
    assert (units / "multi-user.target.wants" / node_mod.DEVICE_PLUGIN_UNIT_NAME).is_symlink()
    # The lab binds lab/sim at /opt/gpuready-lab/sim; Debian's gRPC and PyYAML (its config)
    # come with the rootfs.
    assert (LabPaths.default().sim_dir / "device_plugin.py") == SIM
    assert {"python3-grpcio", "python3-protobuf", "python3-yaml"} <= set(rootfs.SIM_PACKAGES)
