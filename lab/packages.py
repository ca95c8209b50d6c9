"""The SIMULATED vendor packages of the lab repository, per OS, as the real repositories have them.

The package universe comes from the real repositories' facts in
``tests/fixtures/vendor-repos/facts.yml`` (names, versions, revisions, the relations that
matter, key file names, each with its public source): a Debian 12 lab host sees what NVIDIA's
``debian12`` repository carries and a Debian 13 host what ``debian13`` carries. Ubuntu-shaped
package sets exist in the facts but are served to no lab host (no lab host claims Ubuntu).

Only what vendor repositories carry is simulated (NVIDIA driver, fabric manager, NCCL, DCGM,
the container toolkit) plus a site repository (nccl-tests, MLNX ibstat). Kubernetes is not:
kubelet, kubeadm and kubectl are the binaries lab/kube/build.py builds from Kubernetes' sources,
packaged as pkgs.k8s.io packages them (names, ``<upstream>-1.1`` versions, relations from the
facts, the kubelet unit, ``/etc/default/kubelet`` and kubeadm's drop-in from
``tests/fixtures/kube-packaging``, the files of kubernetes/release's krel templates).
Each binary is a thin wrapper that execs a simulator from ``/opt/gpuready-lab/sim``
(bind-mounted into every lab host) with the package's upstream version in
``GPUREADY_SIM_VERSION``, so the tool reports the version that apt installed. Every description
says "gpuready lab simulator"; relations the facts do not give (which package carries which
program) are the lab's own and keep the packages installable together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.paths import REPO_ROOT

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
    source: str = ""  # a file on this machine (a built binary) copied instead of ``content``
    link: str = ""  # a symbolic link to this target instead of a file


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
    conffiles: tuple[str, ...] = ()
    # Not a simulator: real software the lab built (its description says so instead).
    built: str = ""
    compression: str = "gzip"
    prerm: str | None = None

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
        if self.built:
            lines.append(f"Description: {self.summary}")
            return "\n".join(lines) + "\n" + self.built
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

# DCGM's own unit (tests/fixtures/vendor-repos/excerpts/nvidia-dcgm-3.3.6-nvidia-dcgm.service.in)
# with the install location filled in.
DCGM_UNIT = """[Unit]
Description=NVIDIA DCGM service (gpuready lab simulator)
Conflicts=dcgm.service

[Service]
User=root
PrivateTmp=false

Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"

ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm

Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

# DCGM 4's unit (tests/fixtures/vendor-repos/excerpts/nvidia-dcgm-4.6.0-nvidia-dcgm.service.in):
# no Conflicts= any more, dcgm.service is an alias of it.
DCGM4_UNIT = """[Unit]
Description=NVIDIA DCGM service (gpuready lab simulator)
After=nvidia-gpu-reset.target
Wants=nvidia-gpu-reset.target

[Service]
User=root
PrivateTmp=false

Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"

ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm

Restart=on-abort

[Install]
Alias=dcgm.service
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

KUBE_PACKAGING = REPO_ROOT / "tests" / "fixtures" / "kube-packaging"
BUILT_NOTE = (
    " Built from Kubernetes' sources by the gpuready lab (lab/kube/build.py), packaged as\n"
    " pkgs.k8s.io packages it; not signed or published by the Kubernetes project.\n"
)
# Debian's CNI plugins where the kubernetes-cni package puts its own (/opt/cni/bin, containerd's
# default bin_dir): the plugins of the real package are a download this machine cannot make.
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")

FACTS_FILE = REPO_ROOT / "tests" / "fixtures" / "vendor-repos" / "facts.yml"
# The OSes lab hosts run, whose CUDA repository directories the lab serves.
LAB_OSES = ("debian-12", "debian-13")
# Served paths mirror the vendors' URL paths, so a role's default URL with the host swapped for
# the lab's is the lab's URL (as a site mirror keeps the layout).
CUDA_ROOT = "compute/cuda/repos"
TOOLKIT_ROOT = "libnvidia-container"
KUBERNETES_MINOR = "1.37"  # the release lab/kube/build.py builds
EXTRAS = "extras"
# nccl-tests: -J (JSON output) exists from 2.17 on; the older build is for pin moves.
NCCL_TESTS = ("2.13.10", "2.17.1")


@dataclass(frozen=True)
class Repository:
    """One served repository: its directory, where its signing key is published, and for a
    repository that is not flat (Docker's) the suite and component it serves."""

    path: str  # relative to the lab repository root
    key_path: str  # the vendor's key file name, relative to the lab repository root
    label: str
    suite: str = ""  # "" for a flat repository
    component: str = ""

    @property
    def id(self) -> str:
        """What a Package's ``repo`` names: the path, and for a suite its dists directory."""
        return f"{self.path}/dists/{self.suite}" if self.suite else self.path


@functools.cache
def facts() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(FACTS_FILE.read_text())
    return data


def _cuda(os_key: str) -> dict[str, Any]:
    cuda: dict[str, Any] = facts()["repositories"]["nvidia-cuda"]["os"][os_key]
    return cuda


def cuda_path(os_key: str) -> str:
    return f"{CUDA_ROOT}/{_cuda(os_key)['directory']}"


def toolkit_path() -> str:
    return f"{TOOLKIT_ROOT}/{facts()['repositories']['nvidia-container-toolkit']['directory']}"


def docker_repository(os_key: str) -> Repository:
    docker = facts()["repositories"]["docker"]
    return Repository(docker["directory"], f"{docker['directory']}/{docker['key']['file']}",
                      f"Docker ({docker['os'][os_key]['suite']})",
                      suite=docker["os"][os_key]["suite"], component=docker["component"])


def kubernetes_path(minor: str = KUBERNETES_MINOR) -> str:
    directory: str = facts()["repositories"]["kubernetes"]["directory"]
    return directory.replace("{minor}", minor)


def repositories() -> tuple[Repository, ...]:
    toolkit_key = facts()["repositories"]["nvidia-container-toolkit"]["key"]["file"]
    k8s_key = facts()["repositories"]["kubernetes"]["key"]["file"]
    repos = [Repository(cuda_path(os_key), f"{cuda_path(os_key)}/{_cuda(os_key)['key']['file']}",
                        f"NVIDIA CUDA {_cuda(os_key)['directory']}") for os_key in LAB_OSES]
    repos += [
        Repository(toolkit_path(), f"{TOOLKIT_ROOT}/{toolkit_key}", "NVIDIA container toolkit"),
        Repository(kubernetes_path(), f"{kubernetes_path()}/{k8s_key}",
                   f"Kubernetes v{KUBERNETES_MINOR}"),
        Repository(EXTRAS, f"{EXTRAS}/keyring.asc", "site repository (nccl-tests, MLNX ibstat)"),
    ]
    repos += [docker_repository(os_key) for os_key in LAB_OSES]
    return tuple(repos)


def _render(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _relations(relations: list[dict[str, str]], name: str, version: str,
               branch: str = "") -> list[str]:
    """The facts' relations of one package, at one version."""
    return [_render(r["depends"], version=version, branch=branch) for r in relations
            if _render(r["package"], branch=branch) == name]


def _doc(name: str, what: str) -> File:
    return File(f"/usr/share/doc/{name}/README.gpuready-lab",
                f"Simulated package ({what}): no vendor software is included.\n")


def _cuda_packages(os_key: str) -> list[Package]:
    """NVIDIA's CUDA repository for one OS: driver releases, fabric manager, NCCL."""
    cuda = _cuda(os_key)
    if cuda["naming"] != "debian":
        raise ValueError(f"{os_key}: the lab serves only Debian-style CUDA repositories")
    repo = cuda_path(os_key)
    driver = cuda["driver"]
    source = {"Source": driver["source_package"]}
    fabric = cuda["fabricmanager"]
    pkgs: list[Package] = []
    for release in driver["releases"]:
        upstream = release["upstream"]
        branch = upstream.split(".")[0]
        version = _render(driver["package_version"], upstream=upstream)
        exact = f"(= {version})"
        names = set(driver["packages"])

        def rel(name: str, *own: str, _v: str = version, _b: str = branch) -> tuple[str, ...]:
            return (*_relations(driver.get("relations", []), name, _v, _b), *own)

        for name in sorted(names):
            files: tuple[File, ...] = (_doc(name, f"NVIDIA driver {upstream}"),)
            depends: tuple[str, ...] = rel(name)
            conflicts: tuple[str, ...] = ()
            postinst = None
            extra = source
            if name == "nvidia-smi":
                files = (_bin("/usr/bin/nvidia-smi", "nvidia-smi", "nvidia_smi.py", upstream),)
                depends = rel(name, f"nvidia-alternative {exact}")
            elif name in {"libnvidia-ml1", "libcuda1"}:
                depends = rel(name, f"nvidia-alternative {exact}")
            elif name == "nvidia-persistenced":
                # A source of its own in Debian; the lab versions it with the driver.
                extra = {}
                files = (_bin("/usr/bin/nvidia-persistenced", "nvidia-persistenced",
                              "daemons.py", upstream),
                         File("/lib/systemd/system/nvidia-persistenced.service",
                              PERSISTENCED_UNIT))
                postinst = RELOAD
            elif name == "nvidia-driver-cuda":
                # NVIDIA's compute-only meta package: the userland a GPU node runs.
                depends = rel(name, *(f"{n} {exact}" for n in
                                      ("nvidia-smi", "libcuda1", "nvidia-persistenced")
                                      if n in names))
            elif name in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
                flavour = "open" if "open" in name else "proprietary"
                other = ("nvidia-kernel-dkms" if flavour == "open"
                         else "nvidia-kernel-open-dkms")
                files = (File(f"/usr/src/nvidia-{upstream}/dkms.conf",
                              f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{upstream}"\n'
                              f"# gpuready lab simulator: {flavour} kernel modules, "
                              "not built\n"),)
                depends = rel(name, *(f"{n} {exact}" for n in
                                      ("firmware-nvidia-gsp", "nvidia-kernel-support")
                                      if n in names))
                # Both flavours build the same nvidia.ko: one at a time (lab relation).
                conflicts = (other,)
                postinst = DKMS_POSTINST.replace("{version}", upstream)
            pkgs.append(Package(repo, name, version,
                                f"NVIDIA driver package {name} ({upstream})", depends=depends,
                                conflicts=conflicts, files=files, postinst=postinst,
                                extra=extra))
        fm_name = (fabric["name_from_580"] if int(branch) >= 580
                   else _render(fabric["name_before_580"], branch=branch))
        pkgs.append(Package(
            repo, fm_name, _render(fabric["package_version"], upstream=upstream),
            "Fabric Manager for NVSwitch based systems",
            files=(_bin("/usr/bin/nv-fabricmanager", "nv-fabricmanager", "daemons.py", upstream),
                   File("/lib/systemd/system/nvidia-fabricmanager.service", FABRICMANAGER_UNIT),
                   File("/usr/share/nvidia/nvswitch/fabricmanager.cfg", FABRICMANAGER_CFG)),
            postinst=RELOAD))
    for series, dcgm in cuda.get("dcgm", {}).get("series", {}).items():
        pkgs += _dcgm_packages(repo, series, dcgm)
    for nccl in cuda["nccl"]["versions"]:
        pkgs.append(Package(repo, cuda["nccl"]["name"], nccl["version"],
                            "NVIDIA Collective Communication Library (NCCL) Runtime",
                            files=(File("/usr/share/doc/libnccl2/README.gpuready-lab",
                                        "Simulated NCCL: collective results come from the "
                                        "gpuready lab simulator.\n"),)))
    return pkgs


def _dcgm_packages(repo: str, series: str, dcgm: dict[str, Any]) -> list[Package]:
    """One DCGM series at every version the facts list: DCGM 3's one package, or DCGM 4's core
    (dcgmi, nv-hostengine and the unit) and one diagnostics package per CUDA major, with the
    relations the facts name (the CUDA package depends on the core at its exact version)."""
    pkgs: list[Package] = []
    relations = dcgm.get("relations", [])
    unit = File(f"/lib/systemd/system/{dcgm['service']['unit']}.service",
                DCGM_UNIT if series == "3" else DCGM4_UNIT)
    for release in dcgm["versions"]:
        upstream = release["upstream"]
        version = _render(dcgm["package_version"], upstream=upstream)
        # (name, the CUDA major it is for): a {cuda} name once per major the release lists.
        names = [(_render(n, cuda=c), c) for n in dcgm["packages"]
                 for c in (release.get("cuda", []) if "{cuda}" in n else [""])]
        for i, (name, cuda_major) in enumerate(names):
            depends = tuple(_render(r["depends"], version=version) for r in relations
                            if "depends" in r and _render(r["package"], cuda=cuda_major) == name)
            conflicts = tuple(r["conflicts"] for r in relations
                              if "conflicts" in r and r["package"] == name)
            tools = i == 0  # the first package carries the tools and the unit
            files = ((_bin("/usr/bin/dcgmi", "dcgmi", "dcgmi.py", upstream),
                      _bin("/usr/bin/nv-hostengine", "nv-hostengine", "daemons.py", upstream),
                      unit) if tools else (_doc(name, f"DCGM {upstream} diagnostics"),))
            pkgs.append(Package(
                repo, name, version, "NVIDIA Datacenter GPU Manager (DCGM)" + (
                    "" if tools else f" binaries for CUDA{cuda_major} systems"),
                section="non-free/utils", depends=depends, conflicts=conflicts, files=files,
                postinst=RELOAD if tools else None))
    return pkgs


def _toolkit_packages() -> list[Package]:
    toolkit = facts()["repositories"]["nvidia-container-toolkit"]
    repo = toolkit_path()
    pkgs: list[Package] = []
    for release in toolkit["releases"]:
        upstream = release["upstream"]
        version = _render(toolkit["package_version"], upstream=upstream)

        def rel(name: str, *own: str, _v: str = version) -> tuple[str, ...]:
            return (*_relations(toolkit["relations"], name, _v), *own)

        pkgs += [
            Package(repo, "libnvidia-container1", version, "NVIDIA container runtime library",
                    files=(_doc("libnvidia-container1", "no library is included"),)),
            Package(repo, "libnvidia-container-tools", version,
                    "NVIDIA container runtime library (command-line tools)",
                    depends=rel("libnvidia-container-tools", f"libnvidia-container1 (= {version})"),
                    files=(_doc("libnvidia-container-tools", "no nvidia-container-cli"),)),
            Package(repo, "nvidia-container-toolkit-base", version, "NVIDIA Container Toolkit Base",
                    depends=rel("nvidia-container-toolkit-base"),
                    files=(_bin("/usr/bin/nvidia-ctk", "nvidia-ctk", "nvidia_ctk.py", upstream),
                           _bin("/usr/bin/nvidia-container-runtime", "nvidia-container-runtime",
                                "nvidia_ctk.py", upstream))),
            Package(repo, "nvidia-container-toolkit", version, "NVIDIA Container toolkit",
                    depends=rel("nvidia-container-toolkit"),
                    files=(_bin("/usr/bin/nvidia-container-runtime-hook",
                                "nvidia-container-runtime-hook", "nvidia_ctk.py", upstream),)),
        ]
    return pkgs


@functools.cache
def _kubernetes_packages() -> tuple[Package, ...]:
    """pkgs.k8s.io's repository for the built release: kubelet, kubeadm, kubectl as krel's
    templates package them, and the companions the repository carries."""
    from lab.kube import build  # noqa: PLC0415 (the build is waited for only here)

    minor = facts()["repositories"]["kubernetes"]["minors"][KUBERNETES_MINOR]
    repo = kubernetes_path()
    companions = {c["name"]: c["version"] for c in minor["companions"]}
    releases = [r["upstream"] for r in minor["releases"]]
    pkgs: list[Package] = []
    # The repository of a minor carries each of its patch releases: the current one and the
    # previous one (the release lab nodes start on before a roll of the pin).
    for module_dir, bin_dir in ((build.PREVIOUS_DIR, build.ensure_previous_built()),
                                (build.MODULE_DIR, build.ensure_built())):
        built = build.read_go_mod(module_dir).kubernetes_version.lstrip("v")
        if built not in releases:
            raise ValueError(f"{module_dir}/go.mod builds Kubernetes {built}, which the facts "
                             f"do not list for v{KUBERNETES_MINOR} ({', '.join(releases)})")
        pkgs += _kubernetes_release(repo, minor, built, bin_dir)
    return (
        *pkgs,
        Package(repo, "cri-tools", companions["cri-tools"],
                "Command-line utility for interacting with a container runtime",
                files=(_doc("cri-tools", "crictl is not included"),)),
        Package(repo, "kubernetes-cni", companions["kubernetes-cni"],
                "Binaries required to provision kubernetes container networking",
                # The lab's relation: Debian's plugins, linked where this package puts its own.
                depends=("containernetworking-plugins",), section="net",
                built=(" Made by the gpuready lab: Debian's containernetworking-plugins linked\n"
                       " where the real package installs the CNI plugins (/opt/cni/bin).\n"),
                files=tuple(File(f"/opt/cni/bin/{plugin}", "", link=f"/usr/lib/cni/{plugin}")
                            for plugin in CNI_PLUGINS)))


def _kubernetes_release(repo: str, minor: dict[str, Any], built: str,
                        bin_dir: Path) -> list[Package]:
    """kubelet, kubeadm and kubectl of one release, from its built binaries."""
    relations = minor.get("relations", [])
    version = _render(minor["package_version"], upstream=built)

    def rel(name: str) -> tuple[str, ...]:
        return tuple(d for d in _relations(relations, name, version) if d)

    def binary(name: str) -> File:
        return File(f"/usr/bin/{name}", "", 0o755, source=str(bin_dir / name))

    # kubeadm.spec: the drop-in's /etc/sysconfig/kubelet becomes /etc/default/kubelet in a deb.
    dropin = (KUBE_PACKAGING / "10-kubeadm.conf").read_text().replace(
        "/etc/sysconfig/kubelet", "/etc/default/kubelet")
    common: dict[str, Any] = {"built": BUILT_NOTE, "compression": "none"}
    return [
        Package(repo, "kubelet", version, "Node agent for Kubernetes clusters",
                depends=rel("kubelet"), section="net",
                files=(binary("kubelet"),
                       File("/usr/lib/systemd/system/kubelet.service",
                            (KUBE_PACKAGING / "kubelet.service").read_text()),
                       File("/etc/default/kubelet", (KUBE_PACKAGING / "kubelet.env").read_text()),
                       File("/var/lib/kubelet/.kubelet-keep", ""),
                       File("/etc/kubernetes/manifests/.kubelet-keep", "")),
                conffiles=("/etc/default/kubelet",), postinst=RELOAD, **common),
        Package(repo, "kubeadm", version, "Command-line utility for administering a "
                "Kubernetes cluster", depends=rel("kubeadm"), section="admin",
                files=(binary("kubeadm"),
                       File("/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf", dropin)),
                postinst=RELOAD, **common),
        Package(repo, "kubectl", version, "Command-line utility for interacting with a "
                "Kubernetes cluster", depends=rel("kubectl"), section="admin",
                files=(binary("kubectl"),), **common),
    ]


def _site_packages() -> list[Package]:
    """A site's own repository: its nccl-tests build and MLNX_OFED's ibstat."""
    nccl_tools = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf")
    # -J (JSON output) exists from 2.17 on. A site builds nccl-tests with MPI=1 for multi-node
    # runs (it then needs Open MPI's library). The simulated binaries are an mpi4py program when
    # mpirun starts them, so the package needs Debian's python3-mpi4py, which brings Open MPI
    # (libopenmpi3, and openmpi-bin through mpi-default-bin) from Debian, for real.
    pkgs = [Package(
        EXTRAS, "nccl-tests", f"{upstream}-1", "NCCL performance tests (site build)",
        depends=("libnccl2", "python3-mpi4py"),
        files=tuple(_bin(f"/usr/bin/{tool}", tool, "all_reduce_perf.py", upstream)
                    for tool in nccl_tools)) for upstream in NCCL_TESTS]
    pkgs.append(Package(
        EXTRAS, "infiniband-diags", "2410mlnx54-1.2410068", "InfiniBand diagnostic programs "
        "(MLNX_OFED)",
        files=(_bin("/usr/sbin/ibstat", "ibstat", "ibstat.py", "2410mlnx54"),)))
    return pkgs


RUNTIME_NOTE = (
    " containerd and runc built from their sources by the gpuready lab (lab/runtime/build.py),\n"
    " packaged as Docker's containerd.io packages them; not signed or published by Docker.\n"
)
# What dh_systemd_enable and `dh_systemd_start --restart-after-upgrade` (with Docker's sed of
# try-restart to restart) put in containerd.io's maintainer scripts: enabled, and (re)started on
# every configure, an upgrade included; stopped only when removed.
CONTAINERD_POSTINST = """#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable containerd.service >/dev/null 2>&1 || true
  systemctl restart containerd.service
fi
"""
CONTAINERD_PRERM = """#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop containerd.service || true
fi
"""


@functools.cache
def _containerd_packages() -> tuple[Package, ...]:
    """Docker's containerd.io per OS (tests/fixtures/vendor-repos/facts.yml repositories.docker):
    containerd, its runc shim and ctr, and runc, built from source (lab/runtime/build.py); the
    upstream unit with the binary in /usr/bin and the config.toml Docker ships, as its
    packaging installs them."""
    from lab.runtime import build  # noqa: PLC0415 (the build is waited for only here)

    docker = facts()["repositories"]["docker"]
    package = docker["packages"]["containerd.io"]
    relations = {r["field"]: tuple(x.strip() for x in r["value"].split(","))
                 for r in package["relations"]}
    *containerd_bins, runc_bin = build.ensure_built()
    config = (FACTS_FILE.parent / "excerpts" /
              "docker-containerd-packaging-common-containerd.toml").read_text()
    pkgs = []
    for release, containerd_bin in zip(build.RELEASES, containerd_bins, strict=True):
        unit = build.module_file(release, "containerd.service").replace(
            "/usr/local/bin/containerd", "/usr/bin/containerd")
        files = (*(File(f"/usr/bin/{b.name}", "", 0o755, source=str(containerd_bin / b.name))
                   for b in build.CONTAINERD_BINARIES),
                 File("/usr/bin/runc", "", 0o755, source=str(runc_bin / "runc")),
                 File("/lib/systemd/system/containerd.service", unit),
                 File("/etc/containerd/config.toml", config))
        upstream = release.release().removeprefix("v")
        pkgs += [
            Package(docker_repository(os_key).id, "containerd.io",
                    _render(docker["os"][os_key]["version"], upstream=upstream),
                    "An open and reliable container runtime", section="devel",
                    # dpkg-shlibdeps's answer for runc (libseccomp) and the binaries (libc), by
                    # hand.
                    depends=("libc6 (>= 2.34)", "libseccomp2 (>= 2.5.0)"),
                    conflicts=relations["Conflicts"], provides=relations["Provides"],
                    files=files, conffiles=("/etc/containerd/config.toml",),
                    postinst=CONTAINERD_POSTINST, prerm=CONTAINERD_PRERM, built=RUNTIME_NOTE,
                    # Uncompressed, as the kubelet's packages here: xz of 100 MB of binaries
                    # took about 90 s per package on the 2-core CI machine (four per repository
                    # build), and the lab's packages never cross a network.
                    compression="none")
            for os_key in LAB_OSES]
    return tuple(pkgs)


def all_packages() -> list[Package]:
    pkgs: list[Package] = []
    for os_key in LAB_OSES:
        pkgs += _cuda_packages(os_key)
    return (pkgs + _toolkit_packages() + list(_kubernetes_packages()) + _site_packages()
            + list(_containerd_packages()))
