"""lab/kube/acceptance_image.py: the lab's acceptance image, built from Debian's packages on this
machine (cached per machine, as the lab's other images), holds a working Python and busybox, and
its SIMULATED all_reduce_perf reads the GPUs mounted in at the simulators' paths.

The image's layer is unpacked and its programs run in a chroot (as containerd's runc would run
them, without the namespaces): the acceptance script's commands work there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from lab.hardware import render_host, write_faults, write_hardware
from lab.kube import acceptance_image
from lab.paths import LabPaths
from validate.parsers import nccl


@pytest.mark.skipif(shutil.which("dpkg-deb") is None or os.geteuid() != 0,
                    reason="needs dpkg-deb and root (chroot)")
def test_the_image_runs_the_acceptance_tools_against_mounted_gpus(tmp_path: Path) -> None:
    archive = acceptance_image.ensure_archive(LabPaths(tmp_path / "lab"))
    assert acceptance_image.ensure_archive(LabPaths(tmp_path / "lab")) == archive
    with tarfile.open(archive.path) as outer:
        manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest[0]["RepoTags"] == [acceptance_image.IMAGE]
        config = json.loads(outer.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        assert "SIMULATED" in config["config"]["Labels"]["org.opencontainers.image.description"]
        root = tmp_path / "root"
        with tarfile.open(fileobj=outer.extractfile(manifest[0]["Layers"][0])) as layer:
            layer.extractall(root, filter="tar")
    # What the lab's device plugin mounts in: the node's GPUs and its driver state.
    write_hardware(root / "opt/gpuready-lab/hw", render_host("l40s-pcie-4x", "node7"))
    write_faults(root / "opt/gpuready-lab/hw", [])
    (root / "run/gpuready-lab").mkdir(parents=True)
    (root / "run/gpuready-lab/nvidia-module-version").write_text("550.90.07\n")

    chroot = shutil.which("chroot") or "/usr/sbin/chroot"

    def inside(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([chroot, str(root), *argv], capture_output=True, text=True,
                              timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})

    proc = inside("all_reduce_perf", "-b", "1M", "-e", "1M", "-g", "4", "-c", "1")
    assert proc.returncode == 0, proc.stderr
    run = nccl.parse_text(proc.stdout)
    assert len(run.devices) == 4 and run.complete
    assert "nccl-tests version 2.17.1" in proc.stdout
    proc = inside("/bin/sh", "-c", "echo x > /tmp/c && sha256sum /tmp/c > /tmp/s && "
                  "sha256sum -c /tmp/s && python3 -c 'import json, hashlib; print(\"py ok\")'")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["/tmp/c: OK", "py ok"]
