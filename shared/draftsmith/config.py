"""The one config schema and its loader. YAML file, environment variables and CLI flags are views of it.

Precedence (highest first): CLI flags > environment (``DRAFTSMITH_<SECTION>__<FIELD>``, e.g.
``DRAFTSMITH_GENERATION__CONCURRENCY=64``; lists and mappings as JSON,
``DRAFTSMITH_EXTRACT__LAYERS='[1,14,26]'``) > YAML file (``--config FILE`` or ``DRAFTSMITH_CONFIG``) > defaults.
The order is pydantic-settings' own (:meth:`Settings.settings_customise_sources`: init arguments, the environment
source, the YAML source, merged section by section). Every field has a default and a one-line doc; unknown keys
are rejected (``extra="forbid"``; a ``DRAFTSMITH_*`` variable that names no field too) and the whole config is
validated before any model, dataset or server is touched. The sections are in :mod:`draftsmith.config_sections`.

Every key is of one of two kinds, marked in the schema (:func:`draftsmith.config_sections.key_kind`): ``run``
keys say what the run is and travel with its queued jobs (:func:`run_settings`); ``host`` keys say how a host or
service does the work and come from that service's own environment (:func:`settings_for_job` merges the two in a
worker). ``draftsmith config`` prints each key's kind.
"""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator, Field, PlainSerializer, ValidationError, WithJsonSchema
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from draftsmith.artifacts.location import Location, run_location
from draftsmith.artifacts.run_settings import read_record
from draftsmith.config_kinds import Host, Kind, Run, Section, key_kind
from draftsmith.config_sections import (
    MASK,
    DataConfig,
    EvalConfig,
    ExportConfig,
    ExtractConfig,
    GenerationConfig,
    MetricsConfig,
    RedisConfig,
    TargetConfig,
    TrainConfig,
    redact_url,
    secret_value,
)
from draftsmith.config_serving import CanaryConfig, CaptureConfig, GatewayConfig, RefreshConfig
from draftsmith.errors import ConfigError
from draftsmith.log import get_logger

__all__ = ["MASK", "CanaryConfig", "RefreshConfig", "CaptureConfig", "GatewayConfig", "DataConfig", "EvalConfig", "ExportConfig", "ExtractConfig", "GenerationConfig", "MetricsConfig",
           "RedisConfig", "Section", "Settings", "TargetConfig", "TrainConfig", "adopt_recorded", "describe_fields",
           "key_kinds", "load_settings", "redact_url", "redacted_dump", "run_settings", "secret_value", "secrets_of",
           "settings_for_job", "settings_to_yaml", "with_run_settings"]

PREFIX = "DRAFTSMITH_"
CONFIG_FILE_VARIABLE = "DRAFTSMITH_CONFIG"  # the loader's own: where the YAML file is, not a key of it
# the YAML source of the load in progress (load_settings reads the file first, to name what is wrong with it)
_YAML_SOURCE: ContextVar[PydanticBaseSettingsSource | None] = ContextVar("draftsmith_yaml_source", default=None)


class _UnknownVariables(PydanticBaseSettingsSource):
    """``DRAFTSMITH_*`` variables that name no top-level field, handed to validation so that it rejects them as
    unknown keys (pydantic-settings' environment source ignores them, and a typo would go unnoticed)."""

    def get_field_value(self, field, field_name):  # every value comes from __call__
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in os.environ.items():
            if not key.startswith(PREFIX) or key == CONFIG_FILE_VARIABLE:
                continue
            top = key[len(PREFIX):].lower().split("__")[0]
            if top not in self.settings_cls.model_fields:
                out[top] = value
        return out


# a local folder as a Path, an object-store URL as an UPath (artifacts/location.py); written back as one string
RunsLocation = Annotated[Any, BeforeValidator(run_location), PlainSerializer(str, return_type=str),
                         WithJsonSchema({"type": "string"})]


class Settings(BaseSettings):
    """Root of the config schema: global options plus one section per stage."""

    model_config = SettingsConfigDict(
        env_prefix="DRAFTSMITH_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    runs_dir: RunsLocation = Host(
        Path("runs"), description="Folder that holds every run: a local path, or an object-store URL (s3://bucket/runs; "
        "credentials from the AWS_* variables) that workers on any machine share.")
    run: str = Run("default", description="Run name: everything lands under <runs_dir>/<run>/.")
    stage_dir: Path = Host(
        Path("~/.cache/draftsmith/stage"), description="Local working copies of runs on an object store: the "
        "stages after generation compute here and push their results to the store (draftsmith/staging.py).")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Host("INFO", description="Log level.")
    prompts_dir: Path = Host(
        Path("data/prompts"), description="Folder of the bundled prompt pools that `demo` enqueues and `target "
        "make-tiny-mla` trains on; a relative path is read from the working directory (the checkout for `make`).",
    )
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Queue.")
    target: TargetConfig = Field(default_factory=TargetConfig, description="Target model and server.")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="Generation stage.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training-data stage.")
    extract: ExtractConfig = Field(default_factory=ExtractConfig, description="Extraction stage.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Training stage.")
    export: ExportConfig = Field(default_factory=ExportConfig, description="Export stage.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation stage.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Prometheus metrics.")
    canary: CanaryConfig = Field(default_factory=CanaryConfig, description="Canary trials of drafter versions.")
    refresh: RefreshConfig = Field(default_factory=RefreshConfig, description="The refresh loop: new drafter "
                                   "versions from captured traffic.")
    capture: CaptureConfig = Field(default_factory=CaptureConfig, description="Capture of served traffic.")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="The gateway in front of the engines.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest first: CLI flags (init arguments), the environment (``__`` nests into sections; lists and
        mappings as JSON), unknown ``DRAFTSMITH_*`` variables (to be rejected), the YAML file of
        :func:`load_settings`; pydantic-settings merges them section by section."""
        yaml_source = _YAML_SOURCE.get()
        return (init_settings, env_settings, _UnknownVariables(settings_cls),
                *((yaml_source,) if yaml_source is not None else ()))


def _bad_json_variable() -> str | None:
    """Name of the first ``DRAFTSMITH_<SECTION>__<FIELD>`` variable of a list/tuple/dict field that is not JSON."""
    for key, value in os.environ.items():
        parts = key[len(PREFIX):].lower().split("__") if key.startswith(PREFIX) else []
        section = Settings.model_fields.get(parts[0]) if len(parts) == 2 else None
        model = section.annotation if section else None
        field = model.model_fields.get(parts[1]) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None or not any(get_origin(a) in (list, tuple, dict) for a in (field.annotation,
                                                                                   *get_args(field.annotation))):
            continue
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return key
    return None


def load_settings(config_file: Path | str | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Build and validate the settings from a YAML file, the environment and CLI overrides.

    Args:
        config_file: YAML file with the same nesting as :class:`Settings`; None reads ``$DRAFTSMITH_CONFIG`` if set.
        overrides: nested dict of values given as CLI flags (None values are ignored).

    Returns:
        The validated :class:`Settings`.

    Raises:
        ConfigError: unreadable YAML, an unknown key or an invalid value; the message names the key.
    """
    config_file = config_file or os.environ.get(CONFIG_FILE_VARIABLE)
    yaml_source = None
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist", "pass an existing YAML file to --config")
        try:
            yaml_source = YamlConfigSettingsSource(Settings, yaml_file=path)  # pydantic-settings' YAML source
            dict(yaml_source())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}".replace("\n", " ")) from e
        except (ValueError, TypeError) as e:  # the source's dict() of a list or a scalar
            raise ConfigError(f"config file {path} must hold a mapping at the top level") from e
    token = _YAML_SOURCE.set(yaml_source)
    try:
        return Settings(**_drop_none(overrides or {}))
    except SettingsError as e:
        raise ConfigError(f"{_bad_json_variable() or 'a DRAFTSMITH_* variable'} is not valid JSON",
                          "write lists and mappings as JSON, e.g. DRAFTSMITH_EXTRACT__LAYERS='[1,14,26]'") from e
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            raise ConfigError(
                f"unknown config key '{loc}'", "`draftsmith config` lists every key with its doc"
            ) from e
        raise ConfigError(f"invalid config value for '{loc}': {msg}") from e
    finally:
        _YAML_SOURCE.reset(token)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = _drop_none(v)
            if v:
                out[k] = v
        elif v is not None:
            out[k] = v
    return out


def redacted_dump(settings: Settings) -> dict[str, Any]:
    """The settings as JSON-able data with every secret masked (the target API key, the password of the Redis and
    target URLs): what may be written to a file, a manifest, a checkpoint or a log. ``model_dump(mode="json")`` gives
    the same (the secret fields serialise masked); this names the intent where it matters."""
    return settings.model_dump(mode="json")


def secrets_of(settings: Settings) -> tuple[str, ...]:
    """The secret strings in ``settings`` (target API key, passwords in the Redis and target URLs), for the log
    filter (:func:`draftsmith.log.setup_logging`)."""
    from urllib.parse import urlsplit

    out = [secret_value(settings.target.api_key)]
    for url in (settings.redis.url, settings.target.url):
        try:
            out.append(urlsplit(url).password)
        except ValueError:
            continue
    return tuple(x for x in out if x)


def settings_to_yaml(settings: Settings) -> str:
    """The resolved config as YAML (written beside every artifact), secrets masked."""
    return yaml.safe_dump(redacted_dump(settings), sort_keys=False)


def describe_fields(model: type[BaseModel] = Settings, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every config key with its default and doc: ``[(dotted.key, default, doc), ...]``."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(describe_fields(ann, f"{prefix}{name}."))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", repr(default), field.description or ""))
    return rows


def _leaves(model: type[BaseModel], prefix: str = ""):
    """``(dotted key, section model, field name)`` of every leaf key under ``model``."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaves(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", model, name


def key_kinds() -> dict[str, Kind]:
    """Every config key with its kind: ``{"extract.backend": "host", "extract.layers": "run", ...}``."""
    return {key: key_kind(model, name) for key, model, name in _leaves(Settings)}


def run_settings(settings: Settings) -> dict[str, Any]:
    """The run's part of ``settings`` as JSON, nested as the schema (``{"run": "t", "extract": {"layers": ...},
    ...}``): what a queued job carries. No host key is in it, so no secret and no path of the enqueuing host."""
    dumped = settings.model_dump(mode="json")
    out: dict[str, Any] = {}
    for key, kind in key_kinds().items():
        if kind != "run":
            continue
        *section, name = key.split(".")
        src, dst = dumped, out
        for part in section:
            src, dst = src[part], dst.setdefault(part, {})
        dst[name] = src[name]
    return out


def with_run_settings(host: Settings, run: dict[str, Any]) -> tuple[Settings, list[str]]:
    """``host`` (a worker's own settings) with the run keys of ``run`` (a job's :func:`run_settings`) put in.

    Returns:
        The merged settings, and the host keys that ``run`` carried and that were ignored (a job enqueued by an
        older draftsmith carries every key; the worker's own values win). Which keys count as set (pydantic's
        ``model_fields_set``, what a default of the target's profile may fill) stays ``host``'s, plus those put in.

    Raises:
        ConfigError: ``run`` names a key the schema does not have, or holds an invalid value (the key is named).
    """
    kinds = key_kinds()
    merged = host.model_dump()  # python mode: secrets stay SecretStr, nothing is masked
    ignored: list[str] = []
    given: set[str] = set()

    def put(tree: dict[str, Any], dst: dict[str, Any], prefix: str) -> None:
        for name, value in tree.items():
            key = f"{prefix}{name}"
            if isinstance(value, dict) and isinstance(dst.get(name), dict) and key not in kinds:
                put(value, dst[name], f"{key}.")
            elif key not in kinds:
                raise ConfigError(f"the job carries unknown config key '{key}'",
                                  "enqueue it again from a checkout of the same draftsmith version as the worker")
            elif kinds[key] == "run":
                dst[name] = value
                given.add(key)
            else:
                ignored.append(key)

    put(run, merged, "")
    try:
        out = Settings.model_validate(merged)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"the job carries an invalid value for '{loc}': {first['msg']}",
                          "enqueue it again with valid settings") from e
    # model_validate marks every key as set; keep what was set before, and the keys put in
    out.__pydantic_fields_set__ = set(host.model_fields_set) | {k for k in given if "." not in k}
    for name in Settings.model_fields:
        section = getattr(out, name)
        if isinstance(section, BaseModel):
            section.__pydantic_fields_set__ = set(getattr(host, name).model_fields_set) | {
                k.split(".", 1)[1] for k in given if k.startswith(f"{name}.")}
    return out, ignored


def adopt_recorded(s: Settings, run_root: Location, sections: tuple[str, ...]) -> tuple[Settings, list[str]]:
    """``s`` with every run key of ``sections`` that it leaves at its default
    (no file, variable or flag sets it) taken from the run's record
    (:mod:`draftsmith.artifacts.run_settings`): an enqueue run again without its flags (a
    resume) continues the run as recorded. A key that is set keeps its value (the enqueue then records it).

    Returns:
        The settings, and the keys whose value the record changed (``["generation.max_tokens", ...]``); the
        others it took count as set too, so that no default of the target's profile replaces them.

    Raises:
        ConfigError: the record is unreadable.
    """
    doc = read_record(run_root)
    if not doc:
        return s, []
    mine = run_settings(s)
    put: dict[str, dict[str, Any]] = {}
    for name in sections:
        explicit = getattr(s, name).model_fields_set
        for key, value in (doc["sections"].get(name) or {}).items():
            if key not in explicit:  # equal ones too: taken from the record, no default of the target replaces them
                put.setdefault(name, {})[key] = value
    if not put:
        return s, []
    merged, _ = with_run_settings(s, put)
    return merged, [f"{name}.{key}" for name, keys in put.items() for key, value in keys.items()
                    if mine.get(name, {}).get(key) != value]


def settings_for_job(run: dict[str, Any]) -> Settings:
    """A worker's settings for one job: its own (environment, ``$DRAFTSMITH_CONFIG``; :func:`load_settings`) with
    the job's run keys put in (:func:`with_run_settings`). The service that runs the job says how (backend, device,
    GPUs, URLs, paths); the job says what.

    Raises:
        ConfigError: the worker's own settings or the job's run keys are invalid.
    """
    s, ignored = with_run_settings(load_settings(), run)
    if ignored:
        get_logger(__name__).warning(
            "the job carries host settings (%s); this worker's own apply (a job carries only the run's part)",
            ", ".join(ignored[:8]) + (" ..." if len(ignored) > 8 else ""))
    return s
