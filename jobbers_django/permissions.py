"""One rule for "may this user do X", shared by the admin and the API.

A rule is ``"staff"``, ``"superuser"`` or a Django permission name (``"app_label.codename"``),
as set by the ``JOBBERS_*_PERMISSION`` settings. Anonymous and inactive users never pass.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobbers_django import conf

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
