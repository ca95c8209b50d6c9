"""SKU profiles: shipped files load, bands judge, overrides merge, errors name file and key,
and the hardware identity matches what real nvidia-smi prints for that SKU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from validate.model import Status
from validate.profiles import PROFILES_DIR, Band, ProfileError, available, load_profile

SHIPPED = ["a100-sxm4-80gb-8x", "h100-sxm5-80gb-8x", "h200-sxm-141gb-8x", "l40s-pcie-48gb-4x"]


def test_shipped_profiles_load_with_expected_floors() -> None:
    assert available() == SHIPPED
    floors = {n: load_profile(n).band("nccl.allreduce_busbw_gbps").fail for n in SHIPPED}
    assert floors == {
        "h100-sxm5-80gb-8x": 460.0,
        "h200-sxm-141gb-8x": 430.0,
        "a100-sxm4-80gb-8x": 228.0,
        "l40s-pcie-48gb-4x": 14.0,
    }
    h100 = load_profile("h100-sxm5-80gb-8x")
    assert (h100.hardware.gpu_count, h100.hardware.nvlinks_per_gpu, h100.hardware.nvswitch) == (
        8,
        18,
        True,
    )
    assert h100.value("nccl.size_bytes", int) == 8 * 1024**3
    # drive class bands are merged into thresholds.fio
    assert h100.band("fio.seq_read_mibps").better == "higher"
    assert load_profile("l40s-pcie-48gb-4x").hardware.nic_count == 0


@pytest.mark.parametrize(
    ("profile", "capture", "model_re", "mem_re"),
    [
        (
            "h100-sxm5-80gb-8x",
            "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt",
            r"Product Name\s+: (.+)",
            r"FB Memory Usage\s+Total\s+: (\d+) MiB",
        ),
        (
            "h200-sxm-141gb-8x",
            "nvidia-smi-q-text/h200-vm-drv590-load.txt",
            r"Product Name\s+: (.+)",
            r"FB Memory Usage\s+Total\s+: (\d+) MiB",
        ),
        (
            "l40s-pcie-48gb-4x",
            "nvidia-smi-q-text/l40s-drv595-load.txt",
            r"Product Name\s+: (.+)",
            r"FB Memory Usage\s+Total\s+: (\d+) MiB",
        ),
        (
            "a100-sxm4-80gb-8x",
            "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml",
            r"<product_name>(.+)</product_name>",
            r"\n {8}<fb_memory_usage>\s*<total>(\d+) MiB",
        ),
    ],
)
def test_profile_identity_matches_real_capture(
    fixtures_dir: Path, profile: str, capture: str, model_re: str, mem_re: str
) -> None:
    text = (fixtures_dir / capture).read_text()
    model = re.search(model_re, text)
    mem = re.search(mem_re, text)
    assert model and mem
    hw = load_profile(profile).hardware
    assert hw.gpu_model == model.group(1).strip()
    assert hw.gpu_memory_mib == int(mem.group(1))


def test_band_judging() -> None:
    higher = Band(warn=470, fail=460, better="higher")
    assert [higher.judge(v) for v in (480, 465, 459.9)] == [Status.PASS, Status.WARN, Status.FAIL]
    lower = Band(warn=None, fail=0, better="lower")
    assert [lower.judge(v) for v in (0, 1)] == [Status.PASS, Status.FAIL]


def test_inventory_overrides_deep_merge() -> None:
    p = load_profile(
        "h100-sxm5-80gb-8x",
        {"nccl": {"allreduce_busbw_gbps": {"fail": 300, "warn": None}}, "xid": {"window": "-1h"}},
        inventory_vars={"gpuready_scratch_path": "/scratch/x", "gpuready_drive_class": "virtual"},
    )
    band = p.band("nccl.allreduce_busbw_gbps")
    assert (band.fail, band.warn, band.better) == (300.0, None, "higher")
    assert p.value("xid.window", str) == "-1h"
    assert p.value("xid.severity_status", dict)["critical"] == "fail"  # siblings survive
    assert p.scratch_path == "/scratch/x" and p.drive_class == "virtual"
    assert p.band("fio.seq_read_mibps").fail == 20.0


def test_errors_name_file_and_key(tmp_path: Path) -> None:
    d = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR, d)
    with pytest.raises(ProfileError, match=r"nope\.yml: no such profile"):
        load_profile("nope", profiles_dir=d)
    f = d / "h100-sxm5-80gb-8x.yml"
    f.write_text(f.read_text().replace("gpu_count: 8", 'gpu_count: "8"'))
    with pytest.raises(
        ProfileError, match=r"h100-sxm5-80gb-8x\.yml: hardware\.gpu_count: expected"
    ):
        load_profile("h100-sxm5-80gb-8x", profiles_dir=d)
    with pytest.raises(
        ProfileError, match=r"gpu_thresholds: thresholds\.nccl\.allreduce_busbw_gbps\.fail"
    ):
        load_profile(
            "a100-sxm4-80gb-8x", {"nccl": {"allreduce_busbw_gbps": {"fail": "x"}}}, profiles_dir=d
        )
    with pytest.raises(ProfileError, match=r"warn 500\.0 is beyond fail 510\.0"):
        load_profile(
            "a100-sxm4-80gb-8x", {"nccl": {"allreduce_busbw_gbps": {"fail": 510, "warn": 500}}}
        )
    with pytest.raises(ProfileError, match=r"thresholds\.nccl\.repeatz: missing"):
        load_profile("a100-sxm4-80gb-8x").value("nccl.repeatz", int)


@pytest.mark.parametrize("inventory", ["lab", "staging.example", "production.example"])
def test_the_shipped_inventories_thresholds_load_over_every_profile(inventory: str) -> None:
    """Overrides set for every pool (the lab tunes nccl_pair.timeout_s everywhere, also for
    the L40S profile, which defines no pair test) must pass the thresholds' checks."""
    root = PROFILES_DIR.parent.parent / "inventory" / inventory
    found = 0
    for path in sorted(root.rglob("*.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        overrides = data.get("gpu_thresholds") if isinstance(data, dict) else None
        if overrides is None:
            continue
        found += 1
        for name in SHIPPED:
            profile = load_profile(name, overrides, inventory_vars={
                "gpuready_drive_class": data.get("gpuready_drive_class", "virtual")})
            assert profile.thresholds["fio"]["size_mib"] > 0
    assert found or inventory != "lab"
