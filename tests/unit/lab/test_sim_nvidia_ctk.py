"""lab/sim/nvidia_ctk.py: CDI spec generation/listing and version banners."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "nvidia_ctk.py"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    write_hardware(tmp_path / "hw", render_host("a100-sxm4-8x", "gpu-a100-01"))
    write_faults(tmp_path / "hw", [])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "nvidia-module-version").write_text("550.90.07\n")
    return tmp_path


def run_sim(node: Path, *args: str, tool: str = "nvidia-ctk") -> subprocess.CompletedProcess[str]:
    env = {"GPUREADY_LAB_HW": str(node / "hw"), "GPUREADY_LAB_RUN": str(node / "run"),
           "GPUREADY_SIM_TOOL": tool, "GPUREADY_SIM_VERSION": "1.17.3", "PATH": "/nonexistent"}
    return subprocess.run([sys.executable, str(SIM), *args], env=env, capture_output=True,
                          text=True, timeout=10, check=False)


def test_generate_writes_a_cdi_spec_shaped_like_the_real_one(node: Path):
    spec_file = node / "cdi" / "nvidia.yaml"
    out = run_sim(node, "cdi", "generate", f"--output={spec_file}")
    assert out.returncode == 0
    assert "INFO[0000] Generated CDI spec with version 0.5.0" in out.stderr
    text = spec_file.read_text()
    # Layout of the real writer (toolkit generate_test.go): document marker, 4-space lists.
    assert text.startswith(
        '---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n    - name: "0"\n'
    )
    assert (
        "\n      containerEdits:\n        deviceNodes:\n            - path: /dev/nvidia0\n"
    ) in text
    spec = yaml.safe_load(text)
    assert list(spec) == ["cdiVersion", "kind", "devices", "containerEdits"]
    assert [d["name"] for d in spec["devices"]] == [str(i) for i in range(8)] + ["all"]
    assert len(spec["devices"][-1]["containerEdits"]["deviceNodes"]) == 8
    edits = spec["containerEdits"]
    assert {"path": "/dev/nvidiactl"} in edits["deviceNodes"]
    assert all(h["hookName"] == "createContainer" for h in edits["hooks"])
    assert any(m["hostPath"].endswith("libcuda.so.550.90.07") for m in edits["mounts"])


def test_list_reads_the_spec_back(node: Path):
    spec_dir = node / "cdi"
    run_sim(node, "cdi", "generate", f"--output={spec_dir / 'nvidia.yaml'}")
    out = run_sim(node, "cdi", "list", "--spec-dir", str(spec_dir))
    assert out.stdout.split() == [f"nvidia.com/gpu={i}" for i in range(8)] + ["nvidia.com/gpu=all"]
    assert "Found 9 CDI devices" in out.stderr


def test_uuid_strategy_and_gpu_missing(node: Path):
    write_faults(node / "hw", ["gpu-missing"])
    out = run_sim(node, "cdi", "generate", "--device-name-strategy=uuid")
    names = [d["name"] for d in yaml.safe_load(out.stdout)["devices"]]
    assert len(names) == 8 and names[0].startswith("GPU-") and names[-1] == "all"


def test_generate_fails_without_driver(node: Path):
    (node / "run" / "nvidia-module-version").unlink()
    out = run_sim(node, "cdi", "generate")
    assert out.returncode == 1 and out.stdout == "" and "ERRO[0000]" in out.stderr


def test_version_banners(node: Path):
    ctk = run_sim(node, "--version").stdout.splitlines()
    assert ctk[0] == "NVIDIA Container Toolkit CLI version 1.17.3"
    assert ctk[1].startswith("commit: ") and "gpuready lab simulator" in ctk[1]
    rt = run_sim(node, "--version", tool="nvidia-container-runtime").stdout.splitlines()
    assert rt[0] == "NVIDIA Container Runtime version 1.17.3" and rt[2] == "spec: 1.2.0"
