"""``draftsmith gateway``: the OpenAI-compatible pass-through in front of the engines (docs/serving.md)."""

from __future__ import annotations

import redis
import typer

from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.cli.run_record import check_stage
from draftsmith.paths import RunPaths
from draftsmith.serving.capture import Capture


@app.command("gateway")
def gateway(
    port: int = setting_option("gateway.port", "--port"),
    addr: str = setting_option("gateway.addr", "--addr"),
    upstream: str = setting_option("gateway.upstream", "--upstream"),
    capture: bool = typer.Option(None, "--capture/--no-capture", help="capture.enabled: capture sampled requests "
                                 "into the run's records (off by default)."),
) -> None:
    """Serve the run's engines behind one OpenAI-compatible address: each new request goes to the engine the run's
    routes name (stable, or the canary's share), else to gateway.upstream (target.url); sampled chat requests are
    captured into the run's records when capture is on; /metrics has the gateway's counters."""
    import uvicorn

    from draftsmith.serving.gateway import (  # its metrics exist once imported (docs/metrics.md)
        Gateway,
        RouteTable,
    )

    s = settings(gateway={"port": port, "addr": addr, "upstream": upstream}, capture={"enabled": capture})
    g = s.gateway
    table = RouteTable(redis.Redis.from_url(s.redis.url), s.redis.prefix, s.run, g.upstream or s.target.url,
                       g.routes_refresh_s)
    cap = None
    if s.capture.enabled:
        s, _ = check_stage(s, "gateway")  # an answer is the target's own at the run's recorded temperature only
        cap = Capture(s.capture, RunPaths(s.runs_dir, s.run).records, s.generation.temperature, s.run)
    said = (f"on at {s.capture.sample_rate}, answers kept at temperature {s.generation.temperature}" if cap
            else "off")
    typer.echo(f"gateway on http://{g.addr}:{g.port} for run {s.run}: fallback {table.fallback.url}, capture {said}")
    # uvicorn.Server, not uvicorn.run: run() swallows the KeyboardInterrupt (and so the Terminated) that uvicorn
    # re-raises after its graceful shutdown, and the command would end without its "stopped by" line
    uvicorn.Server(uvicorn.Config(Gateway(table, cap, s.run, g.request_timeout_s).app(), host=g.addr, port=g.port,
                                  log_level=s.log_level.lower(), access_log=False)).run()
