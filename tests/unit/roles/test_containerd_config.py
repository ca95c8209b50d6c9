"""The containerd role's config.toml, from real `containerd config default` output.

The role writes `containerd config default` with two edits (roles/containerd/vars/main.yml):
the runc runtime's ``SystemdCgroup`` and the one import of ``containerd_conf_dir``. The
defaults differ by release: containerd 1.6's (Debian 12, format version 2) imports nothing,
containerd 2.2's (Docker's containerd.io, version 3) already imports
``'/etc/containerd/conf.d/*.toml'`` in single quotes. Both captures
(tests/fixtures/containerd-config/) go through the role's own variables in real Ansible; the
result must differ from the default in those two keys only, and the real containerd 2.2.9
(lab/runtime/build.py, built from source) must read it back with the import and the cgroup
driver, as the role's last assert reads ``containerd config dump``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from lab.runtime import build as runtime_build
from tests.conftest import REPO_ROOT
from validate.parsers import containerd_config

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "containerd-config"
CAPTURES = {"default-1.6.20-debian12.toml": "2", "default-2.2.9-containerd.io.toml": "3"}
# Where runc's options sit in each format.
RUNC_OPTIONS = {
    "2": ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "options"),
    "3": ("plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options"),
}


def _facts(tmp_path: Path, role: str, play_vars: dict[str, Any],
           facts: dict[str, str]) -> dict[str, Any]:
    """``facts`` (name -> Jinja expression) as real Ansible evaluates them with ``role``'s
    defaults and vars loaded over ``play_vars`` (what the role's earlier tasks registered)."""
    play = [{
        "name": f"{role} variables", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "vars": play_vars,
        "tasks": [
            {"ansible.builtin.include_vars": str(REPO_ROOT / f"roles/{role}/defaults/main.yml")},
            {"ansible.builtin.include_vars": str(REPO_ROOT / f"roles/{role}/vars/main.yml")},
            {"ansible.builtin.set_fact": facts},
        ],
    }]
    run_dir = tmp_path / f"runner-{role}-{len(list(tmp_path.glob('runner-*')))}"
    run_dir.mkdir()
    (run_dir / "play.yml").write_text(json.dumps(play))
    run = ansible_runner.run(
        private_data_dir=str(run_dir), playbook=str(run_dir / "play.yml"),
        inventory=f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}",
        quiet=True,
        # Over include_vars of the role's defaults, as the inventory's values are.
        extravars={k: v for k, v in play_vars.items() if not k.startswith("_")},
        envvars={"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert run.status == "successful", run.stdout.read()
    found: dict[str, Any] = {}
    for event in run.events:
        if event.get("event") == "runner_on_ok":
            found.update(event["event_data"]["res"].get("ansible_facts") or {})
    return {name: found[name] for name in facts}


def _role_config(tmp_path: Path, default: str, conf_dir: str) -> dict[str, str]:
    """The containerd role's ``_containerd_config_content`` and ``_containerd_config_version``
    for a host whose ``containerd config default`` printed ``default`` (the role's probe result,
    as roles/host_probe/files/host_probe.py reports a run)."""
    probe = {"runs": {"default": {"rc": 0, "stdout": default, "stderr": ""}}}
    got = _facts(tmp_path, "containerd",
                 {"_containerd_probe": {"stdout": json.dumps(probe)},
                  "_containerd_probe_installed": {"skipped": True},
                  "containerd_conf_dir": conf_dir},
                 {"content": "{{ _containerd_config_content }}",
                  "version": "{{ _containerd_config_version }}"})
    return {"content": str(got["content"]), "version": str(got["version"])}


def _nvidia_dropin(tmp_path: Path, version: int) -> str:
    """nvidia_container_toolkit's drop-in template for a containerd of configuration
    ``version``, CDI on (as the role decides for containerd 1.7 and newer)."""
    template = REPO_ROOT / "roles/nvidia_container_toolkit/templates/99-nvidia.toml.j2"
    return str(_facts(tmp_path, "nvidia_container_toolkit",
                      {"_nvidia_container_toolkit_config_version": version,
                       "_nvidia_container_toolkit_cdi_supported": True},
                      {"dropin": f"{{{{ lookup('ansible.builtin.template', '{template}') }}}}"})
               ["dropin"])


def _registered(tmp_path: Path, dump: str) -> bool:
    """The role's ``_nvidia_container_toolkit_registered`` (its final assert) on ``dump``."""
    got = _facts(tmp_path, "nvidia_container_toolkit",
                 {"_nvidia_container_toolkit_probe_after": {
                     "stdout": json.dumps({"runs": {"dump": {"rc": 0, "stdout": dump}}})}},
                 {"registered": "{{ _nvidia_container_toolkit_registered }}"})
    return bool(got["registered"])


def _dig(table: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        table = table[key]
    return table


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_the_role_changes_the_import_and_the_cgroup_driver_and_nothing_else(
        tmp_path: Path, capture: str) -> None:
    default = (FIXTURES / capture).read_text()
    rendered = _role_config(tmp_path, default, "/etc/containerd/conf.d")
    assert rendered["version"] == CAPTURES[capture]
    got, want = tomllib.loads(rendered["content"]), tomllib.loads(default)
    assert got["imports"] == ["/etc/containerd/conf.d/*.toml"]
    runc = RUNC_OPTIONS[rendered["version"]]
    assert _dig(want, runc)["SystemdCgroup"] is False
    assert _dig(got, runc)["SystemdCgroup"] is True
    # Everything else is the release's own default, untouched.
    got["imports"] = want["imports"]
    _dig(got, runc)["SystemdCgroup"] = False
    assert got == want
    # The file says who wrote it and where settings go instead.
    assert rendered["content"].startswith("# Managed by gpuready (containerd)")


def test_containerd_2_reads_the_role_s_config_back_with_the_import_and_the_driver(
        tmp_path: Path) -> None:
    """The real containerd 2.2.9 loads the role's file (and a drop-in from the imported
    directory); its dump carries what the role's final assert looks for."""
    conf_dir = tmp_path / "conf.d"
    conf_dir.mkdir()
    (conf_dir / "50-test.toml").write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n"
        "  sandbox = 'registry.k8s.io/pause:test'\n")
    binary = runtime_build.CONTAINERD.ensure_built(log=False) / "containerd"
    default = subprocess.run([str(binary), "config", "default"], check=True,
                             capture_output=True, text=True).stdout
    # The build prints what the capture holds: the fixture is this release's output.
    assert default == (FIXTURES / "default-2.2.9-containerd.io.toml").read_text()
    rendered = _role_config(tmp_path, default, str(conf_dir))
    config = tmp_path / "config.toml"
    config.write_text(rendered["content"])
    dump = subprocess.run([str(binary), "--config", str(config), "config", "dump"], check=True,
                          capture_output=True, text=True).stdout
    parsed = tomllib.loads(dump)
    # containerd 2 lists import patterns, its own default first (it always reads
    # /etc/containerd/conf.d: cmd/containerd/command/config.go), then the file's; 1.6 listed the
    # files it loaded (tests/fixtures/drift-lab/containerd-1.6.20-config-dump-nvidia-runtime.toml).
    assert parsed["imports"] == ["/etc/containerd/conf.d/*.toml", f"{conf_dir}/*.toml"]
    # The drop-in was read: its sandbox image is the effective one.
    assert _dig(parsed, RUNC_OPTIONS["3"])["SystemdCgroup"] is True
    assert (parsed["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
            == "registry.k8s.io/pause:test")
    # Without NVIDIA's drop-in the toolkit role's assert finds no runtime; with it (the template
    # for format 3) it finds the one containerd 2 really loads, quoted as containerd 2 prints it.
    assert not _registered(tmp_path, dump)
    (conf_dir / "99-nvidia.toml").write_text(_nvidia_dropin(tmp_path, 3))
    dump = subprocess.run([str(binary), "--config", str(config), "config", "dump"], check=True,
                          capture_output=True, text=True).stdout
    runtimes = tomllib.loads(dump)["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtimes["enable_cdi"] is True
    assert runtimes["containerd"]["runtimes"]["nvidia"]["options"] == {
        **runtimes["containerd"]["runtimes"]["nvidia"]["options"],
        "BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True}
    assert runtimes["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert "BinaryName = '/usr/bin/nvidia-container-runtime'" in dump
    assert _registered(tmp_path, dump)
    # validate's parser (drift's runtime layer) reads the same runtime from containerd 2's dump.
    nvidia = containerd_config.parse_runtimes(dump)["nvidia"]
    assert nvidia.binary_name == "/usr/bin/nvidia-container-runtime"
