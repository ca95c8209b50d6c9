"""What the inventory declares for one GPU node, read once into typed records.

The validators read a node's declared state here and nowhere else: the pins (driver, kernel,
DCGM, containerd, container toolkit, Kubernetes packages), the services that must run, storage
paths and sizes, the Xid window, the gate's settings (the cluster, the label prefix, how old a
run may be and still admit a node, the failed taint's effect), the fabric's NCCL and MPI
settings, drift's role inputs and margins, the cost inputs and the profile overrides.
:func:`read` turns the templated inventory variables of one host into a :class:`DesiredState`,
checking each value's type; it returns every problem rather than the first, so that the loader
(``validate.inventory.load``) can name each bad variable with the group or host it was set on
and refuse the inventory before any connection is made.

What a value means beyond its type is judged where it is used: the profile (``gpu_profile``,
``gpu_thresholds``) by ``validate.profiles`` (the loader loads each pool's profile up front as
well), the cost inputs by ``validate.cost``, reserved MPI parameters by ``validate.fabric``.

Output: :class:`DesiredState`; problems as :class:`Problem` (variable, what is wrong).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean

# The prefix rule has one home, beside what the gate sets under it (the gate's --prefix too).
from validate.labels import check_prefix
from validate.mig import LayoutError, MigLayout, read_layout

# Every variable the validators read (besides the connection settings, which
# validate.transport.route reads): the loader templates exactly these.
PROFILE = "gpu_profile"
POOL = "gpu_pool"
THRESHOLDS = "gpu_thresholds"
ENVIRONMENT = "gpuready_environment"
DRIVER_PIN = "nvidia_driver_version"
# The DCGM release the nvidia_dcgm role installs: set, a node without dcgmi is an error.
DCGM_PIN = "nvidia_dcgm_version"
KERNEL_PIN = "gpuready_kernel_release"
# The package pins of the containerd, nvidia_container_toolkit and kubelet roles (unset: the
# role's default; validate/drift/pins.py resolves them as the roles do).
CONTAINERD_PIN = "containerd_version"
# Where the containerd role takes containerd from: vendor (Docker's containerd.io) or distribution.
CONTAINERD_SOURCE = "containerd_source"
CONTAINERD_SOURCES = ("vendor", "distribution")
TOOLKIT_PIN = "nvidia_container_toolkit_version"
TOOLKIT_PACKAGES = "nvidia_container_toolkit_packages"
KUBELET_PIN = "kubelet_version"
KUBELET_PACKAGES = "kubelet_packages"
SERVICES = "gpuready_services"
SCRATCH_PATH = "gpuready_scratch_path"
DRIVE_CLASS = "gpuready_drive_class"
CHECKPOINT_PATH = "gpuready_checkpoint_path"
FIO_SIZE = "gpuready_fio_size_mib"
CHECKPOINT_SIZE = "gpuready_checkpoint_size_mib"
XID_WINDOW = "gpuready_xid_window"
KUBECONFIG = "gpuready_kubeconfig"
LABEL_PREFIX = "gpuready_label_prefix"
GATE_MAX_RUN_AGE = "gpuready_gate_max_run_age"
GATE_TAINT_EFFECT = "gpuready_gate_taint_effect"
NODE_NAME = "node_join_node_name"
PERSISTENCED = "nvidia_driver_persistenced_enabled"
PEERMEM_FABRICS = "nvidia_driver_peermem_fabrics"
KERNEL_MODULES = "gpu_kernel_prereqs_modules"
RUNTIME_NAME = "nvidia_container_toolkit_runtime_name"
DRIFT_MARGINS = "gpuready_drift_margins"
IB_HCA = "gpuready_fabric_nccl_ib_hca"
IB_GID_INDEX = "gpuready_fabric_nccl_ib_gid_index"
SOCKET_IFNAME = "gpuready_fabric_nccl_socket_ifname"
NCCL_ENV = "gpuready_fabric_nccl_env"
MPI_MCA = "gpuready_fabric_mpi_mca"
COST = "gpuready_cost"
MIG_LAYOUT = "gpu_mig_layout"
SYSFS_ROOT = "gpuready_sysfs_root"
# Where the node's dcgm-exporter serves (dcgm.exporter; the check reads them from Node.vars).
DCGM_EXPORTER_PORT = "dcgm_exporter_port"
DCGM_EXPORTER_URL = "dcgm_exporter_url"

# The inventory variables load_profile() reads besides the profile name.
PROFILE_VARS = (THRESHOLDS, DRIVE_CLASS, SCRATCH_PATH, CHECKPOINT_PATH)

_NO_SPACE = re.compile(r"^\S+$")
# A profile name: the stem of validate/profiles/<name>.yml.
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A Node's name: an RFC 1123 subdomain, as the API server validates it.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_NODE_NAME = 253

# The largest size a storage check may be asked to write, in MiB (1 PiB). A larger figure is a
# typo (an exponent, a unit mix-up), and past 2**63 KiB the node's shell cannot even compare
# it with the free space (dash: "Illegal number"). validate.profiles bounds the profiles' sizes
# with the same figure.
MAX_SIZE_MIB = 2**30


@dataclass(frozen=True, slots=True)
class Problem:
    """One declared value that cannot be used: the variable and what is wrong with it."""

    var: str
    reason: str


class _Bad(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Pins:
    """Exact versions the node must run. None: not set in the inventory, which for the driver,
    the kernel and DCGM means not pinned, and for the others the role's default (resolved by
    validate/drift/pins.py); ``containerd_version`` ``""`` pins nothing, as in the role."""

    driver_version: str | None = None
    kernel_release: str | None = None
    dcgm_version: str | None = None
    containerd_version: str | None = None
    toolkit_version: str | None = None
    toolkit_packages: tuple[str, ...] | None = None
    kubelet_version: str | None = None
    kubelet_packages: tuple[str, ...] | None = None
    containerd_source: str | None = None


@dataclass(frozen=True, slots=True)
class Storage:
    """Where and how much the storage checks write (None: the profile's value, or default)."""

    drive_class: str | None = None
    scratch_path: str | None = None
    checkpoint_path: str | None = None
    fio_size_mib: int | None = None
    checkpoint_size_mib: int | None = None


# The gate's defaults: evidence older than a day does not admit a node, and a failed node's
# taint keeps new pods off without evicting running ones.
DEFAULT_MAX_RUN_AGE_S = 24 * 3600.0
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
DEFAULT_TAINT_EFFECT = "NoSchedule"


@dataclass(frozen=True, slots=True)
class GateSettings:
    """Where the cluster is, the site's label prefix, the node's Kubernetes name, how old a
    run may be and still admit the node (seconds), and the effect of its ``failed`` taint."""

    kubeconfig: str | None = None
    label_prefix: str | None = None
    node_name: str | None = None
    max_run_age_s: float = DEFAULT_MAX_RUN_AGE_S
    taint_effect: str = DEFAULT_TAINT_EFFECT


@dataclass(frozen=True, slots=True)
class FabricSettings:
    """How the pool's NCCL pair test runs (names and values checked for shape here; reserved
    names by validate.fabric)."""

    ib_hca: str | None = None
    ib_gid_index: int | None = None
    socket_ifname: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    mpi_mca: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DriftInputs:
    """The bootstrap roles' inputs drift compares the live node against (None: the role's
    default), and per-figure margins."""

    persistenced_enabled: bool | None = None
    peermem_fabrics: tuple[str, ...] | None = None
    kernel_modules: tuple[str, ...] | None = None
    runtime_name: str | None = None
    margins: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DesiredState:
    """One node's declared state (see the module docstring)."""

    environment: str | None = None
    pins: Pins = field(default_factory=Pins)
    services: tuple[str, ...] | None = None
    storage: Storage = field(default_factory=Storage)
    xid_window: str | None = None
    gate: GateSettings = field(default_factory=GateSettings)
    fabric: FabricSettings = field(default_factory=FabricSettings)
    drift: DriftInputs = field(default_factory=DriftInputs)
    # Shape checked here (a mapping); its content by validate.cost, per pool.
    cost: Mapping[str, Any] | None = None
    # The MIG devices a MIG pool declares (validate.mig); None: not a MIG pool.
    mig: MigLayout | None = None
    # Where the node's sysfs is, as the validators' commands see it (None: /sys).
    sysfs_root: str | None = None
    # What the profile is judged with: gpu_thresholds and the storage variables, as declared.
    profile_overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def thresholds(self) -> Mapping[str, Any] | None:
        value = self.profile_overrides.get(THRESHOLDS)
        return value if isinstance(value, Mapping) else None


# -- value readers: each returns the typed value or raises _Bad with what is wrong ----------


def _line(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _Bad(f"is {value!r}, not a string")
    text = str(value)
    if not text.strip() or "\n" in text:
        raise _Bad(f"is {value!r}, not one non-empty line")
    return text


def _version(value: Any) -> str:
    if isinstance(value, float):
        raise _Bad(f"is the YAML number {value!r}, which lost its exact spelling: quote the "
                   "version (\"550.90.07\")")
    return _line(value)


def _version_or_empty(value: Any) -> str:
    """A version, or ``""`` where the role reads empty as "not pinned"."""
    return "" if value == "" else _version(value)


def _word(value: Any) -> str:
    text = _line(value)
    if not _NO_SPACE.match(text):
        raise _Bad(f"is {value!r}, not a single word without blanks")
    return text


def _path(value: Any) -> str:
    text = _line(value)
    if not text.startswith("/"):
        raise _Bad(f"is {value!r}, not an absolute path")
    return text


def _profile_name(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"is {_kind(value)} ({value!r}), not a profile name (a string naming "
                   "validate/profiles/<name>.yml)")
    if not _PROFILE_NAME.match(value):
        raise _Bad(f"is {value!r}, not a profile name (letters, digits, '.', '_', '-')")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Bad(f"is {value!r}, not a positive integer")
    return value


def _size_mib(value: Any) -> int:
    size = _positive_int(value)
    if size > MAX_SIZE_MIB:
        raise _Bad(f"is {size!r} MiB, more than the {MAX_SIZE_MIB} MiB (1 PiB) a storage check "
                   "may write")
    return size


def _tcp_port(value: Any) -> int:
    text = str(value)
    if isinstance(value, bool) or not isinstance(value, int | str) or not text.isdigit() \
            or not 1 <= int(text) <= 65535:
        raise _Bad(f"is {value!r}, not a TCP port (1 to 65535)")
    return int(text)


def _http_url(value: Any) -> str:
    text = _line(value)
    if not re.match(r"^https?://[^/\s]+", text):
        raise _Bad(f"is {value!r}, not an http:// or https:// URL")
    return text


def _gid_index(value: Any) -> int:
    # An RDMA port's GID table has at most 256 entries (ibv_query_port's gid_tbl_len).
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise _Bad(f"is {value!r}, not a non-negative integer up to 255 (a GID index)")
    return value


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhd])+$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration_s(value: Any) -> float:
    """``24h``, ``90m``, ``1d12h``, ``3600s``: a positive duration with units (a bare number
    is refused: hours or seconds would be a guess)."""
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or not _DURATION.match(text):
        raise _Bad(f"is {value!r}, not a duration with units such as 24h, 90m, 1d or 3600s")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    if seconds <= 0:
        raise _Bad(f"is {value!r}: the duration must be longer than 0")
    return seconds


def _taint_effect(value: Any) -> str:
    if value not in TAINT_EFFECTS:
        raise _Bad(f"is {value!r}, not one of {', '.join(TAINT_EFFECTS)} (NoExecute also "
                   "evicts the pods running on a node that fails)")
    return str(value)


NODE_NAME_RULE = ("a Kubernetes Node name (an RFC 1123 subdomain: lowercase letters, digits, "
                  "'-' and '.', each part starting and ending with a letter or digit, at most "
                  f"{MAX_NODE_NAME} characters)")


def is_node_name(name: str) -> bool:
    """Whether ``name`` can be a Kubernetes Node's name. The gate, drift and the upgrade put it
    in the API's paths (``/api/v1/nodes/<name>``), the join in kubeadm's configuration:
    ``../nodes/x`` or ``GPU_01`` is no Node, and must not be sent as one."""
    return len(name) <= MAX_NODE_NAME and bool(_SUBDOMAIN.match(name))


def _node_name(value: Any) -> str:
    text = _line(value)
    if not is_node_name(text):
        raise _Bad(f"is {text!r}, not {NODE_NAME_RULE}")
    return text


def _label_prefix(value: Any) -> str:
    text = _word(value)
    try:
        return check_prefix(text)
    except ValueError as exc:
        raise _Bad(str(exc).replace(f"label prefix {text!r} ", f"is {text!r}: it ", 1)) from None


def _bool(value: Any) -> bool:
    try:
        return bool(boolean(value, strict=True))
    except TypeError:
        raise _Bad(f"is {value!r}, not a boolean (Ansible reads yes/no, true/false, on/off, "
                   "1/0)") from None


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # a single name, as the roles accept it
        return (_word(value),)
    if not isinstance(value, list | tuple):
        raise _Bad(f"is {value!r}, not a list of names")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, str | int)
           or not _NO_SPACE.match(str(v))]
    if bad:
        raise _Bad(f"has entries that are not names: {bad!r}")
    return tuple(str(v) for v in value)


def _kind(value: Any) -> str:
    """What YAML gave, in its words (Ansible wraps values in types of its own)."""
    for kind, name in ((bool, "a boolean"), (str, "a string"), (int, "an integer"),
                       (float, "a number"), (Mapping, "a mapping"), (list, "a list")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(f"is {_kind(value)} ({value!r}), not a mapping")
    return value


def _scalars(value: Any) -> Mapping[str, str]:
    """A mapping of names to one-line scalars (an environment, MCA parameters)."""
    raw = _mapping(value)
    out: dict[str, str] = {}
    for key, item in raw.items():
        if not isinstance(key, str) or not key:
            raise _Bad(f"has the key {key!r}, not a name")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _Bad(f"{key} is {item!r}, not a string or number")
        text = str(item)
        if not text or "\n" in text:
            raise _Bad(f"{key} is {item!r}, not one non-empty line")
        out[key] = text
    return out


def _margins(value: Any) -> Mapping[str, float]:
    raw = _mapping(value)
    out: dict[str, float] = {}
    for key, item in raw.items():
        if isinstance(item, bool) or not isinstance(item, int | float) or not 0 <= item < 1:
            raise _Bad(f"{key} is {item!r}, not a fraction between 0 and 1")
        out[str(key)] = float(item)
    return out


def _choice(value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _Bad(f"is {value!r}, not one of {', '.join(choices)}")
    return value


_READERS: dict[str, Callable[[Any], Any]] = {
    PROFILE: _profile_name,
    POOL: _mapping,
    THRESHOLDS: _mapping,
    ENVIRONMENT: _line,
    DRIVER_PIN: _version,
    DCGM_PIN: _version,
    KERNEL_PIN: _word,
    CONTAINERD_PIN: _version_or_empty,
    CONTAINERD_SOURCE: lambda value: _choice(value, CONTAINERD_SOURCES),
    TOOLKIT_PIN: _version,
    TOOLKIT_PACKAGES: _words,
    KUBELET_PIN: _version,
    KUBELET_PACKAGES: _words,
    SERVICES: _words,
    SCRATCH_PATH: _path,
    DRIVE_CLASS: _word,
    CHECKPOINT_PATH: _path,
    FIO_SIZE: _size_mib,
    CHECKPOINT_SIZE: _size_mib,
    XID_WINDOW: _line,
    KUBECONFIG: _line,  # a path as the kubernetes client takes it (relative, ~)
    LABEL_PREFIX: _label_prefix,
    GATE_MAX_RUN_AGE: _duration_s,
    GATE_TAINT_EFFECT: _taint_effect,
    NODE_NAME: _node_name,
    PERSISTENCED: _bool,
    PEERMEM_FABRICS: _words,
    KERNEL_MODULES: _words,
    RUNTIME_NAME: _word,
    DRIFT_MARGINS: _margins,
    IB_HCA: _word,
    IB_GID_INDEX: _gid_index,
    SOCKET_IFNAME: _word,
    NCCL_ENV: _scalars,
    MPI_MCA: _scalars,
    COST: _mapping,
    MIG_LAYOUT: lambda value: value,  # with gpu_pool, by validate.mig (read() below)
    SYSFS_ROOT: _path,
    DCGM_EXPORTER_PORT: _tcp_port,
    DCGM_EXPORTER_URL: _http_url,
}

# The variables this module reads, in a stable order (the loader templates these).
VARS: tuple[str, ...] = tuple(_READERS)


def read(values: Mapping[str, Any]) -> tuple[DesiredState, tuple[Problem, ...]]:
    """The declared state from one host's templated variables, and every value that cannot be
    used (a bad value reads as unset in the state; the caller refuses the inventory)."""
    got: dict[str, Any] = {}
    problems: list[Problem] = []
    for var, reader in _READERS.items():
        value = values.get(var)
        if value is None:  # unset, or set to null: the role's or profile's default applies
            continue
        try:
            got[var] = reader(value)
        except _Bad as exc:
            problems.append(Problem(var, exc.reason))
    mig: MigLayout | None = None
    if POOL in got or MIG_LAYOUT in got:
        try:
            mig = read_layout(got.get(MIG_LAYOUT), got.get(POOL) or {})
        except LayoutError as exc:
            problems.append(Problem(POOL if exc.in_pool else MIG_LAYOUT, str(exc)))
    state = DesiredState(
        environment=got.get(ENVIRONMENT),
        pins=Pins(got.get(DRIVER_PIN), got.get(KERNEL_PIN), got.get(DCGM_PIN),
                  got.get(CONTAINERD_PIN), got.get(TOOLKIT_PIN), got.get(TOOLKIT_PACKAGES),
                  got.get(KUBELET_PIN), got.get(KUBELET_PACKAGES), got.get(CONTAINERD_SOURCE)),
        services=got.get(SERVICES) or None,
        storage=Storage(got.get(DRIVE_CLASS), got.get(SCRATCH_PATH), got.get(CHECKPOINT_PATH),
                        got.get(FIO_SIZE), got.get(CHECKPOINT_SIZE)),
        xid_window=got.get(XID_WINDOW),
        gate=GateSettings(got.get(KUBECONFIG), got.get(LABEL_PREFIX), got.get(NODE_NAME),
                          got.get(GATE_MAX_RUN_AGE, DEFAULT_MAX_RUN_AGE_S),
                          got.get(GATE_TAINT_EFFECT, DEFAULT_TAINT_EFFECT)),
        fabric=FabricSettings(got.get(IB_HCA), got.get(IB_GID_INDEX), got.get(SOCKET_IFNAME),
                              got.get(NCCL_ENV, {}), got.get(MPI_MCA, {})),
        drift=DriftInputs(got.get(PERSISTENCED), got.get(PEERMEM_FABRICS),
                          got.get(KERNEL_MODULES), got.get(RUNTIME_NAME),
                          got.get(DRIFT_MARGINS, {})),
        cost=got.get(COST),
        mig=mig,
        sysfs_root=got.get(SYSFS_ROOT),
        profile_overrides={v: got[v] for v in PROFILE_VARS if v in got},
    )
    return state, tuple(problems)
