"""Commands of the Compose stack's own services: ``draftsmith queue-exporter``."""

from __future__ import annotations

import typer

from draftsmith.cli import app, settings
from draftsmith.jobqueue.exporter import run_exporter
from draftsmith.jobqueue.queues import connect


@app.command("queue-exporter")
def queue_exporter(
    port: int | None = typer.Option(None, "--port", help="Port of /metrics (default: metrics.port)."),
    interval: float = typer.Option(5.0, "--interval", min=0.5, help="Seconds between reads of the rq queues."),
) -> None:
    """Export rq queue depth, running and failed jobs, and workers alive as Prometheus metrics."""
    s = settings()
    run_exporter(connect(s.redis.url), s.redis.prefix, port if port is not None else s.metrics.port, interval,
                 addr=s.metrics.addr)
