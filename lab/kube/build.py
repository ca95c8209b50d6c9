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

``python -m lab.kube.build`` builds (if needed) and prints the directory.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lab.errors import LabError

MODULE_DIR = Path(__file__).resolve().parent
GO_MOD = MODULE_DIR / "go.mod"
GO_SUM = MODULE_DIR / "go.sum"
KUBERNETES_MODULE = "k8s.io/kubernetes"

# Upstream's release build tags (hack/lib/golang.sh: "selinux,notest" plus "grpcnotrace" for
# non-debug builds).
KUBE_TAGS = ("selinux", "notest", "grpcnotrace")
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


@dataclass(frozen=True)
class Binary:
    """One binary: its name, the main package (a ``tool`` line of go.mod) and how to link it."""

    name: str
    package: str
    cgo: bool = False  # upstream's KUBE_STATIC_BINARIES are static; the kubelet is not
    kubernetes: bool = True  # a Kubernetes binary (tags, version variables) or etcd


BINARIES = (
    Binary("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Binary("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    Binary("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Binary("kubelet", "k8s.io/kubernetes/cmd/kubelet", cgo=True),
    Binary("kubeadm", "k8s.io/kubernetes/cmd/kubeadm"),
    Binary("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    Binary("etcd", "go.etcd.io/etcd/server/v3", kubernetes=False),
)


@dataclass(frozen=True)
class ReleaseFacts:
    """What the module proxy records of a release (``/k8s.io/kubernetes/@v/<version>.info``)."""

    time: str  # its "Time": the binaries' buildDate, so two builds are byte-for-byte alike
    commit: str  # its "Origin.Hash", where the record has one


# v1.37.2's record carries no Origin (no commit) and GitHub is not reachable from the machines
# that build this, so its gitCommit stays empty (gitTreeState "archive": built from the
# published source archive, as upstream calls a build from `git archive`) rather than invented.
RELEASES = {
    "v1.37.2": ReleaseFacts(time="2026-10-27T12:01:04Z", commit=""),
}


@dataclass(frozen=True)
class GoMod:
    """The parts of the wrapper go.mod the build relies on."""

    requires: dict[str, str]
    replaces: dict[str, tuple[str, str]]  # module -> (replacement, version)
    tools: tuple[str, ...]

    @property
    def kubernetes_version(self) -> str:
        try:
            return self.requires[KUBERNETES_MODULE]
        except KeyError:
            raise LabError(f"{GO_MOD}: no `require {KUBERNETES_MODULE} vX.Y.Z`") from None


_REQUIRE_RE = re.compile(r"^\s*([^\s()]+)\s+(v\S+)")
_REPLACE_RE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+(v\S+)")


def parse_go_mod(text: str) -> GoMod:
    """Read require/replace/tool lines (single-line or blocks) of a go.mod."""
    requires: dict[str, str] = {}
    replaces: dict[str, tuple[str, str]] = {}
    tools: list[str] = []
    block = ""
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].rstrip()
        if not line.strip():
            continue
        if block:
            if line.strip() == ")":
                block = ""
                continue
            body = line
        else:
            verb, _, body = line.partition(" ")
            if body.strip() == "(":
                block = verb
                continue
            if verb not in ("require", "replace", "tool"):
                continue
            block_once = verb
            body = " " + body
            _add(block_once, body, requires, replaces, tools)
            continue
        _add(block, body, requires, replaces, tools)
    return GoMod(requires=requires, replaces=replaces, tools=tuple(tools))


def _add(verb: str, body: str, requires: dict[str, str],
         replaces: dict[str, tuple[str, str]], tools: list[str]) -> None:
    if verb == "require" and (m := _REQUIRE_RE.match(body)):
        requires[m.group(1)] = m.group(2)
    elif verb == "replace" and (m := _REPLACE_RE.match(body)):
        replaces[m.group(1)] = (m.group(2), m.group(3))
    elif verb == "tool":
        tools.append(body.strip())


def read_go_mod() -> GoMod:
    return parse_go_mod(GO_MOD.read_text())


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


def recipe(version: str) -> dict[str, object]:
    """Everything that decides the binaries, bar the sources go.mod/go.sum pin."""
    return {
        "version": version,
        "binaries": [asdict(b) for b in BINARIES],
        "argv": [go_build_argv(b, version, Path("OUT")) for b in BINARIES],
        "recipe": 1,
    }


def build_key() -> str:
    """``<version>-<hash>``: the cache directory's name."""
    version = read_go_mod().kubernetes_version
    digest = hashlib.sha256()
    for part in (GO_MOD.read_bytes(), GO_SUM.read_bytes(),
                 json.dumps(recipe(version), sort_keys=True).encode()):
        digest.update(hashlib.sha256(part).digest())
    return f"{version}-{digest.hexdigest()[:12]}"


def cache_root() -> Path:
    """``$GPUREADY_KUBE_CACHE``, else ``$XDG_CACHE_HOME/gpuready/kube`` or
    ``~/.cache/gpuready/kube`` (beside the lab's rootfs cache, see lab.paths)."""
    if "GPUREADY_KUBE_CACHE" in os.environ:
        return Path(os.environ["GPUREADY_KUBE_CACHE"]).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base) / "gpuready" / "kube").resolve()


def build_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / build_key()


def bin_dir(root: Path | None = None) -> Path:
    return build_dir(root) / "bin"


MANIFEST = "manifest.json"


def is_built(target: Path) -> bool:
    return (target / MANIFEST).is_file()


def ensure_built(root: Path | None = None, log: bool = True) -> Path:
    """The directory of the pinned release's binaries, building them first if needed."""
    target = build_dir(root)
    if not is_built(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"kube: waiting for another process's build of {target} "
                      f"(lock {lock.name})", file=sys.stderr, flush=True)
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_built(target):
                _build(target, log)
    return target / "bin"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The wrapper module alone decides the sources: no workspace above it, no -mod=mod from the
    # caller's GOFLAGS (go.sum must already hold every hash), no VCS stamping of our checkout.
    env.update(GOWORK="off", GOFLAGS="-mod=readonly -buildvcs=false")
    return env


def _build(target: Path, log: bool) -> None:
    go = shutil.which("go")
    if go is None:
        raise LabError("Go is not installed: building Kubernetes needs Go "
                       f"{_go_directive()} or newer on PATH (https://go.dev/dl)")
    version = read_go_mod().kubernetes_version
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    (building / "bin").mkdir(parents=True)
    started = time.monotonic()
    if log:
        print(f"kube: building Kubernetes {version} and etcd from source into {target} "
              "(once per machine; 12-15 minutes on 2 cores)", file=sys.stderr, flush=True)
    env = _go_env()
    timings: dict[str, float] = {}
    try:
        for binary in BINARIES:
            t0 = time.monotonic()
            argv = ["nice", "-n", "10", *go_build_argv(binary, version, building / "bin")]
            proc = subprocess.run(argv, cwd=MODULE_DIR, capture_output=True, text=True,
                                  check=False, env={**env, "CGO_ENABLED": str(int(binary.cgo))})
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
                raise LabError(f"building {binary.name} ({binary.package}) failed "
                               f"(exit {proc.returncode}): " + " | ".join(tail))
            timings[binary.name] = round(time.monotonic() - t0, 1)
            if log:
                print(f"kube: built {binary.name} in {timings[binary.name]:.0f} s",
                      file=sys.stderr, flush=True)
        go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                                    check=True, env=env).stdout.strip()
        manifest = {
            "version": version, "go": go_version, "key": target.name,
            "recipe": recipe(version), "build_seconds": timings,
            "sha256": {b.name: hashlib.sha256((building / "bin" / b.name).read_bytes())
                       .hexdigest() for b in BINARIES},
        }
        (building / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        os.rename(building, target)  # atomic: a reader sees no build or a whole one
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    if log:
        print(f"kube: built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _go_directive() -> str:
    m = re.search(r"^go (\S+)", GO_MOD.read_text(), re.M)
    return m.group(1) if m else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kube.build", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--quiet", action="store_true", help="print only the bin directory")
    args = parser.parse_args(argv)
    try:
        started = time.monotonic()
        bins = ensure_built(log=not args.quiet)
    except LabError as exc:
        print(f"kube: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"kube: {read_go_mod().kubernetes_version} ready in {bins} "
              f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    print(bins)
    return 0


if __name__ == "__main__":
    sys.exit(main())
