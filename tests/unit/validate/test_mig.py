"""MIG as a pool declares it (issue 31): the declaration (validate.mig, validate.desired, the
inventory loader), the parsers on real MIG captures, gpu.mig's judgement, and the simulated
nvidia-smi held to the same captures."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from lab.hardware import set_mig_layout
from tests.conftest import FIXTURES
from tests.unit.lab.test_conformance import populated
from tests.unit.lab.test_sim_nvidia_smi import Host, _paths
from tests.unit.validate.parsers.test_nvidia_smi_golden import capture_sections
from tests.unit.validate.test_checks_runner import ScriptedTransport, _node, _out
from validate import desired, runner
from validate.checks import select
from validate.checks.gpu import judge_mig
from validate.inventory import InventoryError, load
from validate.mig import GPU_INSTANCE_PROFILES, MigLayout, known_profile
from validate.model import Status
from validate.parsers import ParseError, nvidia_smi_list, nvidia_smi_q, nvidia_smi_xml
from validate.parsers.nvidia_smi_model import MigDevice

H100_MIG = FIXTURES / "nvidia-smi-captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200_MIG = FIXTURES / "nvidia-smi-captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
H100_LAYOUT = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


def _section(path: Path, title: str) -> str:
    return capture_sections(path)[title]


# ---------------------------------------------------------------------------- parsers


def test_list_names_the_mig_devices_of_real_captures() -> None:
    (h100,) = nvidia_smi_list.parse(_section(H100_MIG, "capabilities :: list (-L)"))
    assert (h100.index, h100.name) == (0, "NVIDIA H100 80GB HBM3")
    assert [(m.index, m.profile) for m in h100.mig_devices] == list(enumerate(H100_LAYOUT))
    (h200,) = nvidia_smi_list.parse(_section(H200_MIG, "capabilities :: list (-L)"))
    # a 3g.71gb GPU instance split into two compute instances
    assert [m.profile for m in h200.mig_devices] == [
        "1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    for plain in sorted(FIXTURES.glob("nvidia-smi-captures/*.txt")):
        if "-mig_" in plain.name:
            continue
        (gpu,) = nvidia_smi_list.parse(_section(plain, "capabilities :: list (-L)"))
        assert gpu.mig_devices == () and gpu.uuid and gpu.uuid.startswith("GPU-")


@pytest.mark.parametrize("text", ["", "garbage\n", "  MIG 1g.10gb     Device  0: (UUID: x)\n"])
def test_list_refuses_what_is_not_a_gpu_list(text: str) -> None:
    with pytest.raises(ParseError):
        nvidia_smi_list.parse(text)


def test_mig_devices_from_real_xml_and_text() -> None:
    a100_40 = nvidia_smi_xml.parse(
        (FIXTURES / "nvidia-smi-xml/a100-sxm4-40gb-mig-drv510-v11.xml").read_text()).gpus[0]
    assert (a100_40.mig_mode, a100_40.mig_pending) == ("Enabled", "Enabled")
    assert a100_40.mig_devices == (MigDevice(0, 1, 0, 42, 19968), MigDevice(1, 2, 0, 42, 19968))
    a100_80 = nvidia_smi_xml.parse(
        (FIXTURES / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()).gpus[0]
    assert [(d.gpu_instance_id, d.multiprocessor_count, d.memory_total_mib)
            for d in a100_80.mig_devices] == [(3, 14, 19968), (4, 14, 19968), (5, 14, 19968),
                                              (6, 14, 19968)]
    h100 = nvidia_smi_q.parse(_section(H100_MIG, "idle :: query (-q)")).gpus[0]
    assert [(d.gpu_instance_id, d.multiprocessor_count, d.memory_total_mib)
            for d in h100.mig_devices] == [(2, 60, 40448), (3, 32, 20096), (9, 16, 9984),
                                           (10, 16, 9984)]
    h200 = nvidia_smi_q.parse(_section(H200_MIG, "idle :: query (-q)")).gpus[0]
    assert [(d.gpu_instance_id, d.compute_instance_id) for d in h200.mig_devices][:2] == [
        (2, 0), (2, 1)]
    t4 = nvidia_smi_xml.parse((FIXTURES / "nvidia-smi-xml/tesla-t4-drv515-v11.xml").read_text())
    assert (t4.gpus[0].mig_mode, t4.gpus[0].mig_pending, t4.gpus[0].mig_devices) == (
        None, None, ())


def test_the_catalog_knows_every_profile_gfd_labelled_on_a_real_a100() -> None:
    names: set[str] = set()
    for path in FIXTURES.glob("k8s-api/node-yaml-*a100-sxm4-40gb-mig*.yaml"):
        labels = yaml.safe_load(path.read_text())["metadata"]["labels"]
        names |= {m[1] for k in labels if (m := re.match(r"nvidia\.com/mig-(.+)\.count$", k))}
    assert names >= {"1g.5gb", "2g.10gb"}
    assert all(known_profile("a100-40gb", n) for n in names), names
    assert not known_profile("a100-80gb", "1g.5gb")
    assert known_profile("h200-141gb", "1c.3g.71gb") and not known_profile(
        "h200-141gb", "3c.3g.71gb")


# ---------------------------------------------------------------------------- declaration

POOL = {"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink", "fabric": "infiniband",
        "workload": "inference", "sharing": "mig"}


@pytest.mark.parametrize(("sharing", "layout", "var", "reason"), [
    ("mig", ["3g.40gb", "3g.41gb"], "gpu_mig_layout", "[1] is '3g.41gb', not a MIG profile of "
     "h100-80gb"),
    ("full-gpu", ["1g.10gb"], "gpu_mig_layout", "gpu_pool.sharing is 'full-gpu'"),
    ("mig", None, "gpu_pool", "gpu_mig_layout is not set"),
    ("mig-1g.10gb", ["1g.10gb", "2g.20gb"], "gpu_mig_layout", "declares every MIG device 1g.10gb"),
    ("mig-9g.1gb", ["1g.10gb"], "gpu_pool", "names no MIG profile of h100-80gb"),
    ("mig", {"x": ["1g.10gb"]}, "gpu_mig_layout", "not a GPU index"),
    ("mig", "1g.10gb", "gpu_mig_layout", "not a non-empty list"),
])
def test_bad_declarations_name_the_variable(sharing: str, layout: object, var: str,
                                            reason: str) -> None:
    state, problems = desired.read({"gpu_pool": {**POOL, "sharing": sharing},
                                    "gpu_mig_layout": layout})
    assert state.mig is None
    assert [p.var for p in problems] == [var]
    assert reason in problems[0].reason, problems[0].reason


def test_good_declarations() -> None:
    state, problems = desired.read({"gpu_pool": POOL, "gpu_mig_layout": H100_LAYOUT})
    assert problems == () and state.mig == MigLayout(every_gpu=tuple(H100_LAYOUT))
    state, problems = desired.read({"gpu_pool": POOL, "gpu_mig_layout": {
        0: ["7g.80gb"], "1": ["1c.3g.40gb", "2c.3g.40gb", "4g.40gb"]}})
    assert problems == () and state.mig is not None
    assert (state.mig.for_gpu(0), state.mig.for_gpu(1), state.mig.for_gpu(2)) == (
        ("7g.80gb",), ("1c.3g.40gb", "2c.3g.40gb", "4g.40gb"), None)
    state, problems = desired.read({"gpu_pool": {**POOL, "sharing": "full-gpu"}})
    assert problems == () and state.mig is None


def test_the_loader_refuses_a_bad_layout_naming_the_group(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars/pool_mig").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_mig:\n"
        "          hosts:\n            gpu-01: {ansible_host: 127.0.1.1}\n")
    pool = (inv / "group_vars/pool_mig/pool.yml")
    pool.write_text(yaml.safe_dump({"gpu_profile": "h100-sxm5-80gb-8x", "gpu_pool": POOL,
                                    "gpu_mig_layout": ["3g.40gb", "1g.5gb"]}))
    with pytest.raises(InventoryError) as err:
        load(inv)
    assert ("gpu_mig_layout (set in group pool_mig, host gpu-01) [1] is '1g.5gb', not a MIG "
            "profile of h100-80gb") in str(err.value)
    pool.write_text(yaml.safe_dump({"gpu_profile": "h100-sxm5-80gb-8x", "gpu_pool": POOL,
                                    "gpu_mig_layout": H100_LAYOUT}))
    (node,) = load(inv)
    assert node.desired.mig == MigLayout(every_gpu=tuple(H100_LAYOUT))


# ---------------------------------------------------------------------------- judgement


def _h100_mig() -> tuple[nvidia_smi_q.NvidiaSmiLog, tuple[nvidia_smi_list.ListedGpu, ...]]:
    return (nvidia_smi_q.parse(_section(H100_MIG, "idle :: query (-q)")),
            nvidia_smi_list.parse(_section(H100_MIG, "capabilities :: list (-L)")))


def _codes(verdicts: list) -> dict[str, tuple[Status, str]]:  # type: ignore[type-arg]
    return {v.metric: (v.status, v.code) for v in verdicts}


def test_a_real_mig_gpu_passes_its_declared_layout_in_any_order() -> None:
    log, listed = _h100_mig()
    layout = MigLayout(every_gpu=tuple(reversed(H100_LAYOUT)))
    assert _codes(judge_mig(log, layout, listed)) == {
        "mig_mode": (Status.PASS, "ok"), "mig_pending": (Status.PASS, "ok"),
        "mig_layout": (Status.PASS, "ok")}


def test_a_real_mig_gpu_with_other_devices_fails_the_layout() -> None:
    log, listed = _h100_mig()
    verdicts = judge_mig(log, MigLayout(every_gpu=("7g.80gb",)), listed)
    layout = next(v for v in verdicts if v.metric == "mig_layout")
    assert (layout.status, layout.code, layout.value) == (
        Status.FAIL, "gpu.mig.layout_mismatch", 1.0)
    assert layout.detail == ("GPU0(00000000:00:09.0): found [3g.40gb, 2g.20gb, 1g.10gb, "
                             "1g.10gb], declared [7g.80gb]")


def test_a_real_mig_gpu_in_a_full_gpu_pool_fails() -> None:
    log, _ = _h100_mig()
    assert _codes(judge_mig(log, None)) == {
        "mig_mode": (Status.FAIL, "gpu.mig.mode_enabled"),
        "mig_pending": (Status.FAIL, "gpu.mig.mode_pending")}


def test_gpus_without_mig_pass_a_full_gpu_pool_and_fail_a_mig_pool() -> None:
    for name in ("tesla-t4-drv515-v11.xml", "rtx-a5000-x2-drv590-v13.xml"):
        log = nvidia_smi_xml.parse((FIXTURES / "nvidia-smi-xml" / name).read_text())
        assert {s for s, _ in _codes(judge_mig(log, None)).values()} == {Status.PASS}
        mode = judge_mig(log, MigLayout(every_gpu=("1g.10gb",)), ())[0]
        assert (mode.status, mode.code) == (Status.FAIL, "gpu.mig.mode_disabled")


# ---------------------------------------------------------------------------- the simulator


@pytest.fixture
def h100_mig(tmp_path: Path) -> Host:
    host = Host(tmp_path, "h100-sxm5-8x")
    set_mig_layout(host.hw, H100_LAYOUT)
    return host


def test_sim_mig_xml_has_the_real_mig_sample_element_paths(h100_mig: Host) -> None:
    real = _paths(ET.fromstring(
        (FIXTURES / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()))
    out = h100_mig.smi("-q", "-x")
    assert out.returncode == 0, out.stderr
    assert _paths(ET.fromstring(out.stdout)) == real  # MIG devices and remapped_rows N/A too


def test_sim_in_mig_mode_has_every_field_of_the_real_mig_sample(h100_mig: Host) -> None:
    real = nvidia_smi_xml.parse(
        (FIXTURES / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()).gpus[0]
    sim = nvidia_smi_xml.parse(h100_mig.smi("-q", "-x").stdout).gpus[0]
    assert populated(real) - populated(sim) == set()
    assert {f for f in populated(sim) if f.startswith("mig")} == {
        f for f in populated(real) if f.startswith("mig")}


def test_sim_mig_devices_are_the_real_capture_s(h100_mig: Host) -> None:
    real = nvidia_smi_q.parse(_section(H100_MIG, "idle :: query (-q)")).gpus[0]
    sim = nvidia_smi_xml.parse(h100_mig.smi("-q", "-x").stdout)
    for gpu in sim.gpus:
        assert (gpu.mig_mode, gpu.mig_pending) == ("Enabled", "Enabled")
        assert gpu.mig_devices == real.mig_devices
    sim_text = nvidia_smi_q.parse(h100_mig.smi("-q").stdout)
    assert {g.mig_mode for g in sim_text.gpus} == {"Enabled"}


def test_sim_list_prints_mig_lines_as_the_real_tool(h100_mig: Host) -> None:
    real_lines = _section(H100_MIG, "capabilities :: list (-L)").splitlines()
    out = h100_mig.smi("-L").stdout.splitlines()
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert [uuid.sub("U", line) for line in out[1:5]] == [
        uuid.sub("U", line) for line in real_lines[1:5]]
    listed = nvidia_smi_list.parse(h100_mig.smi("-L").stdout)
    assert len(listed) == 8
    assert all([m.profile for m in g.mig_devices] == H100_LAYOUT for g in listed)


def test_sim_fault_takes_one_gpu_out_of_mig_mode(h100_mig: Host) -> None:
    h100_mig.faults("mig-gpu-off")
    log = nvidia_smi_xml.parse(h100_mig.smi("-q", "-x").stdout)
    off = [g.index for g in log.gpus if g.mig_mode != "Enabled"]
    assert off == [1] and log.gpus[1].mig_devices == () and log.gpus[1].mig_pending == "Disabled"
    listed = nvidia_smi_list.parse(h100_mig.smi("-L").stdout)
    verdicts = _codes(judge_mig(log, MigLayout(every_gpu=tuple(H100_LAYOUT)), listed))
    assert verdicts["mig_mode"] == (Status.FAIL, "gpu.mig.mode_disabled")
    assert verdicts["mig_layout"] == (Status.PASS, "ok")  # GPU 1 is said by mig_mode


def test_sim_without_a_layout_is_out_of_mig_mode(tmp_path: Path) -> None:
    host = Host(tmp_path, "h100-sxm5-8x")
    log = nvidia_smi_xml.parse(host.smi("-q", "-x").stdout)
    assert {(g.mig_mode, g.mig_devices) for g in log.gpus} == {("Disabled", ())}
    assert {s for s, _ in _codes(judge_mig(log, None)).values()} == {Status.PASS}
    set_mig_layout(host.hw, H100_LAYOUT)
    set_mig_layout(host.hw, None)
    assert "MIG" not in host.smi("-L").stdout
    with pytest.raises(ValueError, match="not a MIG profile name"):
        set_mig_layout(host.hw, ["3g"])
    assert set(GPU_INSTANCE_PROFILES) >= {"h100-80gb", "a100-80gb"}


# ---------------------------------------------------------------------------- through the runner


def test_gpu_mig_asks_nvidia_smi_l_only_in_a_mig_pool() -> None:
    xml = (FIXTURES / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()
    listing = _section(H100_MIG, "capabilities :: list (-L)")
    answers = {("nvidia-smi", "-q", "-x"): _out(xml), ("nvidia-smi", "-L"): _out(listing)}
    # A full-GPU pool: one -q -x serves gpu.mig, and the GPU in MIG mode fails it.
    t = ScriptedTransport("n1", answers)
    rows = runner.run_node(_node(), select("gpu.mig"), "r1", t)
    assert t.calls == [("nvidia-smi", "-q", "-x")]
    assert {(r.metric, r.code) for r in rows} >= {("mig_mode", "gpu.mig.mode_enabled")}
    # A MIG pool: -L names the devices; gpu.nvlink is not asked (MIG refuses NVLink queries).
    pool = {"accelerator": "a100-80gb", "topology": "8gpu-sxm-nvlink", "fabric": "infiniband",
            "workload": "inference", "sharing": "mig"}
    node = _node(gpu_pool=pool, gpu_mig_layout=H100_LAYOUT)
    t = ScriptedTransport("n1", answers)
    rows = runner.run_node(node, select("gpu.mig,gpu.nvlink"), "r1", t)
    assert t.calls == [("nvidia-smi", "-q", "-x"), ("nvidia-smi", "-L")]
    by = {(r.check, r.metric): (r.status.value, r.code) for r in rows}
    assert by[("gpu.mig", "mig_layout")] == ("pass", "ok")
    assert by[("gpu.mig", "mig_mode")] == ("pass", "ok")
    assert by[("gpu.nvlink", "")][0] == "skip"
