#!/usr/bin/env python3
"""gpuready lab simulator: `nvidia-ctk` and `nvidia-container-runtime` (container toolkit).

The command is env GPUREADY_SIM_TOOL (nvidia-ctk | nvidia-container-runtime |
nvidia-container-runtime-hook, the last answering only --version), the toolkit
version env GPUREADY_SIM_VERSION. The node is read on every call from $GPUREADY_LAB_HW
(default /opt/gpuready-lab/hw)/{hardware,faults}.json, the loaded driver from
$GPUREADY_LAB_RUN (default /run/gpuready-lab)/nvidia-module-version.

Commands:
- `nvidia-ctk --version`: `NVIDIA Container Toolkit CLI version X` / `commit: ...`; the commit
  line names the simulator (a real build prints its git commit there).
- `nvidia-container-runtime --version`: `NVIDIA Container Runtime version X` / `commit: ...` /
  `spec: 1.2.0`, then what `runc --version` prints when runc is installed.
- `nvidia-ctk cdi generate [--output=FILE] [--format=yaml|json]
  [--device-name-strategy=index|uuid]`: a CDI spec shaped like the one the real command writes
  (layout and key order from NVIDIA/nvidia-container-toolkit
  cmd/nvidia-ctk/cdi/generate/generate_test.go, driver root /):
    ---
    cdiVersion: 0.5.0
    kind: nvidia.com/gpu
    devices: [{name: "0".., containerEdits: {deviceNodes: [{path: /dev/nvidiaN}]}}, ...,
              {name: all, containerEdits: {deviceNodes: [every /dev/nvidiaN]}}]
    containerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void], deviceNodes: [/dev/nvidia-modeset,
                     /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidiactl],
                     hooks: [create-symlinks, update-ldcache], mounts: [driver libraries,
                     nvidia-smi, nvidia-persistenced]}
  Logs go to stderr in logrus text form (`INFO[0000] Generated CDI spec with version 0.5.0`).
  Without a loaded driver NVML cannot start and the command fails (exit 1).
- `nvidia-ctk cdi list [--spec-dir DIR ...]`: `INFO[0000] Found N CDI devices` on stderr and
  one `nvidia.com/gpu=<name>` per line on stdout, read from the spec files in /etc/cdi and
  /var/run/cdi (or the given directories).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SIMULATOR = "gpuready lab simulator"
DEFAULT_VERSION = "1.17.3"
CDI_VERSION = "0.5.0"
KIND = "nvidia.com/gpu"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# Driver libraries a compute container needs; the real generator finds more (graphics, video).
DRIVER_LIBS = (
    "libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so", "libnvidia-opencl.so", "libnvidia-cfg.so",
)


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _log(level: str, message: str) -> None:
    print(f"{level}[0000] {message}", file=sys.stderr)


def _load() -> tuple[dict[str, Any], set[str]]:
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults_path = _hw_dir() / "faults.json"
    faults: set[str] = set()
    if faults_path.exists():
        faults = set(json.loads(faults_path.read_text()).get("faults", []))
    return hw, faults


def _option(args: list[str], name: str, default: str) -> str:
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return default


def _options(args: list[str], name: str) -> list[str]:
    found = []
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            found.append(arg.split("=", 1)[1])
        elif arg == f"--{name}" and i + 1 < len(args):
            found.append(args[i + 1])
    return found


def build_spec(hw: dict[str, Any], faults: set[str], driver: str, strategy: str) -> dict[str, Any]:
    """The CDI spec for the node's visible GPUs (a dict in the real spec's key order)."""
    gpus = list(hw.get("gpus", []))
    if "gpu-missing" in faults and gpus:
        gpus = gpus[:-1]
    devices: list[dict[str, Any]] = []
    for gpu in gpus:
        index = int(gpu.get("minor_number", gpu.get("index", 0)))
        name = str(gpu.get("uuid")) if strategy == "uuid" else str(gpu.get("index", index))
        devices.append(
            {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}
        )
    all_nodes = [node for d in devices for node in d["containerEdits"]["deviceNodes"]]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": all_nodes}})
    mounts = [
        {
            "hostPath": f"{LIB_DIR}/{lib}.{driver}",
            "containerPath": f"{LIB_DIR}/{lib}.{driver}",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
        for lib in DRIVER_LIBS
    ]
    mounts += [
        {
            "hostPath": "/run/nvidia-persistenced/socket",
            "containerPath": "/run/nvidia-persistenced/socket",
            "options": ["ro", "nosuid", "nodev", "bind", "noexec"],
        },
        {
            "hostPath": "/usr/bin/nvidia-smi",
            "containerPath": "/usr/bin/nvidia-smi",
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
    ]
    hook = "/usr/bin/nvidia-cdi-hook"
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                {"path": "/dev/nvidia-modeset"},
                {"path": "/dev/nvidia-uvm"},
                {"path": "/dev/nvidia-uvm-tools"},
                {"path": "/dev/nvidiactl"},
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": hook,
                    "args": [
                        "nvidia-cdi-hook", "create-symlinks", "--link",
                        f"libcuda.so.1::{LIB_DIR}/libcuda.so",
                    ],
                },
                {
                    "hookName": "createContainer",
                    "path": hook,
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR],
                },
            ],
            "mounts": mounts,
        },
    }


def _yaml_scalar(value: Any) -> str:
    text = str(value)
    # Quote what YAML would read as another type (the real spec writes name: "0").
    if re.fullmatch(r"[0-9.]+|true|false|null|~|", text) and text != CDI_VERSION:
        return json.dumps(text)
    return text


def _yaml_map(value: dict[str, Any], key_col: int, child_base: int) -> list[str]:
    lines: list[str] = []
    for key, item in value.items():
        if isinstance(item, dict | list):
            lines.append(" " * key_col + f"{key}:")
            lines += _yaml(item, child_base)
        else:
            lines.append(" " * key_col + f"{key}: {_yaml_scalar(item)}")
    return lines


def _yaml(value: Any, base: int) -> list[str]:
    """Block YAML as Go's yaml.v3 writes it with indent 4 (the toolkit's spec writer).

    A nested level starts 4 columns right of its parent's level; a mapping that is a list
    item puts its keys 2 columns right of the dash but its children still at +4.
    """
    if isinstance(value, dict):
        return _yaml_map(value, base, base + 4)
    lines: list[str] = []
    for item in value:
        if isinstance(item, dict):
            sub = _yaml_map(item, base + 2, base + 4)
            lines.append(" " * base + "- " + sub[0].lstrip())
            lines += sub[1:]
        else:
            lines.append(" " * base + f"- {_yaml_scalar(item)}")
    return lines


def render_yaml(spec: dict[str, Any]) -> str:
    top = _yaml(spec, 0)
    return "---\n" + "\n".join(top) + "\n"


def cdi_generate(args: list[str]) -> int:
    hw, faults = _load()
    module = _run_dir() / "nvidia-module-version"
    if "driver-not-loaded" in faults or not module.exists():
        _log("ERRO", "failed to generate CDI spec: failed to create device CDI specs: "
             "failed to initialize NVML: ERROR_DRIVER_NOT_LOADED")
        return 1
    driver = module.read_text().strip()
    _log("INFO", "Auto-detected mode as 'nvml'")
    strategy = _option(args, "device-name-strategy", "index")
    spec = build_spec(hw, faults, driver, strategy)
    fmt = _option(args, "format", "yaml")
    text = json.dumps(spec) if fmt == "json" else render_yaml(spec)
    output = _option(args, "output", "")
    _log("INFO", f"Generated CDI spec with version {CDI_VERSION}")
    if output:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, 0o644)
        _log("INFO", f"Wrote CDI spec to {output}")
    else:
        sys.stdout.write(text)
    return 0


def _spec_device_names(text: str) -> tuple[str, list[str]]:
    """(kind, device names) of one spec file, YAML or JSON, without a YAML library."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        doc = json.loads(stripped)
        return str(doc.get("kind", "")), [str(d.get("name")) for d in doc.get("devices", [])]
    kind = ""
    names: list[str] = []
    in_devices = False
    item_indent: int | None = None
    for line in text.splitlines():
        if not line.strip() or line.strip() == "---":
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_devices = line.startswith("devices:")
            if line.startswith("kind:"):
                kind = line.split(":", 1)[1].strip().strip("\"'")
            continue
        match = re.match(r"\s*- name:\s*(.+)$", line)
        if in_devices and match and (item_indent is None or indent == item_indent):
            item_indent = indent
            names.append(match.group(1).strip().strip("\"'"))
    return kind, names


def cdi_list(args: list[str]) -> int:
    dirs = _options(args, "spec-dir") or list(DEFAULT_SPEC_DIRS)
    found: list[str] = []
    for directory in dirs:
        base = Path(directory)
        if not base.is_dir():
            continue
        for spec in sorted(base.iterdir()):
            if spec.suffix not in (".yaml", ".yml", ".json"):
                continue
            kind, names = _spec_device_names(spec.read_text())
            found += [f"{kind}={name}" for name in names]
    _log("INFO", f"Found {len(found)} CDI devices")
    for name in found:
        print(name)
    return 0


def _runc_version() -> str:
    runc = shutil.which("runc")
    if not runc:
        return ""
    proc = subprocess.run([runc, "--version"], capture_output=True, text=True, check=False)
    return proc.stdout


def main(argv: list[str]) -> int:
    tool = os.environ.get("GPUREADY_SIM_TOOL", "nvidia-ctk")
    version = os.environ.get("GPUREADY_SIM_VERSION", DEFAULT_VERSION)
    args = argv[1:]
    commit = f"commit: ({SIMULATOR})"
    if tool == "nvidia-container-runtime-hook":
        if "--version" in args or "-version" in args:
            print(f"NVIDIA Container Runtime Hook version {version}\n{commit}")
            return 0
        _log("ERRO", f"{tool}: only --version is simulated ({SIMULATOR})")
        return 1
    if tool == "nvidia-container-runtime":
        if "--version" in args or "-v" in args:
            print(f"NVIDIA Container Runtime version {version}\n{commit}\nspec: 1.2.0\n")
            sys.stdout.write(_runc_version())
            return 0
        _log("ERRO", f"{tool}: only --version is simulated ({SIMULATOR})")
        return 1
    if not args or args[0] in ("--version", "-v", "version"):
        print(f"NVIDIA Container Toolkit CLI version {version}\n{commit}")
        return 0
    if args[:2] == ["cdi", "generate"]:
        return cdi_generate(args[2:])
    if args[:2] == ["cdi", "list"]:
        return cdi_list(args[2:])
    _log("ERRO", f"{' '.join(args[:2])}: not simulated ({SIMULATOR})")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
