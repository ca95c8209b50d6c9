"""nccl.allreduce: single-node all_reduce_perf over all GPUs, repeated.

Each repeat runs ``all_reduce_perf -b S -e S -g <gpus> -c 1`` at the profile's fixed large size
(``-c 1`` checks results, so ``#wrong`` is meaningful) with its own timeout. Rows:
``busbw_gbps`` (median out-of-place bus bandwidth at the largest size over the repeats, judged
against ``nccl.allreduce_busbw_gbps``) and ``wrong_results`` (sum of ``#wrong`` plus
out-of-bounds values; any is a fail). An exit status of 1 is read as nccl-tests' "wrong
results" only when the table shows some; otherwise it is the tool's failure (an error row), as
is a bus bandwidth above the physical ceiling. Codes: ``nccl.allreduce.low_busbw``,
``nccl.allreduce.wrong_results``, ``nccl.allreduce.incomplete``, ``tool.exit_nonzero``,
``tool.implausible``.
"""

from __future__ import annotations

import statistics

from validate.checks.base import Check, NodeContext, ToolFailure, Verdict, judged, parsed
from validate.model import CODE_EXIT, CODE_IMPLAUSIBLE, Status
from validate.parsers import ParseError, nccl
from validate.profiles import CEILING_BUSBW_GBPS, Band


def allreduce_argv(size_bytes: int, gpus: int, iters: int, warmup: int) -> tuple[str, ...]:
    """The all_reduce_perf command line for one repeat."""
    return (
        "all_reduce_perf",
        "-b",
        str(size_bytes),
        "-e",
        str(size_bytes),
        "-f",
        "2",
        "-g",
        str(gpus),
        "-c",
        "1",
        "-n",
        str(iters),
        "-w",
        str(warmup),
    )


class NcclAllreduce(Check):
    id = "nccl.allreduce"
    title = "NCCL all-reduce bus bandwidth (single node)"
    order = 80

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        p = ctx.profile
        argv = allreduce_argv(
            p.value("nccl.size_bytes", int),
            p.hardware.gpu_count,
            p.value("nccl.iters", int, 20),
            p.value("nccl.warmup_iters", int, 5),
        )
        timeout = p.value("nccl.timeout_s", float, 600.0)
        runs = []
        for _ in range(p.value("nccl.repeats", int, 3)):
            # Not cached: each repeat is a new measurement. nccl-tests exits 1 when it found
            # wrong results but still prints the whole table: that is a verdict, not a tool
            # failure. Exit 1 without a table (a CUDA or NCCL error) stays a tool failure.
            result = ctx.output(argv, timeout, cached=False, ok_rcs=(0, 1))
            if result.rc == 0:
                runs.append(parsed(nccl.parse_text, result.stdout, "all_reduce_perf"))
                continue
            try:
                run = nccl.parse_text(result.stdout)
            except ParseError as exc:
                raise ToolFailure(CODE_EXIT, f"all_reduce_perf exited 1: {exc.reason}") from None
            if not _wrong_values(run):
                # nccl-tests exits 1 for wrong results; without any, the tool itself failed
                # (a rank crashed after the table, an error at teardown): not a measurement.
                tail = (result.stderr.strip() or result.stdout.strip())[-300:]
                raise ToolFailure(CODE_EXIT, "all_reduce_perf exited 1 but reported no wrong "
                                             f"results: {tail}")
            runs.append(run)
        return judge_allreduce(runs, p.band("nccl.allreduce_busbw_gbps"))


def _wrong_values(run: nccl.NcclRun) -> int:
    """``#wrong`` over every row plus the out-of-bounds count."""
    wrong = sum(res.wrong for row in run.rows for res in (row.out_of_place, row.in_place)
                if res is not None and res.wrong)
    return wrong + (run.out_of_bounds or 0)


def judge_allreduce(runs: list[nccl.NcclRun], band: Band) -> list[Verdict]:
    """Median busbw at the largest size across ``runs``, and the wrong-result count. A bus
    bandwidth above :data:`~validate.profiles.CEILING_BUSBW_GBPS` is not a measurement."""
    busbws: list[float] = []
    wrong = 0
    for run in runs:
        if not run.rows:
            raise ToolFailure("nccl.allreduce.incomplete", "all_reduce_perf printed no results")
        largest = max(run.rows, key=lambda r: r.size_bytes)
        result = largest.out_of_place or largest.in_place
        if result is None:
            raise ToolFailure("nccl.allreduce.incomplete", "no result at the largest size")
        if result.busbw_gbps > CEILING_BUSBW_GBPS:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"all_reduce_perf reports {result.busbw_gbps:g} "
                                                f"GB/s bus bandwidth, above the "
                                                f"{CEILING_BUSBW_GBPS:g} GB/s any GPU "
                                                "interconnect carries: not a measurement")
        busbws.append(result.busbw_gbps)
        wrong += _wrong_values(run)
    median = statistics.median(busbws)
    size = max(r.size_bytes for r in runs[0].rows)
    detail = f"size {size} B, repeats {', '.join(f'{b:g}' for b in busbws)} GB/s"
    wrong_v = Verdict(
        "wrong_results",
        Status.FAIL if wrong else Status.PASS,
        "nccl.allreduce.wrong_results" if wrong else "ok",
        f"{wrong} wrong/out-of-bounds values" if wrong else "",
        float(wrong),
        "count",
        None,
        0.0,
    )
    return [judged("busbw_gbps", median, "GB/s", band, "nccl.allreduce.low_busbw", detail), wrong_v]


CHECKS: tuple[Check, ...] = (NcclAllreduce(),)
