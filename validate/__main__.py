"""``python -m validate``: see :mod:`validate.cli`."""

from __future__ import annotations

import os
import sys

from validate.model import ExitCode  # the standard library only: imported at once

# Started with stdout or stderr closed (cron, a parent that closed its fds), Python sets the
# stream to None, and Ansible's Display crashes at import writing a warning to it: give such a
# stream /dev/null before anything imports Ansible, so the run and its report still happen.
for _name in ("stdout", "stderr"):
    if getattr(sys, _name) is None:
        setattr(sys, _name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115

if __name__ == "__main__":
    # Importing the suite (pandas, Ansible, the Kubernetes client) takes a second or two: a
    # Ctrl-C then is one line and exit 130, as it is once main() runs, not a traceback.
    try:
        from validate.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(ExitCode.INTERRUPTED)
    sys.exit(main())
