"""``python -m validate``: run checks, parse a capture, or render a report again.

One :func:`main` turns every exception into an :class:`~validate.model.ExitCode`: a known
failure is one line naming it, an unexpected one is one line naming what failed and the
exception (exit 2, never a traceback exit 1, which playbooks read as "a check failed"). Tests
call it in-process with their own streams; a closed or broken stream never stops a run.

    python -m validate run -i <inventory> [--limit PATTERN] [--checks IDS] [--out DIR]
                           [--concurrency N] [--timeout S] [--node-deadline S]
                           [--ssh-timeout S] [--max-output-mib N] [--run-id ID]
                           [--accept-unknown-host-keys]
                           (run.log in the run directory keeps warnings and paramiko's log)
    python -m validate fabric -i <inventory> [--limit PATTERN] [--out DIR] [--concurrency N]
                           multi-node NCCL between node pairs (fabric.nccl_pair) only
    python -m validate parse <format> <file>     parsed records as JSON on stdout
    python -m validate report <run-dir>          rebuild the report files from results
    python -m validate checks                    list check ids
    python -m validate gate -i <inventory> [--run DIR] [--dry-run]   label and admit nodes
                                                 (validate/gate.py)
    python -m validate gate -i <inventory> --release NODE --reason TEXT   end a quarantine
    python -m validate drift -i <inventory> ...  read-only drift check (validate/drift/cli.py)
    python -m validate history <reports root>    figures over past runs, against baselines
    python -m validate cluster render -i <inventory> -o DIR   the cluster's manifests
    python -m validate cluster apply -i <inventory> [--check]  server-side apply and prune
                                                 (validate/cluster/, docs/cluster.md)
    python -m validate upgrade plan|drain|mark|finish -i <inventory> ...   a rolling
                                                 upgrade's Kubernetes side (validate/upgrade.py)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, cast

from validate import argtypes, cost, fabric, gate, runinfo, runner, upgrade
from validate import checks as check_registry
from validate.cluster import cli as cluster_cli
from validate.drift import cli as drift_cli
from validate.history import HistoryError, last_values
from validate.inventory import InventoryError, Node, load
from validate.model import CheckResult, ExitCode
from validate.parsers import (
    ParseError,
    containerd_config,
    dpkg_query,
    fio,
    ibstat,
    nccl,
    nvidia_smi_csv,
    nvidia_smi_nvlink,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvidia_smi_xml,
    xid,
)
from validate.profiles import ProfileError
from validate.report import Report, finish_run, write_report
from validate.results import (
    PendingRun,
    ReportExtras,
    RunDirError,
    load_results,
    start_run,
    to_frame,
)
from validate.transport import DEFAULT_MAX_OUTPUT_BYTES

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "reports"

PARSERS: dict[str, Callable[[str], Any]] = {
    nvidia_smi_xml.FORMAT: nvidia_smi_xml.parse,
    nvidia_smi_q.FORMAT: nvidia_smi_q.parse,
    nvidia_smi_csv.FORMAT: nvidia_smi_csv.parse_query_gpu,
    nvidia_smi_topo.FORMAT: nvidia_smi_topo.parse,
    nvidia_smi_nvlink.FORMAT: nvidia_smi_nvlink.parse,
    nccl.FORMAT: nccl.parse_text,
    nccl.JSON_FORMAT: nccl.parse_json,
    fio.FORMAT: fio.parse_json,
    ibstat.FORMAT: ibstat.parse_report,
    ibstat.IBSTATUS_FORMAT: ibstat.parse_ibstatus,
    xid.FORMAT: xid.parse,
    dpkg_query.FORMAT: dpkg_query.parse,
    containerd_config.FORMAT: containerd_config.parse_runtimes,
}


class _UsageError(Exception):
    """argparse wanted to exit; carries its status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse that writes to the injected streams and raises instead of exiting."""

    streams: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            self.streams[1].write(message)
        raise _UsageError(status)

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (self.streams[0] if file is None or file is sys.stdout else self.streams[1]).write(
                message
            )


def _build_parser(stdout: TextIO, stderr: TextIO) -> _Parser:
    p = _Parser(prog="python -m validate", description="gpuready GPU node validators")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run checks on the inventory's GPU nodes")
    r.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    r.add_argument("-l", "--limit", help="Ansible host pattern")
    r.add_argument("--checks", help="comma-separated check ids or patterns (gpu.*)")
    r.add_argument("--out", type=argtypes.path, default=DEFAULT_OUT,
                   help="reports root directory")
    r.add_argument("--concurrency", type=argtypes.count(1, argtypes.MAX_CONCURRENCY), default=16)
    r.add_argument(
        "--timeout",
        type=argtypes.seconds(argtypes.MAX_COMMAND_TIMEOUT_S),
        default=60.0,
        help="default per-command timeout in seconds (benchmarks have their own)",
    )
    r.add_argument(
        "--node-deadline",
        type=argtypes.seconds(argtypes.MAX_NODE_DEADLINE_S),
        default=runner.DEFAULT_NODE_DEADLINE_S,
        help="seconds one node may take in all; then its remaining checks are not run "
        "(host.deadline) (default: %(default)g)",
    )
    r.add_argument(
        "--ssh-timeout",
        type=argtypes.seconds(argtypes.MAX_STEP_TIMEOUT_S),
        default=10.0,
        help="seconds each step of the SSH conversation may take: connect, banner, key "
        "exchange, authentication, channel open, exec request, keepalive answer; also how "
        "long `true` may take when a command nears its timeout: a node that answers neither "
        "has stopped answering (host.unresponsive) (default: %(default)g)",
    )
    r.add_argument(
        "--max-output-mib",
        type=argtypes.mib(argtypes.MAX_OUTPUT_MIB),
        default=DEFAULT_MAX_OUTPUT_BYTES / 2**20,
        help="output one command may print (stdout and stderr together) before it is killed "
        "and its check is an error (default: %(default)g)",
    )
    r.add_argument(
        "--run-id",
        help="the run directory's name under --out (default: UTC time and a random suffix); "
        "letters, digits, '.', '_', '-'; never reused",
    )
    r.add_argument(
        "--accept-unknown-host-keys",
        action="store_true",
        help="trust host keys missing from known_hosts (never a changed key)",
    )
    fb = sub.add_parser(
        "fabric",
        help="multi-node NCCL between node pairs of each pool (fabric.nccl_pair), suspect/confirm",
    )
    fb.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    fb.add_argument("-l", "--limit", help="Ansible host pattern")
    fb.add_argument("--out", type=argtypes.path, default=DEFAULT_OUT,
                    help="reports root directory")
    fb.add_argument("--concurrency", type=argtypes.count(1, argtypes.MAX_CONCURRENCY), default=8,
                    help="pair runs at a time")
    fb.add_argument("--run-id", help="defaults to the UTC time")
    fb.add_argument(
        "--accept-unknown-host-keys",
        action="store_true",
        help="trust host keys missing from known_hosts (never a changed key)",
    )
    ps = sub.add_parser("parse", help="parse a captured tool output and print JSON")
    ps.add_argument("format", choices=sorted(PARSERS))
    ps.add_argument("file", type=argtypes.path)
    rp = sub.add_parser("report", help="render a run directory's report again")
    rp.add_argument("run_dir", type=argtypes.path)
    ck = sub.add_parser("checks", help="list the check ids")
    gt = sub.add_parser("gate", help="label and admit (or keep out) nodes from a validation run")
    gt.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    gt.add_argument("--run", type=argtypes.path, default=DEFAULT_OUT / "latest",
                    help="the run directory (default: reports/latest)")
    gt.add_argument("-l", "--limit", help="Ansible host pattern")
    gt.add_argument("--dry-run", action="store_true", help="print the changes, make none")
    gt.add_argument("--kubeconfig", type=argtypes.path,
                    help="default: the inventory's gpuready_kubeconfig, then KUBECONFIG")
    gt.add_argument("--prefix", help="label prefix (default: gpuready_label_prefix)")
    gt.add_argument("--log", type=argtypes.path,
                    help="the gate's log, one JSON line per gate run and release (default: "
                         "gate.log beside the run directory, in the reports root)")
    gt.add_argument("--release", metavar="NODE",
                    help="lift NODE's quarantine (a hardware fault); needs --reason. The node "
                         "stays tainted until a fresh, complete passing run is gated")
    gt.add_argument("--reason", help="why the quarantined node may go back (with --release)")
    for parser in (p, r, fb, ps, rp, ck, gt, *drift_cli.add_parsers(sub, DEFAULT_OUT),
                   *cluster_cli.add_parsers(sub), *upgrade.add_parsers(sub)):
        parser.streams = (stdout, stderr)
    return p


RUN_LOG_FILE = "run.log"


class _RunLog(logging.Handler):
    """The run's log file (``run.log`` in its run directory): warnings of the suite and
    everything paramiko logs. paramiko logs a traceback for each peer that does not speak SSH
    (22 lines per host), from its own threads; those belong in the run's record, not on the
    terminal, which shows the rows. Between runs (and before a run has its directory) records
    are dropped here; the suite's own warnings still reach stderr through the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"))
        self._file: TextIO | None = None

    def open(self, path: Path) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self.close_file()
            with contextlib.suppress(OSError):  # an unwritable log must not stop the run
                self._file = path.open("a", encoding="utf-8")

    def close_file(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            return
        try:
            self._file.write(self.format(record) + "\n")
            self._file.flush()
        except (OSError, ValueError):  # a full disk loses the log line, not the run
            pass


_RUN_LOG = _RunLog()


def _route_logs() -> None:
    """paramiko's records go to the run's log only; the suite's to stderr and the run's log."""
    library = logging.getLogger("paramiko")
    library.propagate = False
    for logger in (library, logging.getLogger()):
        if _RUN_LOG not in logger.handlers:
            logger.addHandler(_RUN_LOG)


class _Failed(Exception):
    """An unexpected exception, with what the command was doing when it came."""

    def __init__(self, doing: str, exc: BaseException) -> None:
        super().__init__(f"{doing} failed: {type(exc).__name__}: {exc}")


def to_jsonable(obj: Any) -> Any:
    """Parser records (frozen dataclasses, tuples, datetimes, enums) as JSON-ready data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def _cmd_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    doing = ["selecting the checks"]
    try:
        return _run(args, stdout, stderr, doing)
    except (InventoryError, ProfileError, check_registry.UnknownCheck, RunDirError, OSError,
            KeyboardInterrupt, _UsageError):
        raise
    except Exception as exc:
        raise _Failed(f"validate run ({doing[-1]})", exc) from exc


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, doing: list[str]) -> int:
    selected = check_registry.select(args.checks)
    multi_node = check_registry.select_multi_node(args.checks)
    doing.append("reading the inventory")
    nodes = load(args.inventory, args.limit)
    if not nodes:
        stderr.write(f"error: no GPU nodes in {args.inventory} match {args.limit!r}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    if multi_node:
        _check_fabric_inputs(nodes)
    # Before the first connection: an unusable --out must not cost a fleet's worth of checks.
    doing.append(f"reserving the run directory in {args.out}")
    pending = start_run(args.out, args.run_id, runner.new_run_id)
    _RUN_LOG.open(pending.partial_dir / RUN_LOG_FILE)
    run_id = pending.run_id
    environment = _environment(nodes)
    stderr.write(f"gpuready run {run_id}: {len(nodes)} nodes x "
                 f"{len(selected) + len(multi_node)} checks"
                 + (f" [{environment}]" if environment else "") + "\n")
    stderr.write(f"rows are appended to {pending.rows_file} as each node finishes\n")
    stderr.flush()

    def progress(o: runner.NodeOutcome) -> None:
        failed = f" ({' '.join(o.failed_checks)})" if o.failed_checks else ""
        stderr.write(
            f"[{o.done}/{o.total}] {o.node}: {o.status.value}{failed} {o.duration_s:.1f}s\n"
        )
        stderr.flush()

    info = runinfo.start(run_id=run_id, environment=environment, inventory=args.inventory,
                         limit=args.limit, checks_requested=args.checks,
                         checks=[*(c.id for c in selected), *multi_node], nodes=nodes)
    keep = _keeper(pending, stderr)
    accept = bool(args.accept_unknown_host_keys)
    max_output = int(args.max_output_mib * 2**20)
    control = runner.RunControl()
    doing.append("running the checks")
    started = time.monotonic()
    outcome: fabric.FabricOutcome | None = None
    try:
        rows: list[CheckResult] = []
        if selected:
            with runner.stop_on_signals(control):
                rows = runner.run(
                    nodes,
                    selected,
                    run_id=run_id,
                    transport_for=lambda n: runner.default_transport(
                        n, accept, step_timeout_s=args.ssh_timeout, max_output_bytes=max_output
                    ),
                    concurrency=args.concurrency,
                    default_timeout_s=args.timeout,
                    node_deadline_s=args.node_deadline,
                    probe_timeout_s=args.ssh_timeout,
                    progress=progress,
                    on_node_done=keep,
                    control=control,
                    previous=_previous(args.out, selected, nodes, stderr),
                )
        if fabric.CHECK_ID in multi_node and not control.interrupted:
            doing.append("running the fabric pair checks")
            outcome = _run_fabric(nodes, run_id, accept, max(1, args.concurrency // 2), stderr)
            keep(None, list(outcome.rows))
            rows = [*rows, *outcome.rows]
            if outcome.interrupted:
                control.interrupt("SIGINT/SIGTERM during the fabric pair checks")
        elapsed = time.monotonic() - started
        if control.interrupted:
            stderr.write(f"interrupted by {control.reason}: queued nodes not started, running "
                         "ones stopped; writing a partial report\n")
        stderr.write(f"gpuready run {run_id}: {len(nodes)} nodes done in {elapsed:.1f} s\n")
        stderr.flush()
        doing.append("writing the report")
        info = dataclasses.replace(info, finished=runinfo.now_utc())
        report = finish_run(pending, rows, environment=environment, interrupted=control.interrupted,
                                run_info=info, extras=_extras(rows, nodes, pending, info,
                                                              outcome, stderr))
    except KeyboardInterrupt:
        pending.close()
        stderr.write(f"interrupted: the rows of finished nodes are in {pending.rows_file}; "
                     f"render them with: python -m validate report {pending.partial_dir}\n")
        return ExitCode.INTERRUPTED
    return _print_result(report, stdout)


def _keeper(pending: PendingRun, stderr: TextIO) -> Callable[[Node | None, list[CheckResult]],
                                                             None]:
    """Append each node's rows durably as it finishes; a failed append warns once (the rows
    stay in memory for the report)."""
    failed: list[str] = []

    def keep(node: Node | None, rows: list[CheckResult]) -> None:
        try:
            pending.append(rows)
        except OSError as exc:
            if not failed:
                failed.append(str(exc))
                stderr.write(f"warning: cannot append rows to {pending.rows_file}: {exc}\n")

    return keep


def _print_result(report: Report, stdout: TextIO) -> int:
    stdout.write(f"report: {report.run_dir}\n")
    code = ExitCode.INTERRUPTED if report.interrupted else report.exit_code
    stdout.write(f"exit: {int(code)} {code.name}\n")
    return code


def _previous(out: Path, selected: Sequence[check_registry.Check], nodes: Sequence[Node],
              stderr: TextIO) -> dict[str, dict[tuple[str, str], tuple[float, str]]]:
    """Each node's previous values for the checks that judge growth since the last run (the
    run history under ``out``). A history that cannot be read is said and judged as none:
    the checks then read this run as a first one."""
    wanting = [c.id for c in selected if c.wants_history]
    if not wanting:
        return {}
    try:
        return last_values(out, wanting, {n.name for n in nodes})
    except Exception as exc:  # a damaged history must not stop a validation
        logging.getLogger(__name__).warning("run history under %s not read: %s", out, exc)
        stderr.write(f"warning: run history under {out} not read ({type(exc).__name__}); "
                     f"{', '.join(wanting)} judge this run as a first one\n")
        return {}


def _run_fabric(
    nodes: Sequence[Node], run_id: str, accept: bool, concurrency: int, stderr: TextIO
) -> fabric.FabricOutcome:
    """fabric.nccl_pair on ``nodes``, with a progress line per pair run. SIGINT and SIGTERM
    interrupt it at once (a scheduler's TERM must clean up like Ctrl-C): run_fabric stops,
    removes every run key and directory, and returns what was decided."""

    def progress(r: fabric.PairRun) -> None:
        bw = f" {r.busbw_gbps:g} GB/s" if r.busbw_gbps is not None else ""
        code = "" if r.code == "ok" else f" {r.code}"
        stderr.write(f"[fabric pass {r.pass_no}] {r.launcher} -> {r.peer}: {r.status.value}"
                     f"{code}{bw} {r.duration_s:.1f}s\n")
        stderr.flush()

    with _signals_interrupt():
        outcome = fabric.run_fabric(
            nodes,
            run_id=run_id,
            transport_for=lambda n: runner.default_transport(n, accept),
            concurrency=concurrency,
            accept_unknown_host_keys=accept,
            progress=progress,
        )
    for problem in outcome.leftovers:
        stderr.write(f"warning: fabric run key or directory not removed: {problem} "
                     "(the key expires by itself; remove it by hand)\n")
    if outcome.interrupted:
        stderr.write("interrupted: fabric pair runs stopped, run keys removed\n")
    return outcome


def _extras(rows: Sequence[CheckResult], nodes: Sequence[Node], pending: PendingRun,
            info: runinfo.RunInfo, outcome: fabric.FabricOutcome | None,
            stderr: TextIO) -> ReportExtras:
    """The capacity and cost view of the run (and the fabric pair table) for its report, GPUs
    counted by the profiles its run.json records (``info``)."""
    inputs = cost.inputs_from_nodes(nodes)
    for pool_inputs in inputs.values():
        for problem in pool_inputs.errors:
            stderr.write(f"warning: {pool_inputs.pool}: {problem} (no cost computed)\n")
    extras = cost.report_extras(to_frame(rows), inputs, pending.out_root,
                                pending.out_root / pending.run_id, info.profiles)
    if outcome is None:
        return extras
    runs = outcome.runs
    write_cost = extras.write_files

    def write_files(target: Path) -> None:
        if write_cost is not None:
            write_cost(target)
        fabric.write_pair_table(target, runs)

    return dataclasses.replace(extras, write_files=write_files)


def _signals_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread while this is active."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return runner.on_signals(handler)


def _cmd_fabric(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.concurrency < 1:
        stderr.write("error: --concurrency must be >= 1\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    nodes = load(args.inventory, args.limit)
    if not nodes:
        stderr.write(f"error: no GPU nodes in {args.inventory} match {args.limit!r}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    _check_fabric_inputs(nodes)
    pending = start_run(args.out, args.run_id, runner.new_run_id)
    _RUN_LOG.open(pending.partial_dir / RUN_LOG_FILE)
    run_id = pending.run_id
    environment = _environment(nodes)
    stderr.write(f"gpuready fabric run {run_id}: {len(nodes)} nodes"
                 + (f" [{environment}]" if environment else "") + "\n")
    info = runinfo.start(run_id=run_id, environment=environment, inventory=args.inventory,
                         limit=args.limit, checks_requested=fabric.CHECK_ID,
                         checks=[fabric.CHECK_ID], nodes=nodes)
    outcome = _run_fabric(nodes, run_id, bool(args.accept_unknown_host_keys),
                          args.concurrency, stderr)
    _keeper(pending, stderr)(None, list(outcome.rows))
    info = dataclasses.replace(info, finished=runinfo.now_utc())
    report = finish_run(pending, list(outcome.rows), environment=environment,
                            interrupted=outcome.interrupted, run_info=info,
                            extras=_extras(outcome.rows, nodes, pending, info, outcome,
                                           stderr))
    return _print_result(report, stdout)


def _environment(nodes: Sequence[Node]) -> str | None:
    """The inventory's gpuready_environment label(s) of these nodes, for every page."""
    labels = sorted({n.desired.environment for n in nodes if n.desired.environment})
    return "; ".join(labels) or None


def _check_fabric_inputs(nodes: Sequence[Node]) -> None:
    """Bad fabric inventory variables stop the run before any node is touched."""
    for node in nodes:
        fabric.nccl_env(node)
        fabric.mpi_mca(node)


def _cmd_gate(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.release is None:
        if args.reason is not None:
            stderr.write("error: --reason goes with --release NODE\n")
            return ExitCode.USAGE_OR_TOOL_ERROR
        return gate.cmd_gate(args.inventory, args.run, limit=args.limit, dry_run=args.dry_run,
                             kubeconfig=args.kubeconfig, prefix=args.prefix, stdout=stdout,
                             stderr=stderr, log=args.log)
    if args.reason is None:
        stderr.write("error: --release needs --reason TEXT (why the node may go back)\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    if args.limit is not None:
        stderr.write("error: --release names its node; --limit does not apply\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    return gate.cmd_release(args.inventory, args.release, args.reason, run_dir=args.run,
                            dry_run=args.dry_run, kubeconfig=args.kubeconfig,
                            prefix=args.prefix, stdout=stdout, stderr=stderr, log=args.log)


def _cmd_parse(args: argparse.Namespace, stdout: TextIO) -> int:
    text = args.file.read_text(encoding="utf-8", errors="replace")
    result = PARSERS[args.format](text)
    json.dump(to_jsonable(result), stdout, indent=2, default=str)
    stdout.write("\n")
    return ExitCode.OK


def _cmd_report(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    run_dir: Path = args.run_dir
    df = load_results(run_dir)
    # run.json makes the re-render the run's own (run id, environment label, profiles).
    info = runinfo.read_run_info(run_dir)
    if info is None:
        stderr.write(
            f"note: {run_dir} has no {runinfo.RUN_INFO_FILE}: rendered without the run's "
            "environment label, inventory and profiles\n"
        )
    # The capacity and cost view from the inputs and profiles the run recorded
    # (capacity_inputs.json, run.json); a run rendered without the view (no such file) is
    # rendered again without it.
    inputs = cost.read_inputs(run_dir)
    extras = (cost.report_extras(df, inputs, run_dir.parent, run_dir,
                                 info.profiles if info else ()) if inputs is not None
              else None)
    report = write_report(
        df,
        run_dir.parent,
        info.run_id if info else run_dir.name,
        run_dir=run_dir,
        update_latest=False,
        run_info=info,
        extras=extras,
    )
    stdout.write(
        f"report: {report.run_dir}\nexit: {int(report.exit_code)} {report.exit_code.name}\n"
    )
    return report.exit_code


class _ReaderSafe(io.TextIOBase):
    """An output stream whose write/flush never raise: a reader that went away (``python -m
    validate parse ... | head``), a closed stderr or a stream that is None (the process started
    with fd 1/2 closed) ends the output, not the command. A ``run`` whose progress reader goes
    away still writes its report and returns its own exit code."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__()
        self._stream = stream
        self.reader_gone = stream is None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.reader_gone and self._stream is not None:
            try:
                self._stream.write(text)
            except (OSError, ValueError):  # BrokenPipeError, or a closed file
                self.reader_gone = True
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone and self._stream is not None:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.reader_gone = True

    def release(self) -> None:
        """Flush; if the reader has gone, point the file descriptor at /dev/null, so that the
        interpreter's own flush at exit has nowhere to fail (Python's documented recipe for
        SIGPIPE, see the ``signal`` module docs)."""
        self.flush()
        if not self.reader_gone or self._stream is None:
            return
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):  # in-memory or closed: nothing to do
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
        finally:
            os.close(devnull)


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Entry point; returns an ExitCode value and never raises (except SystemExit from a
    caller's own code). A reader that goes away ends the output, not the command."""
    # sys.stdout/sys.stderr are None when the process started with fd 1/2 closed.
    out = _ReaderSafe(stdout or sys.stdout)
    err = _ReaderSafe(stderr or sys.stderr)
    try:
        return _dispatch(argv, cast(TextIO, out), cast(TextIO, err))
    finally:
        out.release()
        err.release()


def _dispatch(argv: Sequence[str] | None, stdout: TextIO, stderr: TextIO) -> int:
    out = stdout
    err = stderr
    logging.basicConfig(
        level=logging.WARNING, stream=err, format="%(levelname)s %(name)s: %(message)s"
    )
    _route_logs()
    try:
        args = _build_parser(out, err).parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.cmd == "run":
            return int(_cmd_run(args, out, err))
        if args.cmd == "fabric":
            return int(_cmd_fabric(args, out, err))
        if args.cmd == "parse":
            return int(_cmd_parse(args, out))
        if args.cmd == "report":
            return int(_cmd_report(args, out, err))
        if args.cmd == "gate":
            return int(_cmd_gate(args, out, err))
        if args.cmd == "drift":
            return int(drift_cli.cmd_drift(
                args, out, err, run_log=lambda d: _RUN_LOG.open(d / RUN_LOG_FILE)))
        if args.cmd == "history":
            return int(drift_cli.cmd_history(args, out, err))
        if args.cmd == "cluster":
            return int(cluster_cli.cmd_cluster(args, out, err))
        if args.cmd == "upgrade":
            return int(upgrade.cmd_upgrade(args, out, err))
        for cid, check in check_registry.REGISTRY.items():
            out.write(f"{cid:20} {check.title}\n")
        for cid, title in check_registry.MULTI_NODE.items():
            out.write(f"{cid:20} {title} (only when --checks names it)\n")
        return ExitCode.OK
    except _UsageError as exc:
        return ExitCode.OK if exc.status == 0 else ExitCode.USAGE_OR_TOOL_ERROR
    except ParseError as exc:
        err.write(f"parse error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except (InventoryError, ProfileError, check_registry.UnknownCheck, RunDirError,
            HistoryError, _Failed) as exc:
        err.write(f"error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except (OSError, ValueError) as exc:
        err.write(f"error: {type(exc).__name__}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        # A bug: one line that names it, exit 2 (a traceback's exit 1 reads as "a check failed").
        cmd = " ".join(str(a) for a in (argv if argv is not None else sys.argv[1:])[:1])
        err.write(f"error: internal error in 'validate {cmd}': {type(exc).__name__}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    finally:
        _RUN_LOG.close_file()
