"""``python -m validate``: see :mod:`validate.cli`."""

from __future__ import annotations

import sys

from validate.cli import main

if __name__ == "__main__":
    sys.exit(main())
