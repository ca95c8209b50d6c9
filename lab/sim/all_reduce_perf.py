#!/usr/bin/env python3
"""gpuready lab simulator: nccl-tests performance binaries (all_reduce_perf and friends).

Serves all_reduce_perf, all_gather_perf, reduce_scatter_perf and alltoall_perf, picked by
env GPUREADY_SIM_TOOL; the nccl-tests version is env GPUREADY_SIM_VERSION (the installed
package's upstream version). The simulated node is read on every call from
$GPUREADY_LAB_HW (default /opt/gpuready-lab/hw)/{hardware,faults}.json; per-boot kernel state
from $GPUREADY_LAB_RUN (default /run/gpuready-lab).

What it prints is the shape of the real tool, checked against the captures in
tests/fixtures/nccl-tests:
- header `# nThread .. nGpus .. minBytes .. step: 2(factor) .. validation: 1 graph: 0`,
  `# Using devices`, one `#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] name` per GPU
  (hostname, pid, PCI bus and name from hardware.json), the three table header lines, rows
  `%12li  %12li  %8s  %6s  %6s` + per placement `  %7s  %6.2f  %6.2f  %5g`, then
  `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    : %g `.
- Numbers: time = latency + size/peak + a mid-size inefficiency term, so busbw rises with
  size and saturates towards hardware.json nccl.allreduce_busbw_peak_gbps (bus bandwidth
  factors as nccl-tests PERFORMANCE.md: all-reduce 2(n-1)/n, the others (n-1)/n), with a small
  deterministic jitter (seeded by host, tool, size and placement, so reruns agree).
- CUDA failures use the real CUDACHECK/TESTCHECK shape (`<host>: Test CUDA failure
  common.cu:941 '<cuda error string>'` then ` .. <host> pid <pid>: Test failure common.cu:891`,
  exit 2), as in the real capture all_gather_perf-4worker-b200-test-cuda-failure-invalid-device-
  ordinal-excerpt.txt; the line numbers 941/891 are those 2.13-era builds print (NVIDIA/nccl-tests
  issue 264).

Versions: 2.13.x (the lab repository's package) prints the classic format above and has no
`-J` (getopt rejects it, as the real binary does). From 2.17.0 the tool prints the
`# nccl-tests version` / `# Collective test starting:` preamble, `[%04x:%02x:%02x]` bus ids,
`getFloatStr` number widths, and accepts `-J/--output_file FILE`, writing the JSON document
of NVIDIA/nccl-tests src/util.cu (JSON_FILE_VERSION 1: jsonOutputInit, writeDeviceReport,
writeBenchmarkLinePreamble/Body/Terminator, writeResultFooter, writeErrors):
  {"version":1, "start_time":"%Y-%m-%d %H:%M:%S", "args":[argv...], "env":["K=V"...],
   "nccl_version":<int>, "config":{"nthreads","ngpus","minimum_bytes","maximum_bytes",
   "step_factor"|"step_bytes","warmup_iters","iterations","aggregated_iterations",
   "validation","graph","blocking_collectives":"true"|"false","parallel_init":"true"|"false",
   "devices":[{"rank","group","pid","hostname","device","device_hex","device_info"}]},
   "results":[{"size","count","type","redop","root":"%6i string",
               "out_of_place":{"time","alg_bw","bus_bw","nwrong"|null},"in_place":{...},
               "actual_iterations","experiment_name"}],
   "out_of_bounds":{"count","okay":"true"|"false"},
   "average_bus_bandwidth":{"bandwidth","okay":"unchecked"|"true"|"false"},
   "errors":[...], "end_time":"..."}
(booleans are the strings "true"/"false" and doubles are printed with %lf, as the real
writer does). experiment_name is the collective's name (AllReduce, ...): an assumption, the
call site was not read.

Multi-node (nccl-tests built with MPI=1): when Open MPI's mpirun starts it (OMPI_COMM_WORLD_SIZE
is set, more than one process), it is a real MPI program on mpi4py (Debian's python3-mpi4py):
every process reads its own node's hardware.json/faults.json, rank 0 prints the header, the
device lines of all processes are gathered to rank 0 in rank order (device numbers per node,
as the real writeDeviceReport does), and the nodes exchange their rail state with a real
MPI_Allreduce(MIN): per HCA, the fraction of its rate it can carry (0 when ibstat shows its port
down or NCCL_IB_HCA leaves it out, 0.5 on ib-link-degraded). Rank 0 prints the table at the bus
bandwidth the slowest rail allows (hardware.json nccl.allreduce_multinode_busbw_peak_gbps times
the worst rail's fraction per unit of load; a GPU whose rail is unusable shares a neighbour's),
or at NCCL's socket rate when no rail is usable. The format is held to the real multi-node
captures in tests/fixtures/nccl-tests-multinode/. A node with tool-hang never joins, so the
others wait in the collective until mpirun is killed (a peer whose NCCL bootstrap hangs); a
node with a CUDA failure prints it and exits without MPI_Finalize, and mpirun ends the job.

Faults (faults.json): nccl-low-busbw (peak ~40% lower), nccl-busbw-drop (peak 15% lower: a
drop only history shows), nccl-wrong-results (#wrong > 0 on
the largest sizes, `FAILED`, exit 1), tool-hang (prints nothing and never returns until killed),
driver-not-loaded (CUDA 'no CUDA-capable device is detected'), gpu-missing (the
highest-index GPU is gone, so asking for all GPUs fails with 'invalid device ordinal'). An
NVSwitch system (hardware.json nvswitch true) whose nv-fabricmanager is not running fails with
'system not yet initialized', as real HGX systems do; the lab's daemon writes
$GPUREADY_LAB_RUN/nv-fabricmanager.pid while it runs.
"""

from __future__ import annotations

import fcntl
import getopt
import json
import math
import os
import random
import socket
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIMULATOR = "gpuready lab simulator"
DEFAULT_VERSION = "2.13.10"
JSON_MIN_VERSION = (2, 17, 0)
NCCL_VERSION = (2, 21, 5)  # libnccl2 served by the lab repository

# Per tool: collective name, default reduction op label, bus-bandwidth factor (n ranks).
COLLECTIVES: dict[str, tuple[str, bool]] = {
    "all_reduce_perf": ("AllReduce", True),
    "all_gather_perf": ("AllGather", False),
    "reduce_scatter_perf": ("ReduceScatter", True),
    "alltoall_perf": ("AlltoAll", False),
}
TYPE_SIZES = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float": 4, "double": 8, "bfloat16": 2,
}
OPS = ("sum", "prod", "max", "min", "avg")

# Timing model constants: per-call latency and the size below which the mid-size
# inefficiency (protocol switches, pipelining) is felt; tuned so curves look like the
# H100/A100 captures (busbw ~30% of peak at 32 MiB, ~95% at 8 GiB).
LATENCY_US_NVLINK = 22.0
LATENCY_US_PCIE = 35.0
# Across nodes: the 2-node captures start at 22-36 us for the smallest sizes.
LATENCY_US_NETWORK = 30.0
# nccl-low-busbw: the node's NCCL peak is about 40% lower.
LOW_BUSBW_FACTOR = 0.6
# nccl-busbw-drop: still above the profiles' floors, so only the node's own history shows it.
BUSBW_DROP_FACTOR = 0.85
# NCCL over sockets when no RDMA rail is usable on both ends (NET/Socket over the
# NCCL_SOCKET_IFNAME interface): about what the real 1-NIC T4 capture without GPUDirect
# (nccl-tests-multinode/all_reduce_perf-2node-2x-tesla-t4-*) reaches.
SOCKET_BUSBW_GBPS = 3.1
INEFFICIENCY_BYTES = 16 * 1024 * 1024
WRONG_RESULTS_MIN_BYTES = 128 * 1024 * 1024

# The classic (<= 2.16) table header, byte for byte (trailing spaces included) as in the
# capture all_gather_perf-2node-2x-h200-gke-trailing-spaces-1K-8G.txt.
CLASSIC_TABLE_HEADER = (
    "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place          \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)" + " " * 31 + "(us)  (GB/s)  (GB/s)" + " " * 12
    + "(us)  (GB/s)  (GB/s)       \n"
)


class UsageExit(Exception):
    """Raised to stop with a given exit status after output was printed."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _parse_version(text: str) -> tuple[int, int, int]:
    parts = [*text.partition("-")[0].split("."), "0", "0", "0"][:3]
    return int(parts[0]), int(parts[1]), int(parts[2])


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _load_hw() -> tuple[dict[str, Any], set[str]]:
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults_path = _hw_dir() / "faults.json"
    faults: set[str] = set()
    if faults_path.exists():
        faults = set(json.loads(faults_path.read_text()).get("faults", []))
    return hw, faults



def _parsesize(value: str) -> int:
    # Same as nccl-tests parsesize(): the unit letter may sit anywhere; atof on the rest.
    units = 1
    if "G" in value:
        units = 1024**3
    elif "M" in value:
        units = 1024**2
    elif "K" in value:
        units = 1024
    number = ""
    for ch in value:
        if ch.isdigit() or ch in ".eE+-":
            number += ch
        else:
            break
    try:
        return int(float(number) * units)
    except ValueError:
        return 0



def _int(arg: str) -> int:
    """An integer option as the tool's strtol(arg, NULL, 0) reads it (0x.., 0..)."""
    return int(arg, 0)


def _text(arg: str) -> str:
    return arg


# Each option the tool takes a value for (short and long name) -> the setting and its reader.
_OPTION_SETTINGS: dict[str, tuple[str, Callable[[str], object]]] = {
    name: setting
    for names, setting in (
        (("t", "nthreads"), ("n_threads", _int)),
        (("g", "ngpus"), ("n_gpus", _int)),
        (("b", "minbytes"), ("min_bytes", _parsesize)),
        (("e", "maxbytes"), ("max_bytes", _parsesize)),
        (("i", "stepbytes"), ("step_bytes", _parsesize)),
        (("f", "stepfactor"), ("step_factor", _int)),
        (("n", "iters"), ("iters", _int)),
        (("m", "agg_iters"), ("agg_iters", _int)),
        (("w", "warmup_iters"), ("warmup", _int)),
        (("c", "check"), ("datacheck", _int)),
        (("p", "parallel_init"), ("parallel_init", _int)),
        (("z", "blocking"), ("blocking", _int)),
        (("G", "cudagraph"), ("graph", _int)),
        (("o", "op"), ("op", _text)),
        (("d", "datatype"), ("dtype", _text)),
        (("r", "root"), ("root", _int)),
        (("J", "output_file"), ("output_file", _text)),
    )
    for name in names
}

def _pid_alive(pid_file: Path) -> bool:
    """The daemon of ``pid_file`` runs: its pid answers, or (from a container, where the
    host's pids are not ours) it holds the lock beside its pid file (lab/sim/daemons.py)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        pass
    else:
        return True
    try:
        fd = os.open(pid_file.with_suffix(".lock"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _time_str_classic(usec: float) -> str:
    if usec >= 10000.0:
        return f"{usec:7.0f}"
    if usec >= 100.0:
        return f"{usec:7.1f}"
    return f"{usec:7.2f}"


def _float_str(value: float, width: int) -> str:
    """nccl-tests getFloatStr(): fewer decimals as the integer part grows (>= 2.17)."""
    power = 0
    val = 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def _jdouble(value: float) -> str:
    return "\"nan\"" if math.isnan(value) else f"{value:f}"


def _jstr(value: str) -> str:
    out = []
    for ch in value:
        if ch in "\"\\/":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) >= 0x7F or ord(ch) <= 0x1F:
            break  # the real writer gives up on the rest of the string
        else:
            out.append(ch)
    return "\"" + "".join(out) + "\""


class Sim:
    """One invocation: parsed options, the node, and where the output goes."""

    def __init__(self, argv: list[str]) -> None:
        self.tool = os.environ.get("GPUREADY_SIM_TOOL") or Path(argv[0]).name.removesuffix(".py")
        if self.tool not in COLLECTIVES:
            self.tool = "all_reduce_perf"
        self.version = os.environ.get("GPUREADY_SIM_VERSION", DEFAULT_VERSION)
        self.modern = _parse_version(self.version) >= JSON_MIN_VERSION
        self.argv = [self.tool, *argv[1:]]
        self.n_threads = 1
        self.n_gpus = 1
        self.min_bytes = 32 * 1024 * 1024
        self.max_bytes = 32 * 1024 * 1024
        self.step_bytes = 1024 * 1024
        self.step_factor = 1
        self.iters = 20
        self.warmup = 5
        self.agg_iters = 1
        self.datacheck = 1
        self.graph = 0
        self.blocking = 0
        self.parallel_init = 0
        self.op = "sum"
        self.dtype = "float"
        self.root = 0
        self.output_file: str | None = None
        self.pid = os.getpid()

    # -- options -------------------------------------------------------------------------
    def parse(self) -> None:
        shorts = "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:h"
        longs = [
            "nthreads=", "ngpus=", "minbytes=", "maxbytes=", "stepbytes=", "stepfactor=",
            "iters=", "agg_iters=", "warmup_iters=", "run_cycles=", "parallel_init=", "check=",
            "op=", "datatype=", "root=", "blocking=", "stream_null=", "timeout=", "cudagraph=",
            "report_cputime=", "average=", "local_register=", "help",
        ]
        if self.modern:
            shorts += "J:S:"
            longs += ["output_file=", "report_timestamps="]
        try:
            opts, _ = getopt.gnu_getopt(self.argv[1:], shorts, longs)
        except getopt.GetoptError as err:
            # getopt_long complains on stderr, then the tool's default case prints usage
            # and returns 0, exactly like the real binary.
            print(f"{self.tool}: invalid option -- '{err.opt}'", file=sys.stderr)
            print("invalid option '?'")
            self._usage()
            raise UsageExit(0) from err
        for opt, arg in opts:
            key = opt.lstrip("-")
            if key in ("h", "help"):
                self._usage()
                raise UsageExit(0)
            setting = _OPTION_SETTINGS.get(key)
            if setting is not None:
                attr, convert = setting
                setattr(self, attr, convert(arg))
        if self.min_bytes > self.max_bytes:
            print(
                f"invalid sizes for 'minbytes' and 'maxbytes': {self.min_bytes} > "
                f"{self.max_bytes}",
                file=sys.stderr,
            )
            raise UsageExit(255)
        if self.dtype not in TYPE_SIZES:
            self.dtype = "float"

    def _usage(self) -> None:
        lines = [
            f"USAGE: {self.tool} ",
            "[-t,--nthreads <num threads>] ", "[-g,--ngpus <gpus per thread>] ",
            "[-b,--minbytes <min size in bytes>] ", "[-e,--maxbytes <max size in bytes>] ",
            "[-i,--stepbytes <increment size>] ", "[-f,--stepfactor <increment factor>] ",
            "[-n,--iters <iteration count>] ", "[-m,--agg_iters <aggregated iteration count>] ",
            "[-w,--warmup_iters <warmup iteration count>] ", "[-p,--parallel_init <0/1>] ",
            "[-c,--check <check iteration count>] ",
            "[-o,--op <sum/prod/min/max/avg/mulsum/all>] ", "[-d,--datatype <nccltype/all>] ",
            "[-r,--root <root>] ", "[-z,--blocking <0/1>] ", "[-y,--stream_null <0/1>] ",
            "[-T,--timeout <time in seconds>] ", "[-G,--cudagraph <num graph launches>] ",
            "[-C,--report_cputime <0/1>] ",
        ]
        if self.modern:
            lines.append(
                "[-J,--output_file <file> write output to filepath, if accessible. Infer type "
                "from suffix (only json supported presently.)] "
            )
        lines += [
            "[-a,--average <0/1/2/3> report average iteration time "
            "<0=RANK0/1=AVG/2=MIN/3=MAX>] ",
            "[-h,--help]",
        ]
        print("\n\t".join(lines))
        print(f"# ({SIMULATOR}, nccl-tests {self.version})")

    # -- the run -------------------------------------------------------------------------
    def run(self) -> int:
        mpi = _mpi_module()
        if mpi is not None and mpi.COMM_WORLD.Get_size() > 1:
            return self.run_mpi(mpi)
        hw, faults = _load_hw()
        host = str(hw.get("hostname") or socket.gethostname())
        gpus = _present_gpus(hw, faults)
        if "tool-hang" in faults:
            _hang()
        json_out = self._json_open() if self.output_file else None
        self._print_preamble()

        cuda_error = self._cuda_error(hw, faults, gpus)
        if cuda_error is not None:
            return self._cuda_failure(host, cuda_error, json_out)
        n_ranks = self.n_threads * self.n_gpus
        if n_ranks > len(gpus):
            return self._too_many_gpus(host, n_ranks, len(gpus), json_out)
        lines, devices = self._device_lines(host, gpus, first_rank=0)
        print("\n".join(lines))
        self._print_nccl_version(hw)
        rows = self._rows(hw, faults, host, n_ranks)
        return self._print_table(rows, host, devices, json_out)

    def run_mpi(self, mpi: Any) -> int:
        """One process of a multi-node run launched by Open MPI's mpirun (MPI_SUPPORT build).

        As the real tool does: every process reads its own node, rank 0 prints the header,
        the device lines are gathered to rank 0 in rank order, and rank 0 prints the table.
        What NCCL's transport setup would find out about the fabric between the nodes is
        exchanged with a real MPI_Allreduce (MIN): each node's usable fraction of every rail,
        so the bandwidth is what the slowest end of each rail allows (see _rail_fractions).
        A node whose tools hang never joins: the others wait in the collective until mpirun
        is killed, as ranks do when a peer's NCCL bootstrap hangs."""
        comm = mpi.COMM_WORLD
        proc, nprocs = comm.Get_rank(), comm.Get_size()
        hw, faults = _load_hw()
        host = str(hw.get("hostname") or socket.gethostname())
        gpus = _present_gpus(hw, faults)
        if "tool-hang" in faults:
            _hang()
        json_out = self._json_open() if self.output_file and proc == 0 else None
        if proc == 0:
            self._print_preamble()
        sys.stdout.flush()
        # A process that fails before the gather exits at once without MPI_Finalize, like the
        # real tool returning from main(); mpirun then ends the job and reports the exit.
        cuda_error = self._cuda_error(hw, faults, gpus)
        if cuda_error is not None:
            _exit_now(self._cuda_failure(host, cuda_error, json_out))
        per_proc = self.n_threads * self.n_gpus
        if per_proc > len(gpus):
            _exit_now(self._too_many_gpus(host, per_proc, len(gpus), json_out))
        lines, devices = self._device_lines(host, gpus, first_rank=proc * per_proc)
        gathered = comm.gather((lines, devices), root=0)
        fractions = _rail_fractions(hw, faults, os.environ.get("NCCL_IB_HCA", ""))
        width = comm.allreduce(len(fractions), op=mpi.MAX)
        peak = _multinode_peak(hw) * (LOW_BUSBW_FACTOR if "nccl-low-busbw" in faults else 1.0)
        exchange = array("d", [*fractions, *([0.0] * (width - len(fractions))), peak])
        comm.Allreduce(mpi.IN_PLACE, [exchange, mpi.DOUBLE], op=mpi.MIN)
        wrong = comm.allreduce(int("nccl-wrong-results" in faults), op=mpi.MAX)
        status = 0
        if proc == 0:
            all_devices = []
            for proc_lines, proc_devices in gathered:
                print("\n".join(proc_lines))
                all_devices += proc_devices
            self._print_nccl_version(hw)
            pair_faults = {"nccl-wrong-results"} if wrong else set()
            busbw_peak = _fabric_busbw(list(exchange[:-1]), exchange[-1], hw)
            rows = self._rows(hw, pair_faults, host, per_proc * nprocs, busbw_peak)
            status = self._print_table(rows, host, all_devices, json_out)
        sys.stdout.flush()
        comm.Barrier()
        return status

    def _print_preamble(self) -> None:
        if self.modern:
            code = NCCL_VERSION[0] * 10000 + NCCL_VERSION[1] * 100 + NCCL_VERSION[2]
            print(f"# nccl-tests version {self.version} nccl-headers={code} nccl-library={code}")
            print(f"# Collective test starting: {self.tool}")
        step = self.step_factor if self.step_factor > 1 else self.step_bytes
        kind = "factor" if self.step_factor > 1 else "bytes"
        print(
            f"# nThread {self.n_threads} nGpus {self.n_gpus} minBytes {self.min_bytes} "
            f"maxBytes {self.max_bytes} step: {step}({kind}) warmup iters: {self.warmup} "
            f"iters: {self.iters} agg iters: {self.agg_iters} validation: {self.datacheck} "
            f"graph: {self.graph}"
        )
        if self.blocking:
            print("# Blocking Enabled: wait for completion and barrier after each collective ")
        if self.parallel_init:
            print("# Parallel Init Enabled: threads call into NcclInitRank concurrently ")
        print("#")
        print("# Using devices")

    def _too_many_gpus(self, host: str, wanted: int, found: int, json_out: Any) -> int:
        if self.modern:
            print(
                f"Invalid number of GPUs: {wanted} requested but only {found} were "
                "found.\nPlease check the number of processes and GPUs per process.",
                file=sys.stderr,
            )
            # The TESTCHECK line number of this path is not known from a capture.
            print(f" .. {host} pid {self.pid}: Test failure common.cu:1065")
            self._json_close(json_out, {})
            return 5
        return self._cuda_failure(host, "invalid device ordinal", json_out)

    def _device_lines(
        self, host: str, gpus: list[dict[str, Any]], first_rank: int
    ) -> tuple[list[str], list[tuple[int, str, str, str]]]:
        """This process's '#  Rank' lines and (rank, bus id, name, host) per device."""
        lines, devices = [], []
        for device in range(self.n_threads * self.n_gpus):
            rank = first_rank + device
            gpu = gpus[device]
            domain, bus, dev = _pci_parts(str(gpu.get("pci_bus_id", "00000000:00:00.0")))
            hexid = f"{domain:04x}:{bus:02x}:{dev:02x}" if self.modern else f"0x{bus:02x}"
            name = str(gpu.get("name", "NVIDIA GPU"))
            lines.append(
                f"#  Rank {rank:2d} Group {0:2d} Pid {self.pid:6d} on {host:>10s} device "
                f"{device:2d} [{hexid}] {name}"
            )
            devices.append((rank, hexid, name, host))
        return lines, devices

    def _print_nccl_version(self, hw: dict[str, Any]) -> None:
        if os.environ.get("NCCL_DEBUG", "").upper() in ("VERSION", "INFO", "TRACE"):
            cuda = str(hw.get("cuda_version", "12.4"))
            print(f"NCCL version {'.'.join(map(str, NCCL_VERSION))}+cuda{cuda}")

    def _cuda_error(
        self, hw: dict[str, Any], faults: set[str], gpus: list[dict[str, Any]]
    ) -> str | None:
        module_loaded = (_run_dir() / "nvidia-module-version").exists()
        if "driver-not-loaded" in faults or not module_loaded:
            return "no CUDA-capable device is detected"
        if not gpus:
            return "no CUDA-capable device is detected"
        if hw.get("nvswitch") and not _pid_alive(_run_dir() / "nv-fabricmanager.pid"):
            return "system not yet initialized"
        return None

    def _cuda_failure(self, host: str, error: str, json_out: Any) -> int:
        print(f"{host}: Test CUDA failure common.cu:941 '{error}'")
        print(f" .. {host} pid {self.pid}: Test failure common.cu:891")
        self._json_close(json_out, {})
        return 2

    # -- numbers -------------------------------------------------------------------------
    def _sizes(self) -> list[int]:
        sizes = []
        size = self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            nxt = size * self.step_factor if self.step_factor > 1 else size + self.step_bytes
            if nxt <= size:
                break
            size = nxt
        return sizes

    def _rows(
        self, hw: dict[str, Any], faults: set[str], host: str, n_ranks: int,
        multinode_busbw: float | None = None,
    ) -> list[dict[str, Any]]:
        """The table. ``multinode_busbw``: the peak a multi-node run's fabric allows (its
        faults already applied); None for a single-node run, which peaks at the node's own."""
        collective, reduces = COLLECTIVES[self.tool]
        type_size = TYPE_SIZES[self.dtype]
        if multinode_busbw is None:
            peak_busbw = float(hw.get("nccl", {}).get("allreduce_busbw_peak_gbps", 100.0))
            if "nccl-low-busbw" in faults:
                peak_busbw *= LOW_BUSBW_FACTOR
            elif "nccl-busbw-drop" in faults:
                peak_busbw *= BUSBW_DROP_FACTOR
            latency = LATENCY_US_NVLINK if hw.get("nvswitch") else LATENCY_US_PCIE
        else:
            peak_busbw = multinode_busbw
            latency = LATENCY_US_NETWORK
        if self.tool == "all_reduce_perf":
            factor = 2.0 * (n_ranks - 1) / n_ranks
        else:
            factor = (n_ranks - 1) / n_ranks
        # The links carry busbw; algbw is what one rank sees, so scale the peak back.
        peak_algbw = peak_busbw / factor if factor > 0 else peak_busbw
        sizes = self._sizes()
        wrong_from = min(WRONG_RESULTS_MIN_BYTES, sizes[-1]) if sizes else 0
        rows = []
        for size in sizes:
            count = size // type_size
            if self.tool != "all_reduce_perf":
                count = count // n_ranks  # per-rank count, as the real tests print
                eff_size = count * n_ranks * type_size
            else:
                eff_size = count * type_size
            redop = self.op if reduces else "none"
            root = -1
            row: dict[str, Any] = {
                "size": eff_size, "count": count, "type": self.dtype, "redop": redop,
                "root": root, "collective": collective,
            }
            for place in ("out_of_place", "in_place"):
                rng = random.Random(f"{host}:{self.tool}:{eff_size}:{place}")
                transfer_us = eff_size / (peak_algbw * 1e3)
                ineff_us = (INEFFICIENCY_BYTES * eff_size) ** 0.5 / (peak_algbw * 1e3)
                usec = (latency + transfer_us + ineff_us) * (1.0 + rng.uniform(-0.015, 0.015))
                algbw = eff_size / 1e9 / (usec / 1e6)
                busbw = algbw * factor
                wrong: int | None = 0
                if not self.datacheck:
                    wrong = None
                elif "nccl-wrong-results" in faults and eff_size >= wrong_from and count:
                    wrong = max(1, count // 4096 + rng.randint(0, 7))
                row[place] = {"time": usec, "alg_bw": algbw, "bus_bw": busbw, "nwrong": wrong}
            rows.append(row)
        return rows

    # -- output --------------------------------------------------------------------------
    def _print_table(
        self,
        rows: list[dict[str, Any]],
        host: str,
        devices: list[tuple[int, str, str, str]],
        json_out: Any,
    ) -> int:
        print("#")
        if self.modern:
            e = ""
            # writeResultHeader() of nccl-tests >= 2.17 (src/util.cu), timestamps off.
            print(
                f"# {e:>10s}  {e:>12s}  {e:>8s}  {e:>6s}  {e:>6s}           out-of-place"
                "                       in-place          "
            )
            print(
                f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  "
                f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}  "
                f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} "
            )
            print(
                f"# {'(B)':>10s}  {'(elements)':>12s}  {e:>8s}  {e:>6s}  {e:>6s}  "
                f"{'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {e:>6s}  "
                f"{'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {e:>6s} "
            )
        else:
            print(CLASSIC_TABLE_HEADER, end="")
        errors = 0
        bw_sum = 0.0
        bw_count = 0
        for row in rows:
            line = (
                f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8s}  "
                f"{row['redop']:>6s}  {row['root']:6d}"
            )
            for place in ("out_of_place", "in_place"):
                res = row[place]
                if self.modern:
                    line += (
                        f"  {_float_str(res['time'], 7)}  {_float_str(res['alg_bw'], 6)}"
                        f"  {_float_str(res['bus_bw'], 6)}"
                    )
                    line += "    N/A" if res["nwrong"] is None else f"  {res['nwrong']:6g}"
                else:
                    line += (
                        f"  {_time_str_classic(res['time'])}  {res['alg_bw']:6.2f}"
                        f"  {res['bus_bw']:6.2f}"
                    )
                    line += f"  {'N/A':>5s}" if res["nwrong"] is None else f"  {res['nwrong']:5g}"
                if res["nwrong"]:
                    errors += 1
                bw_sum += res["bus_bw"]
                bw_count += 1
            print(line)
        avg = bw_sum / bw_count if bw_count else 0.0
        print(f"# {'Out of bounds values':<20s} : {errors} {'FAILED' if errors else 'OK'}")
        print(f"# {'Avg bus bandwidth':<20s} : {avg:g} ")
        print("#")
        if self.modern:
            print(f"# Collective test concluded: {self.tool}")
        print("")
        self._json_close(
            json_out,
            {"rows": rows, "devices": devices, "host": host, "errors": errors, "avg": avg},
        )
        return 1 if errors else 0

    # -- JSON (-J, nccl-tests >= 2.17) ---------------------------------------------------
    def _json_open(self) -> Any:
        assert self.output_file is not None
        path = self.output_file
        try_count = 0
        while True:
            try:
                handle = open(path, "x")  # noqa: SIM115 - closed in _json_close
                break
            except FileExistsError:
                path = f"{self.output_file}.{try_count}"
                try_count += 1
            except OSError:
                print(f"# skipping json output; {path} not accessible")
                return None
        print(f"# Writing JSON output to {path}")
        return {"handle": handle, "start": time.strftime("%Y-%m-%d %H:%M:%S")}

    def _json_close(self, json_out: Any, result: dict[str, Any]) -> None:
        if json_out is None:
            return
        code = NCCL_VERSION[0] * 10000 + NCCL_VERSION[1] * 100 + NCCL_VERSION[2]
        parts = [
            "\"version\":1",
            f"\"start_time\":{_jstr(json_out['start'])}",
            "\"args\":[" + ",".join(_jstr(a) for a in self.argv) + "]",
            "\"env\":[" + ",".join(_jstr(f"{k}={v}") for k, v in os.environ.items()) + "]",
            f"\"nccl_version\":{code}",
        ]
        if "rows" in result:
            step_key = (
                f"\"step_factor\":{self.step_factor}" if self.step_factor > 1
                else f"\"step_bytes\":{self.step_bytes}"
            )
            devices = ",".join(
                "{" + f"\"rank\":{rank},\"group\":0,\"pid\":{self.pid},"
                f"\"hostname\":{_jstr(host)},\"device\":{rank},"
                f"\"device_hex\":{_jstr(hexid)},\"device_info\":{_jstr(name)}" + "}"
                for rank, hexid, name, host in result["devices"]
            )
            parts.append(
                "\"config\":{"
                f"\"nthreads\":{self.n_threads},\"ngpus\":{self.n_gpus},"
                f"\"minimum_bytes\":{self.min_bytes},\"maximum_bytes\":{self.max_bytes},"
                f"{step_key},\"warmup_iters\":{self.warmup},\"iterations\":{self.iters},"
                f"\"aggregated_iterations\":{self.agg_iters},\"validation\":{self.datacheck},"
                f"\"graph\":{self.graph},"
                f"\"blocking_collectives\":{_jstr('true' if self.blocking else 'false')},"
                f"\"parallel_init\":{_jstr('true' if self.parallel_init else 'false')},"
                f"\"devices\":[{devices}]" + "}"
            )
            records = []
            for row in result["rows"]:
                rec = (
                    f"\"size\":{row['size']},\"count\":{row['count']},"
                    f"\"type\":{_jstr(row['type'])},\"redop\":{_jstr(row['redop'])},"
                    f"\"root\":{_jstr(format(row['root'], '6d'))}"
                )
                for place in ("out_of_place", "in_place"):
                    res = row[place]
                    nwrong = "null" if res["nwrong"] is None else _jdouble(float(res["nwrong"]))
                    rec += (
                        f",\"{place}\":{{\"time\":{_jdouble(res['time'])},"
                        f"\"alg_bw\":{_jdouble(res['alg_bw'])},"
                        f"\"bus_bw\":{_jdouble(res['bus_bw'])},\"nwrong\":{nwrong}}}"
                    )
                rec += (
                    f",\"actual_iterations\":{self.iters},"
                    f"\"experiment_name\":{_jstr(row['collective'])}"
                )
                records.append("{" + rec + "}")
            parts.append("\"results\":[" + ",".join(records) + "]")
            errors = result["errors"]
            parts.append(
                f"\"out_of_bounds\":{{\"count\":{errors},"
                f"\"okay\":{_jstr('true' if errors == 0 else 'false')}}}"
            )
            parts.append(
                f"\"average_bus_bandwidth\":{{\"bandwidth\":{_jdouble(result['avg'])},"
                "\"okay\":\"unchecked\"}"
            )
            parts.append("\"errors\":[\"\"]")
        parts.append(f"\"end_time\":{_jstr(time.strftime('%Y-%m-%d %H:%M:%S'))}")
        handle = json_out["handle"]
        handle.write("{" + ",".join(parts) + "}")
        handle.close()


def _mpi_module() -> Any:
    """mpi4py's MPI when Open MPI's launcher started this process (it sets
    OMPI_COMM_WORLD_SIZE for every process it starts), else None: a single-node run needs no
    MPI and the simulator then runs where mpi4py is not installed."""
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return None
    from mpi4py import MPI  # noqa: PLC0415 - only MPI runs need it (python3-mpi4py)

    return MPI


def _present_gpus(hw: dict[str, Any], faults: set[str]) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = list(hw.get("gpus", []))
    return gpus[:-1] if "gpu-missing" in faults and gpus else gpus


def _hang() -> None:
    # The catalogue's tool-hang: the tool never prints and never returns until killed.
    sys.stdout.flush()
    while True:
        time.sleep(3600)


def _exit_now(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _hca_selected(name: str, spec: str) -> bool:
    """NCCL_IB_HCA as NCCL reads it: comma-separated ``name[:port]`` prefixes, ``=`` for
    exact names, a leading ``^`` to exclude the listed ones instead. Empty: every HCA."""
    if not spec:
        return True
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    names = [item.split(":")[0] for item in body.split(",") if item]
    hit = any(name == n if exact else name.startswith(n) for n in names)
    return not hit if exclude else hit


# Faults on the node's RDMA rails (one NIC per GPU, as on HGX nodes): which HCA, and what
# fraction of its rate it carries. A port ibstat shows down carries nothing.
DOWN_PORT_FAULTS = {"ib-port-down": 0, "ib-rail-down": -1}
DEGRADED_FAULT = "ib-link-degraded"


def _rail_fractions(hw: dict[str, Any], faults: set[str], ib_hca: str) -> list[float]:
    """Per HCA of this node, the fraction of its rate it can carry (0: not usable), in
    hardware order; HCAs NCCL_IB_HCA leaves out carry nothing."""
    nics = list(hw.get("nics") or [])
    fractions = [1.0 if _hca_selected(str(n["name"]), ib_hca) else 0.0 for n in nics]
    for fault, index in DOWN_PORT_FAULTS.items():
        if fault in faults and nics:
            fractions[index] = 0.0
    if DEGRADED_FAULT in faults and nics:
        fractions[-1] *= 0.5
    return fractions


def _multinode_peak(hw: dict[str, Any]) -> float:
    nccl = hw.get("nccl", {})
    return float(nccl.get("allreduce_multinode_busbw_peak_gbps")
                 or nccl.get("allreduce_busbw_peak_gbps", 100.0))


def _fabric_busbw(fractions: list[float], peak: float, hw: dict[str, Any]) -> float:
    """The bus bandwidth peak the rails allow, from each rail's usable fraction on the worse
    of its two ends. Each GPU's traffic goes over its own rail (NCCL pairs a GPU with the NIC
    behind its PCIe switch); a GPU whose rail is unusable on either end shares the nearest
    usable rail (same NUMA node first), as NCCL falls back to a farther NIC. NCCL splits the
    data evenly over the GPUs' channels, so the slowest rail per unit of load sets the pace.
    Without any usable rail NCCL falls back to sockets."""
    usable = [i for i, f in enumerate(fractions) if f > 0]
    if not usable:
        return SOCKET_BUSBW_GBPS
    nics = list(hw.get("nics") or [])
    gpus = list(hw.get("gpus") or []) or [{}] * len(fractions)
    load = [0] * len(fractions)
    for index, gpu in enumerate(gpus):
        own = index % len(fractions)
        if own in usable:
            load[own] += 1
            continue
        numa = gpu.get("numa_node")
        same = [i for i in usable if i < len(nics) and nics[i].get("numa_node") == numa]
        candidates = same or usable
        load[min(candidates, key=lambda i: (load[i], abs(i - own)))] += 1
    pace = min(fractions[i] / load[i] for i in usable if load[i])
    return peak * pace


def _pci_parts(bus_id: str) -> tuple[int, int, int]:
    """'00000000:18:00.0' -> (domain, bus, device) as integers."""
    try:
        domain, bus, rest = bus_id.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return 0, 0, 0


def main(argv: list[str]) -> int:
    sim = Sim(argv)
    try:
        sim.parse()
        return sim.run()
    except UsageExit as stop:
        return stop.status
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
