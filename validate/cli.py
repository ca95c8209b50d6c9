"""``python -m validate``: run checks, parse a capture, or render a report again.

One :func:`main` turns every exception into an :class:`~validate.model.ExitCode`; tests call it
in-process with their own streams.

    python -m validate run -i <inventory> [--limit PATTERN] [--checks IDS] [--out DIR]
                           [--concurrency N] [--timeout S] [--accept-unknown-host-keys]
    python -m validate fabric -i <inventory> [--limit PATTERN] [--out DIR] [--concurrency N]
                           multi-node NCCL between node pairs (fabric.nccl_pair) only
    python -m validate parse <format> <file>     parsed records as JSON on stdout
    python -m validate report <run-dir>          rebuild the report files from results
    python -m validate checks                    list check ids
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any, TextIO

from validate import checks as check_registry
from validate import cost, fabric, runner
from validate.inventory import InventoryError, Node, load
from validate.model import CheckResult, ExitCode
from validate.parsers import (
    ParseError,
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
from validate.report import load_results, to_frame, write_report

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
    r.add_argument("-i", "--inventory", required=True, type=Path)
    r.add_argument("-l", "--limit", help="Ansible host pattern")
    r.add_argument("--checks", help="comma-separated check ids or patterns (gpu.*)")
    r.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports root directory")
    r.add_argument("--concurrency", type=int, default=16)
    r.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="default per-command timeout in seconds (benchmarks have their own)",
    )
    r.add_argument("--run-id", help="defaults to the UTC time")
    r.add_argument(
        "--accept-unknown-host-keys",
        action="store_true",
        help="trust host keys missing from known_hosts (never a changed key)",
    )
    fb = sub.add_parser(
        "fabric",
        help="multi-node NCCL between node pairs of each pool (fabric.nccl_pair), suspect/confirm",
    )
    fb.add_argument("-i", "--inventory", required=True, type=Path)
    fb.add_argument("-l", "--limit", help="Ansible host pattern")
    fb.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports root directory")
    fb.add_argument("--concurrency", type=int, default=8, help="pair runs at a time")
    fb.add_argument("--run-id", help="defaults to the UTC time")
    fb.add_argument(
        "--accept-unknown-host-keys",
        action="store_true",
        help="trust host keys missing from known_hosts (never a changed key)",
    )
    ps = sub.add_parser("parse", help="parse a captured tool output and print JSON")
    ps.add_argument("format", choices=sorted(PARSERS))
    ps.add_argument("file", type=Path)
    rp = sub.add_parser("report", help="render a run directory's report again")
    rp.add_argument("run_dir", type=Path)
    ck = sub.add_parser("checks", help="list the check ids")
    for parser in (p, r, fb, ps, rp, ck):
        parser.streams = (stdout, stderr)
    return p


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
    if args.concurrency < 1 or args.timeout <= 0:
        stderr.write("error: --concurrency must be >= 1 and --timeout > 0\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    selected = check_registry.select(args.checks)
    multi_node = check_registry.select_multi_node(args.checks)
    nodes = load(args.inventory, args.limit)
    if not nodes:
        stderr.write(f"error: no GPU nodes in {args.inventory} match {args.limit!r}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    if multi_node:
        _check_fabric_inputs(nodes)
    run_id = args.run_id or runner.new_run_id()
    environment = _environment(nodes)
    stderr.write(f"gpuready run {run_id}: {len(nodes)} nodes x "
                 f"{len(selected) + len(multi_node)} checks"
                 + (f" [{environment}]" if environment else "") + "\n")

    def progress(o: runner.NodeOutcome) -> None:
        failed = f" ({' '.join(o.failed_checks)})" if o.failed_checks else ""
        stderr.write(
            f"[{o.done}/{o.total}] {o.node}: {o.status.value}{failed} {o.duration_s:.1f}s\n"
        )
        stderr.flush()

    accept = bool(args.accept_unknown_host_keys)
    rows = runner.run(
        nodes,
        selected,
        run_id=run_id,
        transport_for=lambda n: runner.default_transport(n, accept),
        concurrency=args.concurrency,
        default_timeout_s=args.timeout,
        progress=progress,
    ) if selected else []
    outcome = None
    if fabric.CHECK_ID in multi_node:
        outcome = _run_fabric(nodes, run_id, accept, max(1, args.concurrency // 2), stderr)
        rows = [*rows, *outcome.rows]
    return _finish(rows, outcome, nodes, args.out, run_id, environment, stdout, stderr)


def _run_fabric(
    nodes: Sequence[Node], run_id: str, accept: bool, concurrency: int, stderr: TextIO
) -> fabric.FabricOutcome:
    """fabric.nccl_pair on ``nodes``, with a progress line per pair run."""

    def progress(r: fabric.PairRun) -> None:
        bw = f" {r.busbw_gbps:g} GB/s" if r.busbw_gbps is not None else ""
        code = "" if r.code == "ok" else f" {r.code}"
        stderr.write(f"[fabric pass {r.pass_no}] {r.launcher} -> {r.peer}: {r.status.value}"
                     f"{code}{bw} {r.duration_s:.1f}s\n")
        stderr.flush()

    return fabric.run_fabric(
        nodes,
        run_id=run_id,
        transport_for=lambda n: runner.default_transport(n, accept),
        concurrency=concurrency,
        accept_unknown_host_keys=accept,
        progress=progress,
    )


def _finish(
    rows: Sequence[CheckResult],
    outcome: fabric.FabricOutcome | None,
    nodes: Sequence[Node],
    out: Path,
    run_id: str,
    environment: str | None,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Write the report with its capacity and cost view (and the fabric pair table); an
    interrupted fabric run still writes what it decided, then exits with the tool-error code."""
    df = to_frame(rows)
    inputs = cost.inputs_from_nodes(nodes)
    for pool_inputs in inputs.values():
        for problem in pool_inputs.errors:
            stderr.write(f"warning: {pool_inputs.pool}: {problem} (no cost computed)\n")
    pools = cost.for_run(df, inputs, out, out / run_id)
    report = write_report(df, out, run_id, environment=environment,
                          extra_markdown=cost.markdown(pools), extra_metrics=cost.prometheus(pools))
    cost.write_files(report.run_dir, inputs, pools)
    if outcome is not None:
        fabric.write_pair_table(report.run_dir, outcome.runs)
        for problem in outcome.leftovers:
            stderr.write(f"warning: fabric run key or directory not removed: {problem} "
                         "(the key expires by itself; remove it by hand)\n")
    stdout.write(f"report: {report.run_dir}\n")
    if outcome is not None and outcome.interrupted:
        stderr.write("interrupted: fabric pair runs stopped, run keys removed\n")
        stdout.write(f"exit: {int(ExitCode.USAGE_OR_TOOL_ERROR)} interrupted\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    stdout.write(f"exit: {int(report.exit_code)} {report.exit_code.name}\n")
    return report.exit_code


def _cmd_fabric(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.concurrency < 1:
        stderr.write("error: --concurrency must be >= 1\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    nodes = load(args.inventory, args.limit)
    if not nodes:
        stderr.write(f"error: no GPU nodes in {args.inventory} match {args.limit!r}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    _check_fabric_inputs(nodes)
    run_id = args.run_id or runner.new_run_id()
    environment = _environment(nodes)
    stderr.write(f"gpuready fabric run {run_id}: {len(nodes)} nodes"
                 + (f" [{environment}]" if environment else "") + "\n")
    # A scheduler's TERM must clean up like Ctrl-C: no run key may stay on a node.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        outcome = _run_fabric(nodes, run_id, bool(args.accept_unknown_host_keys),
                              args.concurrency, stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return _finish(outcome.rows, outcome, nodes, args.out, run_id, environment, stdout, stderr)


def _environment(nodes: Sequence[Node]) -> str | None:
    """The inventory's gpuready_environment label(s) of these nodes, for every page."""
    labels = sorted({str(n.vars["gpuready_environment"]) for n in nodes
                     if n.vars.get("gpuready_environment")})
    return "; ".join(labels) or None


def _check_fabric_inputs(nodes: Sequence[Node]) -> None:
    """Bad fabric inventory variables stop the run before any node is touched."""
    for node in nodes:
        fabric.nccl_env(node)
        fabric.mpi_mca(node)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cmd_parse(args: argparse.Namespace, stdout: TextIO) -> int:
    text = args.file.read_text(encoding="utf-8", errors="replace")
    result = PARSERS[args.format](text)
    json.dump(to_jsonable(result), stdout, indent=2, default=str)
    stdout.write("\n")
    return ExitCode.OK


def _cmd_report(args: argparse.Namespace, stdout: TextIO) -> int:
    run_dir: Path = args.run_dir
    df = load_results(run_dir)
    inputs = cost.read_inputs(run_dir)
    pools = cost.for_run(df, inputs, run_dir.parent, run_dir)
    report = write_report(df, run_dir.parent, run_dir.name, run_dir=run_dir, update_latest=False,
                          extra_markdown=cost.markdown(pools), extra_metrics=cost.prometheus(pools))
    cost.write_files(run_dir, inputs, pools)
    stdout.write(
        f"report: {report.run_dir}\nexit: {int(report.exit_code)} {report.exit_code.name}\n"
    )
    return report.exit_code


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Entry point; returns an ExitCode value and never raises (except SystemExit from a
    caller's own code)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    logging.basicConfig(
        level=logging.WARNING, stream=err, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        args = _build_parser(out, err).parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.cmd == "run":
            return int(_cmd_run(args, out, err))
        if args.cmd == "fabric":
            return int(_cmd_fabric(args, out, err))
        if args.cmd == "parse":
            return int(_cmd_parse(args, out))
        if args.cmd == "report":
            return int(_cmd_report(args, out))
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
    except (InventoryError, ProfileError, check_registry.UnknownCheck) as exc:
        err.write(f"error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except (OSError, ValueError) as exc:
        err.write(f"error: {type(exc).__name__}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
