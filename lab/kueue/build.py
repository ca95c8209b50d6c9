"""Build Kueue's manager from source at the release the cluster layer pins, once per machine.

The cluster layer renders Kueue's objects (validate/cluster/render.py ``KUEUE_VERSION``); the lab
runs the real controller on them (lab/kueue/install.py), built here through the Go module proxy
with lab/gobuild.py (cached beside Kubernetes), as Kueue's ``Makefile`` builds ``bin/manager``:
``CGO_ENABLED=0``, ``-X sigs.k8s.io/kueue/pkg/version.GitVersion=<tag>`` and ``GitCommit`` (the
module proxy's record of v0.19.2 names its commit) and ``BuildDate`` (the release's time, so two
builds are alike).

``python -m lab.kueue.build`` builds (if needed) and prints the bin directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.errors import LabError
from lab.gobuild import Binary, GoBuild, GoMod

HERE = Path(__file__).resolve().parent
MODULE = "sigs.k8s.io/kueue"
VERSION_PKG = f"{MODULE}/pkg/version"
# The module proxy's record of each release: its Origin.Hash and Time.
RELEASES = {"v0.19.2": ("8eab68778fc1b52affe165fdf5af29d1e9b4f3cb", "2026-08-20T14:33:19Z")}
BINARIES = (Binary("kueue", f"{MODULE}/cmd/kueue", kubernetes=False),)


def _version(mod: GoMod) -> str:
    try:
        return mod.requires[MODULE]
    except KeyError:
        raise LabError(f"lab/kueue/go.mod: no `require {MODULE} vX.Y.Z`") from None


def go_build_argv(binary: Binary, version: str, out: Path) -> list[str]:
    try:
        commit, built = RELEASES[version]
    except KeyError:
        raise LabError(f"lab/kueue/go.mod pins {MODULE} {version}, but lab/kueue/build.py has "
                       "no RELEASES entry for it (its .info from the module proxy)") from None
    ldflags = [f"-X '{VERSION_PKG}.GitVersion={version}'", f"-X '{VERSION_PKG}.GitCommit={commit}'",
               f"-X '{VERSION_PKG}.BuildDate={built}'"]
    return ["go", "build", "-o", str(out / binary.name), "-ldflags=" + " ".join(ldflags),
            binary.package]


KUEUE = GoBuild(label="kueue", title="Kueue's manager", module_dir=HERE, binaries=BINARIES,
                version=_version, argv=go_build_argv, minutes="5-8 minutes")


def source_dir() -> Path:
    """The release's own source tree (its config/ kustomizations, CRDs, RBAC), as built."""
    return KUEUE.source_dir(MODULE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kueue.build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        print(KUEUE.ensure_built(log=not args.quiet))
    except LabError as exc:
        print(f"kueue: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
