"""``draftsmith config``: print every config key, its kind, its default and its doc, or the resolved config."""

from __future__ import annotations

import typer

from draftsmith.cli import app, settings
from draftsmith.config import describe_fields, key_kinds, settings_to_yaml
from draftsmith.errors import ConfigError


@app.command("config")
def config_cmd(
    show: bool = typer.Option(False, "--show", help="Print the resolved config (file + environment) as YAML."),
    kind: str = typer.Option(None, "--kind", help="Only the keys of this kind: run (carried by queued jobs, "
                             "recorded with the run) or host (each service's own environment)."),
) -> None:
    """List every config key with its kind, default and doc (or the resolved values with --show).

    A ``run`` key says what the run is and travels with its queued jobs; a ``host`` key says how a host or service
    does the work and is read from that service's own environment (docs/configuration.md)."""
    from rich.console import Console
    from rich.table import Table

    if kind not in (None, "run", "host"):
        raise ConfigError(f"--kind {kind} is not a kind of key", "pass --kind run or --kind host")
    s = settings()
    if show:
        typer.echo(settings_to_yaml(s))
        return
    kinds = key_kinds()
    table = Table("key", "kind", "default", "doc", show_lines=False)
    for key, default, doc in describe_fields():
        if kind in (None, kinds[key]):
            table.add_row(key, kinds[key], default, doc)
    Console().print(table)
