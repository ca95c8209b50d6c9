"""The simulated nvidia-smi, run as a subprocess, held against REAL captured output."""

from __future__ import annotations

import csv
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lab.hardware import render_host, write_faults, write_hardware

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "nvidia_smi.py"


class Host:
    """One simulated host: hardware dir, kernel-state dir, driver version."""

    def __init__(self, root: Path, profile: str, version: str = "550.90.07") -> None:
        self.hw = root / "hw"
        self.run_dir = root / "run"
        self.version = version
        write_hardware(self.hw, render_host(profile, f"test-{profile}"))
        write_faults(self.hw, [])

    def faults(self, *names: str) -> Host:
        write_faults(self.hw, list(names))
        return self

    def smi(self, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        env = {"GPUREADY_LAB_HW": str(self.hw), "GPUREADY_LAB_RUN": str(self.run_dir),
               "GPUREADY_SIM_VERSION": self.version, "GPUREADY_SIM_TOOL": "nvidia-smi",
               "PATH": "/usr/bin:/bin"}
        return subprocess.run([sys.executable, str(SIM), *args], capture_output=True,
                              text=True, env=env, timeout=timeout, check=False)


@pytest.fixture
def h100(tmp_path: Path) -> Host:
    return Host(tmp_path, "h100-sxm5-8x")


@pytest.fixture
def l40s(tmp_path: Path) -> Host:
    return Host(tmp_path, "l40s-pcie-4x")


def _sim_module() -> ModuleType:
    # Only to learn which field names the simulator claims; every assertion runs the tool.
    spec = importlib.util.spec_from_file_location("gpuready_sim_nvidia_smi", SIM)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _csv(text: str) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]


# ---------------------------------------------------------------------------- list, banners


def test_list_matches_real_line_shape(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-nvlink/h100-sxm-nvlink-s-18links.txt").read_text()
    shape = re.compile(r"^GPU \d+: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)$")
    assert shape.match(real.splitlines()[0])
    out = h100.smi("-L")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert len(lines) == 8 and all(shape.match(line) for line in lines)


def test_banners_say_simulated_but_data_never_does(h100: Host) -> None:
    version = h100.smi("--version")
    assert "gpuready lab simulator" in version.stdout
    assert version.stdout.startswith(
        "NVIDIA-SMI version  : 550.90.07\nNVML version        : 550.90\n")
    assert "gpuready lab simulator" in h100.smi("-h").stdout
    assert "(gpuready lab simulator)" in h100.smi().stdout
    for args in (["-L"], ["-q"], ["-q", "-x"], ["topo", "-m"], ["nvlink", "-s"],
                 ["--query-gpu=name,uuid,serial", "--format=csv"]):
        assert "gpuready" not in h100.smi(*args).stdout, args


# ---------------------------------------------------------------------------- --query-gpu


@pytest.mark.parametrize(
    ("profile", "sample"),
    [("h100-sxm5-8x", "h100-80gb-hbm3-query-gpu-full-idle.csv"),
     ("l40s-pcie-4x", "l40s-query-gpu-full-load.csv")],
)
def test_csv_header_text_equals_real(tmp_path: Path, fixtures_dir: Path, profile: str,
                                     sample: str) -> None:
    real_header = (fixtures_dir / "nvidia-smi-csv" / sample).read_text().splitlines()[0]
    real_cols = real_header.split(", ")
    names = [c.split(" [")[0] for c in real_cols]
    host = Host(tmp_path, profile)
    supported = [n for n in names if n in _sim_module().QUERY_FIELDS]
    # The validator-relevant fields must all be there; most of the 590 list is.
    needed = {"index", "name", "uuid", "serial", "pci.bus_id", "driver_version", "memory.total",
              "memory.used", "pcie.link.gen.current", "pcie.link.gen.max",
              "pcie.link.width.current", "pcie.link.width.max", "persistence_mode",
              "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
              "ecc.errors.corrected.aggregate.total", "retired_pages.pending",
              "remapped_rows.pending", "temperature.gpu", "power.draw", "power.limit",
              "clocks_event_reasons.gpu_idle", "utilization.gpu", "count"}
    assert needed <= set(supported)
    assert len(supported) >= 130
    out = host.smi("--query-gpu=" + ",".join(supported), "--format=csv")
    ours = out.stdout.splitlines()[0]
    assert ours == ", ".join(c for c, n in zip(real_cols, names, strict=True) if n in supported)


def test_csv_values_units_and_noheader(h100: Host, fixtures_dir: Path) -> None:
    fields = "index,name,memory.total,power.limit,pcie.link.gen.max,clocks_event_reasons.gpu_idle"
    rows = _csv(h100.smi(f"--query-gpu={fields}", "--format=csv").stdout)
    sample = fixtures_dir / "nvidia-smi-csv/h100-80gb-hbm3-query-gpu-full-idle.csv"
    real = _csv(sample.read_text())[0]
    assert [r["index"] for r in rows] == [str(i) for i in range(8)]
    for key in ("name", "memory.total [MiB]", "power.limit [W]", "pcie.link.gen.max",
                "clocks_event_reasons.gpu_idle"):
        assert {r[key] for r in rows} == {real[key]}, key
    bare = h100.smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits").stdout
    assert bare.splitlines()[0] == "0, NVIDIA H100 80GB HBM3, 81559, 700.00, 5, Active"
    assert len(bare.splitlines()) == 8
    one = h100.smi("--query-gpu=index,uuid", "--format=csv,noheader", "-i", "3").stdout
    assert one.startswith("3, GPU-") and len(one.splitlines()) == 1


def test_throttle_alias_answers_like_event_reasons(h100: Host) -> None:
    out = h100.smi("--query-gpu=clocks_throttle_reasons.active,clocks_event_reasons.active",
                   "--format=csv").stdout.splitlines()
    assert out[0] == "clocks_throttle_reasons.active, clocks_event_reasons.active"
    assert out[1] == "0x0000000000000001, 0x0000000000000001"


def test_unknown_field_is_rejected_like_the_real_tool(h100: Host) -> None:
    out = h100.smi("--query-gpu=index,gpu.fabulousness", "--format=csv")
    assert out.returncode == 2
    assert out.stdout == 'Field "gpu.fabulousness" is not a valid field to query.\n\n'


# ---------------------------------------------------------------------------- -q and -q -x


def _q_keys(text: str) -> set[str]:
    keys = set()
    for line in text.splitlines():
        if line.startswith("    "):
            keys.add(line.split(" : ")[0].strip() if " : " in line else line.strip())
    return keys


def test_query_text_sections_and_keys_as_real(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt").read_text()
    out = h100.smi("-q")
    assert out.returncode == 0
    ours = out.stdout
    assert _q_keys(real) - {"Latest Timestamp", "Latest Duration", "Inforom BBX Object Flush"} \
        <= _q_keys(ours)
    assert _q_keys(ours) <= _q_keys(real)
    # Same layout: the banner, then the value column at 44 in every key line.
    assert ours.startswith("\n==============NVSMI LOG==============\n\nTimestamp")
    colons = {line.index(" : ") for line in ours.splitlines() if " : " in line}
    real_colons = {line.index(" : ") for line in real.splitlines() if " : " in line}
    assert colons == real_colons == {41}
    assert re.findall(r"^GPU (\S+)$", ours, re.MULTILINE) == re.findall(
        r"^GPU (\S+)$", real, re.MULTILINE)
    single = h100.smi("-q", "-i", "2").stdout
    assert re.findall(r"^GPU (\S+)$", single, re.MULTILINE) == ["00000000:4C:00.0"]
    assert "Attached GPUs                             : 8" in single


def _paths(element: ET.Element, prefix: str = "") -> set[str]:
    here = f"{prefix}/{element.tag}"
    found = {here}
    for child in element:
        found |= _paths(child, here)
    return found


def test_xml_same_element_paths_as_real_v12(h100: Host, fixtures_dir: Path) -> None:
    real_path = fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml"
    real_text = real_path.read_text()
    out = h100.smi("-q", "-x")
    assert out.returncode == 0
    assert out.stdout.splitlines()[1] == real_text.splitlines()[1]  # the DOCTYPE/DTD line
    real = _paths(ET.fromstring(real_text))
    ours = _paths(ET.fromstring(out.stdout))
    # The real sample has MIG enabled: mig devices listed, remapped_rows N/A (not applicable in
    # MIG mode). Ours is MIG-disabled, which lists no devices and fills remapped_rows in.
    mig = {p for p in real if "/mig_devices/" in p}
    remap = {p for p in ours if "/remapped_rows/" in p}
    assert real - mig == ours - remap
    v11 = ET.fromstring((fixtures_dir / "nvidia-smi-xml/a10g-drv515-v11.xml").read_text())
    assert remap == {p for p in _paths(v11) if "/remapped_rows/" in p}
    root = ET.fromstring(out.stdout)
    assert root.findtext("attached_gpus") == "8"
    ids = [g.get("id") for g in root.findall("gpu")]
    assert ids[:2] == ["00000000:19:00.0", "00000000:3B:00.0"]


# ---------------------------------------------------------------------------- topo, nvlink


def test_topo_matches_real_nv18_board_sample(h100: Host, fixtures_dir: Path) -> None:
    # The 8-GPU NV18 capture (B200, published with its tabs rendered as spaces) gives the
    # columns, legend and cell vocabulary; a tab-separated capture of the same driver family
    # gives the cell layout of the affinity columns.
    real = (fixtures_dir / "nvidia-smi-topo" /
            "b200-8gpu-nv18-8nic-legend-gpu-numa-id-gke-a4-docspaces.txt").read_text()
    tabbed = (fixtures_dir / "nvidia-smi-topo/h100-single-gpu-vm-topo-m-ansi.txt").read_text()
    out = h100.smi("topo", "-m")
    assert out.returncode == 0
    ours = out.stdout
    real_legend = real[real.index("\nLegend:"):real.index("NIC Legend:")]
    assert real_legend in ours
    real_header = re.split(r" {2,}", real.splitlines()[0].strip())
    header = ours.splitlines()[0].split("\t")
    assert header[1:] == real_header
    assert header[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert header[9:17] == [f"NIC{i}" for i in range(8)]
    rows = [line.split("\t") for line in ours.splitlines()[1:17]]
    vocabulary = {" X ", "NV18", "PIX", "NODE", "SYS"}
    real_rows = [line.split() for line in real.splitlines()[1:17]]
    for row, real_row in zip(rows[:8], real_rows[:8], strict=True):
        assert set(row[1:17]) <= vocabulary
        assert {cell.strip() for cell in row[1:17]} <= set(real_row[1:17])
        assert row[1:9].count("NV18") == 7 == real_row[1:9].count("NV18")
        assert row[-1] == real_row[-1] == "N/A"
        assert len(row) == len(header) + 1
    # Real tab layout: NUMA Affinity, an empty cell, then GPU NUMA ID.
    tabbed_gpu0 = tabbed.splitlines()[1].split("\t")
    assert tabbed_gpu0[-2:] == ["", "N/A"]
    for row in rows[:8]:
        assert row[-2:] == ["", "N/A"]
    for row in rows[8:]:
        assert row[-4:] == ["", "", "", ""]
    assert ours.rstrip("\n").endswith("  NIC7: mlx5_7")
    assert re.findall(r"^  NIC\d+: mlx5_\d+$", real, re.MULTILINE)
    assert len(re.findall(r"^  NIC\d+: mlx5_\d+$", ours, re.MULTILINE)) == 8


def test_topo_l40s_pcie_only(l40s: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-topo/l40s-single-gpu-topo-m-ansi.txt").read_text()
    ours = l40s.smi("topo", "-m").stdout
    assert ours.endswith(real[real.index("\nLegend:"):])  # no NIC legend: Ethernet only
    cells = {c for line in ours.splitlines()[1:5] for c in line.split("\t")[1:5]}
    assert cells == {" X ", "NODE", "SYS"}


def test_nvlink_lines_match_real_shape(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-nvlink/h100-sxm-nvlink-s-18links.txt").read_text()
    link = re.compile(r"^\t Link \d+: 26\.562 GB/s$")
    assert all(link.match(line) for line in real.splitlines()[1:])
    ours = h100.smi("nvlink", "-s").stdout.splitlines()
    assert len(ours) == 8 * 19
    assert [line for line in ours if not line.startswith("GPU ")] == real.splitlines()[1:] * 8
    assert h100.smi("nvlink", "--status", "-i", "0").stdout.splitlines()[1:] == \
        real.splitlines()[1:]


def test_nvlink_on_pcie_card_prints_nothing_on_550(l40s: Host, fixtures_dir: Path) -> None:
    assert (fixtures_dir / "nvidia-smi-nvlink/a10-nvlink-status-empty-output.txt").read_text() == ""
    out = l40s.smi("nvlink", "--status")
    assert (out.returncode, out.stdout) == (0, "")


# ---------------------------------------------------------------------------- default table


def test_table_matches_real_550_layout(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-table/h100-x8-drv550.90.07-default-table.txt").read_text()
    real_lines = real.splitlines()
    ours = h100.smi().stdout.splitlines()
    assert ours[1:8] == real_lines[1:8]  # same driver and CUDA: header block byte-identical
    gpu_rows = re.compile(r"^\|\s+\d+\s+NVIDIA H100 80GB HBM3\s+(On|Off)\s+\|\s+0000")
    assert sum(bool(gpu_rows.match(line)) for line in ours) == 8
    assert [len(line) for line in ours[1:41]] == [len(line) for line in real_lines[1:41]]
    assert ours[41:48] == real_lines[41:48]
    assert ours[48] == "(gpuready lab simulator)"


# ---------------------------------------------------------------------------- faults


def test_fault_gpu_missing(h100: Host) -> None:
    h100.faults("gpu-missing")
    assert len(h100.smi("-L").stdout.splitlines()) == 7
    assert h100.smi("--query-gpu=count", "--format=csv,noheader").stdout.splitlines()[0] == "7"
    assert "00000000:DB:00.0" not in h100.smi("-q").stdout


def test_fault_ecc_uncorrectable(h100: Host) -> None:
    h100.faults("ecc-uncorrectable")
    fields = "index,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total"
    rows = h100.smi(f"--query-gpu={fields}", "--format=csv,noheader").stdout.splitlines()
    assert rows[0] != "0, 0, 0" and rows[0].startswith("0, ")
    assert all(row.endswith(", 0, 0") for row in rows[1:])
    gpu0 = h100.smi("-q", "-i", "0").stdout
    assert re.search(r"Volatile\n(.*\n){4}\s+DRAM Uncorrectable\s+: [1-9]", gpu0)
    xml = ET.fromstring(h100.smi("-q", "-x", "-i", "0").stdout)
    assert int(xml.findtext("gpu/ecc_errors/aggregate/dram_uncorrectable") or 0) > 0
    assert re.search(r"\| +[1-9]\d* \|$", h100.smi().stdout.splitlines()[8])


def test_fault_row_remap_pending(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-q-text/"
            "a100-sxm4-80gb-remapped-rows-pending-dram-correctable-excerpt.txt").read_text()
    h100.faults("row-remap-pending")
    rows = h100.smi("--query-gpu=index,remapped_rows.pending", "--format=csv,noheader").stdout
    assert [r for r in rows.splitlines() if r.endswith("Yes")] == ["1, Yes"]
    block = h100.smi("-q", "-i", "1").stdout
    pending = "        Pending                           : Yes"
    assert pending in real.splitlines() and pending in block.splitlines()


def test_fault_pcie_degraded(h100: Host) -> None:
    h100.faults("pcie-degraded")
    fields = ("index,pcie.link.gen.current,pcie.link.gen.max,"
              "pcie.link.width.current,pcie.link.width.max")
    rows = h100.smi(f"--query-gpu={fields}", "--format=csv,noheader").stdout.splitlines()
    assert rows[2] == "2, 3, 5, 8, 16"
    assert all(row.endswith("5, 5, 16, 16") for i, row in enumerate(rows) if i != 2)


def test_fault_nvlink_down(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-nvlink/a100-sxm4-80gb-nvlink-s-all-links-inactive.txt")
    h100.faults("nvlink-down")
    out = h100.smi("nvlink", "-s", "-i", "3").stdout.splitlines()
    assert out[1] == real.read_text().splitlines()[1]
    topo = h100.smi("topo", "-m").stdout.splitlines()
    gpu3 = topo[4].split("\t")
    assert gpu3[0] == "GPU3" and "NV18" not in gpu3[1:9]
    assert set(gpu3[1:9]) - {" X "} <= {"NODE", "SYS", "PIX"}
    assert topo[1].split("\t")[1:9].count("NV18") == 6


def test_fault_driver_not_loaded_is_the_real_message(h100: Host, fixtures_dir: Path) -> None:
    real = (fixtures_dir / "nvidia-smi-nodriver/nvidia-smi-535.261.03-debian12-no-driver-rc9.txt")
    h100.faults("driver-not-loaded")
    for args in ([], ["-L"], ["-q"]):
        out = h100.smi(*args)
        assert (out.returncode, out.stdout) == (9, real.read_text())


def test_fault_tool_hang(h100: Host) -> None:
    h100.faults("tool-hang")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        h100.smi("-L", timeout=1.5)
    assert time.monotonic() - started >= 1.4
    assert not err.value.stdout


def test_faults_are_reread_on_every_call(h100: Host) -> None:
    assert len(h100.smi("-L").stdout.splitlines()) == 8
    h100.faults("gpu-missing")
    assert len(h100.smi("-L").stdout.splitlines()) == 7
    h100.faults()
    assert len(h100.smi("-L").stdout.splitlines()) == 8


# ---------------------------------------------------------------------------- driver state


def test_module_loads_then_mismatch_after_userland_upgrade(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm5-8x", version="535.161.08")
    assert host.smi("-L").returncode == 0
    assert (host.run_dir / "nvidia-module-version").read_text().strip() == "535.161.08"
    host.version = "550.90.07"  # package upgraded, old module still loaded, no reboot yet
    out = host.smi("-L")
    assert out.returncode == 18
    assert out.stdout == ("Failed to initialize NVML: Driver/library version mismatch\n"
                          "NVML library version: 550.90\n")
    (host.run_dir / "nvidia-module-version").unlink()  # the reboot (tmpfs) clears it
    assert host.smi("-L").returncode == 0


def test_cuda_version_follows_driver_branch(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm5-8x", version="535.161.08")
    assert "CUDA Version                              : 12.2" in host.smi("-q").stdout


@pytest.fixture
def persistenced(tmp_path: Path) -> Iterator[None]:
    sleep = shutil.which("sleep")
    assert sleep
    fake = tmp_path / "nvidia-persistenced"
    shutil.copy(sleep, fake)
    proc = subprocess.Popen([str(fake), "30"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def test_persistence_mode_follows_the_daemon(tmp_path: Path, persistenced: None) -> None:
    host = Host(tmp_path / "h", "h100-sxm5-8x")
    out = host.smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout
    assert set(out.splitlines()) == {"Enabled"}
    assert "|   0  NVIDIA H100 80GB HBM3          On  |" in host.smi().stdout


def test_persistence_disabled_without_daemon(h100: Host) -> None:
    # Lab hosts' daemons (make test runs the lab tests beside this suite) are other hosts':
    # each runs in its host's PID namespace, and the simulator does not count them.
    sim = _sim_module()
    if any(p.read_text().strip() == "nvidia-persiste" and sim._in_my_pid_namespace(p.parent)
           for p in Path("/proc").glob("[0-9]*/comm") if p.exists()):
        pytest.skip("a process named nvidia-persistenced runs in this PID namespace")
    out = h100.smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout
    assert set(out.splitlines()) == {"Disabled"}


def test_bad_gpu_id_and_bad_args(h100: Host) -> None:
    out = h100.smi("-q", "-i", "8")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")
    bad = h100.smi("--frobnicate")
    assert bad.returncode == 2 and "Invalid combination of input arguments" in bad.stdout
