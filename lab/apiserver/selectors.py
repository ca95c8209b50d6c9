"""``labelSelector`` and ``fieldSelector`` as apimachinery parses and matches them.

Label selector grammar (k8s.io/apimachinery/pkg/labels/selector.go): requirements separated
by commas, each one of ``key``, ``!key``, ``key=v``, ``key==v``, ``key!=v``,
``key in (v1,v2)``, ``key notin (v1,v2)``, ``key>n``, ``key<n``. ``!=`` and ``notin`` match an
object without the key; values may be empty. Field selectors take ``=``, ``==``, ``!=`` on the
fields a resource supports (Nodes: ``metadata.name``, ``spec.unschedulable``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lab.apiserver.validation import label_value_errors, qualified_name_errors


class SelectorError(ValueError):
    """A selector that does not parse; the message is kube-apiserver's."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if not has:
            return False
        try:
            number = int(value or "")
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=,()<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            raise SelectorError(f"unable to parse requirement: invalid character at {pos}")
        out.append(match.group(1))
        pos = match.end()
    return out


def _check_key(key: str) -> None:
    errs = qualified_name_errors(key)
    if errs:
        raise SelectorError(f'unable to parse requirement: key: Invalid value: "{key}": '
                            f"{errs[0]}")


def _check_value(value: str) -> None:
    errs = label_value_errors(value)
    if errs:
        raise SelectorError(f'unable to parse requirement: values[0][{value}]: Invalid value: '
                            f'"{value}": {errs[0]}')


def parse_label_selector(text: str) -> list[Requirement]:
    tokens = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def expect_value(at: int) -> tuple[str, int]:
        if at < len(tokens) and tokens[at] not in (",", "(", ")", "=", "==", "!=", "!"):
            return tokens[at], at + 1
        return "", at  # `key=` selects an empty value

    while i < len(tokens):
        tok = tokens[i]
        if tok == "!":
            if i + 1 >= len(tokens):
                raise SelectorError("unable to parse requirement: found '', expected: identifier")
            key = tokens[i + 1]
            _check_key(key)
            reqs.append(Requirement(key, "!"))
            i += 2
        else:
            key = tok
            if key in (",", "(", ")", "=", "==", "!=", ">", "<"):
                raise SelectorError(f"unable to parse requirement: found '{key}', "
                                    "expected: !, identifier, or 'end of string'")
            _check_key(key)
            i += 1
            if i >= len(tokens) or tokens[i] == ",":
                reqs.append(Requirement(key, "exists"))
            elif tokens[i] in ("=", "==", "!="):
                op = "!=" if tokens[i] == "!=" else "="
                value, i = expect_value(i + 1)
                _check_value(value)
                reqs.append(Requirement(key, op, (value,)))
            elif tokens[i] in ("in", "notin"):
                op = tokens[i]
                if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                    raise SelectorError("unable to parse requirement: found '', expected: '('")
                i += 2
                values: list[str] = []
                while i < len(tokens) and tokens[i] != ")":
                    if tokens[i] == ",":
                        i += 1
                        continue
                    _check_value(tokens[i])
                    values.append(tokens[i])
                    i += 1
                if i >= len(tokens):
                    raise SelectorError("unable to parse requirement: found '', expected: ')'")
                i += 1
                if op == "in" and not values:
                    raise SelectorError("unable to parse requirement: values: Invalid value: "
                                        "[]: for 'in', 'notin' operators, values set can't "
                                        "be empty")
                reqs.append(Requirement(key, op, tuple(values)))
            elif tokens[i] in (">", "<"):
                op = "gt" if tokens[i] == ">" else "lt"
                value, i = expect_value(i + 1)
                if not re.fullmatch(r"-?\d+", value):
                    raise SelectorError(f'unable to parse requirement: values[0]: Invalid '
                                        f'value: "{value}": for \'Gt\', \'Lt\' operators, '
                                        "the value must be an integer")
                reqs.append(Requirement(key, op, (value,)))
            else:
                raise SelectorError(f"unable to parse requirement: found '{tokens[i]}', "
                                    "expected: in, notin, =, ==, !=, gt, lt")
        if i < len(tokens):
            if tokens[i] != ",":
                raise SelectorError(f"unable to parse requirement: found '{tokens[i]}', "
                                    "expected: ',' or 'end of string'")
            i += 1
    return reqs


def label_matcher(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    if not text:
        return lambda _labels: True
    reqs = parse_label_selector(text)
    return lambda labels: all(r.matches(labels) for r in reqs)


def field_matcher(text: str | None, fields: Mapping[str, Callable[[dict[str, Any]], str]],
                  resource: str) -> Callable[[dict[str, Any]], bool]:
    """A predicate over objects for ``fieldSelector``; ``fields`` maps each supported field to
    how to read it from an object."""
    if not text:
        return lambda _obj: True
    tests: list[tuple[Callable[[dict[str, Any]], str], bool, str]] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        match = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", term)
        if match is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        name, op, value = match.group(1).strip(), match.group(2), match.group(3).strip()
        if name not in fields:
            raise SelectorError(f'field label not supported: {name}')
        tests.append((fields[name], op != "!=", value))
    return lambda obj: all((read(obj) == value) == equal for read, equal, value in tests)
