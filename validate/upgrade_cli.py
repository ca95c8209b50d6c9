"""Arguments of ``python -m validate upgrade`` (plan, drain, mark, finish) and its entry point;
the roll's Kubernetes side is validate/upgrade.py, imported when a verb runs (``upgrade mark``
runs several times per node in a roll: it loads the inventory and the client, never pandas)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes

UPGRADING, VALIDATING, FAILED = "upgrading", "validating", "failed"
MARKABLE = (UPGRADING, VALIDATING, FAILED)
DEFAULT_DRAIN_TIMEOUT_S = 600.0
MAX_DRAIN_TIMEOUT_S = 24 * 3600.0


def serial_arg(text: str) -> str:
    number = text[:-1] if text.endswith("%") else text
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    percent = text.endswith("%")
    if not (math.isfinite(value) and value > 0
            and (value <= 100 if percent else value == int(value))):
        raise argparse.ArgumentTypeError(
            f"must be a whole number of nodes or a percentage up to 100%, not {text!r}")
    return text


def add_parsers(sub: Any, default_out: Path) -> list[argparse.ArgumentParser]:
    up = sub.add_parser("upgrade", help="the Kubernetes side of a rolling upgrade: plan, drain, "
                                        "mark, finish (playbooks/upgrade.yml)")
    verbs = up.add_subparsers(dest="upgrade_cmd", required=True)
    made = [up]
    for verb, text in (("plan", "which nodes differ from their pins, in batches, with the "
                                "pods each drain would evict; writes nothing"),
                       ("drain", "record the state, cordon, taint and evict the node's pods"),
                       ("mark", "record a node's upgrade state"),
                       ("finish", "uncordon a node the gate admitted; record done")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("-i", "--inventory", required=True, type=argtypes.path)
        p.add_argument("--kubeconfig", type=argtypes.path,
                       help="default: the inventory's gpuready_kubeconfig, then KUBECONFIG")
        p.add_argument("--prefix", help="label prefix (default: gpuready_label_prefix)")
        if verb == "plan":
            p.add_argument("-l", "--limit", type=argtypes.limit, help="Ansible host pattern")
            p.add_argument("--serial", type=serial_arg, default="1",
                           help="nodes per batch: a count or a percentage (default 1)")
            p.add_argument("--format", choices=("text", "json"), default="text")
            p.add_argument("--timeout", type=argtypes.seconds(argtypes.MAX_COMMAND_TIMEOUT_S),
                           default=60.0, help="per-probe timeout in seconds")
            p.add_argument("--concurrency", type=argtypes.count(1, argtypes.MAX_CONCURRENCY),
                           default=16)
            p.add_argument("--accept-unknown-host-keys", action="store_true",
                           help="trust host keys missing from known_hosts (never a changed key)")
        else:
            p.add_argument("--node", required=True, help="the inventory host")
        if verb == "drain":
            p.add_argument("--timeout", type=argtypes.seconds(MAX_DRAIN_TIMEOUT_S),
                           default=DEFAULT_DRAIN_TIMEOUT_S,
                           help="seconds to keep asking refused evictions (default %(default)g)")
            p.add_argument("--force", action="store_true",
                           help="evict bare pods too (no controller recreates them), as "
                                "kubectl drain --force (gpuready_upgrade_drain_force)")
            p.add_argument("--delete-emptydir-data", action="store_true",
                           help="evict pods with emptyDir volumes too (their data is lost), as "
                                "kubectl drain --delete-emptydir-data "
                                "(gpuready_upgrade_drain_delete_emptydir_data)")
            p.add_argument("--force-delete", action="store_true",
                           help="delete the pods still there at the timeout (PDBs or not)")
            p.add_argument("--dry-run", action="store_true", help="say what, change nothing")
        if verb == "mark":
            p.add_argument("--state", required=True, choices=MARKABLE)
            p.add_argument("--detail", default="")
        made.append(p)
    up.set_defaults(handler=cmd_upgrade)
    return made


def cmd_upgrade(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import upgrade  # noqa: PLC0415  (lazy: the inventory, probes and the client)

    return upgrade.cmd_upgrade(args, stdout, stderr)
