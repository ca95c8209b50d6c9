"""``python -m validate drift`` and ``python -m validate history``: their arguments and commands
(validate/cli.py registers them and turns exceptions into exit codes).

    python -m validate drift -i <inventory> [--limit PATTERN] [--out DIR] [--history DIR ...]
        [--layers configuration,versions,runtime,labels,performance] [--perf-checks IDS]
        [--baseline-runs K] [--min-runs N] [--margin F] [--textfile PATH] [--keep-days N]
        [--timeout S] [--node-deadline S] [--check-task-timeout S] [--check-timeout S]
        [--kubeconfig FILE] [--run-id ID]
    python -m validate history <reports root> [--node NODE] [--figure F] [--baseline-runs K]
        [--min-runs N] [--margin F] [--kind all|validation|drift] [--format table|csv|json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate import argtypes, runner
from validate.drift.config import DEFAULT_TASK_TIMEOUT_S
from validate.drift.model import FindingStatus, Layer
from validate.drift.performance import DEFAULT_CHECKS
from validate.drift.run import DEFAULT_NODE_DEADLINE_S, DriftOptions, run_drift
from validate.history import (
    DEFAULT_K,
    DEFAULT_MARGIN,
    DEFAULT_MIN_RUNS,
    BaselineSettings,
    fleet_table,
    node_series,
    parse_figure,
    summarise,
)
from validate.model import ExitCode
from validate.runinfo import RUN_KINDS


def _layers(text: str) -> tuple[Layer, ...]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    try:
        chosen = {Layer(n) for n in names}
    except ValueError:
        known = ", ".join(layer.value for layer in Layer)
        raise argparse.ArgumentTypeError(f"unknown layer in {text!r} (known: {known})") from None
    return tuple(layer for layer in Layer if layer in chosen)


def _baseline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline-runs", type=argtypes.count(1, 10_000), default=DEFAULT_K,
                   metavar="K",
                   help=f"baseline = median of the last K passing runs (default {DEFAULT_K})")
    p.add_argument("--min-runs", type=argtypes.count(1, 10_000), default=DEFAULT_MIN_RUNS,
                   metavar="N",
                   help=f"passing runs needed for a baseline (default {DEFAULT_MIN_RUNS})")
    p.add_argument("--margin", type=argtypes.fraction, default=DEFAULT_MARGIN,
                   help="fraction below the baseline that counts as drift (default "
                        f"{DEFAULT_MARGIN}; the inventory's gpuready_drift_margins sets it "
                        "per figure)")


def add_parsers(sub: Any, default_out: Path) -> list[Any]:
    """Add the two subcommands to ``sub`` (argparse subparsers); returns the new parsers."""
    d = sub.add_parser("drift", help="read-only drift check of the inventory's GPU nodes")
    d.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    d.add_argument("-l", "--limit", help="Ansible host pattern")
    d.add_argument("--out", type=argtypes.path, default=default_out,
                   help="reports root directory")
    d.add_argument("--history", type=argtypes.path, action="append", default=[],
                   help="reports root(s) whose runs are the performance history "
                        "(repeatable; default: --out)")
    d.add_argument("--layers", type=_layers, default=tuple(Layer),
                   help="comma-separated layers to compare (default: all)")
    d.add_argument("--perf-checks", default=DEFAULT_CHECKS,
                   help=f"checks of the performance layer (default {DEFAULT_CHECKS}; "
                        "'' for none)")
    _baseline_args(d)
    d.add_argument("--concurrency", type=argtypes.count(1, argtypes.MAX_CONCURRENCY), default=16)
    d.add_argument("--timeout", type=argtypes.seconds(argtypes.MAX_COMMAND_TIMEOUT_S),
                   default=60.0,
                   help="per-command timeout of the probes in seconds; a node that does not "
                        "answer the first probe within it is given up (default %(default)g)")
    d.add_argument("--node-deadline", type=argtypes.seconds(argtypes.MAX_NODE_DEADLINE_S),
                   default=DEFAULT_NODE_DEADLINE_S,
                   help="seconds all of one node's probes and performance checks may take; "
                        "then its connection is aborted (host.deadline) (default %(default)g)")
    d.add_argument("--check-task-timeout",
                   type=argtypes.count(1, int(argtypes.MAX_COMMAND_TIMEOUT_S)),
                   default=DEFAULT_TASK_TIMEOUT_S,
                   help="seconds one check-mode task may take on one node; a node that does "
                        "not answer within it is an error row and check mode goes on with the "
                        "others (default %(default)d)")
    d.add_argument("--check-timeout", type=argtypes.count(1, int(argtypes.MAX_NODE_DEADLINE_S)),
                   default=3600,
                   help="wall-clock limit of the whole check-mode run in seconds")
    d.add_argument("--kubeconfig", type=argtypes.path,
                   help="for the labels layer (default: the inventory's gpuready_kubeconfig, "
                        "then KUBECONFIG / ~/.kube/config), as the gate reads it")
    d.add_argument("--forks", type=argtypes.count(1, argtypes.MAX_CONCURRENCY),
                   help="Ansible forks for the check-mode run")
    d.add_argument("--textfile", type=argtypes.path,
                   help="also write the Prometheus metrics here, atomically (node_exporter's "
                        "textfile collector directory)")
    d.add_argument("--keep-days", type=argtypes.days(36_500),
                   help="remove drift runs under --out that finished more than N days ago")
    d.add_argument("--run-id", help="the run directory's name under --out (default: <UTC "
                                    "time>-drift-<random>); letters, digits, '.', '_', '-'; "
                                    "never reused")
    d.add_argument("--accept-unknown-host-keys", action="store_true",
                   help="trust host keys missing from known_hosts (never a changed key)")
    h = sub.add_parser("history", help="a node's figures over past runs, or the fleet's "
                                       "latest values against their baselines")
    h.add_argument("root", type=argtypes.path,
                   help="reports root (the directory holding run dirs)")
    h.add_argument("--node", help="one node: its figures' baseline and last change")
    h.add_argument("--figure", help="only this figure (nccl_busbw_gbps or CHECK:METRIC); with "
                                    "--node, its whole series")
    h.add_argument("--kind", choices=("all", *RUN_KINDS), default="all",
                   help="read validation runs, drift runs, or both (run.json's run_kind; "
                        "default: %(default)s)")
    _baseline_args(h)
    h.add_argument("--format", choices=("table", "csv", "json"), default="table")
    return [d, h]


def _settings(args: argparse.Namespace) -> BaselineSettings:
    return BaselineSettings(k=args.baseline_runs, min_runs=args.min_runs, margin=args.margin)


def cmd_drift(args: argparse.Namespace, stdout: TextIO, stderr: TextIO,
              run_log: Callable[[Path], None] | None = None) -> int:
    """``validate drift``; ``run_log`` opens the run's log (``run.log``: warnings and
    paramiko's records, validate/cli.py) in its directory once that is reserved."""
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
        result = run_drift(opts, progress=say, control=control, on_reserved=run_log)
    drift = result.table[result.table["status"] == FindingStatus.DRIFT.value]
    for r in drift.itertuples(index=False):
        stdout.write(f"DRIFT {r.node} {r.layer} {r.item}: declared {r.declared}, "
                     f"actual {r.actual} (since {r.since})\n")
    if result.labels_unavailable:
        stdout.write(f"NOT COMPARED labels and taints: {result.labels_unavailable}\n")
    else:  # per node: no validation run of it, or one the gate would not act on
        unseen = result.table[(result.table["layer"] == Layer.LABELS.value)
                              & (result.table["status"] == FindingStatus.UNAVAILABLE.value)]
        for r in unseen.itertuples(index=False):
            stdout.write(f"NOT COMPARED {r.node} {r.layer}: {r.detail}\n")
    if result.interrupted:
        stdout.write("INTERRUPTED: a partial drift report\n")
    stdout.write(f"report: {result.run_dir}\n")
    if result.pruned:
        stdout.write(f"removed {len(result.pruned)} drift runs older than "
                     f"{args.keep_days:g} days\n")
    stdout.write(f"exit: {int(result.exit_code)} {result.exit_code.name}\n")
    return result.exit_code


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
