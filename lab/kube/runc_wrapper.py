#!/usr/bin/python3
"""runc as a lab host may run it: the real runc, with no OOM score below the host's own.

Copied into each kubelet host by lab.kube.node and put first on containerd's PATH (a drop-in
for containerd.service), so containerd's shims run it instead of the package's runc, which it then
execs with the same arguments. The only change: a container's ``process.oomScoreAdj`` (in the
bundle's config.json, for ``create`` and ``run``) lower than this process's own score is
raised to it. The kubelet asks for -998 for every Pod's sandbox and -997 for Guaranteed
containers; lowering a score needs CAP_SYS_RESOURCE, which neither nspawn gives a lab host nor
this machine has to give ("nsexec: failed to update /proc/self/oom_score_adj: Permission
denied"), so without this no Pod could start. Higher scores (BestEffort's 1000, Burstable's)
are left as the kubelet asked. Standard library only: it runs on the hosts' Python 3.11/3.13.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def bundle_of(args: list[str]) -> str | None:
    """The bundle directory given with --bundle/-b (create, run), else None."""
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return None


def clamp(spec: dict[str, object], floor: int) -> bool:
    """Raise the process's oomScoreAdj to ``floor``; True if it changed."""
    process = spec.get("process")
    if not isinstance(process, dict):
        return False
    wanted = process.get("oomScoreAdj")
    if isinstance(wanted, int) and wanted < floor:
        process["oomScoreAdj"] = floor
        return True
    return False


def real_runc(path: str) -> str:
    """The first runc on PATH that is not this wrapper."""
    for directory in path.split(os.pathsep):
        if not directory or os.path.abspath(directory) == HERE:
            continue
        candidate = os.path.join(directory, "runc")
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("gpuready lab runc wrapper: no runc on PATH besides this wrapper")


def main(argv: list[str]) -> None:
    bundle = bundle_of(argv[1:])
    if bundle is not None:
        config = os.path.join(bundle, "config.json")
        with open("/proc/self/oom_score_adj", encoding="ascii") as own:
            floor = int(own.read())
        try:
            with open(config, encoding="utf-8") as handle:
                spec = json.load(handle)
        except (OSError, ValueError):
            spec = None
        if isinstance(spec, dict) and clamp(spec, floor):
            with open(config + ".gpuready-lab", "w", encoding="utf-8") as handle:
                json.dump(spec, handle)
            os.replace(config + ".gpuready-lab", config)
    runc = real_runc(os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
    os.execv(runc, [runc, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
