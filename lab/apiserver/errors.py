"""Failures as kube-apiserver reports them: ``Status`` objects with the real reasons, codes,
details and message formats (k8s.io/apimachinery/pkg/api/errors, and the authorizer's
forbidden message from apiserver's responsewriters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Resource:
    """A group/resource pair as errors name it (``nodes``, ``certificatesigningrequests.
    certificates.k8s.io``)."""

    resource: str
    group: str = ""

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True)
class FieldError:
    """One field.Error: ``type`` is the cause type (FieldValueInvalid, ...)."""

    type: str
    field: str
    body: str  # ErrorBody(): what follows "<field>: "

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def invalid_value(path: str, value: object, detail: str) -> FieldError:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return FieldError("FieldValueInvalid", path, f"Invalid value: {shown}: {detail}")


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path,
                      "Required value" + (f": {detail}" if detail else ""))


def duplicate(path: str, value: object) -> FieldError:
    return FieldError("FieldValueDuplicate", path, f'Duplicate value: "{value}"'
                      if isinstance(value, str) else f"Duplicate value: {value}")


def not_supported(path: str, value: object, supported: list[str]) -> FieldError:
    allowed = ", ".join(f'"{s}"' for s in supported)
    return FieldError("FieldValueNotSupported", path,
                      f'Unsupported value: "{value}": supported values: {allowed}')


def forbidden_field(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, f"Forbidden: {detail}")


@dataclass
class ApiError(Exception):
    """An error the handler answers with a Status body."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = field(default=None)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "message": self.message,
                                "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(res: Resource | None, name: str = "", **extra: Any) -> dict[str, Any]:
    # StatusDetails' field order and omitempty: name, group, kind, uid, causes.
    out: dict[str, Any] = {}
    if name:
        out["name"] = name
    if res is not None and res.group:
        out["group"] = res.group
    if res is not None:
        out["kind"] = res.resource
    out.update({k: v for k, v in extra.items() if v})
    return out


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res} "{name}" not found', _details(res, name))


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(res: Resource, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{res} "{name}" already exists', _details(res, name))


def conflict(res: Resource, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {res} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    _details(res, name))


def forbidden(res: Resource | None, name: str, reason: str) -> ApiError:
    if res is None:
        return ApiError(403, "Forbidden", f"forbidden: {reason}", {})
    what = f'{res} "{name}"' if name else str(res)
    return ApiError(403, "Forbidden", f"{what} is forbidden: {reason}", _details(res, name))


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    # utilerrors.NewAggregate: one error alone, several in brackets.
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": e.type, "message": e.body, "field": e.field}
                         for e in errors]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unprocessable_patch() -> ApiError:
    # A JSON patch that cannot be applied (a failed "test", a missing path): kube-apiserver
    # answers NewGenericServerResponse(422) and drops the library's own message.
    return ApiError(422, "Invalid",
                    "the server rejected our request due to an error in our request", {})


def method_not_supported(res: Resource, action: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed",
                    f'{action} is not supported on resources of kind "{res}"', _details(res))


def unsupported_media_type(content_type: str, supported: list[str]) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f'the body of the request was in an unknown format - accepted media types '
                    f'include: {", ".join(supported)}' if content_type else
                    "the body of the request was in an unknown format")
