"""``containerd config dump`` (the effective TOML after imports) -> the runtimes it defines.

Output schema::

    parse_runtimes(text) -> dict[str, ContainerdRuntime]    by runtime name
    ContainerdRuntime(name, runtime_type: str | None, binary_name: str | None)

Runtimes are the TOML tables ``...containerd.runtimes.<name>`` and their ``.options`` table, in
the CRI plugin's section of any config version (``"io.containerd.grpc.v1.cri"`` in version 2,
``'io.containerd.cri.v1.runtime'`` in version 3); names may be quoted. Only the keys needed here
are read, with a line scanner rather than a TOML library: ``config dump`` prints one key per
line. Output without a ``version = `` line is not a config dump and raises :class:`ParseError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "containerd-config-dump"
_TABLE = re.compile(r"^\s*\[(?P<name>[^\[\]]+)\]\s*$")
_RUNTIME = re.compile(r"""\.runtimes\.(?P<q>["']?)(?P<rt>[^"'.]+)(?P=q)(?P<opts>\.options)?$""")
_KEY = re.compile(r"""^\s*(?P<key>[A-Za-z_]+)\s*=\s*(?P<value>.*?)\s*$""")
_VERSION = re.compile(r"^version\s*=\s*\d+\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ContainerdRuntime:
    name: str
    runtime_type: str | None
    binary_name: str | None


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_runtimes(text: str) -> dict[str, ContainerdRuntime]:
    """Runtimes by name (see module docstring)."""
    if not _VERSION.search(text):
        raise ParseError(FORMAT, "no 'version = N' line: not `containerd config dump` output")
    found: dict[str, dict[str, str | None]] = {}
    current: tuple[str, bool] | None = None
    for line in text.splitlines():
        table = _TABLE.match(line)
        if table:
            rt = _RUNTIME.search(table.group("name").strip())
            current = (rt.group("rt"), bool(rt.group("opts"))) if rt else None
            if current:
                found.setdefault(current[0], {"runtime_type": None, "binary_name": None})
            continue
        if current is None:
            continue
        kv = _KEY.match(line)
        if not kv:
            continue
        name, in_options = current
        if not in_options and kv.group("key") == "runtime_type":
            found[name]["runtime_type"] = _unquote(kv.group("value"))
        elif in_options and kv.group("key") == "BinaryName":
            found[name]["binary_name"] = _unquote(kv.group("value"))
    return {n: ContainerdRuntime(n, v["runtime_type"], v["binary_name"]) for n, v in found.items()}
