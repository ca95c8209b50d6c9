"""Arguments of ``python -m validate gate`` and its entry point (the gate: validate/gate.py,
imported when the command runs, not for its help)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes
from validate.model import ExitCode


def add_parsers(sub: Any, default_out: Path) -> list[argparse.ArgumentParser]:
    gt = sub.add_parser("gate", help="label and admit (or keep out) nodes from a validation run")
    gt.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    gt.add_argument("--run", type=argtypes.path, default=default_out / "latest",
                    help="the run directory (default: reports/latest)")
    gt.add_argument("-l", "--limit", type=argtypes.limit, help="Ansible host pattern")
    gt.add_argument("--dry-run", action="store_true", help="print the changes, make none")
    gt.add_argument("--kubeconfig", type=argtypes.path,
                    help="default: the inventory's gpuready_kubeconfig, then KUBECONFIG")
    gt.add_argument("--prefix", help="label prefix (default: gpuready_label_prefix)")
    gt.add_argument("--log", type=argtypes.output_file,
                    help="the gate's log, one JSON line per gate run and release (default: "
                         "gate.log beside the run directory, in the reports root)")
    gt.add_argument("--release", metavar="NODE",
                    help="lift NODE's quarantine (a hardware fault); needs --reason. The node "
                         "stays tainted until a fresh, complete passing run is gated")
    gt.add_argument("--reason", help="why the quarantined node may go back (with --release)")
    gt.set_defaults(handler=cmd_gate)
    return [gt]


def cmd_gate(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import gate  # noqa: PLC0415  (lazy: the inventory, the run's results, the client)

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
