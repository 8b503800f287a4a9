"""The OpenAPI 3 schema endpoint: this app's endpoints only, whatever else the project
serves, and no ``REST_FRAMEWORK`` setting needed (the views carry drf-spectacular's
AutoSchema, :func:`jobbers_django.api.base.documented`)."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from jobbers_django.api.base import JobbersMixin, documented, error_responses
from jobbers_django.permissions import CanRead

__all__ = ["SchemaView", "jobbers_endpoints_only"]


def jobbers_endpoints_only(endpoints: list[tuple[Any, ...]], **_: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: this app's endpoints (any of its modules),
    whatever else the project serves."""
    return [e for e in endpoints
            if getattr(getattr(e[3], "cls", None), "__module__", "").partition(".")[0]
            == __name__.partition(".")[0]]


class SchemaView(JobbersMixin, SpectacularAPIView):
    """The OpenAPI 3 schema of the jobbers endpoints (readers only)."""

    @documented(operation_id="schema_retrieve", summary="This OpenAPI schema",
                description="YAML by default; JSON with `Accept: "
                "application/vnd.oai.openapi+json` or `?format=json`.",
                responses={200: OpenApiTypes.OBJECT, **error_responses(401, 403)})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        return response

    permission_classes = (CanRead,)
    custom_settings: ClassVar[dict[str, Any]] = {  # type: ignore[misc]
        "TITLE": "jobbers API",
        "DESCRIPTION": "Dead-letter queue triage and task control for Celery "
                       "(jobbers_django).",
        "VERSION": "1",
        "PREPROCESSING_HOOKS": [f"{__name__}.jobbers_endpoints_only"],
    }
