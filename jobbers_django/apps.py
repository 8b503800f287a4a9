"""The Django app. Its label is ``jobbers``, so its permissions read ``jobbers.<codename>``."""

from __future__ import annotations

from django.apps import AppConfig


class JobbersConfig(AppConfig):
    name = "jobbers_django"
    label = "jobbers"
    verbose_name = "Jobbers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        # tasks: registers the paced-resubmit step task on every Celery app (shared_task)
        from jobbers_django import alerting, tasks  # noqa: F401
        from jobbers_django.models import AlertRule

        # the admin's alert rules and Django's email, for every alert service of the process
        alerting.register()
        post_save.connect(alerting.rule_saved, sender=AlertRule,
                          dispatch_uid="jobbers_alert_rule_saved")
        post_delete.connect(alerting.rule_saved, sender=AlertRule,
                            dispatch_uid="jobbers_alert_rule_deleted")
