"""Read a host's state for the roles and print it as one JSON object.

The roles' one read per role: each runs this file, embedded in a `raw` task as
``python3 -c <this file> --package containerd --unit containerd.service --file <path> ...``,
and parses its output once with ``from_json``. Read-only; standard library only, Python 3.10+
(Debian 12/13, Ubuntu 22.04/24.04), so it needs nothing on the host that Ansible does not.

Arguments, each repeatable, and the key each fills in the output:

--package NAME       "packages": {NAME: {"version", "want", "eflag", "status"}}: the version and
                     dpkg's ``${Status}`` split in its three words (want: install|hold|...;
                     eflag: ok|reinstreq; status: installed|config-files|not-installed|...),
                     each "" where dpkg does not know NAME.
--unit NAME          "units": {NAME: {"active", "sub", "enabled", "load"}}: systemd's ActiveState,
                     SubState, UnitFileState and LoadState ("" where systemd says nothing).
--file PATH          "files": {PATH: {"type", "mode", "owner", "group", "sha1"}}, not following
                     a link: type file|directory|link|other|none; mode as "0644"; sha1 of a
                     regular file's content (null for anything else).
--read PATH          "contents": {PATH: text, or null where it is not a readable regular file}.
--match NAME REGEXP PATH
                     "matches": {NAME: whether Python's re finds REGEXP in PATH's text, with
                     re.MULTILINE as ansible.builtin.replace compiles its regexp (false where
                     PATH cannot be read)}.
--keyring PATH       "keyrings": {PATH: {"armored", "fingerprints", "rc"}} for a regular file
                     (null otherwise): whether it starts with the OpenPGP armor header, the
                     primary keys' fingerprints as gpg lists them, gpg's exit status (127: no gpg).
--gpg-home DIR       gpg's home directory for --keyring (default: gpg's own).
--newer GLOB REF     "newer": the regular files matching GLOB that are newer than REF (or any,
                     where REF does not exist), sorted; at most the first one (as `-nt` with break).
--run NAME COMMAND   "runs": {NAME: {"found", "rc", "stdout", "stderr"}}: COMMAND (split as a
                     shell would, not run by one) where its program is on PATH; found false,
                     rc 127 and a line saying so in stderr where it is not.
--csv NAME FIELDS    "csv": {NAME: the stdout of --run NAME read as CSV, one object per non-empty
                     line keyed by FIELDS (comma-separated), each value stripped; a field the
                     line lacks is null, values past the last field are dropped ([] where no
                     --run NAME was given)}. For tools that print the fields they are asked for,
                     in that order (`nvidia-smi --query-gpu=... --format=csv,noheader`).
--sysctl NAME        "sysctls": {NAME: the kernel parameter's value as `sysctl -n NAME` prints it
                     (/proc/sys/NAME with dots as slashes, the trailing newline dropped; fields
                     of a multi-value parameter stay tab-separated), or null where it does not
                     exist or cannot be read}.
--timeout SECONDS    each --run's limit: then SIGTERM, SIGKILL 10 s later; rc 124, or 137 where
                     it had to be killed (as coreutils' `timeout --kill-after=10`).
"""

from __future__ import annotations

import argparse
import csv
import glob
import grp
import hashlib
import itertools
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
from typing import Any

ARMOR_HEADER = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
KILL_AFTER_S = 10.0


def packages(names: list[str]) -> dict[str, dict[str, str]]:
    """dpkg's version and status of each package; every value "" where dpkg does not know it."""
    found = {name: {"version": "", "want": "", "eflag": "", "status": ""} for name in names}
    if not names:
        return found
    proc = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${Package}\t${Version}\t${Status}\n", "--", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    # dpkg-query exits 1 where a package is unknown to it; that package stays all "".
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"dpkg-query exited {proc.returncode}: {proc.stderr.strip()}")
    for line in proc.stdout.splitlines():
        name, _, rest = line.partition("\t")
        version, _, status = rest.partition("\t")
        want, _, rest = status.partition(" ")
        eflag, _, state = rest.partition(" ")
        if name in found and not found[name]["status"]:
            found[name] = {"version": version, "want": want, "eflag": eflag, "status": state}
    return found


def unit(name: str) -> dict[str, str]:
    """systemd's view of a unit; every value "" where systemctl says nothing."""
    props = {
        "ActiveState": "active",
        "SubState": "sub",
        "UnitFileState": "enabled",
        "LoadState": "load",
    }
    proc = subprocess.run(
        ["systemctl", "show", *(f"--property={p}" for p in props), "--", name],
        capture_output=True,
        text=True,
        check=False,
    )
    values = dict.fromkeys(props.values(), "")
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in props:
            values[props[key]] = value
    return values


def _name(table: Any, ident: int) -> str:
    try:
        return str(table(ident)[0])
    except KeyError:
        return str(ident)


def file_state(path: str) -> dict[str, str | None]:
    """What is at path, not following a link; a regular file's sha1."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"type": "none", "mode": None, "owner": None, "group": None, "sha1": None}
    kinds = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "link"))
    kind = next((k for test, k in kinds if test(st.st_mode)), "other")
    digest = None
    if kind == "file":
        with open(path, "rb") as f:
            digest = hashlib.sha1(f.read(), usedforsecurity=False).hexdigest()
    return {
        "type": kind,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
        "sha1": digest,
    }


def contents(path: str) -> str | None:
    """A regular file's text; None where there is none to read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def sysctl(name: str) -> str | None:
    """A kernel parameter's value as ``sysctl -n`` prints it; None where it cannot be read."""
    text = contents("/proc/sys/" + name.replace(".", "/"))
    return None if text is None else text.rstrip("\n")


def matches(regexp: str, path: str) -> bool:
    """Whether regexp (re.MULTILINE, as ansible.builtin.replace compiles it) finds a match in
    path's text; False where there is no text to read."""
    text = contents(path)
    return text is not None and re.search(regexp, text, re.MULTILINE) is not None


def primary_fingerprints(listing: str) -> list[str]:
    """Primary-key fingerprints in `gpg --with-colons` output: the fpr record right after each
    pub record (a subkey's fpr follows its sub record)."""
    lines = listing.splitlines()
    return [
        fpr.split(":")[9]
        for pub, fpr in itertools.pairwise(lines)
        if pub.startswith("pub:") and fpr.startswith("fpr:") and len(fpr.split(":")) > 9
    ]


def keyring(path: str, gpg_home: str | None) -> dict[str, Any] | None:
    """A key file's format and gpg's primary fingerprints of it; None where it is not a
    regular file."""
    if file_state(path)["type"] != "file":
        return None
    with open(path, "rb") as f:
        armored = f.read(len(ARMOR_HEADER)) == ARMOR_HEADER
    gpg = shutil.which("gpg")
    if gpg is None:
        return {"armored": armored, "fingerprints": [], "rc": 127}
    home = ["--homedir", gpg_home] if gpg_home else []
    proc = subprocess.run(
        [gpg, "--batch", *home, "--with-colons", "--show-keys", "--", path],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "armored": armored,
        "fingerprints": primary_fingerprints(proc.stdout),
        "rc": proc.returncode,
    }


def newer(pattern: str, ref: str) -> list[str]:
    """The first regular file matching pattern that is newer than ref (any, where ref is not)."""
    try:
        ref_mtime = os.stat(ref).st_mtime_ns
    except FileNotFoundError:
        ref_mtime = None
    for path in sorted(glob.glob(pattern)):
        if os.path.isfile(path) and (ref_mtime is None or os.stat(path).st_mtime_ns > ref_mtime):
            return [path]
    return []


def run(command: str, timeout: float | None) -> dict[str, Any]:
    """A command's exit status and output, limited as `timeout --kill-after=10` limits it."""
    argv = shlex.split(command)
    if not argv or shutil.which(argv[0]) is None:
        missing = argv[0] if argv else repr(command)
        return {"found": False, "rc": 127, "stdout": "", "stderr": f"{missing}: not found on PATH"}
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.terminate()
        rc = 124
        try:
            out, err = proc.communicate(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            rc = 137
    return {
        "found": True,
        "rc": rc,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
    }


def csv_records(text: str, fields: str) -> list[dict[str, str | None]]:
    """CSV text -> one object per non-empty line, keyed by the comma-separated field names."""
    names = [name.strip() for name in fields.split(",")]
    records = []
    for values in csv.reader(text.splitlines(), skipinitialspace=True):
        if not values:
            continue
        padded: list[str | None] = [v.strip() for v in values[: len(names)]]
        padded += [None] * (len(names) - len(padded))
        records.append(dict(zip(names, padded, strict=True)))
    return records


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="host_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--package", action="append", default=[])
    parser.add_argument("--unit", action="append", default=[])
    parser.add_argument("--file", action="append", default=[])
    parser.add_argument("--read", action="append", default=[])
    parser.add_argument(
        "--match", nargs=3, action="append", default=[], metavar=("NAME", "REGEXP", "PATH")
    )
    parser.add_argument("--keyring", action="append", default=[])
    parser.add_argument("--gpg-home")
    parser.add_argument("--newer", nargs=2, action="append", default=[], metavar=("GLOB", "REF"))
    parser.add_argument("--run", nargs=2, action="append", default=[], metavar=("NAME", "COMMAND"))
    parser.add_argument("--csv", nargs=2, action="append", default=[], metavar=("NAME", "FIELDS"))
    parser.add_argument("--sysctl", action="append", default=[])
    parser.add_argument("--timeout", type=float)
    return parser.parse_args(argv)


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the arguments ask for, keyed as the module docstring says."""
    runs = {name: run(command, args.timeout) for name, command in args.run}
    return {
        "packages": packages(args.package),
        "units": {name: unit(name) for name in args.unit},
        "files": {path: file_state(path) for path in args.file},
        "contents": {path: contents(path) for path in args.read},
        "matches": {name: matches(regexp, path) for name, regexp, path in args.match},
        "keyrings": {path: keyring(path, args.gpg_home) for path in args.keyring},
        "newer": [path for pattern, ref in args.newer for path in newer(pattern, ref)],
        "sysctls": {name: sysctl(name) for name in args.sysctl},
        "runs": runs,
        "csv": {
            name: csv_records(runs[name]["stdout"], fields) if name in runs else []
            for name, fields in args.csv
        },
    }


def main(argv: list[str]) -> int:
    json.dump(probe(parse_args(argv)), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
