"""What every jobbers endpoint shares: errors that name their field, strict query
parameters, the schema decorator and the base view.

Authentication is the project's (DRF's ``DEFAULT_AUTHENTICATION_CLASSES``: session and
HTTP Basic unless the project says otherwise; a session request needs its CSRF token).
Permissions are explicit, one rule per endpoint from the ``JOBBERS_*_PERMISSION`` settings
(the permission classes of :mod:`jobbers_django.permissions`): reading, resubmitting or
discarding, cancelling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db.models import Model
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, serializers
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.schemas.inspectors import ViewInspector
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from jobbers_django.api.parsers import BoundedJSONParser
from jobbers_django.api.serializers.fields import (
    NOT_UNICODE_MESSAGE,
    TASK_ID_MAX_LENGTH,
    TASK_ID_MESSAGE,
    StrictSerializer,
    not_unicode,
)
from jobbers_django.models import DeadLetterEntry
from jobbers_django.permissions import CanRead

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass

__all__ = [
    "ERROR",
    "TASK_ID_PARAM",
    "JobbersAPIView",
    "JobbersMixin",
    "bad",
    "check_task_id",
    "documented",
    "error_responses",
    "read_query",
]


# ---------------------------------------------------------------------- errors
def _flatten(errors: Any, prefix: str = "") -> list[str]:
    """``{"task_ids": {3: ["malformed"]}}`` -> ``["task_ids[3]: malformed"]``."""
    if isinstance(errors, Mapping):
        lines = []
        for key, value in errors.items():
            if key == api_settings.NON_FIELD_ERRORS_KEY and not prefix:
                name = ""
            elif isinstance(key, int):
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            lines += _flatten(value, name)
        return lines
    if isinstance(errors, list | tuple):
        if all(not isinstance(e, Mapping | list | tuple) for e in errors):
            return [f"{prefix}: {e}" if prefix else str(e) for e in errors]
        return [line for i, e in enumerate(errors) for line in _flatten(e, f"{prefix}[{i}]")]
    return [f"{prefix}: {errors}" if prefix else str(errors)]


def _with_summary(handler: Callable[[Exception, dict[str, Any]], Response | None]
                  ) -> Callable[[Exception, dict[str, Any]], Response | None]:
    """The project's exception handler, with a validation error answered as
    ``{"detail": "field: message; ...", "errors": {field: [messages]}}``."""

    def handle(exc: Exception, context: dict[str, Any]) -> Response | None:
        response = handler(exc, context)
        if response is not None and isinstance(exc, exceptions.ValidationError):
            errors = exc.detail if isinstance(exc.detail, dict) else {
                api_settings.NON_FIELD_ERRORS_KEY: exc.detail}
            lines = (line.rstrip(".") for line in _flatten(errors))
            response.data = {"detail": "; ".join(lines), "errors": errors}
        return response

    return handle


def bad(field: str, message: str) -> exceptions.ValidationError:
    """A 400 naming ``field``."""
    return exceptions.ValidationError({field: [message]})


# ---------------------------------------------------------------------- input
def check_task_id(task_id: str) -> None:
    """A path's task id: any text up to the length bound, UTF-8 (else a 400)."""
    if len(task_id) > TASK_ID_MAX_LENGTH:
        raise bad("task_id", TASK_ID_MESSAGE)
    if not_unicode(task_id):
        raise bad("task_id", NOT_UNICODE_MESSAGE)


def read_query(serializer_class: type[StrictSerializer], request: Request) -> dict[str, Any]:
    """Validated query parameters: unknown, repeated or blank ones are 400s."""
    params = request.query_params
    data: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name in params:
        if name == api_settings.URL_FORMAT_OVERRIDE:
            continue
        values = params.getlist(name)
        if len(values) > 1:
            errors[name] = ["give this parameter once"]
        data[name] = values[-1]
    if errors:
        raise exceptions.ValidationError(errors)
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# ---------------------------------------------------------------------- schema
TASK_ID_PARAM = OpenApiParameter(
    "task_id", OpenApiTypes.STR, OpenApiParameter.PATH,
    description=f"the Celery task id, percent-encoded (every character outside "
    f"A-Z a-z 0-9 - . _ ~, '/' included; an id of dots only as %2E); any characters, at "
    f"most {TASK_ID_MAX_LENGTH}")


ERROR = inline_serializer("Error", {
    "detail": serializers.CharField(help_text="what went wrong; a 400 names the field"),
    "errors": serializers.DictField(
        required=False, help_text="400 only: the messages per field (per index for a "
        "list such as task_ids)"),
})


def documented(**kwargs: Any) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """``extend_schema`` based on drf-spectacular's AutoSchema even when the project's
    ``DEFAULT_SCHEMA_CLASS`` is DRF's own (the decorator reads it at import time), so the
    schema endpoint needs no ``REST_FRAMEWORK`` setting."""

    def decorate(method: Callable[..., Response]) -> Callable[..., Response]:
        method.kwargs = {"schema": AutoSchema}  # type: ignore[attr-defined]
        described: Callable[..., Response] = extend_schema(**kwargs)(method)
        return described

    return decorate


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """The schema's error answers for these status codes."""
    text = {400: "invalid input (the message names the field)",
            401: "not authenticated", 403: "not allowed", 404: "not found"}
    return {c: OpenApiResponse(ERROR, description=text[c]) for c in codes}


# ---------------------------------------------------------------------- base view
class JobbersMixin:
    """Errors naming their field, and 401 (not 403) for a request without credentials
    whenever one of the authentication classes can challenge (HTTP Basic): DRF asks only
    the first one, which is usually the session's. The views describe themselves with
    drf-spectacular whatever the project's ``DEFAULT_SCHEMA_CLASS``."""

    schema: ViewInspector | None = AutoSchema()

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        handler: Callable[[Exception, dict[str, Any]], Response | None] = \
            super().get_exception_handler()  # type: ignore[misc]
        return _with_summary(handler)

    def get_authenticate_header(self, request: Request) -> str:
        for authenticator in self.get_authenticators():  # type: ignore[attr-defined]
            header = authenticator.authenticate_header(request)
            if header:
                return str(header)
        return ""  # none can challenge: a 403


class JobbersAPIView(JobbersMixin, APIView):
    """Base of the jobbers endpoints: explicit permissions (reading by default: the read
    rule for ``read_model``, see :class:`~jobbers_django.permissions.CanRead`), JSON bodies
    only."""

    permission_classes: Sequence[_PermissionClass] = (CanRead,)
    #: the model whose records a GET shows (its view permission, by default)
    read_model: type[Model] = DeadLetterEntry
    #: paced resubmits: readable by who may read them or start them
    read_runs = False
    parser_classes: Sequence[type[BaseParser]] = (BoundedJSONParser,)
