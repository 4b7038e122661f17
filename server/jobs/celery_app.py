"""The Celery application on Redis: `celery -A server.jobs.celery_app worker -B` (or
`asyncgrpo jobs`). Configuration comes from the same Settings as the server."""

from __future__ import annotations

from celery import Celery
from celery.signals import beat_init, worker_init

from server.config import Settings, get_settings
from server.jobs.schedule import beat_schedule

QUEUE = "asyncgrpo"


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery = Celery("asyncgrpo", broker=settings.jobs.broker_url, include=["server.jobs.tasks"])
    celery.conf.update(
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        beat_schedule=beat_schedule(settings),
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return celery


app = make_celery()


@worker_init.connect
@beat_init.connect
def _check_bucket(**_kwargs: object) -> None:
    """`celery -A server.jobs.celery_app worker` (or beat) started directly checks its bucket as
    `asyncgrpo jobs` does: a missing bucket or another database's ends the start."""
    from server.bucket import exit_unless_bucket_ok

    exit_unless_bucket_ok(get_settings())
