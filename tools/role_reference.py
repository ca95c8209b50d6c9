"""The role reference: docs/roles.md, written from every role's ``meta/argument_specs.yml``.

The argument specs are the roles' contract (Ansible checks every input against them before a
role runs, and ``ansible-doc -t role -r roles <role>`` prints them); this page is the same data
for readers of the repository. Each role gets its purpose (the entry point's short description
and description) and one table row per option: type, whether it is required, its default,
its choices and its description. A default the spec leaves out because it is templated is
taken from the role's ``defaults/main.yml``, where Ansible finds it too.

    .venv/bin/python -m tools.role_reference     # or `make docs`: rewrite docs/roles.md

``tests/unit/tools/test_role_reference.py`` fails while docs/roles.md differs from what this writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO_ROOT / "roles"
OUTPUT = REPO_ROOT / "docs" / "roles.md"
REGENERATE = "make docs"

# A default longer than this is linked to its file rather than quoted in the table.
_MAX_DEFAULT_CHARS = 80

# Ansible's documentation markup (the subset argument specs use; ansible-doc renders the same).
_MARKUP = re.compile(r"\b([CIBUMOVE])\(([^)]*)\)|\bL\(([^,)]*),\s*([^)]*)\)")


@dataclass(frozen=True, slots=True)
class Option:
    """One row of an entry point's table; sub-options are flattened as ``parent.child``."""

    name: str
    type: str
    required: bool
    default: str
    choices: str
    description: str


@dataclass(frozen=True, slots=True)
class EntryPoint:
    name: str
    short_description: str
    description: tuple[str, ...]
    options: tuple[Option, ...]


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    entry_points: tuple[EntryPoint, ...]


class SpecError(ValueError):
    """An argument spec this generator cannot read, naming the file and the key."""


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")


def markup(text: str) -> str:
    """Ansible markup to Markdown: ``C(x)``, ``I(x)``, ``O(x)``, ``V(x)``, ``M(x)``, ``E(x)``
    become code, ``B(x)`` bold, ``U(url)`` and ``L(text, url)`` links. Outside code, ``<``, ``>``
    and ``*`` are escaped so that ``gpuready-<name>.pref`` is not read as an HTML tag."""
    out: list[str] = []
    done = 0
    for match in _MARKUP.finditer(text):
        out.append(_escape(text[done : match.start()]))
        letter, body, link_text, link_url = match.groups()
        if letter is None:
            out.append(f"[{_escape(link_text)}]({link_url})")
        elif letter == "B":
            out.append(f"**{_escape(body)}**")
        elif letter == "U":
            out.append(f"<{body}>")
        else:
            out.append(f"`{body}`")
        done = match.end()
    out.append(_escape(text[done:]))
    return "".join(out)


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped (inside code spans too, as GFM asks)."""
    return " ".join(text.split()).replace("|", r"\|")


def _paragraphs(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise SpecError(f"a description must be a string or a list of strings, not {value!r}")


def _type(spec: Mapping[str, Any]) -> str:
    kind = str(spec.get("type", "str"))
    elements = spec.get("elements")
    return f"{kind} of {elements}" if kind == "list" and elements else kind


def _literal(value: Any) -> str:
    """A default as it would be written in YAML flow style, in a code span."""
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _default(
    name: str, spec: Mapping[str, Any], role_defaults: Mapping[str, Any], role: str
) -> str:
    if "default" in spec:
        return _literal(spec["default"])
    if spec.get("required"):
        return ""
    if name in role_defaults:
        text = _literal(role_defaults[name])
        if len(text) > _MAX_DEFAULT_CHARS or "\n" in text:
            return f"see [defaults/main.yml](../roles/{role}/defaults/main.yml)"
        return f"{text} (defaults/main.yml)"
    return "unset"


def _options(
    options: Mapping[str, Any],
    role_defaults: Mapping[str, Any],
    role: str,
    prefix: str = "",
    where: str = "",
) -> Iterator[Option]:
    for name, spec in options.items():
        if not isinstance(spec, Mapping):
            raise SpecError(f"{where}: option {prefix}{name} is not a mapping")
        choices = spec.get("choices")
        yield Option(
            name=f"{prefix}{name}",
            type=_type(spec),
            required=bool(spec.get("required", False)),
            # Defaults/main.yml holds the role's top-level variables only.
            default=_default(name, spec, role_defaults if not prefix else {}, role),
            choices=", ".join(f"`{choice}`" for choice in choices) if choices else "",
            description=" ".join(markup(p) for p in _paragraphs(spec.get("description"))),
        )
        sub = spec.get("options")
        if sub:
            child_prefix = (
                f"{prefix}{name}[]." if spec.get("type") == "list" else f"{prefix}{name}."
            )
            yield from _options(sub, role_defaults, role, child_prefix, where)


def load_role(role_dir: Path) -> Role:
    """A role's entry points from its argument specs, ``main`` first, the others by name."""
    spec_file = role_dir / "meta" / "argument_specs.yml"
    where = f"roles/{role_dir.name}/meta/argument_specs.yml"
    data = yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}
    specs = data.get("argument_specs")
    if not isinstance(specs, Mapping) or not specs:
        raise SpecError(f"{where}: no argument_specs mapping")
    defaults_file = role_dir / "defaults" / "main.yml"
    role_defaults: Mapping[str, Any] = {}
    if defaults_file.is_file():
        role_defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8")) or {}
    entry_points = []
    for entry in sorted(specs, key=lambda name: (name != "main", name)):
        spec = specs[entry]
        if not isinstance(spec, Mapping):
            raise SpecError(f"{where}: entry point {entry} is not a mapping")
        entry_points.append(
            EntryPoint(
                name=entry,
                short_description=markup(str(spec.get("short_description", ""))),
                description=tuple(markup(p) for p in _paragraphs(spec.get("description"))),
                options=tuple(
                    _options(spec.get("options") or {}, role_defaults, role_dir.name, where=where)
                ),
            )
        )
    return Role(role_dir.name, tuple(entry_points))


def load_roles(roles_dir: Path = ROLES_DIR) -> list[Role]:
    """Every role under ``roles_dir`` that declares its inputs, by name."""
    return [
        load_role(spec.parent.parent)
        for spec in sorted(roles_dir.glob("*/meta/argument_specs.yml"))
    ]


def _entry_point_lines(role: Role, entry: EntryPoint) -> Iterator[str]:
    if entry.name != "main":
        yield f"### Entry point `{entry.name}`"
        yield ""
        yield (
            f"{entry.short_description}. Included with `tasks_from: {entry.name}` "
            f"(`tasks/{entry.name}.yml`)."
        )
        yield ""
    for paragraph in entry.description:
        yield " ".join(paragraph.split())
        yield ""
    if not entry.options:
        yield "No options."
        yield ""
        return
    yield "| Option | Type | Required | Default | Choices | Description |"
    yield "|---|---|---|---|---|---|"
    for option in entry.options:
        cells = (
            f"`{option.name}`",
            option.type,
            "yes" if option.required else "",
            option.default,
            option.choices,
            option.description,
        )
        yield "| " + " | ".join(_cell(cell) for cell in cells) + " |"
    yield ""


def render(roles: Sequence[Role]) -> str:
    """docs/roles.md: an index of the roles, then each role's entry points and options."""
    lines = [
        "<!-- Generated by `python -m tools.role_reference` (`make docs`) from",
        "     roles/*/meta/argument_specs.yml: edit the specs, not this file. -->",
        "# Role reference",
        "",
        "Every role declares its inputs in `meta/argument_specs.yml`; Ansible checks them before",
        "the role's first task, so a wrong type or a missing required value fails the host before",
        "anything changes. This page is generated from those specs (`make docs`), and",
        "`ansible-doc -t role -r roles <role>` prints the same. A default the spec leaves out is",
        "templated in the role's `defaults/main.yml`. Options are inventory variables: set them in",
        "the pool's or the site's `group_vars` (see [Bootstrap](bootstrap.md)).",
        "",
        "| Role | Purpose |",
        "|---|---|",
    ]
    for role in roles:
        main = role.entry_points[0]
        lines.append(f"| [`{role.name}`](#{role.name}) | {_cell(main.short_description)} |")
    lines.append("")
    for role in roles:
        lines += [f"## {role.name}", ""]
        main = role.entry_points[0]
        if main.name == "main":
            lines += [f"{main.short_description}.", ""]
        for entry in role.entry_points:
            lines += list(_entry_point_lines(role, entry))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.role_reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=OUTPUT,
        help=f"where to write (default: {OUTPUT.relative_to(REPO_ROOT)})",
    )
    args = parser.parse_args(argv)
    try:
        text = render(load_roles())
    except (OSError, SpecError, yaml.YAMLError) as exc:
        print(f"role_reference: error: {exc}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"role_reference: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
