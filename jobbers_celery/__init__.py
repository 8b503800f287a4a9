"""jobbers_celery: a recorded lifecycle, real retry backoff and a dead-letter queue for Celery.

Everything a user imports is here; ``jobbers_django`` uses only these names.
"""

from __future__ import annotations

from jobbers_celery.core.backoff import BackoffStrategy
from jobbers_celery.core.codec import ENCRYPTED, PayloadCodec
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
from jobbers_celery.core.options import (
    DeadLetterPolicy,
    ResubmitVersion,
    ShutdownPolicy,
    TaskOptions,
)
from jobbers_celery.core.printable import escaped_logger, printable
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
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.storable import storable_form, storable_id, storable_value
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
from jobbers_celery.worker.shutdown import WorkerShuttingDown
from jobbers_celery.worker.task import JobbersTask
from jobbers_celery.worker.taskrepr import task_parameters

__version__ = "0.1.0.dev0"

__all__ = [
    "ALTERED",
    "DEFAULT_REDACT_KEYS",
    "ENCRYPTED",
    "FINAL_RUN_STATUSES",
    "REDACTED",
    "UNPUBLISHABLE",
    "AttemptSuperseded",
    "BackoffStrategy",
    "CheckpointTooLarge",
    "CleanReport",
    "CleanerStatus",
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
    "ErrorInfo",
    "InvalidTaskOption",
    "InvalidTransition",
    "Jobbers",
    "JobbersConfig",
    "JobbersError",
    "JobbersTask",
    "PaceError",
    "Parameters",
    "PayloadCodec",
    "PurgeReport",
    "Redactor",
    "RedisDeadLetterSink",
    "ResubmitPace",
    "ResubmitRunConflict",
    "ResubmitRunInfo",
    "ResubmitVersion",
    "RunAction",
    "RunOutcome",
    "RunStatus",
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
    "WorkerInfo",
    "WorkerShuttingDown",
    "__version__",
    "check_pace_options",
    "check_task_id",
    "control_sources",
    "control_transition",
    "dlq_criteria",
    "escaped_logger",
    "get_jobbers",
    "install",
    "parameters",
    "printable",
    "publish_claimed",
    "readable_arguments",
    "redactor",
    "run_outcome",
    "stop_rule",
    "storable_form",
    "storable_id",
    "storable_value",
    "task_parameters",
    "unopenable",
]
