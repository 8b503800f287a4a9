"""The task-id column of the dead-letter tables: looked up by the task's own id.

A dead letter is stored under :func:`jobbers_celery.storable_id` of its task id (NUL and
lone surrogates escaped, an id over 255 characters cut with a hash: what PostgreSQL and the
column hold). :class:`TaskIdField` applies the same to every value a query compares with
it, so ``filter(task_id=...)``, ``task_id__in`` and ``get()`` find the entry of any id Celery
runs (an id with a NUL no longer makes the query raise), wherever the lookup is written;
:class:`TaskIdsField` does it for the JSON lists of ids an audit row or a paced run keeps.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from jobbers_celery import storable_id

__all__ = ["TaskIdField", "TaskIdsField"]


class TaskIdField(models.CharField):  # type: ignore[type-arg]
    """A ``CharField`` whose values, stored or compared, are the storable form of an id."""

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return storable_id(value) if isinstance(value, str) else value

    def deconstruct(self) -> Any:
        # the column is a plain varchar: migrations see a CharField (no schema change)
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs


class TaskIdsField(models.JSONField):
    """A JSON list of task ids (an audit's, a paced run's), each kept in its storable form:
    PostgreSQL's ``jsonb`` refuses a NUL, and the ids then match the entries' column."""

    def get_prep_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            value = [storable_id(v) if isinstance(v, str) else v for v in value]
        return super().get_prep_value(value)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
