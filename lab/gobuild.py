"""Build real components from their Go sources once per machine, cached by what decides them.

The lab runs real Kubernetes, containerd, runc and Kueue, built here from the Go module proxy:
no release download is reachable, the module proxy is. Each component is a **wrapper module**
(a directory with a ``go.mod`` whose ``tool`` lines name the main packages and a ``go.sum``
holding every source's hash, so the sources are the ones the checksum database vouches for) and
a recipe (the ``go build`` argv per binary, as upstream's own build sets tags and version
variables). No code of ours is compiled.

The binaries go to ``<cache>/<label>/<version>-<hash>/bin``, where ``<cache>`` is
``~/.cache/gpuready`` (``$XDG_CACHE_HOME/gpuready``; ``$GPUREADY_<LABEL>_CACHE`` moves one
component's) and ``<hash>`` covers go.mod, go.sum and the recipe: a new release or a changed
go.sum builds again and nothing else does. Two builders in two checkouts take a lock per build
and publish it with one atomic rename; the second waits and uses the first's. A build runs
``nice``d, each binary's time is kept in the build's ``manifest.json``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.errors import LabError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Binary:
    """One binary: its name, the main package (a ``tool`` line of go.mod) and how it links."""

    name: str
    package: str
    cgo: bool = False
    kubernetes: bool = True  # kube/build.py: a Kubernetes binary (tags, version variables)


@dataclass(frozen=True)
class GoMod:
    """The parts of a wrapper go.mod a build relies on."""

    requires: dict[str, str]
    replaces: dict[str, tuple[str, str]]  # module -> (replacement, version)
    tools: tuple[str, ...]


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
            _add(block, line, requires, replaces, tools)
            continue
        verb, _, body = line.partition(" ")
        if body.strip() == "(":
            block = verb
            continue
        if verb in ("require", "replace", "tool"):
            _add(verb, " " + body, requires, replaces, tools)
    return GoMod(requires=requires, replaces=replaces, tools=tuple(tools))


def _add(verb: str, body: str, requires: dict[str, str],
         replaces: dict[str, tuple[str, str]], tools: list[str]) -> None:
    if verb == "require" and (m := _REQUIRE_RE.match(body)):
        requires[m.group(1)] = m.group(2)
    elif verb == "replace" and (m := _REPLACE_RE.match(body)):
        replaces[m.group(1)] = (m.group(2), m.group(3))
    elif verb == "tool":
        tools.append(body.strip())


@dataclass(frozen=True)
class GoBuild:
    """One component: its wrapper module, the release it pins, its binaries and their argv."""

    label: str  # the cache's directory, and the env var GPUREADY_<LABEL>_CACHE
    title: str  # what the log lines call it ("Kubernetes v1.37.2 and etcd")
    module_dir: Path
    binaries: tuple[Binary, ...]
    version: Callable[[GoMod], str]  # the release, read from go.mod
    argv: Callable[[Binary, str, Path], list[str]]  # go build argv for a binary into a dir
    minutes: str = "a few minutes"  # how long a cold build takes on 2 cores, for the log
    recipe_version: int = 1
    extra: dict[str, object] = field(default_factory=dict)  # more that decides the binaries

    @property
    def go_mod(self) -> Path:
        return self.module_dir / "go.mod"

    @property
    def go_sum(self) -> Path:
        return self.module_dir / "go.sum"

    def read_go_mod(self) -> GoMod:
        return parse_go_mod(self.go_mod.read_text())

    def release(self) -> str:
        return self.version(self.read_go_mod())

    def recipe(self) -> dict[str, object]:
        """Everything that decides the binaries, bar the sources go.mod/go.sum pin."""
        version = self.release()
        return {"version": version, "binaries": [asdict(b) for b in self.binaries],
                "argv": [self.argv(b, version, Path("OUT")) for b in self.binaries],
                "recipe": self.recipe_version, **self.extra}

    def key(self) -> str:
        """``<version>-<hash>``: the cache directory's name."""
        digest = hashlib.sha256()
        for part in (self.go_mod.read_bytes(), self.go_sum.read_bytes(),
                     json.dumps(self.recipe(), sort_keys=True).encode()):
            digest.update(hashlib.sha256(part).digest())
        return f"{self.release()}-{digest.hexdigest()[:12]}"

    def cache_root(self) -> Path:
        override = os.environ.get(f"GPUREADY_{self.label.upper().replace('-', '_')}_CACHE")
        if override:
            return Path(override).resolve()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return (Path(base) / "gpuready" / self.label).resolve()

    def build_dir(self, root: Path | None = None) -> Path:
        return (root or self.cache_root()) / self.key()

    def bin_dir(self, root: Path | None = None) -> Path:
        return self.build_dir(root) / "bin"

    def ensure_built(self, root: Path | None = None, log: bool = True) -> Path:
        """The directory of the pinned release's binaries, building them first if needed."""
        target = self.build_dir(root)
        if not is_built(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.parent / f".{target.name}.lock", "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    print(f"{self.label}: waiting for another process's build of {target} "
                          f"(lock {lock.name})", file=sys.stderr, flush=True)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                if not is_built(target):
                    self._build(target, log)
        return target / "bin"

    def _build(self, target: Path, log: bool) -> None:
        go = shutil.which("go")
        if go is None:
            raise LabError(f"Go is not installed: building {self.title} needs Go "
                           f"{self._go_directive()} or newer on PATH (https://go.dev/dl)")
        version = self.release()
        building = target.with_name(f"{target.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        (building / "bin").mkdir(parents=True)
        started = time.monotonic()
        if log:
            print(f"{self.label}: building {self.title} from source into {target} (once per "
                  f"machine; {self.minutes} on 2 cores)", file=sys.stderr, flush=True)
        env = go_env()
        timings: dict[str, float] = {}
        try:
            for binary in self.binaries:
                t0 = time.monotonic()
                argv = ["nice", "-n", "10", *self.argv(binary, version, building / "bin")]
                proc = subprocess.run(argv, cwd=self.module_dir, capture_output=True, text=True,
                                      check=False,
                                      env={**env, "CGO_ENABLED": str(int(binary.cgo))})
                if proc.returncode != 0:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
                    raise LabError(f"building {binary.name} ({binary.package}) failed "
                                   f"(exit {proc.returncode}): " + " | ".join(tail))
                timings[binary.name] = round(time.monotonic() - t0, 1)
                if log:
                    print(f"{self.label}: built {binary.name} in {timings[binary.name]:.0f} s",
                          file=sys.stderr, flush=True)
            go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True,
                                        text=True, check=True, env=env).stdout.strip()
            manifest = {
                "version": version, "go": go_version, "key": target.name,
                "recipe": self.recipe(), "build_seconds": timings,
                "sha256": {b.name: hashlib.sha256((building / "bin" / b.name).read_bytes())
                           .hexdigest() for b in self.binaries},
            }
            (building / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            os.rename(building, target)  # atomic: a reader sees no build or a whole one
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        if log:
            print(f"{self.label}: built in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)

    def source_dir(self, module: str) -> Path:
        """A required module's source tree, as the build compiled it (the module cache's copy,
        verified against go.sum): its unit files, manifests, CRDs."""
        proc = subprocess.run(["go", "mod", "download", "-json", module], cwd=self.module_dir,
                              capture_output=True, text=True, check=False, env=go_env())
        try:
            return Path(json.loads(proc.stdout)["Dir"])
        except (ValueError, KeyError):
            raise LabError(f"{self.label}: go mod download {module} in {self.module_dir} "
                           f"failed: {(proc.stderr or proc.stdout).strip()[-300:]}") from None

    def source_file(self, module: str, relative: str) -> str:
        """A file of a required module's source (source_dir)."""
        return (self.source_dir(module) / relative).read_text()

    def _go_directive(self) -> str:
        m = re.search(r"^go (\S+)", self.go_mod.read_text(), re.M)
        return m.group(1) if m else "?"


def is_built(target: Path) -> bool:
    return (target / MANIFEST).is_file()


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The wrapper module alone decides the sources: no workspace above it, no -mod=mod from the
    # caller's GOFLAGS (go.sum must already hold every hash), no VCS stamping of our checkout.
    env.update(GOWORK="off", GOFLAGS="-mod=readonly -buildvcs=false")
    return env
