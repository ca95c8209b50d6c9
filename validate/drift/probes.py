"""Live read-only probes of one node for the versions and runtime layers, and the GPU-busy test
that guards the performance layer.

Every command here reads and changes nothing: ``uname -r``, ``dpkg-query``, ``cat`` of sysfs,
``nvidia-smi -q -x``, ``nvidia-smi --query-compute-apps``, ``systemctl is-active``,
``containerd config dump``, ``systemd-detect-virt``, ``ls /sys/module``.

Versions: ``kernel`` (against ``gpuready_kernel_release`` when the inventory pins one), ``driver
library`` (the version of the package that owns nvidia-smi, i.e. the user-space driver) and
``driver module`` (``/sys/module/nvidia/version``, else the version the driver reports through
nvidia-smi) against ``nvidia_driver_version``, and ``driver module/library`` when the two
disagree (nvidia-smi's "Driver/library version mismatch", as after a driver package change
without a reboot). Package versions and holds are compared with what the check-mode run
declares (:func:`package_findings`).

Runtime: ``service <unit>`` for the units the validators require (node.services' list and its
rule for a kubelet waiting for ``kubeadm join``) and, where the inventory pins DCGM, the
``nvidia_dcgm`` role's host engine (``nvidia-dcgm.service``: the node's one DCGM host engine,
which the GPU Operator's dcgm-exporter connects to; docs/cluster.md), ``persistence mode`` on
every GPU, ``containerd runtime <name>`` in ``containerd config dump``, ``module <name>`` for
the kernel modules the roles load. In a container the kernel belongs to the host (as the roles
say), so modules are not compared there.

A node that takes the first probe (``systemd-detect-virt``, answered at once by any Linux) and
gives no answer within the timeout has stopped answering: it is given up at once (item
``ssh``, ``unreachable``, code ``host.unresponsive``) instead of costing one timeout per probe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from validate.checks.base import NodeContext, ToolFailure
from validate.checks.gpu import NVSMI_XML
from validate.checks.node import KUBELET, KUBELET_KUBECONFIG, expected_units
from validate.drift import pins
from validate.drift.config import PackageTask
from validate.drift.declared import as_bool, as_list, declared, role_constant
from validate.drift.model import Finding, FindingStatus, Layer
from validate.model import CODE_INTERRUPTED, CODE_TIMEOUT
from validate.parsers import (
    ParseError,
    containerd_config,
    dpkg_query,
    nvidia_smi_csv,
    nvidia_smi_xml,
)
from validate.parsers.nvidia_smi_csv import ComputeApp
from validate.parsers.nvidia_smi_model import NvidiaSmiLog
from validate.transport import TransportError
from validate.transport.base import Unresponsive

NVSMI_PATH = "/usr/bin/nvidia-smi"  # where every NVIDIA driver package installs it
MODULE_VERSION = "/sys/module/nvidia/version"
DPKG_ARGV = ("dpkg-query", "--show", f"--showformat={dpkg_query.SHOWFORMAT}")
# Exactly the query of the real capture in tests/fixtures/nvidia-smi-csv (header with units).
COMPUTE_APPS_FIELDS = (
    "timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,used_gpu_memory"
)
COMPUTE_APPS = ("nvidia-smi", f"--query-compute-apps={COMPUTE_APPS_FIELDS}", "--format=csv")
# nvidia-smi's message when the loaded kernel module and the user-space library differ.
_MISMATCH = re.compile(r"Driver/library version mismatch", re.IGNORECASE)
_NVML_LIBRARY = re.compile(r"NVML library version:\s*(\S+)")
_NO_DRIVER = re.compile(r"couldn't communicate with the NVIDIA driver", re.IGNORECASE)


HOSTENGINE_DETAIL = ("the node's one DCGM host engine (nvidia_dcgm role): dcgmi and the GPU "
                     "Operator's dcgm-exporter connect to it")


def dcgm_hostengine_unit() -> str | None:
    """The unit the nvidia_dcgm role runs nv-hostengine as (its vars/main.yml)."""
    name = role_constant("nvidia_dcgm", "_nvidia_dcgm_service")
    return f"{name}.service" if name else None


@dataclass
class NodeProbe:
    """What the probes saw on one node. ``smi`` is None when nvidia-smi did not answer
    (``smi_problem`` says why); ``busy`` is None when it could not be told."""

    findings: list[Finding] = field(default_factory=list)
    packages: dict[str, dpkg_query.DpkgPackage] | None = None
    smi: NvidiaSmiLog | None = None
    smi_problem: str = ""
    busy: list[ComputeApp] | None = None
    busy_problem: str = ""
    container: str | None = None
    unreachable: str = ""


class Prober:
    """Runs the probes of one node through its :class:`NodeContext`."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.out = NodeProbe()

    def finding(self, layer: Layer, item: str, declared_value: str, actual: str,
                status: FindingStatus = FindingStatus.DRIFT, detail: str = "",
                source: str = "") -> None:
        self.out.findings.append(Finding(self.node.name, self.node.pool, layer, item,
                                         declared_value, actual, status, detail,
                                         f"probe: {source}" if source else "probe"))

    def error(self, layer: Layer, item: str, exc: ToolFailure, source: str) -> None:
        self.finding(layer, item, "readable", exc.code, FindingStatus.ERROR, exc.detail, source)

    def run(self) -> NodeProbe:
        """Every probe; a lost connection ends the node with one ``unreachable`` finding, a
        tool that fails costs only its own probe."""
        try:
            self.out.container = self._container()
            for name, step in (("kernel", self._kernel), ("packages", self._packages),
                               ("nvidia-smi", self._nvidia_smi), ("driver", self._driver),
                               ("services", self._services),
                               ("persistence", self._persistence),
                               ("containerd", self._containerd_runtime),
                               ("modules", self._modules), ("compute apps", self._compute_apps)):
                try:
                    step()
                except ToolFailure as exc:
                    self.error(Layer.RUNTIME if name in ("services", "modules", "containerd")
                               else Layer.VERSIONS, name, exc, name)
        except TransportError as exc:
            self.out.unreachable = exc.reason
            if exc.code == CODE_INTERRUPTED:
                self.finding(Layer.CONFIGURATION, "probes", "run", "interrupted",
                             FindingStatus.ERROR, exc.reason, "ssh")
                return self.out
            status = (FindingStatus.UNREACHABLE if exc.code != CODE_TIMEOUT
                      else FindingStatus.ERROR)
            self.finding(Layer.CONFIGURATION, "ssh", "reachable", exc.code, status,
                         exc.reason, "ssh")
        return self.out

    # -- versions ------------------------------------------------------------------------

    def _container(self) -> str | None:
        argv = ("systemd-detect-virt", "--container")
        try:
            res = self.ctx.output(argv, ok_rcs=(0, 1))
        except ToolFailure as exc:
            if exc.code == CODE_TIMEOUT:  # the first command: a node that stopped answering
                raise Unresponsive(self.node.name, f"the node took `{' '.join(argv)}` and "
                                   f"gave no answer within {self.ctx.default_timeout_s:g} s: "
                                   "it stopped answering; its other probes were not run"
                                   ) from None
            return None  # no systemd-detect-virt: treat as bare metal and compare everything
        kind = res.stdout.strip()
        return kind if res.rc == 0 and kind and kind != "none" else None

    def _kernel(self) -> None:
        try:
            kernel = self.ctx.output(("uname", "-r")).stdout.strip()
        except ToolFailure as exc:
            self.error(Layer.VERSIONS, "kernel", exc, "uname -r")
            return
        pin = self.node.desired.pins.kernel_release
        if pin and pin != kernel:
            self.finding(Layer.VERSIONS, "kernel", pin, kernel, source="uname -r")

    def _packages(self) -> None:
        try:
            res = self.ctx.output(DPKG_ARGV)
            self.out.packages = dpkg_query.parse(res.stdout)
        except ToolFailure as exc:
            self.error(Layer.VERSIONS, "packages", exc, "dpkg-query --show")
        except ParseError as exc:
            self.finding(Layer.VERSIONS, "packages", "readable", "tool.parse_error",
                         FindingStatus.ERROR, str(exc), "dpkg-query --show")

    def _nvidia_smi(self) -> None:
        res = self.ctx.run(NVSMI_XML)
        text = (res.stdout + "\n" + res.stderr).strip()
        if res.timed_out:
            self.out.smi_problem = f"nvidia-smi -q -x timed out after {res.duration_s:.0f} s"
            return
        if res.rc != 0:
            self.out.smi_problem = f"nvidia-smi exited {res.rc}: {text[-300:]}"
            return
        try:
            self.out.smi = nvidia_smi_xml.parse(res.stdout)
        except ParseError as exc:
            self.out.smi_problem = f"nvidia-smi -q -x: {exc}"

    def _driver(self) -> None:
        pin = self.node.desired.pins.driver_version or ""
        library = self._library_version()
        module = self._module_version()
        problem = self.out.smi_problem
        if _NO_DRIVER.search(problem):
            self.finding(Layer.RUNTIME, "module nvidia", "loaded", "not loaded",
                         detail=problem, source="nvidia-smi -q -x")
        if pin and library and library != pin:
            self.finding(Layer.VERSIONS, "driver library", pin, library,
                         source=f"dpkg-query --search {NVSMI_PATH}")
        if pin and module and module != pin:
            self.finding(Layer.VERSIONS, "driver module", pin, module,
                         source=MODULE_VERSION if module else "nvidia-smi -q -x")
        if pin and not library and not module:
            # Nothing to compare with the pin: never a silent "at the pin".
            self.finding(Layer.VERSIONS, "driver", pin, "unreadable", FindingStatus.ERROR,
                         "neither the library (the package owning nvidia-smi) nor the loaded "
                         "module's version could be read" + (f" ({problem})" if problem else ""),
                         source=f"dpkg-query --search {NVSMI_PATH}; {MODULE_VERSION}; "
                         "nvidia-smi -q -x")
        if _MISMATCH.search(problem):
            nvml = _NVML_LIBRARY.search(problem)
            actual = (f"module {module or 'unknown'}, library {library or 'unknown'}"
                      + (f" (NVML {nvml.group(1)})" if nvml else ""))
            self.finding(Layer.VERSIONS, "driver module/library", "the same version", actual,
                         detail=problem + " - a reboot (or module reload) loads the installed "
                         "driver", source="nvidia-smi -q -x")
        elif module and library and module != library:
            self.finding(Layer.VERSIONS, "driver module/library", "the same version",
                         f"module {module}, library {library}", source=MODULE_VERSION)

    def _library_version(self) -> str:
        if self.out.packages is None:
            return ""
        try:
            res = self.ctx.output(("dpkg-query", "--search", NVSMI_PATH), ok_rcs=(0, 1))
        except ToolFailure:
            return ""
        if res.rc != 0:
            return ""
        try:
            owners = dpkg_query.parse_owner(res.stdout)
        except ParseError:
            return ""
        pkg = self.out.packages.get(owners[0])
        return pkg.upstream if pkg is not None and pkg.installed else ""

    def _module_version(self) -> str:
        if self.out.container is None:
            res = self.ctx.run(("cat", MODULE_VERSION))
            if res.ok and res.stdout.strip():
                return res.stdout.strip()
        # No sysfs version (a container, or a driver built into the kernel): the version the
        # driver reports through NVML is the kernel module's.
        smi = self.out.smi
        return smi.driver_version or "" if smi is not None else ""

    # -- runtime -------------------------------------------------------------------------

    def _services(self) -> None:
        units = (self.node.desired.services
                 or expected_units(self.ctx.profile.hardware.nvswitch))
        hostengine = dcgm_hostengine_unit() if self.node.desired.pins.dcgm_version else None
        if hostengine and hostengine not in units:
            units = (*units, hostengine)
        try:
            res = self.ctx.output(("systemctl", "is-active", *units), ok_rcs=(0, 3, 4))
        except ToolFailure as exc:
            self.error(Layer.RUNTIME, "services", exc, "systemctl is-active")
            return
        states = res.stdout.split()
        if len(states) != len(units):
            self.finding(Layer.RUNTIME, "services", "readable", "tool.parse_error",
                         FindingStatus.ERROR, res.stdout.strip()[:200], "systemctl is-active")
            return
        for unit, state in zip(units, states, strict=True):
            if state == "active" or (unit == KUBELET and self._kubelet_waiting()):
                continue
            self.finding(Layer.RUNTIME, f"service {unit}", "active", state,
                         detail=HOSTENGINE_DETAIL if unit == hostengine else "",
                         source="systemctl is-active")

    def _kubelet_waiting(self) -> bool:
        enabled = self.ctx.output(("systemctl", "is-enabled", KUBELET), ok_rcs=(0, 1, 4))
        joined = self.ctx.output(("test", "-e", KUBELET_KUBECONFIG), ok_rcs=(0, 1))
        return enabled.stdout.strip() == "enabled" and joined.rc == 1

    def _persistence(self) -> None:
        wanted = as_bool(declared(self.node, "nvidia_driver", "nvidia_driver_persistenced_enabled"),
                         True)
        if not wanted or self.out.smi is None:
            return
        off = [f"GPU{g.index}" for g in self.out.smi.gpus if g.persistence_mode != "Enabled"]
        if off:
            self.finding(Layer.RUNTIME, "persistence mode", "Enabled on every GPU",
                         f"Disabled on {', '.join(off)}", source="nvidia-smi -q -x")

    def _containerd_runtime(self) -> None:
        name = str(declared(self.node, "nvidia_container_toolkit",
                            "nvidia_container_toolkit_runtime_name") or "nvidia")
        item = f"containerd runtime {name}"
        try:
            res = self.ctx.output(("containerd", "config", "dump"))
            runtimes = containerd_config.parse_runtimes(res.stdout)
        except ToolFailure as exc:
            self.error(Layer.RUNTIME, item, exc, "containerd config dump")
            return
        except ParseError as exc:
            self.finding(Layer.RUNTIME, item, "readable", "tool.parse_error",
                         FindingStatus.ERROR, str(exc), "containerd config dump")
            return
        runtime = runtimes.get(name)
        wanted = "nvidia-container-runtime"
        if runtime is None:
            self.finding(Layer.RUNTIME, item, f"registered, BinaryName *{wanted}", "missing",
                         detail=f"runtimes in the effective config: {', '.join(runtimes)}",
                         source="containerd config dump")
        elif not (runtime.binary_name or "").endswith(wanted):
            self.finding(Layer.RUNTIME, item, f"BinaryName *{wanted}",
                         f"BinaryName {runtime.binary_name}", source="containerd config dump")

    def _modules(self) -> None:
        if self.out.container:
            return  # the kernel (and its modules) belong to the container's host
        fabric = str(self.node.gpu_pool.get("fabric", ""))
        wanted = as_list(declared(self.node, "gpu_kernel_prereqs", "gpu_kernel_prereqs_modules"))
        wanted.append("nvidia")
        if fabric in as_list(declared(self.node, "nvidia_driver", "nvidia_driver_peermem_fabrics")):
            wanted.append("nvidia-peermem")
        try:
            res = self.ctx.output(("ls", "-1", "/sys/module"))
        except ToolFailure as exc:
            self.error(Layer.RUNTIME, "modules", exc, "ls /sys/module")
            return
        loaded = set(res.stdout.split())
        for module in dict.fromkeys(wanted):
            if module.replace("-", "_") not in loaded:
                self.finding(Layer.RUNTIME, f"module {module}", "loaded", "not loaded",
                             source="ls /sys/module")

    # -- performance guard ---------------------------------------------------------------

    def _compute_apps(self) -> None:
        if self.out.smi is None:
            self.out.busy_problem = f"cannot tell whether the GPUs are busy: {self.out.smi_problem}"
            return
        res = self.ctx.run(COMPUTE_APPS)
        if not res.ok:
            tail = (res.stdout + res.stderr).strip()[-200:]
            self.out.busy_problem = f"cannot tell whether the GPUs are busy: nvidia-smi " \
                                    f"--query-compute-apps exited {res.rc}: {tail}"
            return
        try:
            self.out.busy = nvidia_smi_csv.parse_query_compute_apps(res.stdout)
        except ParseError as exc:
            self.out.busy_problem = f"cannot tell whether the GPUs are busy: {exc}"


def probe(ctx: NodeContext) -> NodeProbe:
    return Prober(ctx).run()


def package_findings(node: str, pool: str, tasks: Sequence[PackageTask],
                     installed: Mapping[str, dpkg_query.DpkgPackage] | None) -> list[Finding]:
    """Declared packages (from check mode's apt tasks) against the node's dpkg database."""
    out: list[Finding] = []
    for task in tasks:
        source = f"check mode: {task.role} / {task.task}; probe: dpkg-query"
        found = 0
        for name, version in task.packages.items():
            if installed is None:
                break
            pkg = installed.get(name)
            # What dpkg has, as the upgrade plan says it: the version, "absent", or the
            # version with dpkg's unfinished state ("1.37.2-1.1 (half-configured)").
            have = pins.installed_state(pkg)
            if version is None:
                drifted = not pins.gone(pkg)
            elif version:
                drifted = have != version
            else:  # any version, but installed and configured
                drifted = pkg is None or have != pkg.version
            if drifted:
                out.append(Finding(node, pool, Layer.VERSIONS, f"package {name}",
                                   pins.ABSENT if version is None else version or "installed",
                                   have, FindingStatus.DRIFT, "", source))
                found += 1
        if task.changed and not found:
            out.append(Finding(node, pool, Layer.VERSIONS, f"{task.role}: {task.task}",
                               "nothing to do", "apt would change packages",
                               FindingStatus.DRIFT, task.summary, source))
    return out
