"""What the admin, the API and the command line do, by its documented name: the dead-letter
actions (:mod:`jobbers_django.dlq.selection`, :mod:`jobbers_django.dlq.actions`) and the
Celery side with the live tasks and workflows (:mod:`jobbers_django.bridge`). Neither the admin nor the
API talks to Redis or changes the dead-letter tables on its own.
"""

from __future__ import annotations

from jobbers_django.bridge import (
    LiveOverview,
    TaskDetail,
    WorkflowDetail,
    cancel_task,
    cancel_workflow,
    failure_history,
    get_app,
    get_jobbers,
    live_overview,
    payload_codec,
    readable_arguments,
    task_detail,
    to_dead_letter,
    workflow_detail,
)
from jobbers_django.dlq.actions import (
    SAMPLE_SIZE,
    ActionResult,
    discard,
    publish_pending,
    resubmit,
    resubmit_workflow,
)
from jobbers_django.dlq.selection import FILTERS, Selection, SelectionError, filter_entries

__all__ = [
    "FILTERS",
    "SAMPLE_SIZE",
    "ActionResult",
    "LiveOverview",
    "Selection",
    "SelectionError",
    "TaskDetail",
    "WorkflowDetail",
    "cancel_task",
    "cancel_workflow",
    "discard",
    "failure_history",
    "filter_entries",
    "get_app",
    "get_jobbers",
    "live_overview",
    "payload_codec",
    "publish_pending",
    "readable_arguments",
    "resubmit",
    "resubmit_workflow",
    "task_detail",
    "to_dead_letter",
    "workflow_detail",
]
