"""``python -m validate acceptance``: the acceptance Jobs through the cluster's queues.

    python -m validate acceptance -i <inventory> [--pool POOL ...] [--timeout S]
                                  [--checkpoint-mib N] [--kubeconfig FILE] [--out DIR]
                                  [--run-id ID]

Exit codes (validate.model.ExitCode): 0 every pool's Job admitted, run on a validated node and
judged pass; 1 a row failed (not admitted in time, on a node the gate had not admitted, a
figure below the pool's profile); 2 a bad inventory or a Job the server refused; 3 the API
server cannot be reached. The report: ``<out>/<run id>`` (validate/acceptance.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import Any, TextIO

from validate import argtypes

DEFAULT_TIMEOUT_S = 900.0


def add_parsers(sub: Any, default_out: Path) -> list[argparse.ArgumentParser]:
    ac = sub.add_parser("acceptance", help="run each pool's acceptance Job through its team's "
                                           "Kueue queue and report it per node")
    ac.add_argument("-i", "--inventory", required=True, type=argtypes.path)
    ac.add_argument("--pool", action="append", default=[],
                    help="only this pool (inventory group or object name); repeatable")
    ac.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds to wait for every Job, all pools together "
                         f"(default {DEFAULT_TIMEOUT_S:g})")
    ac.add_argument("--checkpoint-mib", type=int, default=None,
                    help="checkpoint size written and read back (default: the rendered Job's)")
    ac.add_argument("--kubeconfig", type=argtypes.path,
                    help="default: the inventory's gpuready_kubeconfig, then KUBECONFIG")
    ac.add_argument("--out", type=Path, default=default_out, help="reports root")
    ac.add_argument("--validation-run", type=Path,
                    help="the validation run whose cost view the acceptance compares with each "
                         "pool's gpuready_cluster_cost_baseline (default: <out>/latest, the "
                         "gate's)")
    ac.add_argument("--run-id")
    ac.set_defaults(handler=cmd_acceptance)
    return [ac]


def cmd_acceptance(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    # Lazy: the inventory (Ansible), the Kubernetes client, the report (pandas).
    from validate import runinfo, runner  # noqa: PLC0415
    from validate.acceptance import CHECKS, LATEST, Acceptance  # noqa: PLC0415
    from validate.cluster import apply  # noqa: PLC0415
    from validate.cluster.render import ACCEPTANCE_CHECKPOINT_MIB  # noqa: PLC0415
    from validate.cluster.spec import load_spec  # noqa: PLC0415
    from validate.inventory import load  # noqa: PLC0415
    from validate.model import ACCEPTANCE, ExitCode  # noqa: PLC0415
    from validate.report import write_report  # noqa: PLC0415
    from validate.results import ReportExtras, point_link, start_run  # noqa: PLC0415

    if args.timeout <= 0 or (args.checkpoint_mib is not None and args.checkpoint_mib < 1):
        stderr.write("error: --timeout and --checkpoint-mib must be positive\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    spec = load_spec(args.inventory)
    nodes = load(args.inventory)
    known = {p.group for p in spec.pools} | {p.name for p in spec.pools}
    unknown = [p for p in args.pool if p not in known]
    if unknown:
        stderr.write(f"error: --pool {', '.join(unknown)}: not a pool of {args.inventory} "
                     f"(pools: {', '.join(p.group for p in spec.pools)})\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    kubeconfig = args.kubeconfig or (Path(spec.kubeconfig).expanduser()
                                     if spec.kubeconfig else None)
    pending = start_run(args.out, args.run_id, runner.new_run_id)
    try:
        api = apply.ClusterApi(kubeconfig)
        run = Acceptance(spec, api, nodes, pending.run_id, pools=args.pool, out=stdout,
                         checkpoint_mib=args.checkpoint_mib or ACCEPTANCE_CHECKPOINT_MIB)
        for group in run.skipped:
            stdout.write(f"acceptance: {group}: no team has quota there: nothing to run\n")
        if not run.runs:
            stderr.write("error: no pool to run the acceptance on (no team has quota on the "
                         "selected pools)\n")
            _discard(pending.partial_dir)
            return ExitCode.USAGE_OR_TOOL_ERROR
        stdout.write(f"acceptance run {pending.run_id} on {api.server}: "
                     f"{len(run.runs)} pool(s), waiting up to {args.timeout:g} s\n")
        # The inventory's environment label heads every page (the lab's says SIMULATED).
        environment = "; ".join(sorted({n.desired.environment for n in nodes
                                        if n.desired.environment})) or None
        info = runinfo.start(run_id=pending.run_id, environment=environment,
                             inventory=args.inventory,
                             limit=",".join(args.pool) or None,
                             checks_requested="acceptance", checks=list(CHECKS),
                             nodes=nodes, run_kind=ACCEPTANCE)
        run.capacity, run.capacity_note = _cost_view(args.validation_run
                                                     or args.out / "latest")
        run.preflight()
        run.submit()
        if not run.wait(args.timeout):
            stdout.write(f"acceptance: not every Job finished within {args.timeout:g} s\n")
        run.collect()
        rows = run.rows()
    except apply.ApiUnavailable as exc:
        stderr.write(f"error: {exc}\n")
        _discard(pending.partial_dir)
        return ExitCode.UNREACHABLE
    except apply.ApplyError as exc:
        stderr.write(f"error: {exc}\n")
        _discard(pending.partial_dir)
        return ExitCode.USAGE_OR_TOOL_ERROR
    info = dataclasses.replace(info, finished=runinfo.now_utc())
    report = write_report(rows, pending.out_root, pending.run_id, build_dir=pending.partial_dir,
                          update_latest=False, run_info=info,
                          extras=ReportExtras(metrics=run.metrics()))
    point_link(pending.out_root / LATEST, report.run_dir.name)
    for row in rows:
        if row.status.value != "pass":
            stdout.write(f"  {row.node} {row.check} {row.metric}: {row.status.value} "
                         f"({row.code}) {row.detail}\n")
    stdout.write(f"report: {report.run_dir}\nexit: {int(report.exit_code)} "
                 f"{report.exit_code.name}\n")
    return report.exit_code



def _discard(partial: Path) -> None:
    """The reserved run directory of a run that wrote nothing (the Jobs it submitted, named on
    stdout, stay on the cluster)."""
    with contextlib.suppress(OSError):
        partial.rmdir()


def _cost_view(run_dir: Path) -> tuple[Any, str]:
    """validate.cost's view of the validation run in ``run_dir`` by pool, and how to name the
    run; None and why when there is none to read."""
    from validate import cost, runinfo  # noqa: PLC0415
    from validate.errors import InputError  # noqa: PLC0415
    from validate.results import load_results  # noqa: PLC0415

    if not (run_dir / "results.parquet").is_file():
        return None, f"no validation run at {run_dir}"
    resolved = run_dir.resolve()
    kind = runinfo.run_kind(resolved)
    if kind != "validation":
        return None, f"{run_dir} is a {kind} run, not a validation run"
    try:
        df = load_results(resolved)
        info = runinfo.read_run_info(resolved)
        pools = cost.for_run(df, cost.read_inputs(resolved), resolved.parent, resolved,
                             info.profiles if info else ())
    except (InputError, OSError, ValueError) as exc:
        return None, f"the validation run {resolved.name} could not be read: {exc}"
    return {p.pool: p for p in pools}, f"validation run {resolved.name}"
