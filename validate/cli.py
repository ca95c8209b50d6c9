"""``python -m validate``: run checks, parse a capture, or render a report again.

One :func:`main` turns every exception into an :class:`~validate.model.ExitCode`: a known
failure is one line naming it, an unexpected one is one line naming what failed and the
exception (exit 2, never a traceback exit 1, which playbooks read as "a check failed"). Tests
call it in-process with their own streams; a closed or broken stream never stops a run.

This module only dispatches. Each command family registers its own subcommands from a light
module (``FAMILIES``) and imports what it needs when it runs, so `--help`, ``gate --help`` or
``upgrade mark`` never load pandas, pyarrow or matplotlib (tests/unit/validate/test_cli_imports.py
keeps it so; bench/cli_startup.py measures it).

    python -m validate run -i <inventory> [--limit PATTERN] [--checks IDS] [--out DIR]
                           [--concurrency N] [--timeout S] [--node-deadline S]
                           [--ssh-timeout S] [--max-output-mib N] [--run-id ID]
                           [--accept-unknown-host-keys]
                           (run.log in the run directory keeps warnings and paramiko's log)
    python -m validate fabric -i <inventory> [--limit PATTERN] [--out DIR] [--concurrency N]
                           multi-node NCCL between node pairs (fabric.nccl_pair) only
    python -m validate parse <format> <file>     parsed records as JSON on stdout
    python -m validate report <run-dir>          rebuild the report files from results
    python -m validate checks                    list check ids
    python -m validate gate -i <inventory> [--run DIR] [--dry-run]   label and admit nodes
                                                 (validate/gate.py)
    python -m validate gate -i <inventory> --release NODE --reason TEXT   end a quarantine
    python -m validate drift -i <inventory> ...  read-only drift check (validate/drift/cli.py)
    python -m validate history <reports root>    figures over past runs, against baselines
    python -m validate cluster render -i <inventory> -o DIR   the cluster's manifests
    python -m validate cluster apply -i <inventory> [--check]  server-side apply and prune
                                                 (validate/cluster/, docs/cluster.md)
    python -m validate upgrade plan|drain|mark|finish -i <inventory> ...   a rolling
                                                 upgrade's Kubernetes side (validate/upgrade.py)
    python -m validate acceptance -i <inventory> [--pool POOL] [--timeout S]   the acceptance
                                                 Jobs through Kueue (validate/acceptance.py)
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO, cast

from validate.errors import InputError
from validate.model import ExitCode
from validate.parsers import ParseError
from validate.runlog import RUN_LOG, route_logs
from validate.text import printable

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "reports"
# The modules that register the command families, in the order `--help` lists them. Each has
# ``add_parsers(sub, default_out) -> [parser, ...]`` and sets ``handler(args, stdout, stderr)``
# on its parsers; each is light (argparse and constants) and loads its command's code in the
# handler.
FAMILIES = (
    "validate.run_cli",  # run, fabric, parse, report, checks
    "validate.gate_cli",  # gate
    "validate.drift.cli",  # drift, history
    "validate.cluster.cli",  # cluster render|apply
    "validate.upgrade_cli",  # upgrade plan|drain|mark|finish
    "validate.acceptance_cli",  # acceptance
)


class _UsageError(Exception):
    """argparse wanted to exit; carries its status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse that writes to the injected streams and raises instead of exiting."""

    streams: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            self.streams[1].write(message)
        raise _UsageError(status)

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (self.streams[0] if file is None or file is sys.stdout else self.streams[1]).write(
                message
            )


def _build_parser(stdout: TextIO, stderr: TextIO) -> _Parser:
    p = _Parser(prog="python -m validate", description="gpuready GPU node validators")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    made: list[Any] = [p]
    for family in FAMILIES:
        made += importlib.import_module(family).add_parsers(sub, DEFAULT_OUT)
    for parser in made:
        parser.streams = (stdout, stderr)
    return p


class _ReaderSafe(io.TextIOBase):
    """An output stream whose write/flush never raise: a reader that went away (``python -m
    validate parse ... | head``), a closed stderr or a stream that is None (the process started
    with fd 1/2 closed) ends the output, not the command. A ``run`` whose progress reader goes
    away still writes its report and returns its own exit code.

    Everything written is escaped (validate/text.py): a control character an operator typed or
    a peer sent (a release reason, a Node's annotation, a version string, an API server's error
    page) is shown, never acted on by the terminal. Only newline and tab pass; the commands
    escape those too inside a value they print within a line."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__()
        self._stream = stream
        self.reader_gone = stream is None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.reader_gone and self._stream is not None:
            try:
                self._stream.write(printable(text))
            except (OSError, ValueError):  # BrokenPipeError, or a closed file
                self.reader_gone = True
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone and self._stream is not None:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.reader_gone = True

    def release(self) -> None:
        """Flush; if the reader has gone, point the file descriptor at /dev/null, so that the
        interpreter's own flush at exit has nowhere to fail (Python's documented recipe for
        SIGPIPE, see the ``signal`` module docs)."""
        self.flush()
        if not self.reader_gone or self._stream is None:
            return
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):  # in-memory or closed: nothing to do
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
        finally:
            os.close(devnull)


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Entry point; returns an ExitCode value and never raises (except SystemExit from a
    caller's own code). A reader that goes away ends the output, not the command."""
    # sys.stdout/sys.stderr are None when the process started with fd 1/2 closed.
    out = _ReaderSafe(stdout or sys.stdout)
    err = _ReaderSafe(stderr or sys.stderr)
    try:
        return _dispatch(argv, cast(TextIO, out), cast(TextIO, err))
    finally:
        out.release()
        err.release()


def _dispatch(argv: Sequence[str] | None, stdout: TextIO, stderr: TextIO) -> int:
    out = stdout
    err = stderr
    logging.basicConfig(
        level=logging.WARNING, stream=err, format="%(levelname)s %(name)s: %(message)s"
    )
    route_logs()
    try:
        args = _build_parser(out, err).parse_args(list(sys.argv[1:] if argv is None else argv))
        return int(args.handler(args, out, err))
    except _UsageError as exc:
        return ExitCode.OK if exc.status == 0 else ExitCode.USAGE_OR_TOOL_ERROR
    except ParseError as exc:
        err.write(f"parse error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except InputError as exc:
        err.write(f"error: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except (OSError, ValueError) as exc:
        err.write(f"error: {type(exc).__name__}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        # A bug: one line that names it, exit 2 (a traceback's exit 1 reads as "a check failed").
        cmd = " ".join(str(a) for a in (argv if argv is not None else sys.argv[1:])[:1])
        err.write(f"error: internal error in 'validate {cmd}': {type(exc).__name__}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    finally:
        RUN_LOG.close_file()
