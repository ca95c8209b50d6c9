"""Parser for InfiniBand port counters read from sysfs
(``/sys/class/infiniband/<dev>/ports/<n>/counters/<name>``, one decimal value per file).

The validators read them with :data:`READ_COUNTERS` (``sh -c`` over SSH, the sysfs root as its
argument), which prints one ``<path>:<value>`` line per counter file, as ``grep -H . <files>``
does. ``parse(text) -> tuple[PortCounters, ...]``. Schema::

    PortCounters
      device: str                    "mlx5_0"
      port: int                      1
      counters: dict[str, int | None]   counter file name -> value; None where the driver
                                     prints "N/A (no PMA)" (a port without a performance
                                     management agent)

The layout is proven on a real sysfs tree (fixtures/sysfs-infiniband/, procfs's test tree of
hfi1, mlx4 and mlx5 devices), unpacked and read with this very command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from validate.parsers import ParseError

FORMAT = "ib-counters"

# The counters that show a failing link (NVIDIA's "Understanding mlx5 Linux counters"; the
# InfiniBand spec's PortCounters attribute).
ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                  "excessive_buffer_overrun_errors")

# $1: the sysfs root. No HCA (no class/infiniband): no output, exit 0. A counter file that
# cannot be read is skipped; the check names a counter a port lacks.
READ_COUNTERS = (
    'cd "$1/class/infiniband" 2>/dev/null || exit 0\n'
    "for port in */ports/*; do\n"
    "  for name in " + " ".join(ERROR_COUNTERS) + "; do\n"
    '    f="$port/counters/$name"\n'
    '    [ -r "$f" ] && printf \'%s:%s\\n\' "$f" "$(cat "$f")"\n'
    "  done\n"
    "done\n"
    "exit 0\n"
)

_LINE = re.compile(
    r"^(?:.*/)?(?P<dev>[^/:]+)/ports/(?P<port>\d+)/counters/(?P<name>[A-Za-z0-9_]+):"
    r"(?P<value>.*)$")
_NO_PMA = "N/A (no PMA)"


@dataclass(frozen=True)
class PortCounters:
    device: str
    port: int
    counters: dict[str, int | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


def parse(text: str) -> tuple[PortCounters, ...]:
    """Parse ``<path>:<value>`` lines (schema in the module docstring); empty output is no
    port at all (a node without HCAs)."""
    if not isinstance(text, str):
        raise ParseError(FORMAT, "not text")
    ports: dict[tuple[str, int], dict[str, int | None]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if not match:
            raise ParseError(FORMAT, f"line {number}: not <dev>/ports/<n>/counters/<name>:"
                                     f"<value>: {line[:120]!r}")
        raw = match["value"].strip()
        value: int | None
        if raw == _NO_PMA:
            value = None
        elif raw.isdigit():
            value = int(raw)
        else:
            raise ParseError(FORMAT, f"line {number}: {match['name']} is {raw[:40]!r}, not a "
                                     "counter value")
        ports.setdefault((match["dev"], int(match["port"])), {})[match["name"]] = value
    return tuple(PortCounters(dev, port, counters)
                 for (dev, port), counters in sorted(ports.items()))
