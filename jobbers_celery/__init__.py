"""jobbers_celery: a recorded lifecycle, real retry backoff and a dead-letter queue for Celery.

Everything a user imports is here; ``jobbers_django`` uses only these names.
"""

from __future__ import annotations

from jobbers_celery.alerts import (
    AlertEvent,
    AlertKind,
    AlertRule,
    Alerts,
    add_rule_source,
    admin_task_id,
    parse_rule,
    set_email_sender,
)
from jobbers_celery.core.backoff import BackoffStrategy
from jobbers_celery.core.codec import ENCRYPTED, PayloadCodec
from jobbers_celery.core.columns import fit_columns, terminal_width
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.errors import (
    AttemptSuperseded,
    CheckpointTooLarge,
    ConfigurationError,
    DeadLetterRefused,
    InvalidTaskOption,
    InvalidTransition,
    JobbersError,
    ResubmitRunConflict,
    StoreUnavailable,
    TaskCancelled,
    TaskTimeout,
)
from jobbers_celery.core.fairshare import ConcurrencyKey, ConcurrencyKeyError, FairHeld
from jobbers_celery.core.names import unknown_task_message
from jobbers_celery.core.options import (
    DeadLetterPolicy,
    ResubmitVersion,
    ShutdownPolicy,
    TaskOptions,
    WorkerLostPolicy,
)
from jobbers_celery.core.pauses import MAX_NAME as MAX_PAUSE_NAME
from jobbers_celery.core.pauses import Pause, PauseError, PauseKind
from jobbers_celery.core.periodic import PeriodicRun, PeriodicSchedule
from jobbers_celery.core.printable import escaped_logger, printable
from jobbers_celery.core.progress import ProgressShown, progress_shown
from jobbers_celery.core.ratelimit import MAX_RATE_NAME, MAX_RATE_TEXT, RateLimit, RateLimitInfo
from jobbers_celery.core.records import (
    ALTERED,
    UNPUBLISHABLE,
    DeadLetter,
    ErrorInfo,
    SetAside,
    SetAsideReport,
    TaskRecord,
    Transition,
    WorkerInfo,
)
from jobbers_celery.core.redaction import (
    DEFAULT_REDACT_KEYS,
    REDACTED,
    Parameters,
    Redactor,
    parameters,
    redactor,
)
from jobbers_celery.core.search import SearchError, SearchResult
from jobbers_celery.core.series import SeriesPoint, SeriesRangeError, parse_span, short_ms
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.storable import storable_form, storable_id, storable_value
from jobbers_celery.core.timefmt import human_time, iso_time, relative_time
from jobbers_celery.core.unique import (
    DuplicateTask,
    Unique,
    UniqueInfo,
    UniqueKeyError,
    Until,
    unique_json,
    unique_text,
)
from jobbers_celery.core.workflow import (
    Workflow,
    WorkflowMember,
    WorkflowState,
    WorkflowTransition,
)
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.selection import (
    DlqExit,
    DlqFilters,
    DlqRunView,
    DlqUsageError,
    check_pace_options,
    check_task_id,
    dlq_criteria,
)
from jobbers_celery.deadletter.sink import DeadLetterSink
from jobbers_celery.install import get_jobbers, install
from jobbers_celery.jobbers import Jobbers, PurgeReport
from jobbers_celery.lifecycle.cleaner import CleanerStatus, CleanReport
from jobbers_celery.lifecycle.fleet import QueueInfo, RunningTask, WorkerView
from jobbers_celery.lifecycle.pausing import PauseOutcome
from jobbers_celery.lifecycle.payload import readable_arguments, unopenable
from jobbers_celery.resubmit.claimed import publish_claimed
from jobbers_celery.resubmit.pace import FINAL as FINAL_RUN_STATUSES
from jobbers_celery.resubmit.pace import (
    PaceError,
    ResubmitPace,
    ResubmitRunInfo,
    RunAction,
    RunOutcome,
    RunStatus,
    control_sources,
    control_transition,
    run_outcome,
    stop_rule,
)
from jobbers_celery.telemetry.history import CountSample
from jobbers_celery.telemetry.series import SeriesRead
from jobbers_celery.worker.shutdown import WorkerShuttingDown
from jobbers_celery.worker.task import JobbersTask
from jobbers_celery.worker.taskrepr import task_parameters

__version__ = "0.1.0.dev0"

__all__ = [
    "ALTERED",
    "DEFAULT_REDACT_KEYS",
    "ENCRYPTED",
    "FINAL_RUN_STATUSES",
    "MAX_PAUSE_NAME",
    "MAX_RATE_NAME",
    "MAX_RATE_TEXT",
    "REDACTED",
    "UNPUBLISHABLE",
    "AlertEvent",
    "AlertKind",
    "AlertRule",
    "Alerts",
    "AttemptSuperseded",
    "BackoffStrategy",
    "CheckpointTooLarge",
    "CleanReport",
    "CleanerStatus",
    "ConcurrencyKey",
    "ConcurrencyKeyError",
    "ConfigurationError",
    "CountSample",
    "DeadLetter",
    "DeadLetterPolicy",
    "DeadLetterRefused",
    "DeadLetterSink",
    "DlqExit",
    "DlqFilters",
    "DlqRunView",
    "DlqUsageError",
    "DuplicateTask",
    "ErrorInfo",
    "FairHeld",
    "InvalidTaskOption",
    "InvalidTransition",
    "Jobbers",
    "JobbersConfig",
    "JobbersError",
    "JobbersTask",
    "PaceError",
    "Parameters",
    "Pause",
    "PauseError",
    "PauseKind",
    "PauseOutcome",
    "PayloadCodec",
    "PeriodicRun",
    "PeriodicSchedule",
    "ProgressShown",
    "PurgeReport",
    "QueueInfo",
    "RateLimit",
    "RateLimitInfo",
    "Redactor",
    "RedisDeadLetterSink",
    "ResubmitPace",
    "ResubmitRunConflict",
    "ResubmitRunInfo",
    "ResubmitVersion",
    "RunAction",
    "RunOutcome",
    "RunStatus",
    "RunningTask",
    "SearchError",
    "SearchResult",
    "SeriesPoint",
    "SeriesRangeError",
    "SeriesRead",
    "SetAside",
    "SetAsideReport",
    "ShutdownPolicy",
    "StoreUnavailable",
    "TaskCancelled",
    "TaskOptions",
    "TaskRecord",
    "TaskState",
    "TaskTimeout",
    "Transition",
    "Unique",
    "UniqueInfo",
    "UniqueKeyError",
    "Until",
    "WorkerInfo",
    "WorkerLostPolicy",
    "WorkerShuttingDown",
    "WorkerView",
    "Workflow",
    "WorkflowMember",
    "WorkflowState",
    "WorkflowTransition",
    "__version__",
    "add_rule_source",
    "admin_task_id",
    "check_pace_options",
    "check_task_id",
    "control_sources",
    "control_transition",
    "dlq_criteria",
    "escaped_logger",
    "fit_columns",
    "get_jobbers",
    "human_time",
    "install",
    "iso_time",
    "parameters",
    "parse_rule",
    "parse_span",
    "printable",
    "progress_shown",
    "publish_claimed",
    "readable_arguments",
    "redactor",
    "relative_time",
    "run_outcome",
    "set_email_sender",
    "short_ms",
    "stop_rule",
    "storable_form",
    "storable_id",
    "storable_value",
    "task_parameters",
    "terminal_width",
    "unique_json",
    "unique_text",
    "unknown_task_message",
    "unopenable",
]
