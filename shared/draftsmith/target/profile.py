"""Target profiles: what each engine needs to serve a target, derived from the target's own config files.

A checkpoint says most of it itself: ``auto_map`` in ``config.json`` or ``tokenizer_config.json`` means its model
or tokenizer is its own Python code (``--trust-remote-code``, ``target.trust_remote_code``). What a config cannot
say, the parsers that split reasoning and tool calls out of the answer, comes from the model family's own deploy
guide (Kimi-K2.5: ``--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`` for vLLM and SGLang, plus vLLM's
``--mm-encoder-tp-mode data`` for its vision encoder under tensor parallelism). docs/targets.md has the table.

Every value is a default: the serve scripts read them from ``.env`` (``TRUST_REMOTE_CODE``, ``REASONING_PARSER``,
``TOOL_CALL_PARSER``, ``VLLM_EXTRA_ARGS``, ``SGLANG_EXTRA_ARGS``), where ``draftsmith target flags`` writes them and
the user may change them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.target.checkpoint import read_target_config, target_config_path


@dataclass(frozen=True)
class Family:
    """What a model family needs beyond its config: reasoning and tool-call parser names (the same in vLLM and
    SGLang for these families) and extra arguments per engine; ``source`` says where they come from."""

    name: str
    model_types: tuple[str, ...]
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    vllm_args: tuple[str, ...] = ()
    sglang_args: tuple[str, ...] = ()
    source: str = ""


FAMILIES = (
    Family("Kimi-K2.5", ("kimi_k25",), "kimi_k2", "kimi_k2", ("--mm-encoder-tp-mode", "data"), (),
           "the deploy guide of moonshotai/Kimi-K2.5 on Hugging Face; SGLang's Kimi-K2.5 usage page"),
    Family("Kimi-K2", ("kimi_k2",), "kimi_k2", "kimi_k2", (), (),
           "moonshotai/Kimi-K2-Thinking deploy guide (the same parsers)"),
    Family("Qwen3", ("qwen3", "qwen3_moe"), "qwen3", None, (), (), "Qwen3 model card (vLLM and SGLang: qwen3)"),
    Family("DeepSeek-V3", ("deepseek_v3",), None, None, (), (), "a non-thinking chat template: no parser"),
    Family("Llama", ("llama",), None, None, (), (), "no reasoning field: no parser"),
)


@dataclass(frozen=True)
class TargetProfile:
    """The engine settings of one target checkpoint folder.

    Attributes:
        family: the matched :class:`Family` name, or ``None`` (then only the config-derived values are set).
        model_type: ``model_type`` of the config (of ``text_config`` for a multimodal wrapper).
        trust_remote_code: the config or the tokenizer config has an ``auto_map`` (its own Python code).
        remote_code_files: the ``*.py`` files of the folder (what the user should read before trusting them).
        reasoning_parser, tool_call_parser: parser names for ``--reasoning-parser`` / ``--tool-call-parser``.
        vllm_args, sglang_args: extra arguments for one engine only.
    """

    family: str | None
    model_type: str
    trust_remote_code: bool
    remote_code_files: tuple[str, ...]
    reasoning_parser: str | None
    tool_call_parser: str | None
    vllm_args: tuple[str, ...]
    sglang_args: tuple[str, ...]

    def env(self) -> dict[str, str]:
        """The ``.env`` lines the serve scripts read (services/target/*-serve.sh), values as strings."""
        return {
            "TRUST_REMOTE_CODE": "1" if self.trust_remote_code else "0",
            "REASONING_PARSER": self.reasoning_parser or "",
            "TOOL_CALL_PARSER": self.tool_call_parser or "",
            "VLLM_EXTRA_ARGS": " ".join(self.vllm_args),
            "SGLANG_EXTRA_ARGS": " ".join(self.sglang_args),
        }

    def engine_args(self, engine: str) -> list[str]:
        """The arguments this profile adds to ``engine``'s (``vllm`` or ``sglang``) server command line."""
        args = ["--trust-remote-code"] if self.trust_remote_code else []
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.tool_call_parser:
            args += ["--tool-call-parser", self.tool_call_parser]
        return args + list(self.vllm_args if engine == "vllm" else self.sglang_args)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path}: {e}", "the checkpoint folder is damaged; download it again") from e


def target_profile(folder: Path | str) -> TargetProfile:
    """The :class:`TargetProfile` of a checkpoint folder, read from ``config.json`` and ``tokenizer_config.json``
    (no weights are read).

    Raises:
        ModelError: the folder has no ``config.json``, or a config file is not JSON.
    """
    folder = Path(folder)
    if not target_config_path(folder).is_file():
        raise ModelError(f"{folder} has no {target_config_path(folder).name}", "point at the target's checkpoint "
                         "folder")
    cfg = read_target_config(folder)
    tok_cfg = _read_json(folder / "tokenizer_config.json")
    text = cfg.get("text_config") or cfg
    types = {str(cfg.get("model_type", "")), str(text.get("model_type", ""))}
    fam = next((f for f in FAMILIES if types & set(f.model_types)), None)
    remote = bool(cfg.get("auto_map") or tok_cfg.get("auto_map"))
    return TargetProfile(
        family=fam.name if fam else None,
        model_type=str(cfg.get("model_type") or text.get("model_type") or ""),
        trust_remote_code=remote,
        remote_code_files=tuple(sorted(p.name for p in folder.glob("*.py"))),
        reasoning_parser=fam.reasoning_parser if fam else None,
        tool_call_parser=fam.tool_call_parser if fam else None,
        vllm_args=fam.vllm_args if fam else (),
        sglang_args=fam.sglang_args if fam else (),
    )
