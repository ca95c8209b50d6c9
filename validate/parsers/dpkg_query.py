"""``dpkg-query --show --showformat='${Package}\\t${Version}\\t${Status}\\n'`` -> packages.

Output schema::

    parse(text) -> dict[str, DpkgPackage]     by package name
    DpkgPackage(name, version, want, error, state)
      want:  "install" | "hold" | "deinstall" | "purge" | "unknown"   (dpkg's selection)
      error: "ok" | "reinstreq"
      state: "installed" | "config-files" | "half-configured" | "unpacked" | ... | "not-installed"
      .installed -> bool    state == "installed" (a package half-configured by a failed
                            postinst is present but not installed)
      .held -> bool         want == "hold"
      .upstream -> str      version without epoch and Debian revision ("550.90.07")

Only ``\\t``-separated lines with three fields count; a line with a different shape raises
:class:`ParseError` (the caller asked for this exact format), as does empty output.
"""

from __future__ import annotations

from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "dpkg-query"
SHOWFORMAT = "${Package}\\t${Version}\\t${Status}\\n"
_WANTS = frozenset({"install", "hold", "deinstall", "purge", "unknown"})


@dataclass(frozen=True, slots=True)
class DpkgPackage:
    name: str
    version: str
    want: str
    error: str
    state: str

    @property
    def installed(self) -> bool:
        return self.state == "installed"

    @property
    def held(self) -> bool:
        return self.want == "hold"

    @property
    def upstream(self) -> str:
        return upstream_version(self.version)


def upstream_version(version: str) -> str:
    """``1:550.90.07-0ubuntu1`` -> ``550.90.07`` (Debian policy: [epoch:]upstream[-revision])."""
    _, _, rest = version.rpartition(":") if ":" in version else ("", "", version)
    return rest.rsplit("-", 1)[0] if "-" in rest else rest


def parse(text: str) -> dict[str, DpkgPackage]:
    """Packages by name (see module docstring)."""
    if not text.strip():
        raise ParseError(FORMAT, "empty output")
    out: dict[str, DpkgPackage] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ParseError(FORMAT, f"line {lineno}: expected 3 tab-separated fields: {line!r}")
        name, version, status = (f.strip() for f in fields)
        words = status.split()
        if len(words) != 3 or words[0] not in _WANTS or not name:
            raise ParseError(FORMAT, f"line {lineno}: unexpected status {status!r}")
        # Multi-arch packages print once per architecture; the first installed one counts.
        seen = out.get(name)
        if seen is not None and seen.installed:
            continue
        out[name] = DpkgPackage(name, version, words[0], words[1], words[2])
    return out


def parse_owner(text: str) -> list[str]:
    """``dpkg-query --search <path>``: ``pkg[, pkg2]: /path`` -> the owning packages
    (``diversion by ...`` lines are skipped)."""
    owners: list[str] = []
    for line in text.splitlines():
        if line.startswith(("diversion ", "dpkg-query:")) or ": " not in line:
            continue
        names, _, _ = line.partition(": ")
        owners += [n.strip().split(":")[0] for n in names.split(",") if n.strip()]
    if not owners:
        raise ParseError(FORMAT, f"no owning package in {text.strip()[:200]!r}")
    return owners
