"""storage.fio and storage.checkpoint: disk checks that write only what they create.

Safety rules (the same for both checks):

- Every path handed to a remote tool passes one validator, :func:`remote_path`: absolute,
  normalised, not ``/``, not under /dev, /proc, /sys or /run, and made only of
  ``A-Z a-z 0-9 . _ - / @ % + = , ~``. So no ``:`` (fio splits ``--filename`` on it: a probe
  made fio truncate an existing file outside the scratch directory through one), no
  whitespace, quotes, glob or control characters. The configured path
  (``gpuready_scratch_path`` / ``gpuready_checkpoint_path``, else the profile's ``storage``
  block) is validated here before anything is sent, and again on the node: a block device, a
  non-directory or a symlink is refused.
- Each run creates one new subdirectory ``<path>/gpuready-<check>-<run>-<token>`` with
  ``mkdir`` (which fails if it exists, so nothing pre-existing is ever touched) and writes its
  files only there.
- Before that, scratch directories of earlier runs of the same check are removed: only
  directories (not symlinks) directly under the path, named
  ``gpuready-<check>-<run>-<8 hex digits>``, and last modified longer ago than the check's
  timeout (a run still going cannot be that old: its wall clock would have killed it).
- Free space is checked with ``df`` first (size x 1.1 plus 256 MiB headroom).
- The subdirectory is removed by a shell ``trap`` on exit/INT/TERM/HUP and, because the
  wall-clock kill (SIGKILL) cannot be trapped, again by a separate cleanup command from a local
  ``finally``; what even that misses (the validator itself killed) the next run removes.

storage.fio rows: ``seq_write_mibps``, ``seq_read_mibps`` (1 MiB blocks, QD16) and
``randread_4k_iops`` (QD32), from ``fio --output-format=json``; bands per drive class.
storage.checkpoint rows: ``write_gbps``/``read_gbps`` (value) with seconds in the detail.
Before a figure is judged, the tool's own word is: a dd or fio that exited non-zero is an error
row quoting it, and a figure that cannot be a measurement (dd copied other than the bytes
asked, a step under a millisecond, a rate above the physical ceilings of validate.profiles,
a fio job that moved nothing) is a ``tool.implausible`` error row, never a pass.

Codes: ``storage.fio.<metric>_low``, ``storage.checkpoint.{write,read}_slow``,
``storage.path_refused``, ``storage.no_space``, ``inventory.invalid``, ``tool.exit_nonzero``,
``tool.implausible``.
"""

from __future__ import annotations

import logging
import math
import posixpath
import re
import secrets
import shlex
from collections.abc import Mapping

from validate.checks.base import (
    Check,
    NodeContext,
    ToolFailure,
    Verdict,
    check_result,
    judged,
    parsed,
)
from validate.model import CODE_EXIT, CODE_IMPLAUSIBLE, CODE_PARSE, Status
from validate.parsers import fio
from validate.profiles import CEILING_DD_GBPS, CEILING_FIO_IOPS, CEILING_FIO_MIBPS, Band

LOG = logging.getLogger(__name__)
CODE_PATH_REFUSED = "storage.path_refused"
CODE_INVENTORY = "inventory.invalid"
_FORBIDDEN_ROOTS = ("/dev", "/proc", "/sys", "/run")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._@%+=,~/-]*")
# Exit statuses of the guard script, mapped to codes.
_RC_REFUSED = 65
_RC_NO_SPACE = 67
_TOKEN_GLOB = "[0-9a-f]" * 8


def remote_path(path: object, what: str) -> str:
    """The one validator for every path handed to a remote tool (rules in the module
    docstring); ToolFailure(storage.path_refused) naming ``what`` otherwise."""
    text = path if isinstance(path, str) else ""
    norm = posixpath.normpath(text) if text else ""
    problem = None
    if not isinstance(path, str):
        problem = f"not a string ({type(path).__name__})"
    elif not text.startswith("/") or norm != text.rstrip("/") or norm == "/":
        problem = "need an absolute, normalised directory other than /"
    elif any(norm == r or norm.startswith(r + "/") for r in _FORBIDDEN_ROOTS):
        problem = "under /dev, /proc, /sys or /run"
    elif not _SAFE_PATH.fullmatch(text):
        bad = sorted({c for c in text if not _SAFE_PATH.fullmatch("/" + c) and c != "/"})
        problem = (f"character(s) {''.join(bad)!r} not allowed (only A-Z a-z 0-9 . _ - / @ % + "
                   "= , ~; fio splits file names on ':')")
    if problem:
        raise ToolFailure(CODE_PATH_REFUSED, f"refusing {what} {path!r}: {problem}",
                          Status.ERROR)
    return norm


def safe_base(path: str, what: str = "scratch path") -> str:
    """The validated scratch path, or ToolFailure(storage.path_refused)."""
    return remote_path(path, what)


def work_dir(base: str, check: str, run_id: str) -> str:
    """A fresh subdirectory name under ``base`` for one check on one run."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:40]
    return remote_path(
        posixpath.join(base, f"gpuready-{check}-{tag}-{secrets.token_hex(4)}"), "work directory"
    )


def stale_glob(check: str) -> str:
    """The names of ``check``'s scratch directories (any run), as a find -name pattern."""
    return f"gpuready-{check}-?*-{_TOKEN_GLOB}"


def guarded_script(
    base: str,
    work: str,
    need_mib: int,
    body: list[list[str]],
    stale: tuple[str, float] | None = None,
) -> str:
    """A POSIX sh script: refuse bad paths, remove stale scratch directories (``stale``:
    their find -name pattern and the age in seconds past which they cannot belong to a live
    run), check space, mkdir ``work``, run ``body`` (argv lists, each joined with shlex.join)
    with cleanup on every exit path."""
    q = shlex.quote
    need_kib = int(need_mib * 1024 * 1.1) + 256 * 1024
    lines = [
        "set -u",
        f"base={q(base)}; work={q(work)}; made=0",
        'cleanup() { if [ "$made" = 1 ]; then rm -rf -- "$work"; fi; }',
        "trap cleanup EXIT",
        "trap 'exit 130' INT TERM HUP",
        f'if [ -b "$base" ] || [ -L "$base" ] || [ ! -d "$base" ]; then '
        f'echo "gpuready: refusing $base: not a plain directory" >&2; exit {_RC_REFUSED}; fi',
    ]
    if stale is not None:
        pattern, age_s = stale
        minutes = math.ceil(age_s / 60) + 1
        lines.append(
            f'find "$base" -mindepth 1 -maxdepth 1 -type d -name {q(pattern)} -mmin +{minutes} '
            "-exec sh -c 'for d; do echo \"gpuready: removed stale $d\" >&2; "
            "rm -rf -- \"$d\"; done' sh {} +"
        )
    lines += [
        "avail=$(df -Pk -- \"$base\" | awk 'NR==2 {print $4}')",
        # "! [ -ge ]", not "[ -lt ]": a figure the shell cannot compare must refuse, not pass.
        f'if [ -z "$avail" ] || ! [ "$avail" -ge {need_kib} ] 2>/dev/null; then '
        f'echo "gpuready: $base has ${{avail:-?}} KiB free, need {need_kib}" >&2; '
        f"exit {_RC_NO_SPACE}; fi",
        'mkdir -m 0700 -- "$work" || exit 1',
        "made=1",
    ]
    lines += [shlex.join(argv) + " || exit $?" for argv in body]
    return "\n".join(lines) + "\n"


def _size_mib(ctx: NodeContext, declared: int | None, default: int, what: str) -> int:
    """The inventory's size (checked positive when the inventory was read), else the
    profile's, which must be positive too (ToolFailure(inventory.invalid) naming it)."""
    if declared is not None:
        return declared
    if isinstance(default, bool) or not isinstance(default, int) or default <= 0:
        raise ToolFailure(CODE_INVENTORY, f"host {ctx.node.name}: profile {ctx.profile.name} "
                                          f"{what} must be a positive integer, got {default!r}")
    return default


def _path_source(ctx: NodeContext, declared: str | None, var: str, key: str) -> str:
    return (f"inventory {var} of {ctx.node.name}" if declared is not None
            else f"profile {ctx.profile.name} storage.{key}")


def cleanup_argv(work: str) -> tuple[str, ...]:
    """Removes ``work`` (and only it) if a killed script left it behind."""
    return ("rm", "-rf", "--", work)


def _run_guarded(
    ctx: NodeContext,
    check: str,
    base: str,
    need_mib: int,
    body_for: list[list[str]],
    work: str,
    timeout: float,
    tool: str,
) -> str:
    # work_dir() names the directories after the check's short name (fio, checkpoint).
    stale = (stale_glob(check.removeprefix("storage.")), timeout)
    script = guarded_script(base, work, need_mib, body_for, stale)
    try:
        result = ctx.run(("sh", "-c", script), timeout, cached=False, tool=tool)
        check_result(result, check)
        for line in result.stderr.splitlines():
            if line.startswith("gpuready: removed stale "):
                LOG.warning("%s: %s", ctx.node.name, line.removeprefix("gpuready: "))
        if result.rc == _RC_REFUSED:
            raise ToolFailure(CODE_PATH_REFUSED, result.stderr.strip()[-300:])
        if result.rc == _RC_NO_SPACE:
            raise ToolFailure("storage.no_space", result.stderr.strip()[-300:], Status.FAIL)
        if result.rc != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-300:]
            code = "tool.not_found" if result.rc == 127 else "tool.exit_nonzero"
            raise ToolFailure(code, f"{check} exited {result.rc}: {tail}")
        return result.stdout
    finally:
        # The trap cannot run after SIGKILL; this makes sure nothing stays behind.
        ctx.run(cleanup_argv(work), min(60.0, ctx.default_timeout_s), cached=False)


def fio_argv(path: str, size_mib: int, runtime_s: int, ioengine: str, direct: int) -> list[str]:
    """fio: sequential write, then sequential read, then 4k random read, one after another."""
    return [
        "fio",
        "--output-format=json",
        f"--filename={path}",
        f"--size={size_mib}M",
        f"--ioengine={ioengine}",
        f"--direct={direct}",
        f"--runtime={runtime_s}",
        "--name=seq_write",
        "--rw=write",
        "--bs=1M",
        "--iodepth=16",
        "--name=seq_read",
        "--stonewall",
        "--rw=read",
        "--bs=1M",
        "--iodepth=16",
        "--name=randread_4k",
        "--stonewall",
        "--rw=randread",
        "--bs=4k",
        "--iodepth=32",
    ]


class StorageFio(Check):
    id = "storage.fio"
    title = "Scratch disk bandwidth and IOPS (fio)"
    order = 70

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        p = ctx.profile
        declared = ctx.node.desired.storage
        base = safe_base(p.scratch_path, _path_source(ctx, declared.scratch_path,
                                                      "gpuready_scratch_path", "scratch_path"))
        size = _size_mib(ctx, declared.fio_size_mib, p.value("fio.size_mib", int),
                         "fio.size_mib")
        work = work_dir(base, "fio", ctx.run_id)
        argv = fio_argv(
            remote_path(posixpath.join(work, "fio.dat"), "fio file"),
            size,
            p.value("fio.runtime_s", int, 15),
            p.value("fio.ioengine", str, "libaio"),
            p.value("fio.direct", int, 1),
        )
        out = _run_guarded(
            ctx, self.id, base, size, [argv], work, p.value("fio.timeout_s", float, 240.0), "fio"
        )
        run = parsed(fio.parse_json, out, "fio --output-format=json")
        return judge_fio(run, {m: p.band(f"fio.{m}") for m in FIO_METRICS})


FIO_METRICS = ("seq_write_mibps", "seq_read_mibps", "randread_4k_iops")


def judge_fio(run: fio.FioRun, bands: Mapping[str, Band]) -> list[Verdict]:
    """Rows for the three fio jobs, found by their ``rw`` option (write, read, randread) so
    any job names work; a job fio reports an error for is an error row, and so is one whose
    figure cannot be a measurement (no bytes, no time, above the physical ceiling)."""
    by_rw: dict[str, fio.FioJob] = {}
    for each in run.jobs:
        rw = dict(each.options).get("rw") or dict(run.global_options).get("rw", "")
        by_rw.setdefault(rw, each)
    out = []
    for metric, rw, unit in (
        ("seq_write_mibps", "write", "MiB/s"),
        ("seq_read_mibps", "read", "MiB/s"),
        ("randread_4k_iops", "randread", "IOPS"),
    ):
        job = by_rw.get(rw)
        if job is None:
            raise ToolFailure(CODE_PARSE, f"fio output has no rw={rw} job")
        if job.error:
            raise ToolFailure("tool.exit_nonzero", f"fio job {job.name} failed: error {job.error}")
        io = job.write if rw == "write" else job.read
        value = io.iops if rw == "randread" else io.bw_bytes_per_s / 2**20
        ceiling = CEILING_FIO_IOPS if rw == "randread" else CEILING_FIO_MIBPS
        # A job that moved nothing, or in no time, or faster than any drive array, did not
        # measure the disk (a wrong file, a cache, a broken fio): no figure, an error.
        if io.io_bytes <= 0 or io.runtime_ms <= 0:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"fio job {job.name} moved {io.io_bytes} bytes "
                                                f"in {io.runtime_ms} ms: not a measurement")
        if value > ceiling:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"fio job {job.name} reports {value:.6g} "
                                                f"{unit}, above the {ceiling:g} {unit} one fio "
                                                "job can reach: not a measurement")
        out.append(
            judged(
                metric,
                round(value, 2),
                unit,
                bands[metric],
                f"storage.fio.{metric}_low",
                f"job {job.name}, {run.version}",
            )
        )
    return out


class StorageCheckpoint(Check):
    id = "storage.checkpoint"
    title = "Checkpoint-sized write and read-back"
    order = 75

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        p = ctx.profile
        declared = ctx.node.desired.storage
        base = safe_base(p.checkpoint_path, _path_source(
            ctx, declared.checkpoint_path, "gpuready_checkpoint_path", "checkpoint_path"))
        size = _size_mib(ctx, declared.checkpoint_size_mib, p.value("checkpoint.size_mib", int),
                         "checkpoint.size_mib")
        work = work_dir(base, "checkpoint", ctx.run_id)
        f = remote_path(posixpath.join(work, "checkpoint.bin"), "checkpoint file")
        body = [["sh", "-c", CHECKPOINT_WRITE, "ckpt-write", f, str(size)],
                ["sh", "-c", CHECKPOINT_READ, "ckpt-read", f]]
        out = _run_guarded(
            ctx, self.id, base, size, body, work, p.value("checkpoint.timeout_s", float, 300.0),
            "dd",
        )
        return judge_checkpoint(
            out, size, p.band("checkpoint.write_gbps"), p.band("checkpoint.read_gbps")
        )


# The checkpoint's two steps (sh -c, $1 the file, $2 the size in MiB). Each prints its time,
# exit status and the bytes dd says it copied (its own summary line, "<n> bytes ... copied",
# in the C locale); a dd that failed ends the step with its status and its message, so the
# check is an error row that quotes dd, never a figure. A file size limit (ulimit -f,
# LimitFSIZE=) makes dd fail with "File too large" rather than die from SIGXFSZ without a word.
# /dev/zero is compressible: on compressing filesystems the figure is optimistic.
def _dd_step_end(step: str) -> str:
    """sh that reports one dd step (its ``err``, ``rc``, ``t0``, ``t1``) and ends it with dd's
    status and message when dd failed."""
    return (
        f'echo "{step}_ns=$((t1-t0))"; echo "{step}_rc=$rc"; '
        f'echo "{step}_bytes=$(printf "%s\\n" "$err" | '
        r'sed -n "s/^\([0-9][0-9]*\) bytes.*/\1/p" | tail -n 1)"; '
        f'if [ "$rc" != 0 ]; then printf "dd ({step}) exited %s: %s\\n" "$rc" '
        '"$(printf "%s\\n" "$err" | grep -v -e " records in$" -e " records out$")" >&2; '
        'exit "$rc"; fi'
    )


CHECKPOINT_WRITE = (
    "trap '' XFSZ; export LC_ALL=C; t0=$(date +%s%N); "
    'err=$(dd if=/dev/zero of="$1" bs=1M count="$2" conv=fsync 2>&1); rc=$?; '
    "t1=$(date +%s%N); " + _dd_step_end("write")
)
# O_DIRECT, so that the page cache the write just filled is not measured; a filesystem that
# refuses O_DIRECT (tmpfs) is read through the cache, timed from the second start.
CHECKPOINT_READ = (
    "export LC_ALL=C; t0=$(date +%s%N); "
    'if err=$(dd if="$1" of=/dev/null bs=1M iflag=direct 2>&1); then rc=0; else '
    't0=$(date +%s%N); err=$(dd if="$1" of=/dev/null bs=1M 2>&1); rc=$?; fi; '
    "t1=$(date +%s%N); " + _dd_step_end("read")
)
# Below this a timing is a clock artefact (or no work done), not a measurement.
MIN_ELAPSED_S = 0.001


def judge_checkpoint(
    stdout: str, size_mib: int, write_band: Band, read_band: Band
) -> list[Verdict]:
    """Rows ``write_gbps``/``read_gbps`` (GB/s = 1e9 bytes/s) from the script's timings, once
    each step is shown to be a measurement: dd copied exactly the bytes asked, in at least
    :data:`MIN_ELAPSED_S`, at no more than :data:`~validate.profiles.CEILING_DD_GBPS`; else a
    ``tool.implausible`` error naming what is wrong."""
    found = dict(re.findall(r"^((?:write|read)_(?:ns|bytes|rc))=(-?\d*)$", stdout, re.MULTILINE))
    missing = [k for k in ("write_ns", "write_bytes", "read_ns", "read_bytes") if k not in found
               or (not found[k] and not k.endswith("_bytes"))]
    if missing:
        raise ToolFailure(CODE_PARSE, f"checkpoint {', '.join(missing)} missing in "
                                      f"{stdout.strip()[:200]!r}")
    size_bytes = size_mib * 2**20
    out = []
    for metric, step, band in (
        ("write_gbps", "write", write_band),
        ("read_gbps", "read", read_band),
    ):
        rc = int(found.get(f"{step}_rc") or "0")
        if rc != 0:  # the script exits with it; a caller that kept going still gets no figure
            raise ToolFailure(CODE_EXIT, f"dd ({step}) exited {rc}")
        if not found[f"{step}_bytes"]:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"dd ({step}) exited 0 without saying how many "
                                                "bytes it copied")
        moved, seconds = int(found[f"{step}_bytes"]), int(found[f"{step}_ns"]) / 1e9
        if moved != size_bytes:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"dd ({step}) copied {moved} bytes of the "
                                                f"{size_bytes} asked ({size_mib} MiB)")
        if seconds < MIN_ELAPSED_S:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"dd ({step}) of {size_mib} MiB took "
                                                f"{seconds * 1e3:.3f} ms, under the "
                                                f"{MIN_ELAPSED_S * 1e3:g} ms floor: not a "
                                                "measurement")
        rate = size_bytes / seconds / 1e9
        if rate > CEILING_DD_GBPS:
            raise ToolFailure(CODE_IMPLAUSIBLE, f"dd ({step}) of {size_mib} MiB in "
                                                f"{seconds:.4f} s is {rate:.4g} GB/s, above the "
                                                f"{CEILING_DD_GBPS:g} GB/s one dd can move: not "
                                                "a measurement")
        out.append(
            judged(
                metric,
                round(rate, 3),
                "GB/s",
                band,
                f"storage.checkpoint.{metric.split('_')[0]}_slow",
                f"{size_mib} MiB in {seconds:.2f} s",
            )
        )
    return out


CHECKS: tuple[Check, ...] = (StorageFio(), StorageCheckpoint())
