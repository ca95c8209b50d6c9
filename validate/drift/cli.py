"""``python -m validate drift`` and ``python -m validate history``: their arguments and entry
points (validate/cli.py registers them and turns exceptions into exit codes). Light: the
commands themselves (validate/drift/commands.py: check mode, probes, pandas) load when one runs.

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
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes
from validate.drift.model import (
    DEFAULT_CHECKS,
    DEFAULT_NODE_DEADLINE_S,
    DEFAULT_TASK_TIMEOUT_S,
    Layer,
)
from validate.model import DEFAULT_K, DEFAULT_MARGIN, DEFAULT_MIN_RUNS, RUN_KINDS, ExitCode


def _layers(text: str) -> tuple[Layer, ...]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        known = ", ".join(layer.value for layer in Layer)
        raise argparse.ArgumentTypeError(f"{text!r} names no layer (known: {known}); drift "
                                         "that compares nothing would exit 0 and read as none")
    try:
        chosen = {Layer(n) for n in names}
    except ValueError:
        known = ", ".join(layer.value for layer in Layer)
        raise argparse.ArgumentTypeError(f"unknown layer in {text!r} (known: {known})") from None
    return tuple(layer for layer in Layer if layer in chosen)


def _perf_checks(text: str) -> str:
    """``''`` is no performance check (documented); ``,`` names none by mistake."""
    return text if text == "" else argtypes.selection("--perf-checks", "check")(text)


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
    d.add_argument("-l", "--limit", type=argtypes.limit, help="Ansible host pattern")
    d.add_argument("--out", type=argtypes.path, default=default_out,
                   help="reports root directory")
    d.add_argument("--history", type=argtypes.path, action="append", default=[],
                   help="reports root(s) whose runs are the performance history "
                        "(repeatable; default: --out)")
    d.add_argument("--layers", type=_layers, default=tuple(Layer),
                   help="comma-separated layers to compare (default: all)")
    d.add_argument("--perf-checks", type=_perf_checks, default=DEFAULT_CHECKS,
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
    d.add_argument("--textfile", type=argtypes.output_file,
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
    d.set_defaults(handler=cmd_drift)
    h.set_defaults(handler=cmd_history)
    return [d, h]




def cmd_drift(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.layers == (Layer.PERFORMANCE,) and not args.perf_checks:
        stderr.write("error: --layers performance with --perf-checks '' compares nothing; "
                     "name the checks or another layer\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    from validate.drift import commands  # noqa: PLC0415  (lazy: check mode, probes, pandas)

    return commands.cmd_drift(args, stdout, stderr)


def cmd_history(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate.drift import commands  # noqa: PLC0415  (lazy: pandas, pyarrow)

    return commands.cmd_history(args, stdout, stderr)
