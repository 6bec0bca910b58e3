"""DuckDB store: schema, migrations, idempotent writes, Polars reads, and every SQL statement the stages run."""

from factory.store._artifacts import artifact_rows, companion, file_status
from factory.store._browse import RunBrowser
from factory.store._feedback import (
    FEEDBACK_SOURCES,
    FEEDBACK_STATUSES,
    POLARITIES,
    FeedbackRecord,
    assistant_message_indexes,
    feedback_id,
)
from factory.store._migrations import MIGRATIONS, Migration, applied_migrations, migrate
from factory.store._records import (
    BranchEvent,
    BranchRecord,
    ErrorEvent,
    Event,
    FinalAnswerEvent,
    JudgeCallEvent,
    JudgeSample,
    ModelCallEvent,
    PairwiseCall,
    RunManifest,
    RunStartEvent,
    ToolCallEvent,
    ToolResultEvent,
    VerdictEvent,
    WorkspaceSnapshot,
    parse_event,
)
from factory.store._store import Store, utc_now

__all__ = [
    "FEEDBACK_SOURCES",
    "FEEDBACK_STATUSES",
    "MIGRATIONS",
    "POLARITIES",
    "BranchEvent",
    "BranchRecord",
    "ErrorEvent",
    "Event",
    "FeedbackRecord",
    "FinalAnswerEvent",
    "JudgeCallEvent",
    "JudgeSample",
    "Migration",
    "ModelCallEvent",
    "PairwiseCall",
    "RunBrowser",
    "RunManifest",
    "RunStartEvent",
    "Store",
    "ToolCallEvent",
    "ToolResultEvent",
    "VerdictEvent",
    "WorkspaceSnapshot",
    "applied_migrations",
    "artifact_rows",
    "assistant_message_indexes",
    "companion",
    "feedback_id",
    "file_status",
    "migrate",
    "parse_event",
    "utc_now",
]
