"""One rule for "may this user do X", shared by the admin and the API.

A rule is ``"staff"``, ``"superuser"`` or a Django permission name (``"app_label.codename"``),
as set by the ``JOBBERS_*_PERMISSION`` settings. Anonymous and inactive users never pass.
The admin asks :func:`allowed`; the API's views carry the permission classes below, which
ask it too.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from jobbers_django import conf

__all__ = ["CANCEL", "READ", "RESUBMIT", "CanCancel", "CanRead", "CanResubmit", "allowed"]

READ = "READ_PERMISSION"
RESUBMIT = "RESUBMIT_PERMISSION"
CANCEL = "CANCEL_PERMISSION"


def allowed(user: Any, which: str) -> bool:
    """Whether ``user`` passes the rule configured for ``which`` (READ, RESUBMIT, CANCEL)."""
    if user is None or not getattr(user, "is_authenticated", False) \
            or not getattr(user, "is_active", False):
        return False
    rule = conf.get(which)
    if rule == "staff":
        return bool(user.is_staff)
    if rule == "superuser":
        return bool(user.is_superuser)
    if isinstance(rule, str) and "." in rule:
        return bool(user.has_perm(rule))
    raise ImproperlyConfigured(
        f"JOBBERS_{which} must be 'staff', 'superuser' or 'app_label.codename', not {rule!r}")


class _Rule(BasePermission):
    which = READ
    message = "you may not read the jobbers API (JOBBERS_READ_PERMISSION)"

    def has_permission(self, request: Request, view: Any) -> bool:
        return allowed(request.user, self.which)


class CanRead(_Rule):
    """The API's reading endpoints (``JOBBERS_READ_PERMISSION``)."""


class CanResubmit(_Rule):
    """Resubmitting and discarding dead letters (``JOBBERS_RESUBMIT_PERMISSION``)."""

    which = RESUBMIT
    message = "you may not resubmit or discard dead letters (JOBBERS_RESUBMIT_PERMISSION)"


class CanCancel(_Rule):
    """Cancelling tasks (``JOBBERS_CANCEL_PERMISSION``)."""

    which = CANCEL
    message = "you may not cancel tasks (JOBBERS_CANCEL_PERMISSION)"
