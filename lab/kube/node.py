"""What a lab host lacks, as a systemd-nspawn container on this machine, for a real kubelet.

None of this is the roles' business (a real node has it all): the lab puts one unit,
``gpuready-lab-kubelet-host.service``, in the hosts of a fleet with a control plane. It runs
at every boot, before containerd and the kubelet, and gives the host:

- writable cgroup v1 controllers. This machine's kernel has v1 controllers and an empty cgroup2
  hierarchy; nspawn mounts the controllers read-only, and the kubelet's container manager then
  stops with ``Failed to start ContainerManager" err="mkdir
  /sys/fs/cgroup/cpuset/kubepods.slice: read-only file system``. lab.supervisor puts each host
  in its own cgroup of every controller and nspawn mounts them from there (a cgroup
  namespace), so a remount read-write exposes only the host's own subtree: its kubelet's
  ``kubepods.slice`` lands under ``/sys/fs/cgroup/<controller>/gpuready-lab/<host>/``.
- ``/dev/kmsg``, which nspawn does not provide and without which the kubelet exits (``failed to
  create kubelet: open /dev/kmsg: no such file or directory``). It is /dev/null here: the
  machine's kernel log is not the host's to read (the kubelet's OOM watcher then says "Stopped
  receiving OOM notifications").
- the kernel tunables the kubelet insists on (pkg/kubelet/cm/container_manager_linux.go
  ``setupKernelTunables``: vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1).
  They belong to the machine's kernel, which the lab must not change, and /proc/sys is
  read-only in a host (``Failed to start ContainerManager" err="[open
  /proc/sys/kernel/panic_on_oops: read-only file system, ...]``), so the host is shown a file
  with the value a node would have over each: SIMULATED, and only what the kubelet reads.

What a Pod's containers need, so that Pods on a lab node (bound by ``spec.nodeName`` or by the
real kube-scheduler of the lab's control plane) really run under the kubelet and containerd the
roles install:

- containerd's state (``/var/lib/containerd``) bound from ``<host dir>/containerd`` on this
  machine's own filesystem (``nspawn_args``): the host's root is an overlay, which the kernel
  refuses as the upper layer of containerd's overlayfs snapshots ("overlay: filesystem on
  /var/lib/containerd/.../work not supported as upperdir"). It goes with the host's directory.
- runc's keyring calls (add_key, keyctl, request_key) allowed through nspawn's seccomp filter:
  runc gives each container a session keyring ("unable to join session keyring: unable to
  create session key: operation not permitted").
- a runc wrapper first on containerd's PATH (``lab/kube/runc_wrapper.py``, a containerd.service
  drop-in) that raises an OOM score adjustment below the host's own (the kubelet asks -998 for
  every sandbox) to it: lowering one needs CAP_SYS_RESOURCE, which neither nspawn gives a host
  nor this machine has ("nsexec: failed to update /proc/self/oom_score_adj: Permission
  denied"). Everything else is the runc containerd.io carries (lab/runtime: built from its
  source), unchanged.
- an image: no registry can be reached, so lab/kube/images.py builds one on this machine from
  Debian's busybox-static and a unit imports it into containerd whenever containerd starts, as
  ``gpuready.lab/sleep:1`` and as containerd's sandbox image. A real image, built locally; no
  registry image is used.

Pods must use ``hostNetwork: true``. A Pod network namespace needs CAP_NET_ADMIN on this
machine's network namespace, which the hosts share and which the lab does not give them (it
would let a host change the machine's network): the CNI bridge's loopback plugin fails
("plugin type="loopback" failed (add): operation not permitted"), the sandbox is never made,
and the Pod cannot even be torn down cleanly (its deletion must be forced).

Two more things a cluster's add-ons would give a node, which the lab puts in the host itself:

- a CNI configuration (``/etc/cni/net.d/10-gpuready-lab.conflist``), standing in for the
  cluster's network add-on: a bridge with host-local addresses from Debian's
  containernetworking-plugins (which the lab's kubernetes-cni package links into /opt/cni/bin).
  Without one containerd reports ``NetworkReady=false`` and the Node never turns Ready. Each
  host gets its own pod subnet; no Pod can use it (see above), so no traffic crosses it.
- a SIMULATED GPU Feature Discovery (``gpuready-lab-gfd.service``, lab/sim/daemons.py): once the
  host has joined, it puts GFD's labels (from the host's simulated hardware) on its Node with the
  kubelet's credentials, as the GPU Operator's GFD pod would with its own.
- a SIMULATED NVIDIA device plugin (``gpuready-lab-device-plugin.service``,
  lab/sim/device_plugin.py): it registers with the real kubelet over the kubelet's device plugin
  gRPC API (Debian's python3-grpcio, in the lab rootfs) and lists one device per simulated GPU,
  Unhealthy after an Xid fault, so the kubelet's own device manager puts ``nvidia.com/gpu`` into
  the Node's capacity and allocatable; it registers again whenever the kubelet restarts.
"""

from __future__ import annotations

import json
from pathlib import Path

UNIT_NAME = "gpuready-lab-kubelet-host.service"
SCRIPT = "/usr/local/lib/gpuready-lab/kubelet-host.sh"

# The kubelet's own expectations (setupKernelTunables); kernel.keys.root_maxkeys/maxbytes are
# expected too but this kernel's defaults already match.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
}

CNI_CONFIG = "/etc/cni/net.d/10-gpuready-lab.conflist"
GFD_UNIT_NAME = "gpuready-lab-gfd.service"
GFD_UNIT = """\
[Unit]
Description=GPU Feature Discovery (SIMULATED by the gpuready lab, from the simulated hardware)
After=kubelet.service

[Service]
Environment=GPUREADY_SIM_TOOL=gpu-feature-discovery
ExecStart=/usr/bin/python3 /opt/gpuready-lab/sim/daemons.py
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

DEVICE_PLUGIN_UNIT_NAME = "gpuready-lab-device-plugin.service"
DEVICE_PLUGIN_UNIT = """\
[Unit]
Description=NVIDIA device plugin (SIMULATED by the gpuready lab, from the simulated hardware)
After=kubelet.service

[Service]
ExecStart=/usr/bin/python3 /opt/gpuready-lab/sim/device_plugin.py
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

UNIT = f"""\
[Unit]
Description=gpuready lab: what a kubelet needs of this nspawn host (cgroups, /dev/kmsg, sysctls)
DefaultDependencies=no
After=local-fs.target
Before=containerd.service kubelet.service sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh {SCRIPT}

[Install]
WantedBy=sysinit.target
"""


def script() -> str:
    sysctls = " ".join(f"{key}={value}" for key, value in KUBELET_SYSCTLS.items())
    return f"""\
#!/bin/sh
# gpuready lab (lab/kube/node.py): not part of any role. See there for why each step.
set -eu
for controller in /sys/fs/cgroup/*; do
    # cgroup v1 hierarchies ("cgroupfs"), each rooted at this host's own cgroup.
    if [ "$(stat -f -c %T "$controller")" = cgroupfs ]; then
        mount -o remount,bind,rw "$controller"
    fi
done
[ -e /dev/kmsg ] || ln -s /dev/null /dev/kmsg
shown=/run/gpuready-lab/sysctl
mkdir -p "$shown"
for setting in {sysctls}; do
    key=${{setting%%=*}}
    file="$shown/$(echo "$key" | tr / .)"
    echo "${{setting#*=}}" > "$file"
    mount --bind -o ro "$file" "/proc/sys/$key"
done
"""


def cni_config(address: str) -> str:
    """The lab's network add-on for one host: a bridge, its own /24 of the pod network."""
    subnet = f"10.244.{int(address.rsplit('.', 1)[1])}.0/24"
    return json.dumps({
        "cniVersion": "1.0.0", "name": "gpuready-lab",
        "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}],
    }, indent=2) + "\n"


def _enable(units: Path, name: str, target: str) -> None:
    wants = units / f"{target}.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / name
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{name}")


CONTAINERD_STATE = "/var/lib/containerd"
# runc gives each container a new session keyring (add_key, keyctl); nspawn's seccomp filter
# refuses those calls to a host ("unable to join session keyring: unable to create session key:
# operation not permitted"), so a kubelet host's filter allows them.
KEYRING_SYSCALLS = ("add_key", "keyctl", "request_key")
RUNC_DIR = "/usr/local/lib/gpuready-lab/runc"
CONTAINERD_DROP_IN = "/etc/systemd/system/containerd.service.d/50-gpuready-lab-runc.conf"
CONTAINERD_DROP_IN_TEXT = f"""\
# gpuready lab (lab/kube/node.py): containerd's shims run the lab's runc wrapper
# (lab/kube/runc_wrapper.py), which runs Debian's runc with no OOM score below the host's own.
[Service]
Environment=PATH={RUNC_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""


def nspawn_args(host_dir: Path) -> list[str]:
    """What a kubelet host's containers need of systemd-nspawn.

    - containerd's state on this machine's own filesystem, where its overlayfs snapshotter can
      mount (the host's root is an overlay, which the kernel refuses as an upper layer:
      "overlay: filesystem on /var/lib/containerd/.../work not supported as upperdir");
    - runc's keyring calls (KEYRING_SYSCALLS).
    """
    state = host_dir / "containerd"
    state.mkdir(parents=True, exist_ok=True)
    return [f"--bind={state}:{CONTAINERD_STATE}",
            f"--system-call-filter={' '.join(KEYRING_SYSCALLS)}"]


def provision(root: Path, address: str) -> None:
    """Install the units and the CNI configuration in a host's (not yet booted) overlay."""
    script_path = root / SCRIPT.lstrip("/")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script())
    script_path.chmod(0o755)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / UNIT_NAME).write_text(UNIT)
    _enable(units, UNIT_NAME, "sysinit.target")
    (units / GFD_UNIT_NAME).write_text(GFD_UNIT)
    _enable(units, GFD_UNIT_NAME, "multi-user.target")
    (units / DEVICE_PLUGIN_UNIT_NAME).write_text(DEVICE_PLUGIN_UNIT)
    _enable(units, DEVICE_PLUGIN_UNIT_NAME, "multi-user.target")
    wrapper = root / RUNC_DIR.lstrip("/") / "runc"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_bytes((Path(__file__).parent / "runc_wrapper.py").read_bytes())
    wrapper.chmod(0o755)
    drop_in = root / CONTAINERD_DROP_IN.lstrip("/")
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(CONTAINERD_DROP_IN_TEXT)
    cni = root / CNI_CONFIG.lstrip("/")
    cni.parent.mkdir(parents=True, exist_ok=True)
    cni.write_text(cni_config(address))
