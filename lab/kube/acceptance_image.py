"""The lab's acceptance image: Python and the lab's SIMULATED nccl-tests, built on this machine.

`validate acceptance` runs the site's acceptance image (``gpuready_cluster_acceptance_image``:
nccl-tests, ``dd``, ``sha256sum``) as a Job through Kueue. No registry can be reached here, so
the lab builds a stand-in the same way lab/kube/images.py builds its sleep image: from Debian
packages fetched with ``apt-get download`` on this machine, laid out as a Docker image archive
that ``ctr images import`` reads, byte for byte the same from the same packages and script.

- Its one layer holds Debian's ``busybox-static`` (``/bin/sh`` and the applets the acceptance
  script uses: ``dd``, ``sha256sum``), the interpreter of Debian's default Python
  (``python3.X-minimal``, ``libpython3.X-minimal``, ``libpython3.X-stdlib``) and the libraries
  they link (``libc6``, ``zlib1g``, ``libexpat1``, ``libssl3``, ``libffi8``; Debian 13's
  ``t64`` names where those are what the archive has), each package's ``copyright`` file
  included; and ``/usr/bin/all_reduce_perf``, the lab's nccl-tests simulator
  (lab/sim/all_reduce_perf.py, **SIMULATED**), at the version the lab's site repository serves
  last. Its configuration's labels say it is the lab's, built locally, simulated.
- In a Pod it sees the node's simulated GPUs because the lab's device plugin mounts the host's
  hardware description and driver state into every container it allocates GPUs to, where the
  real NVIDIA Container Toolkit would inject the driver (lab/sim/device_plugin.py).

It is not imported by every kubelet host at boot (it is ~45 MB): ``load(paths, host)`` copies it
into a host and imports it into containerd's ``k8s.io`` namespace, for a test or the demo that
runs the acceptance (Pods use it with ``imagePullPolicy: Never``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab import hosts as hosts_mod
from lab.errors import LabError
from lab.kube import images
from lab.paths import LabPaths

IMAGE = "gpuready.lab/acceptance:1"
RECIPE = 1
NCCL_TESTS_VERSION = "2.17.1"  # the site repository's newest nccl-tests (lab/packages.py)
APPLETS = ("cat", "dd", "echo", "env", "hostname", "ls", "mkdir", "rm", "sh", "sha256sum",
           "sleep", "true")
SIM_SCRIPT = Path(__file__).resolve().parents[1] / "sim" / "all_reduce_perf.py"
SIM_IN_IMAGE = "usr/lib/gpuready-lab/sim/all_reduce_perf.py"
ARCHIVE_IN_HOST = "/var/lib/gpuready-lab/images/acceptance.tar"
IMPORT_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Archive:
    path: Path
    image_id: str
    packages: dict[str, str]  # name -> version


def python_packages() -> tuple[str, ...]:
    """Debian's default Python's packages (``python3-minimal`` 3.X: ``python3.X-minimal``, ...)."""
    version = candidates(("python3-minimal",)).get("python3-minimal", "")
    minor = ".".join(version.partition(":")[2 if ":" in version else 0].split(".")[:2])
    if not minor.startswith("3."):
        raise LabError("apt has no python3-minimal candidate (the lab's acceptance image "
                       "carries Debian's Python: lab/kube/acceptance_image.py)")
    return (f"python{minor}-minimal", f"libpython{minor}-minimal", f"libpython{minor}-stdlib")


def candidates(names: tuple[str, ...]) -> dict[str, str]:
    """The version apt would download of each of ``names`` it has (one ``apt-cache policy``)."""
    proc = subprocess.run(["apt-cache", "policy", *names], capture_output=True, text=True,
                          timeout=120, check=False)
    found: dict[str, str] = {}
    current = None
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = line[:-1]
        elif current and line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version != "(none)":
                found[current] = version
    return found


LIBRARIES = ("libc6", "zlib1g", "libexpat1", "libssl3", "libffi8")


def packages() -> dict[str, str]:
    """Each package of the image and the version apt would download (Debian 13's ``t64``
    library names where those are what the archive has)."""
    libs = [*LIBRARIES, *(f"{lib}t64" for lib in LIBRARIES)]
    wanted = (images.PACKAGE, *python_packages())
    have = candidates((*wanted, *libs))
    chosen = [*wanted, *(lib if lib in have or f"{lib}t64" not in have else f"{lib}t64"
                         for lib in LIBRARIES)]
    missing = [name for name in chosen if name not in have]
    if missing:
        raise LabError(f"apt has no candidate for {', '.join(missing)} (the lab's acceptance "
                       "image needs them: lab/kube/acceptance_image.py)")
    return {name: have[name] for name in chosen}


def _download(names: tuple[str, ...], directory: Path) -> list[Path]:
    proc = subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *names],
                          cwd=directory, capture_output=True, text=True, timeout=600,
                          check=False)
    debs = sorted(directory.glob("*.deb"))
    if proc.returncode != 0 or len(debs) != len(names):
        raise LabError(f"apt-get download {' '.join(names)} failed (exit {proc.returncode}): "
                       f"{(proc.stderr or proc.stdout).strip()[-600:]}; the lab's acceptance "
                       "image is built from them (lab/kube/acceptance_image.py)")
    return debs


def wrapper() -> str:
    return ("#!/bin/sh\n"
            f"# all_reduce_perf: gpuready lab simulator (SIMULATED nccl-tests "
            f"{NCCL_TESTS_VERSION}), in the lab's acceptance image\n"
            f"export GPUREADY_SIM_TOOL=all_reduce_perf GPUREADY_SIM_VERSION={NCCL_TESTS_VERSION}\n"
            f'exec /usr/bin/python3 /{SIM_IN_IMAGE} "$@"\n')


def _tree_members(root: Path) -> list[tuple[object, bytes | None]]:
    """Every entry under ``root`` (sorted, fixed owners and times), as the layer's members."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        entries = [(base / d, True) for d in dirnames] + [(base / f, False) for f in
                                                          sorted(filenames)]
        for path, is_dir in sorted(entries, key=lambda e: e[0].name):
            name = path.relative_to(root).as_posix()
            if path.is_symlink():
                out.append(images._member(name, link=os.readlink(path)))
            elif is_dir:
                out.append(images._member(name + "/"))
            else:
                mode = path.stat().st_mode & 0o7777
                out.append(images._member(name, data=path.read_bytes(),
                                          mode=mode & 0o755 | 0o644))
    return sorted(out, key=lambda m: m[0].name)  # type: ignore[attr-defined]


def _layout(root: Path) -> None:
    """The links and files the packages leave to the system: applets, python3, the tool."""
    for applet in APPLETS:
        link = root / "bin" / applet
        if not link.exists() and not link.is_symlink():
            link.symlink_to("busybox")
    python = root / "usr/bin/python3"
    if not python.exists():
        python.symlink_to(next((root / "usr/bin").glob("python3.*")).name)
    sim = root / SIM_IN_IMAGE
    sim.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SIM_SCRIPT, sim)
    tool = root / "usr/bin/all_reduce_perf"
    tool.write_text(wrapper())
    tool.chmod(0o755)
    (root / "tmp").mkdir(exist_ok=True)


def _config(layer_digest: str, packages: dict[str, str]) -> bytes:
    listed = " ".join(f"{n}={v}" for n, v in sorted(packages.items()))
    config = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {
            "Cmd": ["/bin/sh"], "WorkingDir": "/",
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "Labels": {"org.opencontainers.image.title": "gpuready lab acceptance image",
                       "org.opencontainers.image.description":
                           "Debian packages and the gpuready lab's SIMULATED nccl-tests "
                           "(all_reduce_perf), built on this machine by the gpuready lab "
                           "(lab/kube/acceptance_image.py); not from any registry",
                       "org.opencontainers.image.licenses":
                           "see /usr/share/doc/*/copyright; lab simulator: the project's",
                       "io.gpuready.lab.packages": listed,
                       "io.gpuready.lab.simulated": "nccl-tests all_reduce_perf"},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": f"gpuready lab: {listed} + all_reduce_perf (SIMULATED)"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _key(packages: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps([sorted(packages.items()), RECIPE,
                                        hashlib.sha256(SIM_SCRIPT.read_bytes()).hexdigest()])
                            .encode()).hexdigest()
    return digest[:12]


def _cached(directory: Path, key: str) -> Archive | None:
    record = directory / f"acceptance-r{RECIPE}-{key}.json"
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    path = record.with_suffix(".tar")
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == data["sha256"]:
        return Archive(path, data["image_id"], data["packages"])
    return None


def ensure_archive(paths: LabPaths) -> Archive:
    """The acceptance image archive in the lab cache, built once per package set and script."""
    directory = images.cache_dir(paths)
    directory.mkdir(parents=True, exist_ok=True)
    versions = packages()
    names = tuple(versions)
    key = _key(versions)
    found = _cached(directory, key)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        debs = _download(names, Path(tmp))
        root = Path(tmp) / "root"
        root.mkdir()
        for deb in debs:
            subprocess.run(["dpkg-deb", "--extract", str(deb), str(root)], check=True,
                           timeout=300)
        _layout(root)
        layer_tar = images._tar(_tree_members(root))  # type: ignore[arg-type]
        layer_digest = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
        config = _config(layer_digest, versions)
        config_hex = hashlib.sha256(config).hexdigest()
        layer_path = f"{layer_digest.removeprefix('sha256:')}/layer.tar"
        manifest = [{"Config": f"{config_hex}.json", "RepoTags": [IMAGE],
                     "Layers": [layer_path]}]
        data = images._tar([images._member(f"{config_hex}.json", data=config),
                            images._member(f"{layer_digest.removeprefix('sha256:')}/"),
                            images._member(layer_path, data=layer_tar),
                            images._member("manifest.json", data=json.dumps(manifest).encode())])
        path = directory / f"acceptance-r{RECIPE}-{key}.tar"
        # Its own partial file: the unit tests and a lab session may build it at once.
        partial = directory / f".{path.name}.{os.getpid()}.part"
        partial.write_bytes(data)
        partial.replace(path)
    archive = Archive(path, f"sha256:{config_hex}", versions)
    record = path.with_suffix(f".json.{os.getpid()}")
    record.write_text(json.dumps({
        "image": IMAGE, "image_id": archive.image_id, "packages": versions,
        "sha256": hashlib.sha256(data).hexdigest(), "recipe": RECIPE,
        "simulated": "all_reduce_perf (lab/sim/all_reduce_perf.py)",
        "source": "apt-get download on this machine (Debian's archive)",
    }, indent=2) + "\n")
    record.replace(path.with_suffix(".json"))
    return archive


def load(paths: LabPaths, host: str) -> str:
    """Copy the image into the (running) host and import it into containerd; its name."""
    archive = ensure_archive(paths)
    target = paths.host_dir(host) / "merged" / ARCHIVE_IN_HOST.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive.path, target)
    proc = hosts_mod.host_exec(paths, host, ["ctr", "-n", images.NAMESPACE, "images", "import",
                                             ARCHIVE_IN_HOST], timeout=IMPORT_TIMEOUT_S)
    if proc.returncode != 0:
        raise LabError(f"{host}: ctr images import of the acceptance image failed: "
                       f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    listed = hosts_mod.host_exec(paths, host, ["ctr", "-n", images.NAMESPACE, "images", "ls",
                                               "-q"], timeout=60).stdout.split()
    if IMAGE not in listed:
        raise LabError(f"{host}: containerd lacks {IMAGE} after its import")
    return IMAGE
