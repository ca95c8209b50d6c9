"""``python -m validate cluster``: render the cluster's manifests, or apply them.

    python -m validate cluster render -i <inventory> -o DIR
    python -m validate cluster apply -i <inventory> [--check] [--kubeconfig FILE]

Exit codes (validate.model.ExitCode): 0 done (``--check``: whatever it would change), 2 a bad
inventory (nothing rendered or applied), a cluster that lacks the CRDs or holds an object of the
same name that is not gpuready's (nothing applied), the API server refusing a request (403:
named with what to do) or answering what was not asked for (validate/kube_response.py), 3 the
API server cannot be reached or does not accept the credentials (401).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes
from validate.model import ExitCode


def add_parsers(sub: Any, default_out: Path) -> list[argparse.ArgumentParser]:
    cl = sub.add_parser("cluster", help="the cluster's manifests (GPU Operator, Kueue, teams) "
                                        "from the inventory: render or apply")
    verbs = cl.add_subparsers(dest="cluster_cmd", required=True)
    rd = verbs.add_parser("render", help="write the manifests and the operator's Helm values")
    rd.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    rd.add_argument("-o", "--out", required=True, type=Path, help="directory to write")
    ap = verbs.add_parser("apply", help="server-side apply, prune what gpuready owns and the "
                                        "inventory no longer declares")
    ap.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    ap.add_argument("--check", action="store_true",
                    help="the server's dry run (dryRun=All) with a diff; nothing is changed")
    ap.add_argument("--kubeconfig", type=argtypes.path,
                    help="default: the inventory's gpuready_kubeconfig, then KUBECONFIG")
    cl.set_defaults(handler=cmd_cluster)
    return [cl, rd, ap]


def cmd_cluster(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    # Lazy: the inventory (Ansible), the renderer and the Kubernetes client.
    from validate.cluster import apply, render  # noqa: PLC0415
    from validate.cluster.spec import load_spec  # noqa: PLC0415

    spec = load_spec(args.inventory)
    if args.cluster_cmd == "render":
        files = render.write(spec, args.out)
        stdout.write(f"cluster: rendered {len(files)} file(s) into {args.out}: "
                     f"{len(spec.pools)} pool(s), {len(spec.teams)} team(s); "
                     f"{apply.CONTROLLERS_NOTE}\n")
        return ExitCode.OK
    kubeconfig = args.kubeconfig or (Path(spec.kubeconfig).expanduser()
                                     if spec.kubeconfig else None)
    try:
        api = apply.ClusterApi(kubeconfig)
        mode = "check (server dry run, nothing changed)" if args.check else "apply"
        stdout.write(f"cluster: {mode} on {api.server} as field manager "
                     f"{apply.FIELD_MANAGER}\n")
        summary = apply.run(spec, api, check=args.check, out=stdout)
    except apply.ApiUnavailable as exc:
        stderr.write(f"error: {exc}\n")
        return ExitCode.UNREACHABLE
    except apply.ApplyError as exc:
        stderr.write(f"error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    would = "would be " if args.check else ""
    stdout.write(f"cluster: {summary.created} {would}created, {summary.configured} "
                 f"{would}configured, {summary.deleted} {would}deleted, {summary.unchanged} "
                 f"unchanged; {apply.CONTROLLERS_NOTE}\n")
    return ExitCode.OK
