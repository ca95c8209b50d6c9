"""``python -m validate drift`` and ``history`` at work (their arguments: validate/drift/cli.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import runner
from validate.drift.model import FindingStatus, Layer
from validate.drift.run import DriftOptions, run_drift
from validate.history import BaselineSettings, fleet_table, node_series, parse_figure, summarise
from validate.model import ExitCode
from validate.runlog import RUN_LOG, RUN_LOG_FILE
from validate.text import one_line


def _open_run_log(run_dir: Path) -> None:
    RUN_LOG.open(run_dir / RUN_LOG_FILE)


def _settings(args: argparse.Namespace) -> BaselineSettings:
    return BaselineSettings(k=args.baseline_runs, min_runs=args.min_runs, margin=args.margin)


def cmd_drift(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``validate drift``; the run's log (``run.log``: warnings and paramiko's records,
    validate/runlog.py) opens in its directory once that is reserved."""
    opts = DriftOptions(
        inventory=args.inventory, out=args.out, limit=args.limit,
        history=tuple(args.history), layers=args.layers, perf_checks=args.perf_checks,
        baseline=_settings(args), concurrency=args.concurrency, timeout_s=args.timeout,
        node_deadline_s=args.node_deadline, check_timeout_s=args.check_timeout,
        check_task_timeout_s=args.check_task_timeout, forks=args.forks,
        textfile=args.textfile, keep_days=args.keep_days, run_id=args.run_id,
        accept_unknown_host_keys=bool(args.accept_unknown_host_keys),
        kubeconfig=args.kubeconfig)

    def say(msg: str) -> None:
        stderr.write(f"gpuready drift: {msg}\n")
        stderr.flush()

    control = runner.RunControl()
    # Every SIGINT/SIGTERM asks the run to stop; the stop itself is bounded (the probes'
    # connections are aborted, check mode's process group killed), so a second signal need
    # not abandon the Ansible children.
    with runner.stop_on_signals(control, second_stops_at_once=False):
        result = run_drift(opts, progress=say, control=control, on_reserved=_open_run_log)
    drift = result.table[result.table["status"] == FindingStatus.DRIFT.value]
    # A finding's values are the node's (a version string, a label someone set): each stays
    # on its line, its control characters escaped (validate/text.py).
    for r in drift.itertuples(index=False):
        stdout.write(f"DRIFT {_s(r.node)} {_s(r.layer)} {_s(r.item)}: declared "
                     f"{_s(r.declared)}, actual {_s(r.actual)} (since {_s(r.since)})\n")
    notes = result.table[result.table["status"] == FindingStatus.NOTE.value]
    for r in notes.itertuples(index=False):
        stdout.write(f"NOTE {_s(r.node)} {_s(r.layer)} {_s(r.item)}: {_s(r.actual)}; "
                     f"{_s(r.detail)}\n")
    if result.labels_unavailable:
        stdout.write(f"NOT COMPARED labels and taints: {_s(result.labels_unavailable)}\n")
    else:  # per node: no validation run of it, or one the gate would not act on
        unseen = result.table[(result.table["layer"] == Layer.LABELS.value)
                              & (result.table["status"] == FindingStatus.UNAVAILABLE.value)]
        for r in unseen.itertuples(index=False):
            stdout.write(f"NOT COMPARED {_s(r.node)} {_s(r.layer)}: {_s(r.detail)}\n")
    if result.interrupted:
        stdout.write("INTERRUPTED: a partial drift report\n")
    stdout.write(f"report: {result.run_dir}\n")
    if result.pruned:
        stdout.write(f"removed {len(result.pruned)} drift runs older than "
                     f"{args.keep_days:g} days\n")
    stdout.write(f"exit: {int(result.exit_code)} {result.exit_code.name}\n")
    return result.exit_code


def _s(value: object) -> str:
    return one_line(str(value))


def _emit(df: pd.DataFrame, fmt: str, stdout: TextIO) -> None:
    if fmt == "csv":
        df.to_csv(stdout, index=False)
    elif fmt == "json":
        json.dump(json.loads(df.to_json(orient="records")), stdout, indent=1)
        stdout.write("\n")
    else:
        stdout.write(df.to_string(index=False) + "\n" if not df.empty else "(no rows)\n")


def cmd_history(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    settings = _settings(args)
    figures = [parse_figure(args.figure)] if args.figure else None
    kinds = None if args.kind == "all" else (args.kind,)
    if not args.node:
        _emit(fleet_table(args.root, settings, figures, kinds), args.format, stdout)
        return ExitCode.OK
    series = node_series(args.root, args.node, figures, kinds=kinds)
    if series.empty:
        stderr.write(f"error: no figures of node {args.node!r} under {args.root}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    summary = summarise(series, settings)
    if args.figure:
        _emit(series[["run_id", "run_kind", "time", "value", "status"]], args.format, stdout)
        if args.format == "table":
            s = summary.iloc[0]
            base = "none" if pd.isna(s["baseline"]) else f"{s['baseline']:g}"
            change = ("never" if s["last_change_run"] is None or pd.isna(s["last_change_run"])
                      else f"{s['last_change_run']}: {s['last_change_from']:g} -> "
                           f"{s['last_change_to']:g}")
            stdout.write(f"baseline (median of last {int(s['baseline_runs'])} passing runs "
                         f"before the latest): {base}; latest {s['latest']:g}; "
                         f"last change: {change}\n")
        return ExitCode.OK
    _emit(summary, args.format, stdout)
    return ExitCode.OK
