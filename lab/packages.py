"""The SIMULATED vendor packages of the lab repository: production names, realistic versions.

Only what vendor repositories carry is simulated (NVIDIA driver branches, fabric manager, the
container toolkit, kubelet/kubeadm/kubectl, nccl-tests, MLNX ibstat). Each binary is a thin
wrapper that execs a simulator from ``/opt/gpuready-lab/sim`` (bind-mounted into every lab host)
with the package's upstream version in ``GPUREADY_SIM_VERSION``, so the tool reports the version
that apt installed. Every description says "gpuready lab simulator".
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIM = "/opt/gpuready-lab/sim"
LAB_NOTE = (
    " SIMULATED by the gpuready lab: this package carries the production name and\n"
    " version of a vendor package, but its programs are gpuready lab simulators that\n"
    " read the host's simulated hardware description. It is not NVIDIA or Kubernetes\n"
    " software and does nothing on real hardware.\n"
)


@dataclass(frozen=True)
class File:
    path: str
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class Package:
    repo: str
    name: str
    version: str
    summary: str
    depends: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    files: tuple[File, ...] = ()
    postinst: str | None = None
    arch: str = "amd64"
    section: str = "non-free/libs"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def upstream(self) -> str:
        return self.version.rsplit("-", 1)[0]

    def control(self) -> str:
        lines = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            f"Architecture: {self.arch}",
            "Maintainer: gpuready lab <lab@gpuready.invalid>",
            f"Section: {self.section}",
            "Priority: optional",
        ]
        for key, values in (("Depends", self.depends), ("Conflicts", self.conflicts),
                            ("Replaces", self.conflicts), ("Provides", self.provides)):
            if values:
                lines.append(f"{key}: {', '.join(values)}")
        lines += [f"{k}: {v}" for k, v in self.extra.items()]
        lines.append(f"Description: {self.summary} (gpuready lab simulator)")
        return "\n".join(lines) + "\n" + LAB_NOTE


def _bin(path: str, tool: str, script: str, version: str) -> File:
    """A program that runs a lab simulator as ``tool`` (its argv[0] and process name)."""
    body = (
        "#!/bin/bash\n"
        f"# {tool}: gpuready lab simulator (simulated package, version {version})\n"
        f"export GPUREADY_SIM_TOOL={tool} GPUREADY_SIM_VERSION={version}\n"
        f'exec -a {tool} /usr/bin/python3 {SIM}/{script} "$@"\n'
    )
    return File(path=path, content=body, mode=0o755)


RELOAD = """#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
"""

# A DKMS build as the real package does it; the lab's driver-install-fail fault makes it fail
# the way a real DKMS build failure fails dpkg (so the roles' failure handling is exercised).
DKMS_POSTINST = """#!/bin/sh
set -e
KVER=$(uname -r)
echo "Loading new nvidia-{version} DKMS files..."
echo "Building for $KVER"
echo "Building initial module for $KVER (gpuready lab simulator)"
if grep -q '"driver-install-fail"' /opt/gpuready-lab/hw/faults.json 2>/dev/null; then
  echo "Error! Bad return status for module build on kernel: $KVER (x86_64)" >&2
  echo "Consult /var/lib/dkms/nvidia/{version}/build/make.log for more information." >&2
  exit 10
fi
echo "Done."
# The simulated kernel: a first install loads the new module (as modprobe after the DKMS build
# does); over an already loaded module of another version it does not, so userspace and kernel
# disagree until a reboot, as on a real node ("Driver/library version mismatch").
if [ ! -e /run/gpuready-lab/nvidia-module-version ]; then
  mkdir -p /run/gpuready-lab
  echo "{version}" > /run/gpuready-lab/nvidia-module-version
fi
"""

PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (gpuready lab simulator)
Wants=syslog.target

[Service]
Type=forking
PIDFile=/var/run/nvidia-persistenced/nvidia-persistenced.pid
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_UNIT = """[Unit]
Description=NVIDIA fabric manager service (gpuready lab simulator)
After=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_CFG = """# NVIDIA Fabric Manager configuration (gpuready lab simulator)
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
LOG_APPEND_TO_LOG=1
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
"""

KUBELET_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent (gpuready lab simulator)
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

KUBEADM_DROPIN = """# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""  # noqa: E501 (the real drop-in's line)

CUDA = "cuda/debian12/x86_64"
TOOLKIT = "libnvidia-container/stable/deb/amd64"
KUBERNETES = "kubernetes/v1.30/deb"
EXTRAS = "extras"
REPOS = (CUDA, TOOLKIT, KUBERNETES, EXTRAS)

DRIVERS = (("535", "535.161.08"), ("550", "550.54.15"), ("550", "550.90.07"))
TOOLKITS = ("1.16.2", "1.17.3")
KUBE = ("1.30.4", "1.30.5")
NCCL_TESTS = ("2.13.10", "2.17.1")


def _driver_packages(branch: str, upstream: str) -> list[Package]:
    version = f"{upstream}-0ubuntu1"
    exact = f"(= {version})"
    pkgs = [
        Package(CUDA, f"nvidia-utils-{branch}", version, "NVIDIA driver support binaries",
                provides=("nvidia-utils",), conflicts=("nvidia-utils",),
                files=(_bin("/usr/bin/nvidia-smi", "nvidia-smi", "nvidia_smi.py", upstream),)),
        Package(CUDA, f"nvidia-compute-utils-{branch}", version, "NVIDIA compute utilities",
                provides=("nvidia-compute-utils",), conflicts=("nvidia-compute-utils",),
                files=(_bin("/usr/bin/nvidia-persistenced", "nvidia-persistenced",
                            "daemons.py", upstream),
                       File("/lib/systemd/system/nvidia-persistenced.service",
                            PERSISTENCED_UNIT)),
                postinst=RELOAD),
        Package(CUDA, f"nvidia-fabricmanager-{branch}", version,
                "Fabric Manager for NVSwitch based systems",
                provides=("nvidia-fabricmanager",), conflicts=("nvidia-fabricmanager",),
                files=(_bin("/usr/bin/nv-fabricmanager", "nv-fabricmanager", "daemons.py",
                            upstream),
                       File("/lib/systemd/system/nvidia-fabricmanager.service",
                            FABRICMANAGER_UNIT),
                       File("/usr/share/nvidia/nvswitch/fabricmanager.cfg", FABRICMANAGER_CFG)),
                postinst=RELOAD),
    ]
    for flavour, suffix in (("proprietary", ""), ("open", "-open")):
        dkms = f"nvidia-dkms-{branch}{suffix}"
        pkgs.append(Package(
            CUDA, dkms, version, f"NVIDIA DKMS package ({flavour} kernel modules)",
            provides=("nvidia-dkms-kernel",), conflicts=("nvidia-dkms-kernel",),
            files=(File(f"/usr/src/nvidia-{upstream}/dkms.conf",
                        f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{upstream}"\n'
                        f"# gpuready lab simulator: {flavour} kernel modules, not built\n"),),
            postinst=DKMS_POSTINST.replace("{version}", upstream)))
        pkgs.append(Package(
            CUDA, f"nvidia-driver-{branch}{suffix}", version,
            f"NVIDIA driver metapackage ({flavour} kernel modules)",
            depends=(f"nvidia-utils-{branch} {exact}", f"nvidia-compute-utils-{branch} {exact}",
                     f"{dkms} {exact}"),
            provides=("nvidia-driver",), conflicts=("nvidia-driver",), section="non-free/misc"))
    return pkgs


def all_packages() -> list[Package]:
    pkgs: list[Package] = []
    for branch, upstream in DRIVERS:
        pkgs += _driver_packages(branch, upstream)
    pkgs.append(Package(CUDA, "libnccl2", "2.21.5-1+cuda12.4",
                        "NVIDIA Collective Communication Library (NCCL) Runtime",
                        files=(File("/usr/share/doc/libnccl2/README.gpuready-lab",
                                    "Simulated NCCL: collective results come from the "
                                    "gpuready lab simulator.\n"),)))
    for upstream in TOOLKITS:
        version = f"{upstream}-1"
        pkgs.append(Package(
            TOOLKIT, "libnvidia-container1", version, "NVIDIA container runtime library",
            files=(File("/usr/share/doc/libnvidia-container1/README.gpuready-lab",
                        "Simulated package: no library is included.\n"),)))
        pkgs.append(Package(
            TOOLKIT, "libnvidia-container-tools", version,
            "NVIDIA container runtime library (command-line tools)",
            depends=(f"libnvidia-container1 (= {version})",),
            files=(File("/usr/share/doc/libnvidia-container-tools/README.gpuready-lab",
                        "Simulated package: nvidia-container-cli is not included.\n"),)))
        pkgs.append(Package(
            TOOLKIT, "nvidia-container-toolkit-base", version, "NVIDIA Container Toolkit Base",
            files=(_bin("/usr/bin/nvidia-ctk", "nvidia-ctk", "nvidia_ctk.py", upstream),
                   _bin("/usr/bin/nvidia-container-runtime", "nvidia-container-runtime",
                        "nvidia_ctk.py", upstream))))
        pkgs.append(Package(
            TOOLKIT, "nvidia-container-toolkit", version, "NVIDIA Container toolkit",
            depends=(f"nvidia-container-toolkit-base (= {version})",
                     f"libnvidia-container-tools (>= {version})"),
            files=(_bin("/usr/bin/nvidia-container-runtime-hook",
                        "nvidia-container-runtime-hook", "nvidia_ctk.py", upstream),)))
    for upstream in KUBE:
        version = f"{upstream}-1.1"
        pkgs.append(Package(
            KUBERNETES, "kubelet", version, "Node agent for Kubernetes clusters",
            depends=("kubernetes-cni (>= 1.1.1)",),
            files=(_bin("/usr/bin/kubelet", "kubelet", "daemons.py", upstream),
                   File("/lib/systemd/system/kubelet.service", KUBELET_UNIT)),
            postinst=RELOAD))
        pkgs.append(Package(
            KUBERNETES, "kubeadm", version, "Command-line utility for administering a "
            "Kubernetes cluster", depends=("cri-tools (>= 1.28.0)",),
            files=(_bin("/usr/bin/kubeadm", "kubeadm", "k8s.py", upstream),
                   File("/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
                        KUBEADM_DROPIN))))
        pkgs.append(Package(
            KUBERNETES, "kubectl", version, "Command-line utility for interacting with a "
            "Kubernetes cluster",
            files=(_bin("/usr/bin/kubectl", "kubectl", "k8s.py", upstream),)))
    pkgs.append(Package(KUBERNETES, "cri-tools", "1.30.1-1.1",
                        "Command-line utility for interacting with a container runtime",
                        files=(File("/usr/share/doc/cri-tools/README.gpuready-lab",
                                    "Simulated package: crictl is not included.\n"),)))
    pkgs.append(Package(KUBERNETES, "kubernetes-cni", "1.4.0-1.1",
                        "Binaries required to provision kubernetes container networking",
                        files=(File("/opt/cni/bin/README.gpuready-lab",
                                    "Simulated package: no CNI plugins are included.\n"),)))
    nccl_tools = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf")
    for upstream in NCCL_TESTS:  # -J (JSON output) exists from 2.17 on
        # A site builds nccl-tests with MPI=1 for multi-node runs (it then needs Open MPI's
        # library). The simulated binaries are an mpi4py program when mpirun starts them, so
        # the package needs Debian's python3-mpi4py, which brings Open MPI (libopenmpi3, and
        # openmpi-bin through mpi-default-bin) from Debian, for real.
        pkgs.append(Package(
            EXTRAS, "nccl-tests", f"{upstream}-1", "NCCL performance tests (site build)",
            depends=("libnccl2", "python3-mpi4py"),
            files=tuple(_bin(f"/usr/bin/{tool}", tool, "all_reduce_perf.py", upstream)
                        for tool in nccl_tools)))
    pkgs.append(Package(
        EXTRAS, "infiniband-diags", "2410mlnx54-1.2410068", "InfiniBand diagnostic programs "
        "(MLNX_OFED)",
        files=(_bin("/usr/sbin/ibstat", "ibstat", "ibstat.py", "2410mlnx54"),)))
    return pkgs
