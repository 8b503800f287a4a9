"""Every ``JOBBERS_*`` Django setting, with its default, in one place.

``JOBBERS_CELERY_APP``
    Dotted path of the Celery app (``"proj.celery.app"`` or ``"proj.celery:app"``) that
    ``jobbers_celery.install`` was called on. Default: Celery's current app.
``JOBBERS_READ_PERMISSION``
    Who may read records (dead letters, task records, groups, audit, paced resubmits) in the
    admin and the API: ``"view"`` (default: Django's view permission of the model read,
    e.g. ``jobbers.view_deadletterentry``), ``"staff"`` (any staff account: the default
    before issue 24), ``"superuser"`` or one permission name for every read.
``JOBBERS_RESUBMIT_PERMISSION``
    Who may resubmit or discard dead letters (admin and API). Default
    ``"jobbers.resubmit_deadletter"``; same forms as above.
``JOBBERS_CANCEL_PERMISSION``
    Who may cancel tasks (admin "Live tasks" page and API). Default ``"jobbers.cancel_task"``.
``JOBBERS_ALERTS_PERMISSION``
    Who may add, change and delete alert rules in the admin (reading them is the read
    rule's: ``jobbers.view_alertrule`` by default). Default ``"jobbers.change_alertrule"``;
    same forms as above.
``JOBBERS_PAUSE_PERMISSION``
    Who may pause and resume a task name or a queue on every worker (admin "Workers and
    queues" page and API). Default ``"superuser"``; same forms as above.
``JOBBERS_RATE_LIMIT_PERMISSION``
    Who may set and clear rate-limit overrides (admin "Rate limits" page and API). Default
    ``"superuser"``; same forms as above.
``JOBBERS_REDACT_KEYS``
    Substrings of argument keys and parameter names whose values are shown as ``********``
    (case-insensitive). Default (``None``): the Celery app's ``jobbers_redact_keys``, whose
    default is password, passwd, token, secret, api_key, apikey, authorization, credential,
    private_key. Credentials in strings (URL passwords, ``Bearer`` tokens) are redacted
    whatever their key. Resubmission always uses the real values.
``JOBBERS_DISPLAY_MAX_CHARS``
    Characters of JSON shown of each of a dead-letter entry's args, kwargs, checkpoint and
    publish options (admin and API); a longer value is cut, keeping its shape, with a
    ``[cut for display: ...]`` marker. Default 16384; 0 shows everything. Resubmission
    always uses the full values.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "JOBBERS_CELERY_APP": None,
    "JOBBERS_READ_PERMISSION": "view",
    "JOBBERS_RESUBMIT_PERMISSION": "jobbers.resubmit_deadletter",
    "JOBBERS_CANCEL_PERMISSION": "jobbers.cancel_task",
    "JOBBERS_PAUSE_PERMISSION": "superuser",
    "JOBBERS_RATE_LIMIT_PERMISSION": "superuser",
    "JOBBERS_ALERTS_PERMISSION": "jobbers.change_alertrule",
    "JOBBERS_REDACT_KEYS": None,
    "JOBBERS_DISPLAY_MAX_CHARS": 16384,
}

#: Fixed limits of the API (docs/howto/rest-api.md, "Validation"), not settings.
MAX_IDS = 1000
MAX_LIMIT = 1000
DEFAULT_RESUBMIT_LIMIT = 100
DEFAULT_PAGE_SIZE = 50


def get(name: str) -> Any:
    """The value of ``JOBBERS_<name>``, read at call time (``override_settings`` works)."""
    key = name if name.startswith("JOBBERS_") else f"JOBBERS_{name}"
    return getattr(settings, key, DEFAULTS[key])
