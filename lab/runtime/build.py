"""Build containerd 2 and runc from source, as Docker's ``containerd.io`` package builds them.

The roles install containerd from Docker's apt repository (``containerd.io``, which bundles
runc: docs/bootstrap.md says why), so the lab serves a ``containerd.io`` package built from the
same sources: containerd at the release the lab's package carries (``lab/runtime/containerd``)
and runc at the version that release pins (its ``script/setup/runc-version``,
``lab/runtime/runc``), both through the Go module proxy with lab/gobuild.py (cached per
machine, beside Kubernetes).

How they are linked follows the packaging (docker/containerd-packaging: ``debian/rules``
runs containerd's ``make binaries`` with ``VERSION`` without its ``v``, ``PACKAGE=containerd.io``
and ``REVISION`` the release's commit, and runc's ``make runc``): containerd's ``Makefile``
(tag ``urfave_cli_no_docs``; the shim also ``no_grpc``, without cgo) and runc's (tags ``seccomp
urfave_cli_no_docs``, ``-buildmode=pie``, cgo with libseccomp, ``-trimpath``). Differences, each
for a reason: containerd is linked without cgo, which leaves out the btrfs snapshotter (it needs
libbtrfs headers; lab hosts run overlayfs); ``REVISION`` and runc's ``gitCommit`` stay empty
where the module proxy's record names no commit, rather than invented.

``python -m lab.runtime.build`` builds (if needed) and prints the bin directories.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from lab.errors import LabError
from lab.gobuild import Binary, GoBuild, GoMod

HERE = Path(__file__).resolve().parent
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
RUNC_MODULE = "github.com/opencontainers/runc"
# Docker's package name, which containerd prints as its package (`containerd --version`).
PACKAGE = "containerd.io"
# The module proxy's records of these releases carry no Origin (no commit).
REVISIONS = {"v2.2.8": "", "v2.2.9": ""}
RUNC_COMMITS = {"v1.3.6": ""}

CONTAINERD_BINARIES = (
    Binary("containerd", f"{CONTAINERD_MODULE}/cmd/containerd", kubernetes=False),
    Binary("containerd-shim-runc-v2", f"{CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2",
           kubernetes=False),
    Binary("ctr", f"{CONTAINERD_MODULE}/cmd/ctr", kubernetes=False),
)
RUNC_BINARIES = (Binary("runc", RUNC_MODULE, cgo=True, kubernetes=False),)


def _required(module: str) -> Callable[[GoMod], str]:
    def version(mod: GoMod) -> str:
        try:
            return mod.requires[module]
        except KeyError:
            raise LabError(f"lab/runtime: no `require {module} vX.Y.Z`") from None
    return version


def containerd_argv(binary: Binary, version: str, out: Path) -> list[str]:
    try:
        revision = REVISIONS[version]
    except KeyError:
        raise LabError(f"lab/runtime/containerd pins {CONTAINERD_MODULE} {version}, but "
                       "lab/runtime/build.py has no REVISIONS entry for it") from None
    pkg = CONTAINERD_MODULE
    ldflags = [f"-X {pkg}/version.Version={version.removeprefix('v')}",
               f"-X {pkg}/version.Revision={revision}", f"-X {pkg}/version.Package={PACKAGE}"]
    tags = ["urfave_cli_no_docs"] + (["no_grpc"] if binary.name.startswith("containerd-shim")
                                     else [])
    return ["go", "build", "-trimpath", "-o", str(out / binary.name), "-tags=" + ",".join(tags),
            "-ldflags=" + " ".join(ldflags), binary.package]


def runc_argv(binary: Binary, version: str, out: Path) -> list[str]:
    try:
        commit = RUNC_COMMITS[version]
    except KeyError:
        raise LabError(f"lab/runtime/runc pins {RUNC_MODULE} {version}, but "
                       "lab/runtime/build.py has no RUNC_COMMITS entry for it") from None
    return ["go", "build", "-trimpath", "-buildmode=pie", "-o", str(out / binary.name),
            "-tags=seccomp,urfave_cli_no_docs", f"-ldflags=-X main.gitCommit={commit}",
            binary.package]


CONTAINERD = GoBuild(
    label="runtime", title="containerd 2", module_dir=HERE / "containerd",
    binaries=CONTAINERD_BINARIES, version=_required(CONTAINERD_MODULE),
    argv=containerd_argv, minutes="3-5 minutes")
CONTAINERD_PREVIOUS = GoBuild(
    label="runtime", title="the previous containerd 2 release",
    module_dir=HERE / "containerd-previous",
    binaries=CONTAINERD_BINARIES, version=_required(CONTAINERD_MODULE), argv=containerd_argv,
    minutes="3-5 minutes")
RUNC = GoBuild(
    label="runtime", title="runc", module_dir=HERE / "runc", binaries=RUNC_BINARIES,
    version=_required(RUNC_MODULE), argv=runc_argv,
    minutes="a minute or two")


def module_file(build: GoBuild, relative: str) -> str:
    """A file of the built release's own source (its unit file, say)."""
    module = RUNC_MODULE if build is RUNC else CONTAINERD_MODULE
    return build.source_file(module, relative)


# The containerd.io releases the lab serves: the previous one (what a roll starts from) and the
# current one, each with the runc both pin.
RELEASES = (CONTAINERD_PREVIOUS, CONTAINERD)


def ensure_built(log: bool = True) -> tuple[Path, ...]:
    """Every containerd release's bin directory, then runc's, built first if needed."""
    return (*(b.ensure_built(log=log) for b in RELEASES), RUNC.ensure_built(log=log))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.runtime.build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        for path in ensure_built(log=not args.quiet):
            print(path)
    except LabError as exc:
        print(f"runtime: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
