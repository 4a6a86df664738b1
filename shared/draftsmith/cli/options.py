"""CLI flags that mirror a setting take their help and default from the schema (one declaration per setting).

A flag made by :func:`setting_option` defaults to None, so the settings' own layers (YAML file, environment,
schema default) decide unless the flag is given; its help is the field's ``description`` followed by the setting's
dotted path and its schema default, so ``--help`` and ``draftsmith config`` never disagree.
"""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from draftsmith.config import Settings


def setting_field(path: str):
    """The pydantic ``FieldInfo`` of a dotted setting path (``"train.ttt_steps"``, ``"run"``).

    Raises:
        KeyError: no such setting (a programming error: the flag names a field the schema lacks).
    """
    model: type[BaseModel] = Settings
    *sections, name = path.split(".")
    for sec in sections:
        model = model.model_fields[sec].annotation  # type: ignore[assignment]
    if name not in model.model_fields:
        raise KeyError(f"no setting {path!r}")
    return model.model_fields[name]


def setting_default(path: str) -> Any:
    """The schema default of a dotted setting path (the default factory's value where it has one)."""
    f = setting_field(path)
    if f.default is PydanticUndefined and f.default_factory is not None:
        return f.default_factory()
    return f.default


def setting_help(path: str, extra: str = "") -> str:
    """``"<description> <extra> (setting <path>, default <value>)"`` (no square brackets: rich reads them as markup)."""
    f = setting_field(path)
    text = (f.description or "").rstrip()
    if extra:
        text = f"{text} {extra}".strip()
    default = setting_default(path)
    shown = "none" if default is None else (",".join(map(str, default)) if isinstance(default, (list, tuple))
                                            else str(default))
    return f"{text} (setting {path}, default {shown})"


def setting_option(path: str, *flags: str, extra: str = "", **kwargs: Any) -> Any:
    """A ``typer.Option`` for the setting at ``path``: default None (the settings decide), help from the schema.

    Args:
        path: dotted setting path, e.g. ``"generation.concurrency"``.
        flags: the flag names (``"--concurrency", "-c"``).
        extra: words added after the field's description (a flag's own format, e.g. ``"Comma-separated."``).
        kwargs: passed to ``typer.Option`` (``min=1``, ...).
    """
    return typer.Option(None, *flags, help=setting_help(path, extra), **kwargs)


def engine_args_help() -> str:
    """Help of the trailing ``-- ARGS`` of a command that starts vLLM engines (``draftsmith refresh``)."""
    return ("vLLM arguments after `--` for the engines this command starts, appended to target.extra_args (compose "
            "passes the engine lines of .env this way, as to the target).")


def with_engine_args(s: Settings, eager: bool | None, engine_args: list[str] | None) -> Settings:
    """``s`` with ``--eager/--compiled`` (when given) and the trailing engine arguments appended to
    ``target.extra_args``: the flags an engine this command starts needs to serve the target as the stable one does."""
    update: dict[str, Any] = {}
    if eager is not None:
        update["enforce_eager"] = eager
    if engine_args:
        update["extra_args"] = [*s.target.extra_args, *engine_args]
    return s.model_copy(update={"target": s.target.model_copy(update=update)}) if update else s
