"""The operator-action catalogue covers every fault code the checks, the runner and the
transport can emit, each with a source.

Codes are found in the source itself (string literals and f-string templates), so a new code
without an action fails here rather than showing up in a report with no advice."""

from __future__ import annotations

import ast
import re

import yaml

from tests.conftest import REPO_ROOT
from validate import xid_catalog
from validate.actions import ACTIONS, SUITE, action_for, is_hardware_fault
from validate.checks import REGISTRY
from validate.checks.storage import FIO_METRICS

EMITTERS = [
    *sorted((REPO_ROOT / "validate" / "checks").glob("*.py")),
    *sorted((REPO_ROOT / "validate" / "transport").glob("*.py")),
    REPO_ROOT / "validate" / "model.py",
    REPO_ROOT / "validate" / "parsers" / "dcgmi_diag.py",
    REPO_ROOT / "validate" / "runner.py",
]
# First segments of the suite's own codes; check codes start with "<check id>.".
FRAMEWORK = ("host.", "tool.", "check.", "profile.", "inventory.", "storage.", "run.")
CODE_SHAPE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


def _is_code(text: str) -> bool:
    if not CODE_SHAPE.match(text) or text in REGISTRY:
        return False
    return text.startswith(FRAMEWORK) or any(text.startswith(f"{cid}.") for cid in REGISTRY)


def _codes_in_source() -> tuple[set[str], set[str]]:
    """(literal codes, f-string code templates with ``{}`` for each placeholder)."""
    literals: set[str] = set()
    templates: set[str] = set()
    for path in EMITTERS:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _is_code(node.value):
                    literals.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                template = "".join(
                    v.value if isinstance(v, ast.Constant) else "{}" for v in node.values
                )
                if _is_code(template.replace("{}", "x")):
                    templates.add(template)
    return literals, templates


def _profile_reasons() -> set[str]:
    reasons: set[str] = set()
    for path in (REPO_ROOT / "validate" / "profiles").glob("[!_]*.yml"):
        throttle = yaml.safe_load(path.read_text())["thresholds"]["throttle"]
        reasons |= set(throttle["fail_reasons"]) | set(throttle["warn_reasons"])
    return reasons


def test_every_code_in_the_source_has_an_action() -> None:
    literals, templates = _codes_in_source()
    # The scan finds what the lab's faults produce (tests/lab/test_validate.py EXPECTED).
    assert {"gpu.ecc.uncorrectable", "host.unreachable", "tool.timeout",
            "gpu.driver.not_loaded", "fabric.ib.port_down"} <= literals
    assert templates == {"storage.fio.{}_low", "storage.checkpoint.{}_slow",
                         "gpu.throttle.{}", "gpu.xid.{}"}, "a new code family needs actions"
    expanded = (
        {f"storage.fio.{m}_low" for m in FIO_METRICS}
        | {"storage.checkpoint.write_slow", "storage.checkpoint.read_slow"}
        | {f"gpu.throttle.{r}" for r in _profile_reasons()}
        | {f"gpu.xid.{x}" for x in xid_catalog.XID_CATALOG}
    )
    missing = sorted(c for c in literals | expanded if action_for(c) is None)
    assert missing == []
    # and the catalogue holds no code that nothing emits (a renamed code leaves one behind)
    assert set(ACTIONS) <= literals | expanded


def test_every_action_names_its_source() -> None:
    for code, action in ACTIONS.items():
        assert action.meaning and action.action and action.source.title, code
        # our own codes cite this suite; everything else cites a public document
        assert action.source is SUITE or action.source.url.startswith("https://"), code


def test_families_and_unknown_codes() -> None:
    xid79 = action_for("gpu.xid.79")
    assert xid79 is not None and xid79.action == xid_catalog.XID_CATALOG[79].action
    assert xid79.source.url == xid_catalog.CATALOG_URL and "fallen off the bus" in xid79.meaning
    unknown_xid = action_for("gpu.xid.31337")
    assert unknown_xid is not None and xid_catalog.CATALOG_URL in unknown_xid.action
    thermal = action_for("gpu.throttle.hw_thermal_slowdown")
    assert thermal is not None and "too hot" in thermal.meaning
    assert action_for("no.such.code") is None and action_for("gpu.xid.abc") is None


def test_hardware_faults_are_the_ones_a_clean_run_does_not_clear() -> None:
    marked = sorted(code for code, action in ACTIONS.items() if action.hardware_fault)
    assert marked == ["dcgm.diag.memory", "dcgm.diag.row_remap_failed", "gpu.count.missing",
                      "gpu.ecc.remap_failure", "nccl.allreduce.wrong_results"]
    xids = sorted(x for x in xid_catalog.XID_CATALOG if is_hardware_fault(f"gpu.xid.{x}"))
    assert xids == [64, 79]  # fallen off the bus; row remapping failed
    # Faults a GPU reset clears stay ordinary failures: the next clean run re-admits.
    for code in ("gpu.ecc.uncorrectable", "gpu.ecc.remap_pending", "gpu.xid.48", "gpu.xid.95",
                 "dcgm.diag.row_remap_pending", "dcgm.diag.pcie",
                 "host.unreachable", "no.such.code"):
        assert not is_hardware_fault(code), code
