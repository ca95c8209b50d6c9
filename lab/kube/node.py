"""What a lab host lacks, as a systemd-nspawn container on this machine, for a real kubelet.

None of this is the roles' business (a real node has it all): the lab puts one unit,
``gpuready-lab-kubelet-host.service``, in the hosts of a fleet with ``kubernetes: real``. It runs
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
"""

from __future__ import annotations

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


def provision(root: Path) -> None:
    """Install the unit in a host's (not yet booted) overlay."""
    script_path = root / SCRIPT.lstrip("/")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script())
    script_path.chmod(0o755)
    units = root / "etc/systemd/system"
    (units / UNIT_NAME).write_text(UNIT)
    wants = units / "sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / UNIT_NAME
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{UNIT_NAME}")
