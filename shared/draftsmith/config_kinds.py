"""The kind of every config key, ``run`` or ``host``, written in the schema beside its doc.

Every key has a kind, written in the schema beside its doc (:func:`Run`, :func:`Host`, :func:`key_kind`):

- ``run``: what the run is, the same on every host that works on it (target model, lengths, layers, draft
  vocabulary, the recipe). A queued job carries these (:func:`draftsmith.config.run_settings`) and the run records
  them (:mod:`draftsmith.artifacts.run_settings`).
- ``host``: how this host or service does it (backend, device, GPUs, tensor/expert parallel, memory budgets, URLs,
  concurrency, timeouts, paths, secrets). A worker takes these from its own environment, never from a job.

A section whose keys are all of one kind says so once (``section_kind``); a section of both kinds marks every field
(``Run(...)`` or ``Host(...)`` in place of pydantic's ``Field(...)``), and a field of neither is refused when the
class is built.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["run", "host"]


def Run(default: Any = ..., **kwargs: Any) -> Any:  # noqa: N802 (spelled as the Field it stands for)
    """pydantic's ``Field`` of a ``run`` key: part of what the run is, carried by its queued jobs."""
    return Field(default, json_schema_extra={"kind": "run"}, **kwargs)


def Host(default: Any = ..., **kwargs: Any) -> Any:  # noqa: N802
    """pydantic's ``Field`` of a ``host`` key: the host's or service's own, never taken from a job."""
    return Field(default, json_schema_extra={"kind": "host"}, **kwargs)


def key_kind(model: type[BaseModel], name: str) -> Kind:
    """The kind (``"run"`` or ``"host"``) of field ``name`` of section ``model``: the field's own mark
    (:func:`Run`, :func:`Host`), else the section's ``section_kind``.

    Raises:
        KeyError: ``model`` has no field ``name``; TypeError: the field has no kind.
    """
    extra = model.model_fields[name].json_schema_extra
    if isinstance(extra, dict) and extra.get("kind") in ("run", "host"):
        return extra["kind"]  # type: ignore[return-value]
    kind = getattr(model, "section_kind", None)
    if kind is None:
        raise TypeError(f"config key {model.__name__}.{name} has no kind: declare it with Run(...) or Host(...)")
    return kind


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked on assignment; every field has a
    kind (:func:`key_kind`), checked when the section class is built."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    section_kind: ClassVar[Kind | None] = None  # the kind of every field without a mark of its own

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name in cls.model_fields:
            key_kind(cls, name)  # at import: a key without a kind would travel with jobs (or not) by accident
