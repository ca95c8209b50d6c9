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
  commas and, where the real toolkit would inject the driver (SIMULATED), read-only mounts of
  the host's simulated GPUs ($GPUREADY_LAB_HW, $GPUREADY_LAB_RUN) at the simulators' default
  paths, so nccl-tests in a Pod's image see the node's GPUs; it refuses an unknown ID with the
  real message ("invalid request: unknown device: ..."). GetPreferredAllocation takes the
  required devices, then free ones on the same NUMA node first, then by index (SIMULATED: the
  real one ranks by NVLink topology through NVML).
- Configuration, as the GPU Operator's config-manager hands it to the real plugin: the
  ClusterPolicy's ``devicePlugin.config`` names the ConfigMap (in the operator's namespace,
  $GPUREADY_SIM_OPERATOR_NAMESPACE, default gpu-operator) and its default key; the Node's
  ``nvidia.com/device-plugin.config`` label picks a key. A configuration with
  ``sharing.timeSlicing`` replicas of nvidia.com/gpu advertises each GPU that many times, with
  the real plugin's annotated IDs ``<UUID>::<i>`` (internal/rm/device_map.go
  updateDeviceMapWithReplicas); Allocate names each GPU once. No ClusterPolicy (or none of its
  CRD), no access kubeconfig (a fleet without a control plane): the plugin's defaults. A key the
  ConfigMap lacks, or a configuration it cannot run (MPS, a renamed resource: not simulated),
  keeps it from starting, as the real config-manager's failure keeps the real plugin from
  starting. It reads the API every $GPUREADY_SIM_DP_CONFIG_INTERVAL seconds (5) with the lab's
  service account (lab/kube/cluster.py: a stand-in for the plugin's own service account and
  ConfigMap volume) and restarts and registers again when the configuration changes, as the
  real plugin does on the config-manager's SIGHUP; an API server that does not answer keeps the
  last configuration read.
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
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

try:  # run from the checkout (unit tests import it)
    from lab.sim import daemons, kubeclient, lab_kmsg
except ImportError:  # run as /opt/gpuready-lab/sim/device_plugin.py in a lab host
    import daemons  # type: ignore[no-redef]
    import kubeclient  # type: ignore[no-redef]
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
DEFAULT_HW, DEFAULT_RUN = "/opt/gpuready-lab/hw", "/run/gpuready-lab"  # as the simulators read
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


# -- its configuration: what the GPU Operator's config-manager hands the real plugin ---------
CONFIG_LABEL = "nvidia.com/device-plugin.config"
CLUSTER_POLICIES = "/apis/nvidia.com/v1/clusterpolicies"
# The lab's stand-in for the plugin's service account (lab/kube/cluster.py writes it on every
# kubelet host of a fleet with a control plane).
ACCESS_KUBECONFIG = "/etc/gpuready-lab/device-plugin/kubeconfig"
OPERATOR_NAMESPACE = "gpu-operator"  # the chart's; $GPUREADY_SIM_OPERATOR_NAMESPACE overrides


@dataclass(frozen=True)
class Config:
    """The configuration the plugin runs with: its name (the ConfigMap key; "" for the plugin's
    built-in defaults) and how many replicas of each GPU it advertises (time-slicing)."""

    name: str
    replicas: int


DEFAULT_CONFIG = Config("", 1)


class ConfigError(Exception):
    """A configuration the plugin cannot start with (the config-manager's init would fail)."""


def replicas_in(text: str, where: str) -> int:
    """The time-slicing replicas of nvidia.com/gpu in a k8s-device-plugin config file (v1);
    1 without a sharing section."""
    import yaml  # noqa: PLC0415 (Debian's python3-yaml in the host; only this reads YAML)

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise ConfigError(f"{where}: not a device plugin configuration (version: v1)")
    sharing = doc.get("sharing") or {}
    if sharing.get("mps"):
        raise ConfigError(f"{where}: MPS sharing is not simulated")
    for resource in (sharing.get("timeSlicing") or {}).get("resources") or []:
        if not isinstance(resource, dict) or resource.get("name") != RESOURCE:
            continue
        replicas = resource.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ConfigError(f"{where}: timeSlicing replicas of {RESOURCE} must be a whole "
                              f"number of at least 1, not {replicas!r}")
        if resource.get("rename") or (sharing.get("timeSlicing") or {}).get("renameByDefault"):
            raise ConfigError(f"{where}: a renamed shared resource is not simulated")
        return replicas
    return 1


def select_config(client: Any, node_name: str, namespace: str) -> Config:
    """As the operator's config-manager chooses: the ClusterPolicy names the ConfigMap and its
    default key; the Node's ``nvidia.com/device-plugin.config`` label picks a key, else the
    default. No ClusterPolicy (or CRD) or no ConfigMap named: the plugin's defaults. A key the
    ConfigMap lacks is an error (the real config-manager fails, and the plugin does not start)."""
    node = client.request("GET", f"/api/v1/nodes/{node_name}")
    label = str((node.get("metadata", {}).get("labels") or {}).get(CONFIG_LABEL, ""))
    try:
        policies = client.request("GET", CLUSTER_POLICIES).get("items") or []
    except kubeclient.ApiFailure as exc:
        if exc.code != 404:  # 404: no GPU Operator CRDs in this cluster
            raise
        policies = []
    settings: dict[str, Any] = {}
    if policies:
        first = sorted(policies, key=lambda p: str(p.get("metadata", {}).get("name")))[0]
        settings = ((first.get("spec") or {}).get("devicePlugin") or {}).get("config") or {}
    map_name = str(settings.get("name") or "")
    chosen = label or str(settings.get("default") or "")
    if not map_name or not chosen:
        return DEFAULT_CONFIG
    where = f"ConfigMap {namespace}/{map_name}"
    data = client.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{map_name}"
                          ).get("data") or {}
    if chosen not in data:
        source = f"label {CONFIG_LABEL}={label}" if label else "the ClusterPolicy's default"
        raise ConfigError(f"{source}: {where} has no such configuration (it has: "
                          f"{', '.join(sorted(data)) or 'none'})")
    return Config(chosen, replicas_in(str(data[chosen]), f"{where}, key {chosen}"))


def access_client() -> Any | None:
    """A client with the lab's device plugin credentials, or None where the host has none (a
    fleet without a control plane: the plugin's defaults)."""
    path = daemons._root(ACCESS_KUBECONFIG)
    return kubeclient.kubeconfig_client(path) if path.exists() else None


def device_ids(gpus: list[dict[str, Any]], replicas: int) -> list[tuple[str, dict[str, Any]]]:
    """(device ID, its GPU): the GPU's UUID, or with time-slicing each replica's annotated ID
    ``<UUID>::<i>`` as the real plugin's NewAnnotatedID makes it (internal/rm/devices.go)."""
    if replicas <= 1:
        return [(str(g["uuid"]), g) for g in gpus]
    return [(f"{g['uuid']}::{i}", g) for g in gpus for i in range(replicas)]


def gpu_of(device_id: str) -> str:
    """The GPU UUID of a device ID (the real AnnotatedID's GetID: the part before ``::``)."""
    return device_id.split("::", 1)[0]


class DevicePlugin:
    """One serving of the plugin: its gRPC server on the endpoint, registered with one kubelet."""

    def __init__(self, messages: dict[str, Any], gpus: list[dict[str, Any]],
                 health_of: dict[str, str], config: Config = DEFAULT_CONFIG) -> None:
        self.m = messages
        self.gpus = gpus
        self.config = config
        self.devices = device_ids(gpus, config.replicas)
        self.health = dict(health_of)  # by GPU UUID: a GPU's replicas share its health
        self.changed = threading.Condition()
        self.generation = 0
        self.stopped = threading.Event()
        self.server: grpc.Server | None = None

    # -- the DevicePlugin service ---------------------------------------------------------
    def _devices(self) -> Any:
        response = self.m["ListAndWatchResponse"]()
        for device_id, gpu in self.devices:
            device = response.devices.add(ID=device_id, health=self.health[gpu["uuid"]])
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
        numa = {d: g.get("numa_node") for d, g in self.devices}
        index = {d: int(g["index"]) for d, g in self.devices}
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
        known = {d for d, _gpu in self.devices}
        for container in request.container_requests:
            for device in container.devices_ids:
                if device not in known:
                    context.abort(grpc.StatusCode.UNKNOWN,
                                  f'invalid allocation request for "{RESOURCE}": invalid request: '
                                  f"unknown device: {device}")
            # Replicas of one GPU name that GPU once (time-slicing: they share it).
            ids = list(dict.fromkeys(gpu_of(d) for d in container.devices_ids))
            answer = response.container_responses.add()
            answer.envs[VISIBLE_DEVICES] = ",".join(ids)
            # SIMULATED driver injection: the real NVIDIA Container Toolkit mounts the driver's
            # devices and libraries into the container; here the simulated GPUs are the host's
            # hardware description and per-boot driver state, mounted read-only at the paths
            # the simulated tools read (an image's nccl-tests: lab/kube/acceptance_image.py).
            for host_path, container_path in ((daemons._hw_dir(), DEFAULT_HW),
                                              (daemons._run_dir(), DEFAULT_RUN)):
                answer.mounts.add(container_path=container_path, host_path=str(host_path),
                                  read_only=True)
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


def run(interval: float, config_interval: float = 5.0) -> int:
    messages = message_classes()
    directory = plugin_dir()
    kubelet_socket, endpoint = directory / KUBELET_SOCKET, directory / ENDPOINT
    namespace = os.environ.get("GPUREADY_SIM_OPERATOR_NAMESPACE", OPERATOR_NAMESPACE)
    klog(f"NVIDIA device plugin for '{RESOURCE}' ({SIMULATED}: devices and health from "
         f"{daemons._hw_dir()}, the kubelet's real device plugin API {API_VERSION})")
    said = ""
    good: Config | None = None  # the last configuration read

    def once(message: str) -> None:
        nonlocal said
        if message != said:
            klog(message)
            said = message

    def configuration() -> Config | None:
        """The configuration to run with; None: none can be had yet (said once). An API
        server that does not answer keeps the last one read."""
        nonlocal good
        try:
            client = access_client()
            if client is None:
                good = DEFAULT_CONFIG
            else:
                good = select_config(client, daemons._node_name(), namespace)
        except ConfigError as exc:
            once(f"config-manager: {exc}")
            return None
        except (kubeclient.ApiFailure, OSError, KeyError, ValueError) as exc:
            if good is None:
                once(f"config-manager: cannot read the configuration: {exc}; retrying")
        return good

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
        config = configuration()
        if config is None:
            _stop.wait(interval)
            continue
        gpus = enumerate_gpus(hw, faults)
        plugin = DevicePlugin(messages, gpus, health(gpus, hw, faults), config)
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
        if config.replicas > 1:
            klog(f"Running with config {config.name!r}: {len(plugin.devices)} device(s), "
                 f"{config.replicas} replicas of each of {len(gpus)} GPU(s) (time-slicing)")
        elif config != DEFAULT_CONFIG:
            klog(f"Running with config {config.name!r}: one device per GPU")
        _watch(plugin, Watched(kubelet_socket, registered_with, endpoint), interval,
               config_interval, configuration)
        plugin.stop(endpoint)
    klog('Received signal "terminated", shutting down.')
    return 0


@dataclass(frozen=True)
class Watched:
    kubelet_socket: Path
    registered_with: tuple[int, int, int] | None
    endpoint: Path


def _watch(plugin: DevicePlugin, watched: Watched, interval: float, config_interval: float,
           configuration: Callable[[], Config | None]) -> None:
    """While the plugin serves: health each interval; returns when it must restart (a new
    kubelet, its socket gone, a new configuration) or on a signal."""
    checked = time.monotonic()
    while not _stop.wait(interval):
        if time.monotonic() - checked >= config_interval:
            checked = time.monotonic()
            config = configuration()
            if config is not None and config != plugin.config:
                klog(f"Config changed ({plugin.config.name or 'defaults'} -> "
                     f"{config.name or 'defaults'}), restarting.")
                return
        now = _file_id(watched.kubelet_socket)
        if now is not None and now != watched.registered_with:
            klog(f"inotify: {watched.kubelet_socket} created, restarting.")
            return
        if _file_id(watched.endpoint) is None:
            klog(f"{watched.endpoint} removed, restarting.")
            return
        hw, faults = daemons._load()
        plugin.set_health(health(plugin.gpus, hw, faults))


def main(argv: list[str]) -> int:
    del argv
    daemons.set_process_name("nvidia-device-p")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(float(os.environ.get("GPUREADY_SIM_DP_INTERVAL", "1")),
               float(os.environ.get("GPUREADY_SIM_DP_CONFIG_INTERVAL", "5")))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
