"""``draftsmith config``: print every config key, its default and its doc, or the resolved config."""

from __future__ import annotations

import typer

from draftsmith.cli import app, settings


@app.command("config")
def config_cmd(
    show: bool = typer.Option(False, "--show", help="Print the resolved config (file + environment) as YAML."),
) -> None:
    """List every config key with its default and doc (or the resolved values with --show)."""
    from rich.console import Console
    from rich.table import Table

    from draftsmith.config import describe_fields, settings_to_yaml

    s = settings()
    if show:
        typer.echo(settings_to_yaml(s))
        return
    table = Table("key", "default", "doc", show_lines=False)
    for key, default, doc in describe_fields():
        table.add_row(key, default, doc)
    Console().print(table)
