"""Kernel log lines with NVIDIA Xid events -> ``tuple[XidEvent, ...]``.

An Xid event is an ``NVRM: Xid (PCI:<bus>): <code>, [pid=<pid>, ][name=<name>, ]<message>``
line. The parser accepts it behind any of the prefixes real collectors produce:

* ``dmesg``: ``[  123.456789] NVRM: Xid ...`` (seconds since boot -> ``uptime_s``)
* ``dmesg -T``: ``[Tue Jan 21 02:21:33 2025] NVRM: Xid ...`` (local time, naive datetime)
* ``dmesg --time-format iso``: ``2025-01-21T02:21:33,498559+00:00 NVRM: Xid ...``
* ``dmesg --decode``: ``kern  :warn  : <any of the above> NVRM: Xid ...``
* ``journalctl -o short-iso`` / ``short-iso-precise``:
  ``2025-01-21T02:21:33+0000 host kernel: NVRM: Xid ...``
* classic syslog / ``journalctl -o short``: ``Jan 21 02:21:33 host kernel: [  12.3] NVRM: ...``
  (no year, so ``timestamp`` stays None; the uptime stamp is kept when present)
* no prefix at all (text copied out of a log).

Every other line is ignored, so empty input is zero events, not an error. A line that contains
``NVRM: Xid`` but is not a complete event (cut off mid-line) raises :class:`ParseError`, as does
binary data.

Output schema::

    XidEvent(
      xid: int                      # 79
      pci_bus_id: str               # "0000:38:00" as printed (domain:bus:device)
      timestamp: datetime | None    # tz-aware when the log carried an offset
      uptime_s: float | None        # dmesg seconds since boot
      host: str | None              # journal/syslog hostname
      pid: int | None               # None when absent or '<unknown>'
      process: str | None           # name=..., None when absent or <unknown>
      message: str                  # the rest of the line
    )
    .info -> validate.xid_catalog.XidInfo (severity, summary, action)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from validate.parsers import ParseError
from validate.xid_catalog import XidInfo, lookup

FORMAT = "xid"

_MARKER = "NVRM: Xid"
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r" (?P<xid>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
_PID_RE = re.compile(r"^pid=(?P<pid>[^,]*),\s*(?:name=(?P<name>[^,]*),\s*)?(?P<message>.*)$")
_ISO_RE = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
_CTIME_RE = re.compile(
    r"\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]"
)
_UPTIME_RE = re.compile(r"\[\s*(?P<uptime>\d+\.\d+)\]")
_HOST_RE = re.compile(r"(?:^|\s)(?P<host>[^\s\[\]]+) kernel:")


@dataclass(frozen=True)
class XidEvent:
    """One Xid event from the kernel log (see the module docstring for the schema)."""

    xid: int
    pci_bus_id: str
    timestamp: datetime | None
    uptime_s: float | None
    host: str | None
    pid: int | None
    process: str | None
    message: str

    @property
    def info(self) -> XidInfo:
        """What this code means and what to do (validate.xid_catalog)."""
        return lookup(self.xid)


def parse(text: str) -> tuple[XidEvent, ...]:
    """Every Xid event in ``text``, in log order."""
    if "\x00" in text:
        raise ParseError(FORMAT, "binary data, not a kernel log")
    events = []
    for raw in text.splitlines():
        at = raw.find(_MARKER)
        if at < 0:
            continue
        match = _XID_RE.search(raw, at)
        if not match:
            raise ParseError(FORMAT, f"incomplete Xid line: {raw.strip()[:200]!r}")
        events.append(_event(raw[:at], match))
    return tuple(events)


def _event(prefix: str, match: re.Match[str]) -> XidEvent:
    rest = match["rest"] or ""
    pid: int | None = None
    process: str | None = None
    message = rest
    if pid_match := _PID_RE.match(rest):
        pid_text = pid_match["pid"].strip("'\" ")
        pid = int(pid_text) if pid_text.isdigit() else None
        name = pid_match["name"]
        process = name.strip() if name and name.strip() != "<unknown>" else None
        message = pid_match["message"]
    uptime = _UPTIME_RE.search(prefix)
    host = _HOST_RE.search(prefix)
    return XidEvent(
        xid=int(match["xid"]),
        pci_bus_id=match["bus"],
        timestamp=_timestamp(prefix),
        uptime_s=float(uptime["uptime"]) if uptime else None,
        host=host["host"] if host else None,
        pid=pid,
        process=process,
        message=message,
    )


def _timestamp(prefix: str) -> datetime | None:
    if iso := _ISO_RE.search(prefix):
        frac = f".{iso['frac'][:6]}" if iso["frac"] else ""
        tz = iso["tz"] or ""
        if tz and tz != "Z" and ":" not in tz:
            tz = f"{tz[:3]}:{tz[3:]}"  # journalctl prints +0000; fromisoformat wants +00:00
        try:
            return datetime.fromisoformat(f"{iso['date']}T{iso['time']}{frac}{tz}")
        except ValueError:
            raise ParseError(FORMAT, f"bad timestamp in {prefix.strip()!r}") from None
    if ctime := _CTIME_RE.search(prefix):
        try:
            return datetime.strptime(" ".join(ctime["ctime"].split()), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            raise ParseError(FORMAT, f"bad timestamp in {prefix.strip()!r}") from None
    return None
