"""The run's log file (``run.log`` in its run directory), shared by the commands that make a
run directory (``run``, ``fabric``, ``drift``). Standard library only: every command imports it."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TextIO

RUN_LOG_FILE = "run.log"


class RunLog(logging.Handler):
    """The run's log file (``run.log`` in its run directory): warnings of the suite and
    everything paramiko logs. paramiko logs a traceback for each peer that does not speak SSH
    (22 lines per host), from its own threads; those belong in the run's record, not on the
    terminal, which shows the rows. Between runs (and before a run has its directory) records
    are dropped here; the suite's own warnings still reach stderr through the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"))
        self._file: TextIO | None = None

    def open(self, path: Path) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self.close_file()
            with contextlib.suppress(OSError):  # an unwritable log must not stop the run
                self._file = path.open("a", encoding="utf-8")

    def close_file(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            return
        try:
            self._file.write(self.format(record) + "\n")
            self._file.flush()
        except (OSError, ValueError):  # a full disk loses the log line, not the run
            pass


RUN_LOG = RunLog()


def route_logs() -> None:
    """paramiko's records go to the run's log only; the suite's to stderr and the run's log."""
    library = logging.getLogger("paramiko")
    library.propagate = False
    for logger in (library, logging.getLogger()):
        if RUN_LOG not in logger.handlers:
            logger.addHandler(RUN_LOG)

