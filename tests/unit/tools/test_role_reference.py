"""docs/roles.md is what the argument specs say, and the generator renders specs faithfully."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tools import role_reference as rr


def test_docs_roles_md_is_generated_from_the_current_argument_specs() -> None:
    expected = rr.render(rr.load_roles())
    current = rr.OUTPUT.read_text(encoding="utf-8") if rr.OUTPUT.is_file() else ""
    assert current == expected, (
        "docs/roles.md is stale: a role's meta/argument_specs.yml (or defaults/main.yml) changed. "
        f"Regenerate it with `{rr.REGENERATE}` (.venv/bin/python -m tools.role_reference) "
        "and commit docs/roles.md"
    )


def test_every_role_and_every_declared_option_is_on_the_page() -> None:
    page = rr.OUTPUT.read_text(encoding="utf-8")
    roles = sorted(p.parent.parent.name for p in rr.ROLES_DIR.glob("*/meta/argument_specs.yml"))
    assert len(roles) >= 10
    for role in roles:
        assert f"\n## {role}\n" in page, role
        specs = yaml.safe_load((rr.ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
        for entry, spec in specs["argument_specs"].items():
            if entry != "main":
                assert f"### Entry point `{entry}`" in page, (role, entry)
            for option in spec.get("options") or {}:
                assert f"| `{option}` |" in page, (role, entry, option)


def _role(tmp_path: Path, specs: str, defaults: str | None = None) -> Path:
    role = tmp_path / "roles" / "demo_role"
    (role / "meta").mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(textwrap.dedent(specs))
    if defaults is not None:
        (role / "defaults").mkdir()
        (role / "defaults" / "main.yml").write_text(textwrap.dedent(defaults))
    return role


def test_a_spec_renders_type_required_default_choices_and_sub_options(tmp_path: Path) -> None:
    _role(
        tmp_path,
        """\
        argument_specs:
          helper:
            short_description: The second entry point
            options: {}
          main:
            short_description: Does a thing
            description:
              - Writes gpuready-<name>.pref and reads I(demo_role_mode).
              - Second paragraph with B(bold) and U(https://example.com/x).
            options:
              demo_role_mode:
                type: str
                default: fast
                choices: [fast, safe]
                description: C(a|b) pipes stay inside one cell.
              demo_role_items:
                type: list
                elements: dict
                required: true
                description: Items.
                options:
                  name:
                    type: str
                    required: true
                    description: The item's name.
              demo_role_path:
                type: path
                description: Templated in defaults.
              demo_role_table:
                type: list
                elements: dict
                description: A long default.
        """,
        defaults="""\
        demo_role_path: "{{ role_path }}/x"
        demo_role_table:
          - {name: a-rather-long-key-name, value: 1, why: a reason long enough to overflow a cell}
        """,
    )
    (role,) = rr.load_roles(tmp_path / "roles")
    assert [e.name for e in role.entry_points] == ["main", "helper"]
    page = rr.render([role])
    assert (
        '| `demo_role_mode` | str |  | `"fast"` | `fast`, `safe` | '
        r"`a\|b` pipes stay inside one cell. |"
    ) in page
    assert "| `demo_role_items` | list of dict | yes |  |  | Items. |" in page
    assert "| `demo_role_items[].name` | str | yes |  |  | The item's name. |" in page
    assert (
        '| `demo_role_path` | path |  | `"{{ role_path }}/x"` (defaults/main.yml) |  | '
        "Templated in defaults. |"
    ) in page
    assert "see [defaults/main.yml](../roles/demo_role/defaults/main.yml)" in page
    assert "Writes gpuready-&lt;name&gt;.pref and reads `demo_role_mode`." in page
    assert "Second paragraph with **bold** and <https://example.com/x>." in page
    assert "### Entry point `helper`" in page
    assert "No options." in page
    # main's section comes before the other entry point's, whatever the order in the file.
    assert page.index("Does a thing.") < page.index("### Entry point `helper`")


def test_markup_outside_code_is_escaped_but_code_spans_are_kept() -> None:
    assert rr.markup("C(mig-<profile>) or <raw> *x*") == r"`mig-<profile>` or &lt;raw&gt; \*x\*"
    assert rr.markup("L(the guide, https://example.com)") == "[the guide](https://example.com)"


def test_a_broken_spec_is_an_error_naming_its_file(tmp_path: Path) -> None:
    _role(tmp_path, "argument_specs:\n  main:\n    options:\n      demo_role_x: 3\n")
    with pytest.raises(rr.SpecError, match=r"roles/demo_role/meta/argument_specs.yml.*demo_role_x"):
        rr.load_roles(tmp_path / "roles")


def test_main_writes_the_page_it_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "roles.md"
    assert rr.main(["--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == rr.render(rr.load_roles())
    assert "wrote" in capsys.readouterr().out
