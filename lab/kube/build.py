"""Build the pinned Kubernetes release (and its etcd) from source, once per machine.

The release is pinned in ``lab/kube/go.mod``: a wrapper module that requires
``k8s.io/kubernetes vX.Y.Z`` and replaces each staging module (``k8s.io/api``, ...) with its
published ``v0.Y.Z`` (Kubernetes' own go.mod points them at ``./staging``, which exists only in
its repository; that is why ``go install k8s.io/kubernetes/cmd/...@vX`` does not work). Its
``tool`` lines name what is built; ``go.sum`` holds every module's hash, so the sources are the
ones the checksum database vouches for. No code of ours is compiled: etcd is
``go.etcd.io/etcd/server/v3``'s own ``main`` at the version Kubernetes' go.mod requires, which is
the etcd this release's kubeadm defaults to.

The binaries go to ``<cache>/<version>-<hash>/bin`` (``~/.cache/gpuready/kube`` unless
``GPUREADY_KUBE_CACHE`` says otherwise), where ``<hash>`` covers go.mod, go.sum and the build
recipe below, so a new release or a changed go.sum builds again and nothing else does. Builders
in two checkouts take a lock per build and publish it with one atomic rename: the second waits
and uses the first's.

Built as the upstream release is (``hack/lib/golang.sh``): ``-trimpath``, tags
``selinux,notest,grpcnotrace``, ``-s -w``, static (``CGO_ENABLED=0``) but for the kubelet,
which upstream links with cgo; version variables set through ``-ldflags`` so each binary prints
its real version and kubeadm's version checks work.

The previous patch release's kubelet, kubeadm and kubectl are built the same way from their own
wrapper module (``lab/kube/previous/``): the lab serves both releases' packages, so a roll of the
Kubernetes pin from one to the other upgrades real binaries (tests/lab/test_upgrade.py). The
cache, lock and build mechanics are lab/gobuild.py's, shared with containerd, runc and Kueue.

``python -m lab.kube.build`` builds both (if needed) and prints the current release's directory.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab import gobuild
from lab.errors import LabError
from lab.gobuild import Binary, is_built

MODULE_DIR = Path(__file__).resolve().parent
GO_MOD = MODULE_DIR / "go.mod"
GO_SUM = MODULE_DIR / "go.sum"
PREVIOUS_DIR = MODULE_DIR / "previous"
KUBERNETES_MODULE = "k8s.io/kubernetes"

# Upstream's release build tags (hack/lib/golang.sh: "selinux,notest" plus "grpcnotrace" for
# non-debug builds).
KUBE_TAGS = ("selinux", "notest", "grpcnotrace")
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")

BINARIES = (
    Binary("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Binary("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    Binary("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Binary("kubelet", "k8s.io/kubernetes/cmd/kubelet", cgo=True),
    Binary("kubeadm", "k8s.io/kubernetes/cmd/kubeadm"),
    Binary("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    Binary("etcd", "go.etcd.io/etcd/server/v3", kubernetes=False),
)
# What a node installs of the previous release (pkgs.k8s.io's three packages).
PREVIOUS_BINARIES = tuple(b for b in BINARIES if b.name in ("kubelet", "kubeadm", "kubectl"))


@dataclass(frozen=True)
class ReleaseFacts:
    """What the module proxy records of a release (``/k8s.io/kubernetes/@v/<version>.info``)."""

    time: str  # its "Time": the binaries' buildDate, so two builds are byte-for-byte alike
    commit: str  # its "Origin.Hash", where the record has one


# The records of v1.37.1 and v1.37.2 carry no Origin (no commit) and GitHub is not reachable from
# the machines that build this, so their gitCommit stays empty (gitTreeState "archive": built from
# the published source archive, as upstream calls a build from `git archive`) rather than
# invented.
RELEASES = {
    "v1.37.1": ReleaseFacts(time="2026-09-23T17:06:22Z", commit=""),
    "v1.37.2": ReleaseFacts(time="2026-10-27T12:01:04Z", commit=""),
}


class GoMod(gobuild.GoMod):
    @property
    def kubernetes_version(self) -> str:
        try:
            return self.requires[KUBERNETES_MODULE]
        except KeyError:
            raise LabError(f"{GO_MOD}: no `require {KUBERNETES_MODULE} vX.Y.Z`") from None


def parse_go_mod(text: str) -> GoMod:
    parsed = gobuild.parse_go_mod(text)
    return GoMod(parsed.requires, parsed.replaces, parsed.tools)


def read_go_mod(module_dir: Path = MODULE_DIR) -> GoMod:
    return parse_go_mod((module_dir / "go.mod").read_text())


def staging_version(kubernetes_version: str) -> str:
    """``v1.37.2`` -> ``v0.37.2``: the tag Kubernetes publishes its staging modules under."""
    m = re.fullmatch(r"v1\.(\d+\.\d+)", kubernetes_version)
    if m is None:
        raise LabError(f"{GO_MOD}: {KUBERNETES_MODULE} {kubernetes_version} is not a v1.Y.Z "
                       "release")
    return f"v0.{m.group(1)}"


def release_facts(version: str) -> ReleaseFacts:
    try:
        return RELEASES[version]
    except KeyError:
        raise LabError(f"{GO_MOD} pins {KUBERNETES_MODULE} {version}, but lab/kube/build.py "
                       f"has no RELEASES entry for it (its Time and Origin.Hash from "
                       f"https://proxy.golang.org/{KUBERNETES_MODULE}/@v/{version}.info)"
                       ) from None


def version_ldflags(version: str) -> list[str]:
    """``-X`` flags for the version variables, as hack/lib/version.sh sets them."""
    facts = release_facts(version)
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {"gitVersion": version, "gitMajor": major, "gitMinor": minor,
              "gitCommit": facts.commit, "gitTreeState": "clean" if facts.commit else "archive",
              "buildDate": facts.time}
    return [f"-X {pkg}.{key}={value}" for pkg in VERSION_PACKAGES
            for key, value in values.items()]


def go_build_argv(binary: Binary, version: str, out: Path) -> list[str]:
    ldflags = ["-s", "-w"]
    argv = ["go", "build", "-trimpath", "-o", str(out / binary.name)]
    if binary.kubernetes:
        argv.append("-tags=" + ",".join(KUBE_TAGS))
        ldflags = version_ldflags(version) + ldflags
    return [*argv, "-ldflags=all=" + " ".join(ldflags), binary.package]


def _kubernetes_version(mod: gobuild.GoMod) -> str:
    return GoMod(mod.requires, mod.replaces, mod.tools).kubernetes_version


CURRENT = gobuild.GoBuild(
    label="kube", title="Kubernetes and etcd", module_dir=MODULE_DIR, binaries=BINARIES,
    version=_kubernetes_version, argv=go_build_argv, minutes="12-15 minutes")
PREVIOUS = gobuild.GoBuild(
    label="kube", title="the previous Kubernetes patch release's kubelet, kubeadm and kubectl",
    module_dir=PREVIOUS_DIR, binaries=PREVIOUS_BINARIES, version=_kubernetes_version,
    argv=go_build_argv, minutes="8-10 minutes")


def recipe(version: str) -> dict[str, object]:
    """Everything that decides the current release's binaries, bar go.mod/go.sum's sources."""
    del version  # read from go.mod, as the build reads it
    return CURRENT.recipe()


def build_key() -> str:
    return CURRENT.key()


def cache_root() -> Path:
    """``$GPUREADY_KUBE_CACHE``, else ``$XDG_CACHE_HOME/gpuready/kube`` or
    ``~/.cache/gpuready/kube`` (beside the lab's rootfs cache, see lab.paths)."""
    return CURRENT.cache_root()


def build_dir(root: Path | None = None) -> Path:
    return CURRENT.build_dir(root)


def bin_dir(root: Path | None = None) -> Path:
    return CURRENT.bin_dir(root)


def ensure_built(root: Path | None = None, log: bool = True) -> Path:
    """The directory of the pinned release's binaries, building them first if needed."""
    return CURRENT.ensure_built(root, log)


def ensure_previous_built(root: Path | None = None, log: bool = True) -> Path:
    """The previous patch release's kubelet, kubeadm and kubectl (lab/kube/previous/)."""
    return PREVIOUS.ensure_built(root, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kube.build", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--quiet", action="store_true", help="print only the bin directory")
    args = parser.parse_args(argv)
    try:
        started = time.monotonic()
        bins = ensure_built(log=not args.quiet)
        ensure_previous_built(log=not args.quiet)
    except LabError as exc:
        print(f"kube: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"kube: {read_go_mod().kubernetes_version} and "
              f"{read_go_mod(PREVIOUS_DIR).kubernetes_version} ready in "
              f"{time.monotonic() - started:.1f} s", file=sys.stderr)
    print(bins)
    return 0


__all__ = ["BINARIES", "PREVIOUS_BINARIES", "Binary", "is_built"]

if __name__ == "__main__":
    sys.exit(main())
