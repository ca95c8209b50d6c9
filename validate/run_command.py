"""The commands that run checks and write or rewrite a run's report: ``run``, ``fabric`` and
``report`` (their arguments: validate/run_cli.py). Imported only when one of them runs: it loads
the checks, the transports, the inventory and the report (pandas, pyarrow, Ansible, paramiko)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from validate import checks as check_registry
from validate import cost, fabric, runinfo, runner
from validate.errors import CommandFailed, InputError
from validate.history import last_values
from validate.inventory import Node, load
from validate.model import CheckResult, ExitCode
from validate.report import Report, finish_run, write_report
from validate.results import PendingRun, ReportExtras, load_results, start_run, to_frame
from validate.runlog import RUN_LOG, RUN_LOG_FILE


def cmd_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    doing = ["selecting the checks"]
    try:
        return _run(args, stdout, stderr, doing)
    except (InputError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise CommandFailed(f"validate run ({doing[-1]})", exc) from exc


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
    RUN_LOG.open(pending.partial_dir / RUN_LOG_FILE)
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


def cmd_fabric(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.concurrency < 1:
        stderr.write("error: --concurrency must be >= 1\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    nodes = load(args.inventory, args.limit)
    if not nodes:
        stderr.write(f"error: no GPU nodes in {args.inventory} match {args.limit!r}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    _check_fabric_inputs(nodes)
    pending = start_run(args.out, args.run_id, runner.new_run_id)
    RUN_LOG.open(pending.partial_dir / RUN_LOG_FILE)
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


def cmd_report(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    run_dir: Path = args.run_dir
    df = load_results(run_dir, renderable=True)
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
