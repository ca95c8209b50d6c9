"""Arguments of ``run``, ``fabric``, ``parse``, ``report`` and ``checks``, and their entry points.

Light on purpose: `python -m validate --help`, ``run --help`` and ``parse`` import only this
module (and the pure parsers); a command that runs checks or writes a report imports
validate/run_command.py, with the checks, transports, inventory and report, when it starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes
from validate.model import DEFAULT_NODE_DEADLINE_S, ExitCode
from validate.parsers import (
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
from validate.transport.base import DEFAULT_MAX_OUTPUT_BYTES

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


def add_parsers(sub: Any, default_out: Path) -> list[argparse.ArgumentParser]:
    """Add ``run``, ``fabric``, ``parse``, ``report`` and ``checks`` to ``sub``."""
    r = sub.add_parser("run", help="run checks on the inventory's GPU nodes")
    r.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    r.add_argument("-l", "--limit", type=argtypes.limit, help="Ansible host pattern")
    r.add_argument("--checks", type=argtypes.selection("--checks", "check"),
                   help="comma-separated check ids or patterns (gpu.*)")
    r.add_argument("--out", type=argtypes.path, default=default_out,
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
        default=DEFAULT_NODE_DEADLINE_S,
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
    fb.add_argument("-l", "--limit", type=argtypes.limit, help="Ansible host pattern")
    fb.add_argument("--out", type=argtypes.path, default=default_out,
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
    r.set_defaults(handler=cmd_run)
    fb.set_defaults(handler=cmd_fabric)
    ps.set_defaults(handler=cmd_parse)
    rp.set_defaults(handler=cmd_report)
    ck.set_defaults(handler=cmd_checks)
    return [r, fb, ps, rp, ck]


def cmd_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import run_command  # noqa: PLC0415  (lazy: the whole suite)

    return run_command.cmd_run(args, stdout, stderr)


def cmd_fabric(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import run_command  # noqa: PLC0415  (lazy: the whole suite)

    return run_command.cmd_fabric(args, stdout, stderr)


def cmd_report(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import run_command  # noqa: PLC0415  (lazy: pandas, pyarrow, the report)

    return run_command.cmd_report(args, stdout, stderr)


def cmd_checks(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from validate import checks  # noqa: PLC0415  (lazy: every check module)

    for cid, check in checks.REGISTRY.items():
        stdout.write(f"{cid:20} {check.title}\n")
    for cid, title in checks.MULTI_NODE.items():
        stdout.write(f"{cid:20} {title} (only when --checks names it)\n")
    return ExitCode.OK


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


def cmd_parse(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    text = args.file.read_text(encoding="utf-8", errors="replace")
    result = PARSERS[args.format](text)
    json.dump(to_jsonable(result), stdout, indent=2, default=str)
    stdout.write("\n")
    return ExitCode.OK
