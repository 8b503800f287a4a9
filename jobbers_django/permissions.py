"""One rule for "may this user do X", shared by the admin and the API.

A rule is ``"view"`` (reading only), ``"staff"``, ``"superuser"`` or a Django permission name
(``"app_label.codename"``), as set by the ``JOBBERS_*_PERMISSION`` settings. Anonymous and
inactive users never pass.

Reading (``JOBBERS_READ_PERMISSION``, default ``"view"``) is one rule for every page and
endpoint that shows a record: ``"view"`` asks for Django's view permission of the model
read (``jobbers.view_deadletterentry`` for dead letters and live task records,
``jobbers.view_failuregroup``, ``jobbers.view_deadletteraudit``, ``jobbers.view_resubmitrun``),
so a staff account without jobbers permissions reads nothing. Paced resubmits are also
readable by whoever may start them (the resubmit rule). The admin asks :func:`can_read`
(the read-only model admins' ``has_view_permission``), the API's views carry
:class:`CanRead` (their ``read_model``); a new reading page or endpoint uses the same.
Acting asks :func:`allowed` with ``RESUBMIT`` or ``CANCEL``; editing alert rules with
``ALERTS``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from jobbers_django import conf

__all__ = [
    "ALERTS",
    "CANCEL",
    "PAUSE",
    "RATE_LIMIT",
    "READ",
    "RESUBMIT",
    "VIEW",
    "CanCancel",
    "CanPause",
    "CanRead",
    "CanResubmit",
    "CanSetRateLimits",
    "allowed",
    "can_read",
    "can_watch_runs",
    "view_permission",
]

READ = "READ_PERMISSION"
RESUBMIT = "RESUBMIT_PERMISSION"
CANCEL = "CANCEL_PERMISSION"
PAUSE = "PAUSE_PERMISSION"
#: Setting and clearing rate-limit overrides (admin page and API).
RATE_LIMIT = "RATE_LIMIT_PERMISSION"
#: Editing alert rules (the admin's add, change and delete of ``AlertRule``).
ALERTS = "ALERTS_PERMISSION"
#: The read rule "the view permission of the model read" (the default).
VIEW = "view"


def view_permission(model: type[Model]) -> str:
    """Django's view permission of ``model``: ``"jobbers.view_deadletterentry"``."""
    opts = model._meta
    return f"{opts.app_label}.view_{opts.model_name}"


def _rule(which: str, model: type[Model] | None) -> str:
    """The rule configured for ``which``, ``"view"`` made the permission name of ``model``."""
    rule = conf.get(which)
    if rule == VIEW and which == READ:
        if model is None:
            raise TypeError("the read rule 'view' needs the model read")
        return view_permission(model)
    if rule in ("staff", "superuser") or (isinstance(rule, str) and "." in rule):
        return str(rule)
    forms = "'view', 'staff'" if which == READ else "'staff'"
    raise ImproperlyConfigured(
        f"JOBBERS_{which} must be {forms}, 'superuser' or 'app_label.codename', not {rule!r}")


def allowed(user: Any, which: str, model: type[Model] | None = None) -> bool:
    """Whether ``user`` passes the rule configured for ``which`` (READ, RESUBMIT, CANCEL);
    reading names the ``model`` read."""
    rule = _rule(which, model)
    if user is None or not getattr(user, "is_authenticated", False) \
            or not getattr(user, "is_active", False):
        return False
    if rule == "staff":
        return bool(user.is_staff)
    if rule == "superuser":
        return bool(user.is_superuser)
    return bool(user.has_perm(rule))


def can_read(user: Any, model: type[Model]) -> bool:
    """Whether ``user`` may see the records of ``model`` (the read rule)."""
    return allowed(user, READ, model)


def can_watch_runs(user: Any) -> bool:
    """Paced resubmits: who may read them, or start them (an operator watches the run they
    started)."""
    from jobbers_django.models import ResubmitRun

    return can_read(user, ResubmitRun) or allowed(user, RESUBMIT)


class CanRead(BasePermission):
    """The API's reading endpoints: the read rule for the view's ``read_model`` (dead-letter
    entries when it names none; the live task records are theirs too). A view whose
    records are paced resubmits sets ``read_runs = True`` (:func:`can_watch_runs`)."""

    message = "you may not read the jobbers API (JOBBERS_READ_PERMISSION)"

    def has_permission(self, request: Request, view: Any) -> bool:
        from jobbers_django.models import DeadLetterEntry, ResubmitRun

        if getattr(view, "read_runs", False):
            model: type[Model] = ResubmitRun
            ok = can_watch_runs(request.user)
        else:
            model = getattr(view, "read_model", None) or DeadLetterEntry
            ok = can_read(request.user, model)
        if not ok:
            self.message = (f"you may not read these records (JOBBERS_READ_PERMISSION: "
                            f"{_rule(READ, model)})")
        return ok


class _Rule(BasePermission):
    which = RESUBMIT
    message = ""

    def has_permission(self, request: Request, view: Any) -> bool:
        return allowed(request.user, self.which)


class CanResubmit(_Rule):
    """Resubmitting and discarding dead letters (``JOBBERS_RESUBMIT_PERMISSION``)."""

    which = RESUBMIT
    message = "you may not resubmit or discard dead letters (JOBBERS_RESUBMIT_PERMISSION)"


class CanCancel(_Rule):
    """Cancelling tasks (``JOBBERS_CANCEL_PERMISSION``)."""

    which = CANCEL
    message = "you may not cancel tasks (JOBBERS_CANCEL_PERMISSION)"


class CanPause(_Rule):
    """Pausing and resuming a task name or a queue on every worker
    (``JOBBERS_PAUSE_PERMISSION``)."""

    which = PAUSE
    message = "you may not pause or resume task names or queues (JOBBERS_PAUSE_PERMISSION)"


class CanSetRateLimits(_Rule):
    """Setting and clearing rate-limit overrides (``JOBBERS_RATE_LIMIT_PERMISSION``)."""

    which = RATE_LIMIT
    message = "you may not change rate limits (JOBBERS_RATE_LIMIT_PERMISSION)"
