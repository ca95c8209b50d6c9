"""What an operator does about each fault code the checks emit, and where that advice comes from.

The report page shows, for every fault code on a node, what it means, what to do, and the
source the advice rests on: NVIDIA's Xid catalog (via :mod:`validate.xid_catalog`), NVIDIA's GPU
memory error management and dynamic page retirement notes, NVIDIA's GPU debug guidelines, the
NVML clock event reasons, the fabric manager guide, nccl-tests' and NCCL's own docs, fio's and
systemd's manuals, and, for the suite's own codes (transport, profile, inventory), this suite's
documented behaviour.

Schema: ``ACTIONS: dict[code, Action(meaning, action, source, hardware_fault)]`` for fixed
codes, plus two families resolved by :func:`action_for`: ``gpu.xid.<n>`` (the Xid catalog) and
``gpu.throttle.<reason>`` (NVML clock event reasons). ``action_for`` returns ``None`` for a
code nobody catalogued; the report then says so instead of guessing.

``hardware_fault`` marks the faults a clean run does not clear: the GPU or board needs a person
(reseat, replace, RMA) even when the next run passes, as after Xid 79 (fallen off the bus) or a
failed row remap. The gate quarantines a node with such a code until an operator releases it
(:func:`is_hardware_fault`, validate/gate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from validate import xid_catalog


@dataclass(frozen=True, slots=True)
class Source:
    """Where the advice comes from: a title, and a public URL when there is one."""

    title: str
    url: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """What a fault code means, what the operator does about it, and the advice's source."""

    meaning: str
    action: str
    source: Source
    hardware_fault: bool = False


XID_CATALOG = Source("NVIDIA: Analyzing Xid Errors with the Xid Catalog", xid_catalog.CATALOG_URL)
MEMORY_ERRORS = Source(
    "NVIDIA GPU Memory Error Management (row remapping, recovery flags, RMA policy)",
    "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html",
)
PAGE_RETIREMENT = Source(
    "NVIDIA Dynamic Page Retirement",
    "https://docs.nvidia.com/deploy/dynamic-page-retirement/index.html",
)
DEBUG_GUIDE = Source(
    "NVIDIA GPU Debug Guidelines", "https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html"
)
PERSISTENCE = Source(
    "NVIDIA Driver Persistence", "https://docs.nvidia.com/deploy/driver-persistence/index.html"
)
CLOCK_REASONS = Source(
    "NVML API: clocks event reasons",
    "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html",
)
FABRIC_MANAGER = Source(
    "NVIDIA Fabric Manager User Guide",
    "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html",
)
NCCL_TESTS_PERF = Source(
    "nccl-tests: Performance reported by NCCL tests (doc/PERFORMANCE.md)",
    "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md",
)
NCCL_TROUBLESHOOTING = Source(
    "NCCL User Guide: Troubleshooting",
    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html",
)
NCCL_NETWORK = Source(
    "NCCL User Guide: Networking Troubleshooting (NIC-level diagnostics, ibstat)",
    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/"
    "networking_troubleshooting.html",
)
DCGM_DIAG = Source(
    "NVIDIA DCGM Diagnostics",
    "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html",
)
DCGM_EXPORTER = Source(
    "NVIDIA DCGM-Exporter (GPU telemetry: deployment, port 9400, default counters)",
    "https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/dcgm-exporter.html",
)
MIG_GUIDE = Source(
    "NVIDIA Multi-Instance GPU User Guide (enable MIG mode, create GPU instances)",
    "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html",
)
MLX5_COUNTERS = Source(
    "NVIDIA (Mellanox): Understanding mlx5 Linux counters and status parameters",
    "https://enterprise-support.nvidia.com/s/article/understanding-mlx5-linux-counters-and-"
    "status-parameters",
)
FIO_DOCS = Source("fio documentation", "https://fio.readthedocs.io/en/latest/fio_doc.html")
SYSTEMCTL = Source(
    "systemctl(1)", "https://www.freedesktop.org/software/systemd/man/latest/systemctl.html"
)
OPENSSH = Source("ssh(1): verifying host keys", "https://man.openbsd.org/ssh#VERIFYING_HOST_KEYS")
SUITE = Source("gpuready docs/validators.md (this suite's own behaviour)")

_DRAIN = "Drain the node (kubectl drain) before touching the GPU"

ACTIONS: dict[str, Action] = {
    # The suite's own codes: the transport, the framework, the inputs.
    "host.unreachable": Action(
        "The node did not answer over SSH (refused, timed out, no route).",
        "Check power and boot state on the BMC console, that sshd runs, and the inventory's "
        "ansible_host/ansible_port; the node stays out of service until it validates.",
        SUITE,
    ),
    "host.auth_failed": Action(
        "SSH refused the login (user or key).",
        "Check ansible_user, the key (ansible_ssh_private_key_file or the ssh-agent) and the "
        "node's authorized_keys.",
        SUITE,
    ),
    "host.hostkey_rejected": Action(
        "The node's host key is missing from known_hosts or differs from it.",
        "Do not accept it blindly: confirm on the console that the node was reinstalled, then "
        "replace its known_hosts entry with the key read over a trusted path.",
        OPENSSH,
    ),
    "host.unresponsive": Action(
        "The node answered SSH, then stalled (a step of the conversation overran its budget or "
        "keepalives went unanswered) or dropped the connection mid-command.",
        "Check the node's console and load (a hung kernel, a full disk, an OOM storm); the node "
        "stays out of service until it validates.",
        SUITE,
    ),
    "host.deadline": Action(
        "The node's overall deadline (--node-deadline) passed; its remaining checks were not run.",
        "Look for the check that ran long in the node's rows (a hung tool), fix it, then "
        "validate the node again.",
        SUITE,
    ),
    "run.interrupted": Action(
        "The run was stopped (SIGINT/SIGTERM) before this check finished or started.",
        "Nothing is known about this check on this node: validate the node again.",
        SUITE,
    ),
    "tool.output_too_large": Action(
        "A command printed more than the output cap (--max-output-mib) and was stopped.",
        "Run the command on the node to see why it floods (a log loop, a runaway tool); raise "
        "the cap only if the output is expected.",
        SUITE,
    ),
    "tool.timeout": Action(
        "A command did not finish within its timeout and was killed.",
        "Look on the node for a hung nvidia-smi (state D) and Xid events in the kernel log; a "
        "driver that no longer answers needs a GPU reset or a reboot.",
        DEBUG_GUIDE,
    ),
    "tool.exit_nonzero": Action(
        "A tool exited with an error.",
        "Read the tool's last lines in the detail and run the same command on the node.",
        SUITE,
    ),
    "tool.implausible": Action(
        "A tool finished but its figure cannot be a measurement: fewer bytes moved than asked, "
        "less time than the floor, or more than the hardware can carry. Nothing was judged.",
        "Run the command from the detail on the node by hand; a clock that jumped, a "
        "filesystem that dropped the data or a tool that lies needs fixing before the figure "
        "means anything.",
        SUITE,
    ),
    "tool.parse_error": Action(
        "A tool printed something the parser does not recognise.",
        "Compare the tool's version on the node with the pinned one (gpu_validation_tools role); "
        "if the format is new, keep the output as a capture and extend the parser.",
        SUITE,
    ),
    "tool.sudo_denied": Action(
        "The inventory says to become root (ansible_become), but sudo -n refused the command "
        "named in the detail: the login user has no passwordless sudo right for it.",
        "Give ansible_user passwordless sudo on the node (a sudoers.d drop-in with NOPASSWD), "
        "as Ansible's become needs too, or log in as a user that may read the kernel log.",
        SUITE,
    ),
    "tool.not_found": Action(
        "The tool is not installed on the node.",
        "Converge the node (playbooks/bootstrap.yml, tag gpu_validation_tools) so the pinned "
        "tools are installed.",
        SUITE,
    ),
    "check.internal_error": Action(
        "The check itself crashed (a bug in the suite); the node's other checks still ran.",
        "Report it with the detail; rerun the check after the fix.",
        SUITE,
    ),
    "check.non_finite_value": Action(
        "A tool reported a value that is not a finite number (NaN or infinity), so the figure "
        "cannot be judged.",
        "Run the tool on the node by hand; NaN bandwidth usually means the measurement failed "
        "(a timer of 0, a crashed rank). Validate the node again once it prints real figures.",
        SUITE,
    ),
    "profile.invalid": Action(
        "The node's SKU profile or its gpu_thresholds override could not be loaded.",
        "Fix the file and key named in the detail (validate/profiles/<name>.yml or the "
        "inventory's gpu_thresholds).",
        SUITE,
    ),
    "inventory.invalid": Action(
        "An inventory variable has the wrong type.",
        "Fix the variable named in the detail in the pool's or host's vars.",
        SUITE,
    ),
    "storage.path_refused": Action(
        "The scratch or checkpoint path is not a plain, safe directory; nothing was written.",
        "Point gpuready_scratch_path / gpuready_checkpoint_path at a plain directory on the "
        "node's local NVMe mount.",
        SUITE,
    ),
    "gpu.xid.journal_unreadable": Action(
        "journalctl could not read the system journal (no journal files, or a login user "
        "outside the adm/systemd-journal groups), so no Xid event could be seen.",
        "Log in as root or set ansible_become (sudo -n) for the validators, and make sure "
        "systemd-journald runs on the node and keeps the kernel log.",
        SUITE,
    ),
    "storage.no_space": Action(
        "The scratch path has less free space than the test needs (size x 1.1 + 256 MiB).",
        "Free space on that mount or point the check at a larger one.",
        SUITE,
    ),
    # Driver and inventory pins.
    "gpu.driver.not_loaded": Action(
        "nvidia-smi cannot talk to the driver: the kernel module is not loaded.",
        "Look for NVRM errors in the kernel log, check that DKMS built the module for the "
        "running kernel (dkms status) and Secure Boot signing; converge the nvidia_driver role "
        "and reboot.",
        DEBUG_GUIDE,
    ),
    "gpu.driver.version_mismatch": Action(
        "The running driver is not the version the inventory pins.",
        "Converge the nvidia_driver role (the pin wins) and reboot so the new module loads.",
        SUITE,
    ),
    "gpu.driver.no_pin": Action(
        "The inventory pins no driver version, so the driver was not judged.",
        "Set nvidia_driver_version in the pool's group_vars.",
        SUITE,
    ),
    # Hardware against the profile.
    "gpu.count.missing": Action(
        "Fewer GPUs than the profile expects are visible to the driver.",
        f"{_DRAIN}; look for Xid 79 (fallen off the bus) in the kernel log and for the GPU in "
        "`lspci -d 10de:`; reboot once, then reseat or replace with the vendor if it stays gone.",
        DEBUG_GUIDE,
        hardware_fault=True,
    ),
    "gpu.count.extra": Action(
        "More GPUs than the profile expects: the node is probably in the wrong pool.",
        "Move the node to the pool (inventory group) that matches its hardware.",
        SUITE,
    ),
    "gpu.model.mismatch": Action(
        "The GPU model differs from the profile's.",
        "Move the node to the pool that matches its hardware, or fix the pool's gpu_profile.",
        SUITE,
    ),
    "gpu.memory.mismatch": Action(
        "GPU memory differs from the profile's.",
        "If the model matches, check `nvidia-smi -q` for MIG mode and retired or remapped "
        "memory; otherwise move the node to the pool that matches its hardware.",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.uncorrectable": Action(
        "Uncorrectable (double-bit) ECC errors since the driver loaded.",
        f"{_DRAIN}; reset the GPU (nvidia-smi -r) so row remapping takes effect, check "
        "remapped rows and Xid 48/63/64/94/95; replace the GPU if it recurs.",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.mode_disabled": Action(
        "ECC is off on a GPU of a pool that expects it on: memory errors go undetected.",
        f"{_DRAIN}; enable ECC (nvidia-smi -e 1) and reset the GPU or reboot the node so the "
        "pending mode takes effect.",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.mode_enabled": Action(
        "ECC is on where the pool's profile expects it off.",
        f"{_DRAIN}; disable ECC (nvidia-smi -e 0) and reset the GPU, or fix the profile's "
        "thresholds.ecc.expect_mode.",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.correctable": Action(
        "Correctable ECC errors above the profile's limit.",
        "Watch the rate; reset the GPU at the next maintenance window; replace it if the rate "
        "stays high (Xid 92).",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.remap_pending": Action(
        "A memory row is marked for remapping, which happens at the next GPU reset.",
        f"{_DRAIN}, then reset the GPU (nvidia-smi -r) so the remapping takes effect.",
        MEMORY_ERRORS,
    ),
    "gpu.ecc.remap_failure": Action(
        "Row remapping failed: the bank has no spare rows left.",
        f"{_DRAIN} and take it out of service: NVIDIA's RMA policy treats a remapping failure "
        "as grounds to replace the GPU.",
        MEMORY_ERRORS,
        hardware_fault=True,
    ),
    "gpu.ecc.retired_pending": Action(
        "Pages are marked for retirement that only takes effect after a reset.",
        f"{_DRAIN}, then reset the GPU or reload the driver so the retirement takes effect.",
        PAGE_RETIREMENT,
    ),
    "gpu.pcie.degraded": Action(
        "A GPU's PCIe link runs below its maximum generation or width, or below the profile's.",
        "Rerun under load (idle GPUs lower the link speed); if it stays low, reseat the GPU or "
        "riser, check the slot's BIOS settings and the kernel log for AER errors.",
        DEBUG_GUIDE,
    ),
    "gpu.persistence.disabled": Action(
        "Persistence mode is off on some GPUs: each new process pays the GPU's initialisation.",
        "Enable and start nvidia-persistenced (the nvidia_driver role does) and check it runs.",
        PERSISTENCE,
    ),
    "gpu.mig.mode_disabled": Action(
        "A GPU of a MIG pool is not in MIG mode: it offers one whole GPU where the pool's "
        "scheduling expects MIG devices.",
        f"{_DRAIN}; enable MIG (nvidia-smi -i <gpu> -mig 1), reset the GPU so the mode takes "
        "effect, and create the pool's MIG devices again (gpu_mig_layout; or let the GPU "
        "Operator's MIG manager apply them).",
        MIG_GUIDE,
    ),
    "gpu.mig.mode_enabled": Action(
        "A GPU of a pool that is not declared MIG is in MIG mode: jobs asking for a whole GPU "
        "get a slice of one, or none.",
        f"{_DRAIN}; destroy its instances (nvidia-smi mig -dci; nvidia-smi mig -dgi), disable "
        "MIG (nvidia-smi -i <gpu> -mig 0) and reset the GPU; or move the node to a MIG pool.",
        MIG_GUIDE,
    ),
    "gpu.mig.mode_pending": Action(
        "A MIG mode change waits for a GPU reset: the GPU runs in one mode and turns to the "
        "other at its next reset or reboot.",
        f"{_DRAIN}, then reset the GPU (nvidia-smi -r -i <gpu>) or reboot, so the node runs "
        "the mode its pool declares; set the mode that pool declares first if it is the wrong "
        "one.",
        MIG_GUIDE,
    ),
    "gpu.mig.layout_mismatch": Action(
        "A GPU's MIG devices (by nvidia-smi -L's profile names) are not the ones its pool "
        "declares in gpu_mig_layout.",
        f"{_DRAIN}; destroy the GPU's compute and GPU instances and create the declared ones "
        "(nvidia-smi mig -cgi <profiles> -C), or correct gpu_mig_layout if the layout changed "
        "on purpose.",
        MIG_GUIDE,
    ),
    "gpu.nvlink.down": Action(
        "Fewer NVLinks are active than the profile expects.",
        "Check `nvidia-smi nvlink -s` and `-e` and the fabric manager (NVSwitch systems); "
        "reset the GPUs; if links stay down, the baseboard needs the vendor.",
        FABRIC_MANAGER,
    ),
    "gpu.topology.gpu_count": Action(
        "`nvidia-smi topo -m` shows a different number of GPUs than the profile.",
        "Treat as gpu.count: look for a GPU that fell off the bus.",
        DEBUG_GUIDE,
    ),
    "gpu.topology.no_nvlink": Action(
        "GPU pairs talk over PCIe where the pool's topology has NVLink.",
        "Check that nvidia-fabricmanager is running (NVSwitch systems) and the NVLink state.",
        FABRIC_MANAGER,
    ),
    "gpu.topology.unexpected_nvlink": Action(
        "NVLink found where the pool's topology says PCIe: the node is in the wrong pool.",
        "Move the node to the pool that matches its hardware.",
        SUITE,
    ),
    "gpu.topology.nic_far": Action(
        "Some GPUs have no RDMA NIC on their PCIe switch: GPU-NIC traffic crosses the CPU.",
        "Check the NIC placement and PCIe/ACS settings against the platform's reference.",
        NCCL_TROUBLESHOOTING,
    ),
    # Fabric.
    "fabric.ib.port_down": Action(
        "Fewer fabric ports are Active/LinkUp than the profile expects.",
        "Check cables and transceivers, the switch port, and the subnet manager (ibstat, "
        "iblinkinfo) before the node takes multi-node jobs.",
        NCCL_NETWORK,
    ),
    "fabric.ib.rate_low": Action(
        "A fabric port trained below the profile's rate.",
        "Reseat or replace the cable or transceiver; check the switch port's configured speed.",
        NCCL_NETWORK,
    ),
    "fabric.ib.link_downed_growing": Action(
        "The port's link went down (link_downed grew) since the node's previous run: a "
        "flapping link, which drops every multi-node job's traffic on it.",
        "Keep multi-node jobs off the node; reseat the cable and transceiver at both ends, "
        "check the switch port's log and the cable's optical levels (mlxlink), replace the "
        "cable if it flaps again.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.link_error_recovery_growing": Action(
        "The port retrained its link (link_error_recovery grew) since the previous run: a "
        "marginal link that recovers before it goes down.",
        "Reseat or replace the cable or transceiver; watch link_downed next.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.symbol_error_growing": Action(
        "Symbol errors on the port's physical link grew faster than the profile allows: "
        "a bad cable, transceiver or connector.",
        "Reseat the cable at both ends, clean or replace the transceiver, replace the cable "
        "if the rate stays.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.port_rcv_errors_growing": Action(
        "Packets with errors (bad CRC, malformed) arrived at the port faster than the profile "
        "allows.",
        "Check symbol_error on this port and the peer switch port's counters; reseat or "
        "replace the cable.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.excessive_buffer_overrun_errors_growing": Action(
        "The port's receive buffers overran repeatedly (flow control failing) faster than the "
        "profile allows.",
        "Check the link's flow-control settings at both ends and the switch port; reseat the "
        "cable; look for a peer that ignores credits.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.counter_high": Action(
        "An error counter is past the profile's warning count but did not grow since the "
        "previous run: a past incident nobody cleared.",
        "Find the incident in the history (python -m validate history); once understood, "
        "clear the port's counters (perfquery -x -R) so a new error shows again.",
        MLX5_COUNTERS,
    ),
    "fabric.ib.counter_missing": Action(
        "A port does not expose an error counter in sysfs (counters/<name>).",
        "Check the RDMA driver (mlx5_ib loaded, rdma-core) and gpuready_sysfs_root.",
        SUITE,
    ),
    # Benchmarks.
    "nccl.allreduce.low_busbw": Action(
        "Single-node all-reduce bus bandwidth is below the profile's floor.",
        "Look at gpu.nvlink, gpu.pcie and gpu.throttle on the same node; rerun all_reduce_perf "
        "with NCCL_DEBUG=INFO to see the transport NCCL chose.",
        NCCL_TESTS_PERF,
    ),
    "nccl.allreduce.wrong_results": Action(
        "all_reduce_perf found wrong values: data corruption.",
        f"{_DRAIN} at once; run DCGM diagnostics (dcgmi diag -r 3) to find the GPU, and replace "
        "it.",
        DCGM_DIAG,
        hardware_fault=True,
    ),
    "nccl.allreduce.incomplete": Action(
        "all_reduce_perf printed no result at the tested size.",
        "Rerun with NCCL_DEBUG=WARN and read NCCL's warning.",
        NCCL_TROUBLESHOOTING,
    ),
    # Storage.
    "storage.fio.seq_write_mibps_low": Action(
        "Sequential write to the scratch disk is below its drive class's floor.",
        "Check the drive's health (nvme smart-log), that the path is on the local NVMe, and the "
        "mount options.",
        FIO_DOCS,
    ),
    "storage.fio.seq_read_mibps_low": Action(
        "Sequential read from the scratch disk is below its drive class's floor.",
        "Check the drive's health (nvme smart-log), that the path is on the local NVMe, and the "
        "mount options.",
        FIO_DOCS,
    ),
    "storage.fio.randread_4k_iops_low": Action(
        "4 KiB random reads per second are below the drive class's floor.",
        "Check the drive's health (nvme smart-log) and that the path is on the local NVMe.",
        FIO_DOCS,
    ),
    "storage.checkpoint.write_slow": Action(
        "Writing a checkpoint-sized file was slower than the profile allows.",
        "Check the checkpoint path's drive and mount; a network or overlay mount there slows "
        "every checkpoint.",
        SUITE,
    ),
    "storage.checkpoint.read_slow": Action(
        "Reading a checkpoint back was slower than the profile allows.",
        "Check the checkpoint path's drive and mount.",
        SUITE,
    ),
    # DCGM diagnostics (validate/checks/dcgm.py): DCGM's own message is in the row's detail.
    "dcgm.diag.memory": Action(
        "DCGM's memory test found faulty GPU memory (miscompares, uncorrectable errors, low "
        "memory bandwidth) on the GPU the row names.",
        f"{_DRAIN}; reset the GPU (nvidia-smi -r) and rerun dcgmi diag -r 3. A GPU that fails "
        "again is an RMA: send the DCGM output and nvidia-bug-report with it.",
        DCGM_DIAG,
        hardware_fault=True,
    ),
    "dcgm.diag.pcie": Action(
        "DCGM's PCIe test failed: bandwidth or latency out of range, replay errors, or the link "
        "trained below its generation or width.",
        f"{_DRAIN}; compare gpu.pcie on the same node, reseat the GPU or its riser and check "
        "the slot's BIOS settings; a link that degrades again is an RMA.",
        DCGM_DIAG,
    ),
    "dcgm.diag.nvlink": Action(
        "DCGM found NVLink errors or links down on the GPU the row names.",
        "Compare gpu.nvlink; check the fabric manager (NVSwitch systems) and reset the GPUs; "
        "links that stay down or keep erroring need the baseboard serviced.",
        FABRIC_MANAGER,
    ),
    "dcgm.diag.thermal_power": Action(
        "DCGM saw thermal violations, a temperature too high, or the GPU could not reach its "
        "target power during the test.",
        "Check fans, airflow, inlet temperature and the power supplies on the BMC; verify the "
        "power limit (nvidia-smi -q -d POWER); rerun the diagnostic once cooling is fixed.",
        DCGM_DIAG,
    ),
    "dcgm.diag.row_remap_pending": Action(
        "The GPU has uncorrectable memory errors whose row remapping (or page retirement) is "
        "pending: it takes effect only after a GPU reset.",
        f"{_DRAIN}, reset the GPU (nvidia-smi -r -i <gpu>) or reboot, then validate again; "
        "the remap clears the finding.",
        MEMORY_ERRORS,
    ),
    "dcgm.diag.row_remap_failed": Action(
        "Row remapping failed or the GPU ran out of spare rows: its memory cannot be repaired.",
        f"{_DRAIN} and replace the GPU (RMA); NVIDIA's memory error guide says a failed remap "
        "needs the board replaced.",
        MEMORY_ERRORS,
        hardware_fault=True,
    ),
    "dcgm.diag.deployment": Action(
        "A DCGM deployment test failed: the node's software setup blocks GPU work (persistence "
        "mode off, a denylisted driver, CUDA library missing, graphics processes, inforom).",
        "Read DCGM's message in the detail; converge the driver roles and rerun.",
        DCGM_DIAG,
    ),
    "dcgm.diag.compute": Action(
        "DCGM's stress or compute test failed (too low a stress level or performance, a CUDA "
        "error under load).",
        f"{_DRAIN}; rerun dcgmi diag -r 3; a GPU that fails again goes to RMA.",
        DCGM_DIAG,
    ),
    "dcgm.diag.other": Action(
        "A DCGM test this suite does not classify failed.",
        "Read DCGM's message in the detail and the DCGM diagnostics guide for that test.",
        DCGM_DIAG,
    ),
    "dcgm.diag.gpu_busy": Action(
        "The DCGM diagnostic was not started: processes are using the GPUs (named in the "
        "detail), and the diagnostic would disturb them and fail on them.",
        "Validate again when the node is idle (drain it first to make it so).",
        SUITE,
    ),
    # The DCGM exporter (validate/checks/dcgm_exporter.py).
    "dcgm.exporter.down": Action(
        "The node's dcgm-exporter does not answer: monitoring sees none of this node's GPU "
        "health (Xids, ECC errors, throttling) while the node runs work.",
        "Check the exporter where it runs (`kubectl -n gpu-operator get pods -o wide` for the "
        "GPU Operator's DaemonSet, `systemctl status` or the container otherwise) and its log; "
        "the exporter needs DCGM and a loaded driver. Confirm with `curl <address>:9400/metrics`.",
        DCGM_EXPORTER,
    ),
    "dcgm.exporter.bad_output": Action(
        "Something answers on the exporter's port, but not with dcgm-exporter's metrics (another "
        "service, a proxy's page, a truncated answer).",
        "Check what listens on the port (`ss -ltnp` on the node) and the inventory's "
        "dcgm_exporter_port / dcgm_exporter_url.",
        DCGM_EXPORTER,
    ),
    "dcgm.exporter.gpu_count_mismatch": Action(
        "The exporter reports a different number of GPUs than nvidia-smi: monitoring is blind "
        "to some GPUs, or counts GPUs that are not there.",
        "Restart the exporter (it enumerates GPUs at start: a GPU that was reset or hot-plugged "
        "since is missed); if it persists, compare `dcgmi discovery -l` with `nvidia-smi -L`.",
        DCGM_EXPORTER,
    ),
    "dcgm.exporter.uuid_mismatch": Action(
        "The exporter reports GPU UUIDs nvidia-smi does not list: a stale view (a board was "
        "replaced since it started) or another node's exporter at this address.",
        "Check the URL points at this node's exporter; restart the exporter so it enumerates "
        "the GPUs again, then validate again.",
        DCGM_EXPORTER,
    ),
    "dcgm.exporter.driver_mismatch": Action(
        "The exporter labels a different driver version than nvidia-smi reports: it started "
        "before a driver upgrade and still reports the old one.",
        "Restart the exporter (with the GPU Operator, delete its pod on this node).",
        DCGM_EXPORTER,
    ),
    "dcgm.exporter.xid": Action(
        "DCGM saw an Xid on this GPU (the value is the last Xid number).",
        "Read gpu.xid's rows and the kernel log for the Xid and its catalog action.",
        XID_CATALOG,
    ),
    "dcgm.exporter.ecc": Action(
        "DCGM counts double-bit (uncorrectable) ECC errors on this GPU.",
        f"{_DRAIN}; follow gpu.ecc's rows and NVIDIA's memory error management guide (reset "
        "for a row remap, RMA when remapping fails).",
        MEMORY_ERRORS,
    ),
    # Services.
    "node.services.inactive": Action(
        "A unit the node needs (containerd, kubelet, nvidia-persistenced, fabric manager) is "
        "not active.",
        "Read `systemctl status <unit>` and `journalctl -u <unit>` on the node; converge the "
        "bootstrap roles.",
        SYSTEMCTL,
    ),
}

# NVML clock event reasons the profiles judge (validate/profiles/*.yml, throttle.*_reasons).
_THROTTLE: dict[str, tuple[str, str]] = {
    "hw_slowdown": (
        "HW slowdown engaged (clocks cut by half or more): temperature too high, external "
        "power brake, or power draw too high.",
        "Check GPU and inlet temperatures and the BMC's power events; drain the node if it stays.",
    ),
    "hw_thermal_slowdown": (
        "HW thermal slowdown engaged: the GPU is too hot.",
        "Check fans, airflow and inlet temperature on the BMC; drain the node if it stays.",
    ),
    "hw_power_brake_slowdown": (
        "HW power brake engaged: the power supply asserted the brake.",
        "Check the power supplies and the BMC's power events.",
    ),
    "sw_thermal_slowdown": (
        "SW thermal slowdown: the driver lowers clocks to stay under its temperature target.",
        "Check cooling; a GPU that runs hot under light load needs airflow looked at.",
    ),
    "sw_power_cap": (
        "SW power cap: clocks held to stay under the power limit.",
        "Check the power limit (nvidia-smi -q -d POWER) against the SKU's default.",
    ),
}


# Xids whose catalog action is hardware work, not a reset: 79 (fallen off the bus: RESTART_BM,
# then PCIe, power and thermals, replace if it recurs) and 64 (row remapping or page retirement
# failed: the GPU likely needs replacement).
HARDWARE_FAULT_XIDS = frozenset({64, 79})


def action_for(code: str) -> Action | None:
    """The catalogued action for ``code``, or None when nobody catalogued it."""
    if code in ACTIONS:
        return ACTIONS[code]
    family, _, tail = code.rpartition(".")
    if family == "gpu.xid" and tail.isdigit():
        info = xid_catalog.lookup(int(tail))
        return Action(f"Xid {tail}: {info.summary} ({info.severity}).", info.action, XID_CATALOG,
                      hardware_fault=int(tail) in HARDWARE_FAULT_XIDS)
    if family == "gpu.throttle":
        meaning, action = _THROTTLE.get(
            tail,
            (f"Clock event reason {tail} is active.", "Read the reason in NVML's list."),
        )
        return Action(meaning, action, CLOCK_REASONS)
    return None


def is_hardware_fault(code: str) -> bool:
    """Whether the catalogue marks ``code`` as a hardware fault (quarantine until released)."""
    action = action_for(code)
    return action is not None and action.hardware_fault
