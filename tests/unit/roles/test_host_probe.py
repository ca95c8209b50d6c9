"""The roles' host probe (roles/host_probe/files/host_probe.py): the JSON the roles act on.

The roles run it as ``python3 -c <file> ARGS`` through `raw`, the argv quoted with Ansible's
``quote`` filter (shlex.quote); these tests run it the same way, on this machine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "roles" / "host_probe" / "files" / "host_probe.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_probe", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(*args: str) -> dict[str, Any]:
    """Run the probe as the roles' raw tasks do: `sh -c` of the quoted argv."""
    argv = ["python3", "-c", SCRIPT.read_text(), *args]
    proc = subprocess.run(["/bin/sh", "-c", " ".join(shlex.quote(a) for a in argv)],
                          capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_files_are_read_without_following_links(tmp_path: Path) -> None:
    conf = tmp_path / "a.conf"
    conf.write_text("nvidia-peermem\n")
    conf.chmod(0o640)
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d").chmod(0o700)
    (tmp_path / "link").symlink_to(conf)
    out = _probe(*(f"--file={tmp_path / n}" for n in ("a.conf", "d", "link", "none")))
    files = {Path(k).name: v for k, v in out["files"].items()}
    me = {"owner": files["a.conf"]["owner"], "group": files["a.conf"]["group"]}
    assert files == {
        "a.conf": {"type": "file", "mode": "0640", **me,
                   "sha1": hashlib.sha1(b"nvidia-peermem\n").hexdigest()},
        "d": {"type": "directory", "mode": "0700", **me, "sha1": None},
        "link": {"type": "link", "mode": "0777", **me, "sha1": None},
        "none": {"type": "none", "mode": None, "owner": None, "group": None, "sha1": None},
    }
    assert out["packages"] == {} and out["units"] == {} and out["runs"] == {}


def test_runs_report_exit_status_output_and_a_missing_program(tmp_path: Path) -> None:
    out = _probe("--run", "py", f"{sys.executable} -c 'import sys; print(1); sys.exit(3)'",
                 "--run", "gone", "no-such-program-gpuready --version",
                 "--read", str(tmp_path / "none"))
    assert out["runs"] == {
        "py": {"found": True, "rc": 3, "stdout": "1\n", "stderr": ""},
        "gone": {"found": False, "rc": 127, "stdout": "",
                 "stderr": "no-such-program-gpuready: not found on PATH"},
    }
    assert out["contents"] == {str(tmp_path / "none"): None}


# The fields of the real capture below, in the order nvidia-smi was asked for them
# (fixtures/SOURCES.tsv: telegraf's Tesla P4 sample).
P4_FIELDS = ("fan.speed,memory.total,memory.used,memory.free,pstate,temperature.gpu,name,uuid,"
             "compute_mode,utilization.gpu,utilization.memory,index,power.draw")


def test_csv_reads_a_run_s_lines_into_objects_by_field_name(fixtures_dir: Path) -> None:
    capture = fixtures_dir / "nvidia-smi-csv" / "tesla-p4-query-gpu-noheader-nounits.csv"
    out = _probe("--run", "smi", f"cat {capture}", "--csv", "smi", P4_FIELDS,
                 "--run", "two", "printf '550.90.07, 4\\n\\n550.90.07\\n'",
                 "--csv", "two", "driver_version,count", "--csv", "never", "a,b")
    (gpu,) = out["csv"]["smi"]
    assert (gpu["fan.speed"], gpu["name"], gpu["uuid"], gpu["index"], gpu["power.draw"]) == (
        "[Not Supported]", "Tesla P4", "GPU-xxx", "0", "0.0")
    assert len(gpu) == len(P4_FIELDS.split(","))
    # A blank line is no GPU; a short line's missing field is null, not shifted.
    assert out["csv"]["two"] == [{"driver_version": "550.90.07", "count": "4"},
                                 {"driver_version": "550.90.07", "count": None}]
    assert out["csv"]["never"] == []


def test_a_run_past_its_timeout_is_stopped_as_coreutils_timeout_stops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    probe = _module()
    assert probe.run("sleep 30", 0.2)["rc"] == 124  # SIGTERM ends sleep
    monkeypatch.setattr(probe, "KILL_AFTER_S", 0.2)
    stubborn = (f"{sys.executable} -c 'import signal, time;"
                " signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)'")
    assert probe.run(stubborn, 0.5)["rc"] == 137


@pytest.mark.skipif(not Path("/usr/bin/dpkg-query").exists(), reason="needs dpkg")
def test_packages_are_dpkgs_status_words_or_empty_where_dpkg_does_not_know_them() -> None:
    out = _probe("--package=dpkg", "--package=no-such-package-gpuready")
    dpkg = out["packages"]["dpkg"]
    assert (dpkg["want"], dpkg["eflag"], dpkg["status"]) in {("install", "ok", "installed"),
                                                             ("hold", "ok", "installed")}
    assert dpkg["version"]
    assert out["packages"]["no-such-package-gpuready"] == {
        "version": "", "want": "", "eflag": "", "status": ""}


def test_primary_fingerprints_skip_subkeys() -> None:
    listing = "\n".join([
        "pub:-:4096:1:A4285295FC7B1A81:1581:::-:::scSC::::::23::0:",
        "fpr:::::::::EB693B3035CD5710E231E123A4B469963BF863CC:",
        "uid:-::::1581::0::cudatools <cudatools@nvidia.com>::::::::::0:",
        "sub:-:4096:1:1234567890ABCDEF:1581::::::e::::::23:",
        "fpr:::::::::0123456789ABCDEF0123456789ABCDEF01234567:",
    ])
    assert _module().primary_fingerprints(listing) == ["EB693B3035CD5710E231E123A4B469963BF863CC"]


def test_a_keyring_that_is_not_a_file_is_null_and_armor_is_read_from_its_first_line(
        tmp_path: Path) -> None:
    armored = tmp_path / "k.asc"
    armored.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot a key\n")
    binary = tmp_path / "k.gpg"
    binary.write_bytes(b"\x99\x02\x0d")
    out = _probe("--gpg-home", str(tmp_path / ".gnupg"), "--keyring", str(armored),
                 "--keyring", str(binary), "--keyring", str(tmp_path))
    keyrings = out["keyrings"]
    assert keyrings[str(tmp_path)] is None
    assert keyrings[str(armored)]["armored"] is True
    assert keyrings[str(binary)]["armored"] is False
    for key in (armored, binary):
        assert keyrings[str(key)]["fingerprints"] == []
        assert keyrings[str(key)]["rc"] != 0


def test_newer_names_the_first_file_newer_than_its_reference(tmp_path: Path) -> None:
    ref = tmp_path / "lists"
    ref.mkdir()
    old, new = tmp_path / "a.sources", tmp_path / "b.sources"
    old.write_text("")
    new.write_text("")
    os.utime(old, (1_000, 1_000))
    os.utime(ref, (2_000, 2_000))
    os.utime(new, (3_000, 3_000))
    assert _probe("--newer", str(tmp_path / "*.sources"), str(ref))["newer"] == [str(new)]
    assert _probe("--newer", str(tmp_path / "*.sources"), str(tmp_path / "gone"))["newer"] == [
        str(old)]


def test_sysctls_read_as_sysctl_n_prints_them() -> None:
    """This machine's real kernel parameters, against procps' own `sysctl -n` (a multi-value one
    among them, tab-separated), and one that does not exist."""
    names = ["vm.max_map_count", "net.ipv4.ip_local_port_range", "kernel.ostype"]
    real = subprocess.run(["sysctl", "-n", *names], capture_output=True, text=True, check=True)
    out = _probe(*(f"--sysctl={n}" for n in names), "--sysctl=gpuready.no_such_parameter")
    assert out["sysctls"] == {**dict(zip(names, real.stdout.splitlines(), strict=True)),
                              "gpuready.no_such_parameter": None}
    assert "\t" in out["sysctls"]["net.ipv4.ip_local_port_range"]
