"""dcgm-exporter's /metrics on REAL scrapes (tests/fixtures/dcgm-exporter/): GPUs by UUID with
their labels and readings; DCGM's blank sentinel is no reading; garbage names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.parsers import ParseError
from validate.parsers.dcgm_exporter import parse

T4 = "dcgm-exporter/tesla-t4-1gpu-drv460.106.00-exporter2-datadog.prom"
README = "dcgm-exporter/1gpu-exporter4.5.3-readme-docker-quickstart-excerpt.prom"


def test_the_datadog_t4_scrape(fixtures_dir: Path) -> None:
    scrape = parse((fixtures_dir / T4).read_text())
    [gpu] = scrape.gpus
    assert (gpu.index, gpu.uuid, gpu.device, gpu.model, gpu.hostname, gpu.driver_version) == (
        0, "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "nvidia0", "Tesla T4", "424773df46e0",
        "460.106.00")
    assert scrape.driver_versions == {"460.106.00"}
    assert len(gpu.values) == 16
    assert gpu.values["DCGM_FI_DEV_XID_ERRORS"] == 0.0
    assert gpu.values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(8.969)
    assert gpu.values["DCGM_FI_DEV_FB_FREE"] == 15109.0
    assert gpu.values["DCGM_FI_DEV_COUNT"] == 1.0
    assert scrape.help["DCGM_FI_DEV_XID_ERRORS"] == "Value of the last XID error encountered."
    assert scrape.types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert scrape.types["DCGM_FI_DEV_SM_CLOCK"] == "gauge"


def test_nvidias_readme_scrape_spaces_split_help_and_the_blank_sentinel(
        fixtures_dir: Path) -> None:
    # HELP/TYPE lines apart from their samples, "gpu="0", UUID=..." with a space, no driver
    # label, and DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794 (DCGM's blank: no reading).
    scrape = parse((fixtures_dir / README).read_text())
    [gpu] = scrape.gpus
    assert (gpu.index, gpu.uuid, gpu.driver_version) == (
        0, "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", None)
    assert gpu.values == {"DCGM_FI_DEV_SM_CLOCK": 139.0, "DCGM_FI_DEV_MEM_CLOCK": 405.0}
    assert scrape.driver_versions == frozenset()
    assert scrape.help["DCGM_FI_DEV_MEMORY_TEMP"] == "Memory temperature (in C)."


def test_two_gpus_and_a_mig_instance(fixtures_dir: Path) -> None:
    # The real T4 line, then the same family for a second GPU and for a MIG instance of it
    # (GPU_I_ID): the instance names its GPU but its reading is not the GPU's own.
    line = (fixtures_dir / T4).read_text().splitlines()[2]
    second = (line.replace('gpu="0"', 'gpu="1"').replace("GPU-20c56d28", "GPU-aaaaaaaa")
              .replace("nvidia0", "nvidia1").replace("} 300", "} 210"))
    mig = second.replace('Hostname=', 'GPU_I_PROFILE="1g.5gb",GPU_I_ID="7",Hostname=').replace(
        "} 210", "} 99")
    scrape = parse("\n".join([line, mig, second]) + "\n")
    assert [(g.index, g.uuid[:12]) for g in scrape.gpus] == [(0, "GPU-20c56d28"),
                                                              (1, "GPU-aaaaaaaa")]
    assert scrape.gpus[1].values == {"DCGM_FI_DEV_SM_CLOCK": 210.0}


@pytest.mark.parametrize(("text", "where"), [
    ("<html><body>404 page not found</body></html>\n", "line 1"),
    ('# HELP x y\nDCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1" 300\n', "line 2"),
    ('DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1"} 3OO\n', "line 1"),
])
def test_garbage_names_the_line(text: str, where: str) -> None:
    with pytest.raises(ParseError, match=f"not the Prometheus text format at {where}"):
        parse(text)


@pytest.mark.parametrize("text", [
    "",
    "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 8\n",
    "DCGM_FI_DEV_COUNT 1\n",  # no gpu, no UUID: not a GPU's
])
def test_no_gpu_sample_is_an_error(text: str) -> None:
    with pytest.raises(ParseError, match="no DCGM_FI_\\* sample labelled with a gpu and a UUID"):
        parse(text)


def test_one_uuid_on_two_indices_is_an_error() -> None:
    text = ('DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1"} 1\n'
            'DCGM_FI_DEV_MEM_CLOCK{gpu="1",UUID="GPU-1"} 1\n')
    with pytest.raises(ParseError, match="GPU-1 is labelled gpu 0 and gpu 1"):
        parse(text)
