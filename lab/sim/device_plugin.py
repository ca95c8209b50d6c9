#!/usr/bin/env python3
"""gpuready lab simulator: the NVIDIA device plugin (SIMULATED), over the kubelet's REAL device
plugin gRPC API, from the lab host's simulated hardware.

Beside a real kubelet (fleets with a control plane; unit ``gpuready-lab-device-plugin
.service`` from lab/kube/node.py) it does what NVIDIA's k8s-device-plugin does with its default
configuration (resource ``nvidia.com/gpu``, device IDs by UUID, ``deviceListStrategy: envvar``,
MIG strategy none), so the kubelet's own device manager puts ``nvidia.com/gpu`` into the Node's
capacity and allocatable:

- It serves ``v1beta1.DevicePlugin`` (GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation,
  Allocate, PreStartContainer) on ``/var/lib/kubelet/device-plugins/nvidia-gpu.sock`` and calls
  ``v1beta1.Registration/Register`` on the kubelet's ``kubelet.sock`` there (version v1beta1,
  endpoint ``nvidia-gpu.sock``, options GetPreferredAllocationAvailable), as the real plugin's
  internal/plugin/server.go does. The messages are Kubernetes' own api.proto, built at run time
  from the committed descriptor set ``deviceplugin_v1beta1.binpb`` (lab/kube/deviceplugin.py), and
  served with grpc's generic handlers: Debian's python3-grpcio and python3-protobuf in the host.
- Devices: one per GPU NVML shows when the plugin starts (hardware.json; the last one gone with
  the gpu-missing fault), ID the GPU's UUID (what ``nvidia-smi -L`` prints in the lab), topology
  its NUMA node. No devices and no registration without a loaded driver (the real plugin fails
  to initialise NVML and is restarted; the GPU Operator holds it back until the driver is
  validated): it waits for the simulated driver, saying so once.
- Health, as the real health check (internal/rm/health.go) decides it: a GPU turns Unhealthy on
  an NVML XidCriticalError event whose Xid is not one of the application errors the plugin
  ignores (13, 31, 43, 45, 68, 109). In the lab those events are the Xid faults the simulated
  driver logs (lab_kmsg.py): ``xid-79`` (the last GPU fell off the bus) and ``xid-48`` (GPU 0, a
  double bit ECC error). ``ecc-uncorrectable`` alone (counters that nvidia-smi reads; NVML's
  DoubleBitEcc event type is skipped by the real check), ``row-remap-pending``, ``pcie-degraded``,
  ``nvlink-down`` and the rest leave every GPU Healthy, as the real plugin would. Unlike the real
  plugin, which keeps a GPU Unhealthy until it restarts (the Xid is an event), the simulation
  reads faults.json every $GPUREADY_SIM_DP_INTERVAL seconds (1) and a GPU is Healthy again once
  its fault is removed. ListAndWatch sends the new list whenever health changes, so the
  kubelet's allocatable counts only the Healthy GPUs.
- Allocate answers each container with ``NVIDIA_VISIBLE_DEVICES`` = the requested UUIDs joined by
  commas, and refuses an unknown ID with the real message ("invalid request: unknown device:
  ..."). GetPreferredAllocation takes the required devices, then free ones on the same NUMA node
  first, then by index (SIMULATED: the real one ranks by NVLink topology through NVML).
- Kubelet restarts: the kubelet removes the sockets in device-plugins/ when it starts and makes
  a new kubelet.sock; like the real plugin (fsnotify on kubelet.sock's Create), it restarts its
  server and registers again when kubelet.sock is a new file (polled each interval: device,
  inode and change time) or its own socket is gone.

Logs are klog lines on stdout (the journal), the first saying SIMULATED. Paths as the other
simulators (daemons.py): $GPUREADY_LAB_HW, $GPUREADY_LAB_RUN, and $GPUREADY_LAB_ROOT in front of
/var/lib/kubelet, so the unit tests run it unprivileged. Exit 0 on SIGTERM/SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

try:  # run from the checkout (unit tests import it)
    from lab.sim import daemons, lab_kmsg
except ImportError:  # run as /opt/gpuready-lab/sim/device_plugin.py in a lab host
    import daemons  # type: ignore[no-redef]
    import lab_kmsg  # type: ignore[no-redef]

SIMULATED = "SIMULATED by the gpuready lab"
API_VERSION = "v1beta1"
RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
ENDPOINT = "nvidia-gpu.sock"  # the real plugin's "nvidia-" + the resource's name + ".sock"
DESCRIPTOR_SET = Path(__file__).resolve().with_name("deviceplugin_v1beta1.binpb")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Application errors the real health check ignores (the GPU is still healthy).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MESSAGES = ("Empty", "RegisterRequest", "DevicePluginOptions", "ListAndWatchResponse",
            "PreferredAllocationRequest", "PreferredAllocationResponse", "AllocateRequest",
            "AllocateResponse", "PreStartContainerRequest", "PreStartContainerResponse")
_XID_LINE = re.compile(r"Xid \(PCI:(?P<pci>[0-9a-f:]+)\): (?P<xid>\d+),")


def message_classes(path: Path = DESCRIPTOR_SET) -> dict[str, Any]:
    """The API's message classes by name, from the committed descriptor set (any protobuf
    runtime from Debian's 3.21/4.21 to today's)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.AddSerializedFile(proto.SerializeToString())
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    factory = None if get_class else message_factory.MessageFactory(pool)
    classes: dict[str, Any] = {}
    for name in MESSAGES:
        descriptor = pool.FindMessageTypeByName(f"{API_VERSION}.{name}")
        classes[name] = get_class(descriptor) if get_class else factory.GetPrototype(descriptor)
    return classes


def klog(message: str, level: str = "I") -> None:
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
    print(f"{level}{stamp}.{int((now % 1) * 1e6):06d} {os.getpid():7d} device_plugin.py] "
          f"{message}", flush=True)


def plugin_dir() -> Path:
    return daemons._root(DEVICE_PLUGIN_PATH)


def driver_loaded(faults: set[str]) -> bool:
    return daemons._module_version() is not None and "driver-not-loaded" not in faults


def enumerate_gpus(hw: dict[str, Any], faults: set[str]) -> list[dict[str, Any]]:
    """The GPUs NVML shows: all of hardware.json's, less the last one with gpu-missing."""
    gpus = list(hw.get("gpus", []))
    if "gpu-missing" in faults and gpus:
        gpus = gpus[:-1]
    return gpus


def xid_events(hw: dict[str, Any], faults: set[str]) -> dict[str, int]:
    """{GPU UUID: Xid} for the Xid faults the simulated driver logs (lab_kmsg's lines)."""
    by_pci = {lab_kmsg._pci(gpu)[0]: str(gpu["uuid"]) for gpu in hw.get("gpus", [])}
    events: dict[str, int] = {}
    for fault in lab_kmsg.XID_FAULTS:
        if fault not in faults:
            continue
        for line in lab_kmsg.xid_lines(fault, hw):
            match = _XID_LINE.search(line)
            if match and match["pci"] in by_pci:
                events[by_pci[match["pci"]]] = int(match["xid"])
    return events


def health(gpus: list[dict[str, Any]], hw: dict[str, Any], faults: set[str]) -> dict[str, str]:
    events = {uuid: xid for uuid, xid in xid_events(hw, faults).items()
              if xid not in IGNORED_XIDS}
    return {str(g["uuid"]): UNHEALTHY if str(g["uuid"]) in events else HEALTHY for g in gpus}


def _file_id(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class DevicePlugin:
    """One serving of the plugin: its gRPC server on the endpoint, registered with one kubelet."""

    def __init__(self, messages: dict[str, Any], gpus: list[dict[str, Any]],
                 health_of: dict[str, str]) -> None:
        self.m = messages
        self.gpus = gpus
        self.health = dict(health_of)
        self.changed = threading.Condition()
        self.generation = 0
        self.stopped = threading.Event()
        self.server: grpc.Server | None = None

    # -- the DevicePlugin service ---------------------------------------------------------
    def _devices(self) -> Any:
        response = self.m["ListAndWatchResponse"]()
        for gpu in self.gpus:
            device = response.devices.add(ID=str(gpu["uuid"]), health=self.health[gpu["uuid"]])
            if gpu.get("numa_node") is not None and int(gpu["numa_node"]) >= 0:
                device.topology.nodes.add(ID=int(gpu["numa_node"]))
        return response

    def get_device_plugin_options(self, request: Any, context: grpc.ServicerContext) -> Any:
        del request, context
        return self.m["DevicePluginOptions"](get_preferred_allocation_available=True)

    def list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        del request
        sent = -1
        while not self.stopped.is_set() and context.is_active():
            with self.changed:
                if self.generation == sent:
                    self.changed.wait(1.0)
                    continue
                sent = self.generation
                response = self._devices()
            yield response

    def get_preferred_allocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        del context
        numa = {str(g["uuid"]): g.get("numa_node") for g in self.gpus}
        index = {str(g["uuid"]): int(g["index"]) for g in self.gpus}
        response = self.m["PreferredAllocationResponse"]()
        for wanted in request.container_requests:
            chosen = list(dict.fromkeys(wanted.must_include_deviceIDs))
            near = {numa.get(d) for d in chosen} or {numa.get(wanted.available_deviceIDs[0])
                                                     if wanted.available_deviceIDs else None}
            free = sorted((d for d in wanted.available_deviceIDs if d not in chosen),
                          key=lambda d: (numa.get(d) not in near, index.get(d, 1 << 30), d))
            chosen += free[:max(0, wanted.allocation_size - len(chosen))]
            response.container_responses.add(deviceIDs=chosen)
        return response

    def allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.m["AllocateResponse"]()
        for container in request.container_requests:
            for device in container.devices_ids:
                if device not in self.health:
                    context.abort(grpc.StatusCode.UNKNOWN,
                                  f'invalid allocation request for "{RESOURCE}": invalid request: '
                                  f"unknown device: {device}")
            ids = list(dict.fromkeys(container.devices_ids))
            answer = response.container_responses.add()
            answer.envs[VISIBLE_DEVICES] = ",".join(ids)
        return response

    def pre_start_container(self, request: Any, context: grpc.ServicerContext) -> Any:
        del request, context
        return self.m["PreStartContainerResponse"]()

    def handler(self) -> grpc.GenericRpcHandler:
        m = self.m

        def unary(method: Callable[..., Any], request: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                method, request_deserializer=m[request].FromString,
                response_serializer=lambda message: message.SerializeToString())

        return grpc.method_handlers_generic_handler(f"{API_VERSION}.DevicePlugin", {
            "GetDevicePluginOptions": unary(self.get_device_plugin_options, "Empty"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.list_and_watch, request_deserializer=m["Empty"].FromString,
                response_serializer=lambda message: message.SerializeToString()),
            "GetPreferredAllocation": unary(self.get_preferred_allocation,
                                            "PreferredAllocationRequest"),
            "Allocate": unary(self.allocate, "AllocateRequest"),
            "PreStartContainer": unary(self.pre_start_container, "PreStartContainerRequest"),
        })

    # -- serving and registering ----------------------------------------------------------
    def set_health(self, health_of: dict[str, str]) -> None:
        with self.changed:
            if health_of == self.health:
                return
            for uuid, state in health_of.items():
                if state != self.health.get(uuid):
                    klog(f"'{RESOURCE}' device marked {state.lower()}: {uuid}")
            self.health = dict(health_of)
            self.generation += 1
            self.changed.notify_all()

    def serve(self, socket_path: Path) -> None:
        socket_path.unlink(missing_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self.handler(),))
        if not self.server.add_insecure_port(f"unix://{socket_path}"):  # grpc 1.51: 0, no raise
            raise RuntimeError(f"cannot listen on {socket_path}")
        self.server.start()
        klog(f"Starting to serve '{RESOURCE}' on {socket_path}")

    def register(self, kubelet_socket: Path, timeout: float = 5.0) -> None:
        m = self.m
        request = m["RegisterRequest"](version=API_VERSION, endpoint=ENDPOINT,
                                       resource_name=RESOURCE)
        request.options.get_preferred_allocation_available = True
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            register = channel.unary_unary(
                f"/{API_VERSION}.Registration/Register",
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=m["Empty"].FromString)
            register(request, timeout=timeout)
        klog(f"Registered device plugin for '{RESOURCE}' with Kubelet")

    def stop(self, socket_path: Path) -> None:
        self.stopped.set()
        with self.changed:
            self.changed.notify_all()
        if self.server is not None:
            klog(f"Stopping to serve '{RESOURCE}' on {socket_path}")
            self.server.stop(grace=1).wait(5)
        socket_path.unlink(missing_ok=True)


_stop = threading.Event()


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _stop.set()


def run(interval: float) -> int:
    messages = message_classes()
    directory = plugin_dir()
    kubelet_socket, endpoint = directory / KUBELET_SOCKET, directory / ENDPOINT
    klog(f"NVIDIA device plugin for '{RESOURCE}' ({SIMULATED}: devices and health from "
         f"{daemons._hw_dir()}, the kubelet's real device plugin API {API_VERSION})")
    said = ""

    def once(message: str) -> None:
        nonlocal said
        if message != said:
            klog(message)
            said = message

    while not _stop.is_set():
        hw, faults = daemons._load()
        if not driver_loaded(faults):
            once("Failed to initialize NVML: the NVIDIA driver is not loaded "
                 f"({SIMULATED}); waiting for it")
            _stop.wait(interval)
            continue
        if _file_id(kubelet_socket) is None:
            once(f"Waiting for the kubelet's registration socket {kubelet_socket}")
            _stop.wait(interval)
            continue
        gpus = enumerate_gpus(hw, faults)
        plugin = DevicePlugin(messages, gpus, health(gpus, hw, faults))
        registered_with = _file_id(kubelet_socket)
        try:
            plugin.serve(endpoint)
            plugin.register(kubelet_socket)
            said = ""
        except (grpc.RpcError, grpc.FutureTimeoutError, RuntimeError, OSError) as exc:
            plugin.stop(endpoint)
            detail = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or repr(exc)
            once(f"Could not register device plugin: {detail}; retrying")
            _stop.wait(interval)
            continue
        for uuid, state in plugin.health.items():
            if state == UNHEALTHY:
                klog(f"'{RESOURCE}' device marked unhealthy: {uuid}")
        while not _stop.wait(interval):
            now = _file_id(kubelet_socket)
            if now is not None and now != registered_with:
                klog(f"inotify: {kubelet_socket} created, restarting.")
                break
            if _file_id(endpoint) is None:
                klog(f"{endpoint} removed, restarting.")
                break
            hw, faults = daemons._load()
            plugin.set_health(health(gpus, hw, faults))
        plugin.stop(endpoint)
    klog('Received signal "terminated", shutting down.')
    return 0


def main(argv: list[str]) -> int:
    del argv
    daemons.set_process_name("nvidia-device-p")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(float(os.environ.get("GPUREADY_SIM_DP_INTERVAL", "1")))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
