"""A real container image for the lab's kubelets, built on this machine: no registry is used.

Nothing in the lab can pull an image (no registry is reachable), yet a Pod on a lab node must
run and turn Ready for the API server's eviction logic to treat it as healthy (a
PodDisruptionBudget allows one disruption at a time only over Ready pods). So the lab builds one
small image itself and imports it into each kubelet host's containerd:

- its one layer is Debian's ``busybox-static`` package (``/bin/busybox``, GPL-2.0-only, with the
  package's ``copyright`` file beside it) and links for a few applets (``sh``, ``sleep``,
  ``true``, ...), fetched with ``apt-get download`` on this machine once, as any Debian package;
- its entrypoint is a shell that sleeps until SIGTERM (then exits 0, so a Pod's containers stop
  at once rather than after the grace period);
- it is a Docker image archive (``docker save``'s format, which ``ctr images import`` reads),
  made byte for byte the same from the same package: fixed modes, owners and times, entries
  in a fixed order. It is kept in the lab cache (``<cache>/images/``) with a JSON record of
  the package, its version and the archive's digest, and remade only when the recipe changes
  (or the archive no longer matches its record).

Each kubelet host gets the archive and a unit, ``gpuready-lab-images.service``, before its
first boot (``provision``, from lab.controlplane). The unit is wanted by containerd.service,
so it runs whenever containerd starts: once the roles (or a test, by hand) install containerd,
after each restart for a new config.toml, after a reboot. It imports the archive into the
``k8s.io`` namespace (the CRI's) as ``gpuready.lab/sleep:1`` (Pods use it with
``imagePullPolicy: Never``) and tags it with the sandbox ("pause") image that containerd's
configuration names (``registry.k8s.io/pause:3.6`` for Debian 12's containerd 1.6, ``:3.8``
for Debian 13's 1.7), so RunPodSandbox finds its sandbox image locally and never pulls: the
image's sleeping shell stands in for ``/pause``. ``load(paths, host)`` runs the unit now and
checks containerd has both names, for a test that wants them before it makes Pods.

A real image, built locally from a Debian package; no registry image is used anywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab import hosts as hosts_mod
from lab.errors import LabError
from lab.paths import LabPaths

IMAGE = "gpuready.lab/sleep:1"
NAMESPACE = "k8s.io"
PACKAGE = "busybox-static"
LICENCE = "GPL-2.0-only"
APPLETS = ("cat", "echo", "env", "false", "hostname", "ls", "ps", "sh", "sleep", "true")
# Sleeps until told to stop. As PID 1 of its container a plain `sleep` would ignore SIGTERM (no
# default handler for the init of a PID namespace) and wait out the Pod's grace period.
ENTRYPOINT = ["/bin/busybox", "sh", "-c",
              "trap 'exit 0' TERM INT; /bin/busybox sleep 2147483647 & wait"]
# Bumped when the archive's recipe (not the package) changes, so a cached archive is remade.
RECIPE = 1
EPOCH = 0  # every time in the archive: the layer and the config, so the bytes never vary
IMPORT_TIMEOUT_S = 120.0
UNIT_NAME = "gpuready-lab-images.service"
SCRIPT = "/usr/local/lib/gpuready-lab/import-images.sh"
ARCHIVE_IN_HOST = "/var/lib/gpuready-lab/images/sleep.tar"


@dataclass(frozen=True)
class Archive:
    """The built image: the archive on this machine and what it was made from."""

    path: Path
    package: str
    version: str
    deb_sha256: str
    image_id: str  # the config's digest, as containerd and the CRI report it

    @property
    def record(self) -> Path:
        return self.path.with_suffix(".json")


def cache_dir(paths: LabPaths) -> Path:
    return paths.cache / "images"


def _download(directory: Path) -> Path:
    """Debian's busybox-static for this machine's release, through its own apt."""
    proc = subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root",
                           PACKAGE], cwd=directory, capture_output=True, text=True,
                          timeout=300, check=False)
    debs = sorted(directory.glob(f"{PACKAGE}_*.deb"))
    if proc.returncode != 0 or len(debs) != 1:
        raise LabError(f"apt-get download {PACKAGE} failed (exit {proc.returncode}): "
                       f"{(proc.stderr or proc.stdout).strip()[-400:]}; the lab's container "
                       "image is built from it (lab/kube/images.py)")
    return debs[0]


def _deb_field(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb), field], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def _extract(deb: Path, into: Path) -> tuple[bytes, bytes]:
    """The package's /bin/busybox and its copyright file."""
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(into)], check=True, timeout=120)
    copyright_file = into / f"usr/share/doc/{PACKAGE}/copyright"
    return (into / "bin/busybox").read_bytes(), copyright_file.read_bytes()


def _member(name: str, *, data: bytes | None = None, mode: int = 0o644, link: str = ""
            ) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if link:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
    elif data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size, info.mode = len(data), mode
    return info, data


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def layer(busybox: bytes, copyright_text: bytes) -> bytes:
    """The image's one layer (an uncompressed tar, as in ``docker save``)."""
    doc = f"usr/share/doc/{PACKAGE}/"
    members = [_member("bin/"), _member("bin/busybox", data=busybox, mode=0o755),
               *(_member(f"bin/{applet}", link="busybox") for applet in APPLETS),
               _member("tmp/"), _member("usr/"), _member("usr/share/"), _member("usr/share/doc/"),
               _member(doc), _member(doc + "copyright", data=copyright_text)]
    return _tar(members)


def image_config(layer_digest: str, version: str) -> bytes:
    """The image configuration (OCI/Docker), with the package it holds in its labels."""
    config = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": ENTRYPOINT, "Env": ["PATH=/bin"], "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "gpuready lab sleep image",
                       "org.opencontainers.image.description":
                           f"Debian's {PACKAGE} {version}, built on this machine by the "
                           "gpuready lab (lab/kube/images.py); not from any registry",
                       "org.opencontainers.image.licenses": LICENCE,
                       "io.gpuready.lab.package": f"{PACKAGE}={version}"},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": f"gpuready lab: {PACKAGE} {version} /bin/busybox"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def archive_bytes(busybox: bytes, copyright_text: bytes, version: str) -> tuple[bytes, str]:
    """The Docker image archive and the image's id (its config's digest)."""
    layer_tar = layer(busybox, copyright_text)
    layer_digest = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    config = image_config(layer_digest, version)
    config_hex = hashlib.sha256(config).hexdigest()
    layer_path = f"{layer_digest.removeprefix('sha256:')}/layer.tar"
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": [IMAGE], "Layers": [layer_path]}]
    members = [_member(f"{config_hex}.json", data=config),
               _member(f"{layer_digest.removeprefix('sha256:')}/"),
               _member(layer_path, data=layer_tar),
               _member("manifest.json", data=json.dumps(manifest).encode())]
    return _tar(members), f"sha256:{config_hex}"


def _name(version: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", version)
    return f"sleep-{PACKAGE}-{safe}-r{RECIPE}.tar"


def _cached(directory: Path) -> Archive | None:
    for record in sorted(directory.glob(f"sleep-{PACKAGE}-*-r{RECIPE}.json")):
        data = json.loads(record.read_text())
        path = record.with_suffix(".tar")
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == data["sha256"]:
            return Archive(path, data["package"], data["version"], data["deb_sha256"],
                           data["image_id"])
    return None


def ensure_archive(paths: LabPaths) -> Archive:
    """The image archive in the lab cache: built once from Debian's busybox-static."""
    directory = cache_dir(paths)
    directory.mkdir(parents=True, exist_ok=True)
    found = _cached(directory)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        deb = _download(Path(tmp))
        version = _deb_field(deb, "Version")
        busybox, copyright_text = _extract(deb, Path(tmp) / "root")
        data, image_id = archive_bytes(busybox, copyright_text, version)
        archive = Archive(directory / _name(version), PACKAGE, version,
                          hashlib.sha256(deb.read_bytes()).hexdigest(), image_id)
        partial = archive.path.with_suffix(".part")
        partial.write_bytes(data)
        partial.rename(archive.path)
    archive.record.write_text(json.dumps({
        "image": IMAGE, "image_id": image_id, "package": PACKAGE, "version": version,
        "licence": LICENCE, "deb_sha256": archive.deb_sha256,
        "sha256": hashlib.sha256(data).hexdigest(), "recipe": RECIPE,
        "source": f"apt-get download {PACKAGE} on this machine (Debian's archive)",
    }, indent=2) + "\n")
    return archive


def sandbox_image(config_dump: str) -> str:
    """The sandbox (pause) image of a containerd configuration (``containerd config dump``):
    ``sandbox_image`` in 1.x's CRI plugin, ``sandbox`` under the 2.x images plugin's
    ``pinned_images`` (2.x writes TOML literal strings, in single quotes)."""
    found = re.search(r"""^\s*(?:sandbox_image|sandbox)\s*=\s*["']([^"']+)["']""", config_dump,
                      re.MULTILINE)
    if found is None:
        raise LabError("containerd's configuration names no sandbox image "
                       "(`containerd config dump` has neither sandbox_image nor sandbox)")
    return found.group(1)


def script() -> str:
    """The host's import: the archive into containerd's k8s.io namespace, under the test name
    (in the archive) and the sandbox image's name (from containerd's own configuration)."""
    return f"""\
#!/bin/sh
# gpuready lab (lab/kube/images.py): a container image built on the lab's machine from Debian's
# {PACKAGE}, not pulled from any registry, for Pods ({IMAGE}) and as the sandbox image.
set -eu
for _ in $(seq 30); do ctr version >/dev/null 2>&1 && break; sleep 1; done
pattern="s/^ *(sandbox_image|sandbox) *= *[\\"']([^\\"']+)[\\"'].*/\\2/p"
sandbox=$(containerd config dump | sed -n -E "$pattern" | head -n 1)
[ -n "$sandbox" ] || {{ echo "containerd's configuration names no sandbox image" >&2; exit 1; }}
ctr -n {NAMESPACE} images import {ARCHIVE_IN_HOST}
ctr -n {NAMESPACE} images tag --force {IMAGE} "$sandbox"
echo "imported {IMAGE} (built locally from {PACKAGE}, no registry), also as $sandbox"
"""


UNIT = f"""\
[Unit]
Description=gpuready lab: its locally built container image into containerd (no registry)
After=containerd.service
ConditionPathExists={ARCHIVE_IN_HOST}

[Service]
Type=oneshot
ExecStart=/bin/sh {SCRIPT}

[Install]
WantedBy=containerd.service
"""


def provision(paths: LabPaths, root: Path) -> Archive:
    """Before a kubelet host's first boot: the archive, the import script and its unit, started
    with containerd whenever it starts (installed by hand or by the roles, restarted, after a
    reboot), so the images are there before the kubelet asks for them."""
    archive = ensure_archive(paths)
    target = root / ARCHIVE_IN_HOST.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive.path, target)
    shutil.copyfile(archive.record, target.with_suffix(".json"))
    script_path = root / SCRIPT.lstrip("/")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script())
    script_path.chmod(0o755)
    units = root / "etc/systemd/system"
    (units / "containerd.service.wants").mkdir(parents=True, exist_ok=True)
    (units / UNIT_NAME).write_text(UNIT)
    link = units / "containerd.service.wants" / UNIT_NAME
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{UNIT_NAME}")
    return archive


def load(paths: LabPaths, host: str) -> list[str]:
    """Import the image into the host's (running) containerd now, as its unit does whenever
    containerd starts; return the names it has there: ``IMAGE`` and the sandbox image."""
    proc = hosts_mod.host_exec(paths, host, ["systemctl", "start", UNIT_NAME],
                               timeout=IMPORT_TIMEOUT_S)
    if proc.returncode != 0:
        journal = hosts_mod.host_exec(paths, host, ["journalctl", "--no-pager", "-o", "cat",
                                                    "-n", "20", "-u", UNIT_NAME]).stdout
        raise LabError(f"{host}: {UNIT_NAME} failed: {proc.stderr.strip()}\n{journal}")
    dump = hosts_mod.host_exec(paths, host, ["containerd", "config", "dump"], timeout=60)
    names = [IMAGE, sandbox_image(dump.stdout)]
    listed = hosts_mod.host_exec(paths, host, ["ctr", "-n", NAMESPACE, "images", "ls", "-q"],
                                 timeout=60).stdout.split()
    missing = [name for name in names if name not in listed]
    if missing:
        raise LabError(f"{host}: containerd lacks {missing} after {UNIT_NAME}")
    return names
