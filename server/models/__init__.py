"""All tables; importing this module registers them on Base.metadata."""

from server.models.adapter import AdapterVersion
from server.models.audit import AuditEntry
from server.models.base import Base
from server.models.dataset import Dataset
from server.models.evals import EvalItem, EvalResult, EvalRow
from server.models.idempotency import IdempotencyWatermark, IdempotentAnswer
from server.models.installation import Installation
from server.models.jobs import AlarmState, CostMark, WebhookDelivery
from server.models.lease import Lease, RolloutBatch
from server.models.pool_learner import PoolLearner
from server.models.project import Project
from server.models.run import DatasetRow, PromptRow, Run
from server.models.session import DashboardSession
from server.models.sweep import Sweep
from server.models.telemetry import CostRecord, Event, MetricPoint
from server.models.token import Token
from server.models.worker import GpuPrice, Worker

__all__ = [
    "AdapterVersion",
    "AuditEntry",
    "AlarmState",
    "CostMark",
    "WebhookDelivery",
    "Base",
    "CostRecord",
    "DashboardSession",
    "Dataset",
    "DatasetRow",
    "EvalItem",
    "EvalResult",
    "EvalRow",
    "Event",
    "GpuPrice",
    "IdempotencyWatermark",
    "IdempotentAnswer",
    "Installation",
    "Lease",
    "MetricPoint",
    "PoolLearner",
    "Project",
    "PromptRow",
    "RolloutBatch",
    "Run",
    "Sweep",
    "Token",
    "Worker",
]
