"""The lab's locally built container image (lab/kube/images.py) and what a kubelet host needs to
run containers (lab/kube/node.py, lab/kube/runc_wrapper.py), without a lab: the archive's bytes
and layout, the cache, the host's import script run against stand-ins for containerd and ctr,
and the runc wrapper run against a stand-in runc. tests/lab/test_kube.py runs all of it for real.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from lab.errors import LabError
from lab.kube import images, node, runc_wrapper
from lab.paths import LabPaths

BUSYBOX = b"\x7fELF not really busybox"
COPYRIGHT = b"GPL-2 (a stand-in for the package's copyright file)\n"
VERSION = "1:1.35.0-4+deb12u1+b1"

DUMP_16 = """\
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
"""
DUMP_17 = """\
    sandbox_image = "registry.k8s.io/pause:3.8"
        sandbox_mode = "podsandbox"
"""
DUMP_20 = """\
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10'
"""


def members(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar.getmembers():
            handle = tar.extractfile(info) if info.isfile() else None
            out[info.name] = (info, handle.read() if handle else None)
    return out


def test_the_archive_is_the_same_bytes_every_time_and_reads_as_docker_save() -> None:
    data, image_id = images.archive_bytes(BUSYBOX, COPYRIGHT, VERSION)
    assert images.archive_bytes(BUSYBOX, COPYRIGHT, VERSION) == (data, image_id)
    outer = members(data)
    manifest = json.loads(outer["manifest.json"][1] or b"")
    assert manifest[0]["RepoTags"] == [images.IMAGE]
    config_bytes = outer[manifest[0]["Config"]][1] or b""
    assert image_id == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    config = json.loads(config_bytes)
    assert config["config"]["Entrypoint"] == images.ENTRYPOINT
    assert config["config"]["Labels"]["io.gpuready.lab.package"] == f"busybox-static={VERSION}"
    assert config["config"]["Labels"]["org.opencontainers.image.licenses"] == "GPL-2.0-only"
    (layer_name,) = manifest[0]["Layers"]
    layer = outer[layer_name][1] or b""
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    inner = members(layer)
    busybox, content = inner["bin/busybox"]
    assert content == BUSYBOX and busybox.mode == 0o755
    for applet in ("sh", "sleep", "true"):
        assert inner[f"bin/{applet}"][0].linkname == "busybox"
    assert inner["usr/share/doc/busybox-static/copyright"][1] == COPYRIGHT
    for info, _ in [*inner.values(), *outer.values()]:
        assert (info.mtime, info.uid, info.gid, info.uname) == (0, 0, 0, "")


def test_a_different_package_makes_a_different_image() -> None:
    _, one = images.archive_bytes(BUSYBOX, COPYRIGHT, VERSION)
    _, other = images.archive_bytes(BUSYBOX + b"!", COPYRIGHT, VERSION)
    assert one != other


def fake_deb(directory: Path) -> Path:
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin/busybox").write_bytes(BUSYBOX)
    doc = root / "usr/share/doc/busybox-static"
    doc.mkdir(parents=True)
    (doc / "copyright").write_bytes(COPYRIGHT)
    (root / "DEBIAN/control").write_text(
        f"Package: busybox-static\nVersion: {VERSION}\nArchitecture: amd64\n"
        "Maintainer: nobody <nobody@invalid>\nDescription: stand-in\n")
    deb = directory / "busybox-static_1.35.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_the_archive_is_built_once_into_the_cache_with_its_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_LAB_CACHE", str(tmp_path / "cache"))
    paths = LabPaths(tmp_path / "lab")
    downloads = []

    def download(directory: Path) -> Path:
        downloads.append(directory)
        return fake_deb(directory)

    monkeypatch.setattr(images, "_download", download)
    archive = images.ensure_archive(paths)
    assert archive.path.parent == tmp_path / "cache/images"
    assert (archive.package, archive.version) == ("busybox-static", VERSION)
    record = json.loads(archive.record.read_text())
    assert record["sha256"] == hashlib.sha256(archive.path.read_bytes()).hexdigest()
    assert record["image_id"] == archive.image_id
    assert record["licence"] == "GPL-2.0-only"
    assert images.ensure_archive(paths) == archive
    assert len(downloads) == 1
    archive.path.write_bytes(b"damaged")  # a damaged archive is made again
    assert images.ensure_archive(paths).path.read_bytes() != b"damaged"
    assert len(downloads) == 2


def test_the_sandbox_image_is_read_from_each_containerd_release() -> None:
    assert images.sandbox_image(DUMP_16) == "registry.k8s.io/pause:3.6"
    assert images.sandbox_image(DUMP_17) == "registry.k8s.io/pause:3.8"
    assert images.sandbox_image(DUMP_20) == "registry.k8s.io/pause:3.10"
    with pytest.raises(LabError, match="no sandbox image"):
        images.sandbox_image('    sandbox_mode = "podsandbox"\n')


def stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize(("dump", "sandbox"), [(DUMP_16, "registry.k8s.io/pause:3.6"),
                                               (DUMP_17, "registry.k8s.io/pause:3.8"),
                                               (DUMP_20, "registry.k8s.io/pause:3.10")])
def test_the_hosts_import_script_imports_and_tags_the_sandbox_image(
        tmp_path: Path, dump: str, sandbox: str) -> None:
    (tmp_path / "dump").write_text(dump)
    log = tmp_path / "ctr.log"
    stub(tmp_path, "containerd", f'cat "{tmp_path}/dump"')
    stub(tmp_path, "ctr", f'echo "$*" >> "{log}"')
    script = tmp_path / "import.sh"
    script.write_text(images.script())
    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert f"-n k8s.io images import {images.ARCHIVE_IN_HOST}" in calls
    assert calls[-1] == f"-n k8s.io images tag --force {images.IMAGE} {sandbox}"
    assert sandbox in proc.stdout


def test_provision_puts_the_archive_and_a_unit_containerd_wants(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive_path = tmp_path / "cache/sleep.tar"
    archive_path.parent.mkdir()
    archive_path.write_bytes(b"archive")
    archive_path.with_suffix(".json").write_text("{}")
    archive = images.Archive(archive_path, "busybox-static", VERSION, "0" * 64, "sha256:x")
    monkeypatch.setattr(images, "ensure_archive", lambda paths: archive)
    root = tmp_path / "merged"
    images.provision(LabPaths(tmp_path / "lab"), root)
    assert (root / images.ARCHIVE_IN_HOST.lstrip("/")).read_bytes() == b"archive"
    link = root / "etc/systemd/system/containerd.service.wants" / images.UNIT_NAME
    assert os.readlink(link) == f"/etc/systemd/system/{images.UNIT_NAME}"
    unit = (root / "etc/systemd/system" / images.UNIT_NAME).read_text()
    assert "After=containerd.service" in unit and "WantedBy=containerd.service" in unit


def test_a_kubelet_host_gets_containerds_state_on_this_machine_and_runcs_keyring_calls(
        tmp_path: Path) -> None:
    args = node.nspawn_args(tmp_path / "host")
    assert f"--bind={tmp_path / 'host/containerd'}:/var/lib/containerd" in args
    assert "--system-call-filter=add_key keyctl request_key" in args
    assert (tmp_path / "host/containerd").is_dir()
    root = tmp_path / "merged"
    node.provision(root, "127.0.5.11")
    drop_in = (root / node.CONTAINERD_DROP_IN.lstrip("/")).read_text()
    assert f"Environment=PATH={node.RUNC_DIR}:" in drop_in
    wrapper = root / node.RUNC_DIR.lstrip("/") / "runc"
    assert wrapper.read_bytes() == Path(runc_wrapper.__file__).read_bytes()
    assert os.access(wrapper, os.X_OK)


def test_the_runc_wrapper_finds_the_bundle_and_raises_only_lower_scores() -> None:
    assert runc_wrapper.bundle_of(["--root", "r", "create", "--bundle", "/b", "id"]) == "/b"
    assert runc_wrapper.bundle_of(["run", "--bundle=/c", "id"]) == "/c"
    assert runc_wrapper.bundle_of(["--root", "r", "start", "id"]) is None
    spec: dict[str, object] = {"process": {"oomScoreAdj": -998}}
    assert runc_wrapper.clamp(spec, 0) and spec == {"process": {"oomScoreAdj": 0}}
    spec = {"process": {"oomScoreAdj": 1000}}
    assert not runc_wrapper.clamp(spec, 0) and spec == {"process": {"oomScoreAdj": 1000}}
    assert not runc_wrapper.clamp({"process": {}}, 0)


@pytest.mark.parametrize(("asked", "given"), [(-998, 0), (1000, 1000)])
def test_the_runc_wrapper_execs_the_real_runc_with_the_same_arguments(
        tmp_path: Path, asked: int, given: int) -> None:
    if int(Path("/proc/self/oom_score_adj").read_text()) != 0:
        pytest.skip("this test's floor is an OOM score of 0")
    wrapper_dir, real_dir, bundle = tmp_path / "wrapper", tmp_path / "real", tmp_path / "bundle"
    for directory in (wrapper_dir, real_dir, bundle):
        directory.mkdir()
    shutil.copy(runc_wrapper.__file__, wrapper_dir / "runc")
    stub(real_dir, "runc", f'echo "$*"; cat "{bundle}/config.json"')
    (bundle / "config.json").write_text(json.dumps({"process": {"oomScoreAdj": asked}}))
    proc = subprocess.run([sys.executable, str(wrapper_dir / "runc"), "--root", "/r", "create",
                           "--bundle", str(bundle), "c1"], capture_output=True, text=True,
                          check=False, env={"PATH": f"{wrapper_dir}:{real_dir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    first, config = proc.stdout.split("\n", 1)
    assert first == f"--root /r create --bundle {bundle} c1"
    assert json.loads(config) == {"process": {"oomScoreAdj": given}}
