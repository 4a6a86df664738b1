"""The settings a Compose host's ``.env`` gives the services, for the commands that run beside them on the host
(``draftsmith plan``): the ``DRAFTSMITH_*`` lines as they are, and the variables that the compose files turn into
config keys (``MAX_MODEL_LEN`` -> ``DRAFTSMITH_TARGET__MAX_MODEL_LEN``, ...) under their key's name.

``make`` reads the same file (``ENV_FILE``, default ``.env``) and hands it to Compose (``--env-file``); as there, a
variable already set in the shell wins over the file.
"""

from __future__ import annotations

import os
from pathlib import Path

# .env variable -> the config key's variable, as compose.yaml / compose.gpu.yaml map it for the services
# (tests/test_envfile.py checks each pair against the compose files)
COMPOSE_VARIABLES = {
    "TRUST_REMOTE_CODE": "DRAFTSMITH_TARGET__TRUST_REMOTE_CODE",
    "MAX_MODEL_LEN": "DRAFTSMITH_TARGET__MAX_MODEL_LEN",
    "SERVED_MODEL_NAME": "DRAFTSMITH_TARGET__MODEL",
    "EXTRACT_BACKEND": "DRAFTSMITH_EXTRACT__BACKEND",
    "EXTRACT_GPUS": "DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE",
    "TRAIN_PARALLEL": "DRAFTSMITH_TRAIN__PARALLEL",
}


def env_file_variables(path: Path | str) -> dict[str, str]:
    """The config variables ``path`` (a Compose ``.env``) gives: ``{"DRAFTSMITH_TARGET__MAX_MODEL_LEN": "65536",
    ...}``; empty values are left out (Compose's defaults apply to them), and so is a missing file.

    Raises:
        ConfigError: the file exists but cannot be read.
    """
    from dotenv import dotenv_values

    from draftsmith.errors import ConfigError

    path = Path(path)
    if not path.is_file():
        return {}
    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}", "fix the file's permissions or pass --env-file") from e
    out: dict[str, str] = {}
    for name, value in values.items():
        if value in (None, ""):
            continue
        if name.startswith("DRAFTSMITH_"):
            out[name] = value
        elif name in COMPOSE_VARIABLES:
            out[COMPOSE_VARIABLES[name]] = value
    return out


def apply_env_file(path: Path | str) -> dict[str, str]:
    """Put the config variables of ``path`` (:func:`env_file_variables`) into this process's environment, except
    those the shell sets already (the shell wins, as with ``make``); returns the ones put in."""
    added = {k: v for k, v in env_file_variables(path).items() if k not in os.environ}
    os.environ.update(added)
    return added


def models_dir_target(path: Path | str) -> Path | None:
    """The target folder ``.env`` names for the services (``MODELS_DIR``/``TARGET_MODEL``, relative to the file's
    folder as Compose reads it), or None when it names none."""
    from dotenv import dotenv_values

    path = Path(path)
    if not path.is_file():
        return None
    values = dotenv_values(path)
    model = os.environ.get("TARGET_MODEL") or values.get("TARGET_MODEL")
    if not model:
        return None
    models = Path(os.environ.get("MODELS_DIR") or values.get("MODELS_DIR") or "./models")
    return (models if models.is_absolute() else path.parent / models) / model
