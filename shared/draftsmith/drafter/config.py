"""The drafter's shape, derived from the target's ``config.json`` (copied, never guessed).

Layer ids follow the project's one convention (``draftsmith.features.layers``, formats.md section 4): id ``i`` is
the output of decoder layer ``i`` (0-based), transformers' ``output_hidden_states[i + 1]``; the default is
``(1, L//2 - 1, L - 4)``, ``(1, 14, 26)`` for SmolLM2. Exports translate them to vLLM's
``eagle_aux_hidden_state_layer_ids`` with :func:`~draftsmith.features.layers.vllm_aux_ids` (``i + 1``, because vLLM
records aux id ``k`` after decoder layer ``k - 1``; ``vllm/model_executor/models/interfaces.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.errors import ModelError
from draftsmith.features.layers import default_layer_ids, vllm_aux_ids
from draftsmith.target.checkpoint import read_target_config as read_checkpoint_config


def vllm_layer_ids(layer_ids: list[int]) -> list[int]:
    """vLLM's ``eagle_aux_hidden_state_layer_ids`` for our ``layer_ids`` (``i + 1``)."""
    return vllm_aux_ids(layer_ids)


def from_vllm_layer_ids(ids: list[int]) -> list[int]:
    """Inverse of :func:`vllm_layer_ids`."""
    return [int(i) - 1 for i in ids]


@dataclass
class DraftConfig:
    """Shape of an EAGLE-3 drafter.

    Attributes mirror the Llama config fields of the same name. ``target_hidden_size`` is the width of each aux
    feature (``fc`` maps ``len(layer_ids) * target_hidden_size -> hidden_size``). ``rope_parameters`` is the
    target's dict (``rope_theta``, ``rope_type`` and scaling keys), copied whole.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    rope_parameters: dict[str, Any]
    target_hidden_size: int
    target_num_layers: int
    layer_ids: list[int]
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    num_layers: int = 1
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    target_model_type: str = "llama"
    target_architectures: list[str] = field(default_factory=lambda: ["LlamaForCausalLM"])
    target_name: str = ""

    def llama_config(self):
        """A transformers ``LlamaConfig`` with the same shape (for rotary embeddings, MLP and norms)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, vocab_size=self.vocab_size,
            rope_parameters=dict(self.rope_parameters), hidden_act=self.hidden_act,
            attention_bias=self.attention_bias, mlp_bias=self.mlp_bias, num_hidden_layers=self.num_layers,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ModelError (a checkpoint from another version)."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ModelError(f"drafter config has unknown keys {sorted(extra)}", "it was written by another tool")
        return cls(**d)


def decoder_fields(cfg: DraftConfig) -> dict[str, Any]:
    """The decoder fields every exported drafter's ``config.json`` spells the same way (Llama and Qwen3 field
    names; ``vocab_size`` is the target vocabulary). Each layout adds its own ``model_type``, rope and bias keys."""
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "attention_bias": cfg.attention_bias,
        "num_hidden_layers": cfg.num_layers,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def read_target_config(target_path: Path | str) -> dict[str, Any]:
    """The target's whole ``config.json`` (:func:`draftsmith.target.checkpoint.read_target_config`).

    Raises:
        ModelError: no readable ``config.json`` in the folder.
    """
    return read_checkpoint_config(target_path)


def is_mla(text_config: dict[str, Any]) -> bool:
    """True for a multi-head-latent-attention target (DeepSeek-V2/V3, Kimi-K2): its config has ``kv_lora_rank``."""
    return text_config.get("kv_lora_rank") is not None


def attention_head_dim(text_config: dict[str, Any]) -> int:
    """Head width of the drafter's (Llama) attention for a target config.

    Llama-like targets: ``head_dim``, else ``hidden_size // num_attention_heads``. MLA targets: ``v_head_dim``
    (DeepSeek-V3 and Kimi-K2: 128, equal to ``qk_nope_head_dim``), because an MLA config's ``head_dim`` is
    transformers' alias of ``qk_rope_head_dim`` (64, the rotary part only) and the original DeepSeek-V3 config has
    none (``hidden // heads`` would give 56). The public Kimi-K2.5 EAGLE-3 drafter (k-l-lambda/Kimi-K2.5-Eagle3,
    ``config.json``: ``head_dim`` 128, 64 heads, 64 kv heads) uses the same rule; docs/mla.md compares the fields.
    """
    if is_mla(text_config):
        return int(text_config.get("v_head_dim") or text_config["qk_nope_head_dim"])
    return int(text_config.get("head_dim") or int(text_config["hidden_size"]) // int(text_config["num_attention_heads"]))


def rope_of(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings of a (text) config as one dict: ``rope_parameters`` (transformers >= 5) when present,
    else ``rope_scaling`` plus ``rope_theta`` (the older layout; theta 10000 and no scaling when absent), with
    ``rope_type`` always set (compare two with :func:`same_rope`)."""
    rope = config.get("rope_parameters")
    if rope is None:
        rope = dict(config.get("rope_scaling") or {})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope["rope_theta"] = float(config.get("rope_theta", 10000.0))
    rope = dict(rope)
    rope.setdefault("rope_type", "default")
    return rope


def same_rope(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`rope_of` dicts rotate alike (numbers compared as floats: 32 == 32.0)."""
    def norm(r: dict[str, Any]) -> dict[str, Any]:
        return {k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in r.items()
                if v is not None}

    return norm(a) == norm(b)


def derive_config(
    target_path: Path | str,
    draft_vocab_size: int,
    layer_ids: list[int] | tuple[int, ...] | None = None,
    num_layers: int = 1,
    norm_before_residual: bool = False,
    fc_norm: bool = False,
    norm_before_fc: bool = False,
    norm_output: bool = False,
) -> DraftConfig:
    """Drafter config copied from the target's ``config.json``.

    Args:
        target_path: target checkpoint folder.
        draft_vocab_size: N, the size of the draft vocabulary (``d2t`` length).
        layer_ids: aux layer ids (outputs of decoder layers); None = :func:`draftsmith.features.layers.default_layer_ids`.
        num_layers: decoder layers of the drafter (1 for EAGLE-3).
        norm_before_residual: residual carries the normed feature (vLLM flag of the same name).
        fc_norm: one RMSNorm per aux feature before ``fc`` (vLLM's ``fc_norm`` config flag).
        norm_before_fc: one RMSNorm over the concatenated aux features before ``fc`` (EAGLE-3.1; vLLM's
            ``norm_before_fc``, weight ``input_norm.weight``).
        norm_output: the next draft step is fed the normed hidden state instead of the pre-norm sum (EAGLE-3.1;
            vLLM's ``norm_output``).

    Raises:
        ModelError: a missing field, a non-Llama-like target, layer ids out of range, or both ``norm_before_fc``
            and ``fc_norm`` (speculators refuses such a config; vLLM would apply one norm after the other).
    """
    if norm_before_fc and fc_norm:
        raise ModelError("norm_before_fc and fc_norm are both set", "choose one: a single RMSNorm over the "
                         "concatenated aux features (norm_before_fc) or one per feature (fc_norm)")
    t = read_target_config(target_path)
    text = t.get("text_config", t)  # multimodal wrappers keep the language model under text_config
    missing = [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size") if k not in text]
    if missing:
        raise ModelError(f"target config lacks {missing}", "use a decoder-only Hugging Face checkpoint")
    n_layers = int(text["num_hidden_layers"])
    ids = list(layer_ids) if layer_ids else list(default_layer_ids(n_layers))
    if any(i < 0 or i >= n_layers - 1 for i in ids):
        raise ModelError(f"aux layer ids {ids} are outside 0..{n_layers}", "pick ids of existing target layers")
    heads = int(text["num_attention_heads"])
    head_dim = attention_head_dim(text)
    rope = rope_of(text)
    if not 0 < draft_vocab_size <= int(text["vocab_size"]):
        raise ModelError(f"draft vocabulary size {draft_vocab_size} is not in 1..{text['vocab_size']}")
    return DraftConfig(
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text.get("intermediate_size", 4 * int(text["hidden_size"]))),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(text["max_position_embeddings"]),
        vocab_size=int(text["vocab_size"]),
        draft_vocab_size=int(draft_vocab_size),
        rope_parameters=dict(rope),
        target_hidden_size=int(text["hidden_size"]),
        target_num_layers=n_layers,
        layer_ids=ids,
        hidden_act=text.get("hidden_act", "silu"),
        attention_bias=bool(text.get("attention_bias", False)),
        mlp_bias=bool(text.get("mlp_bias", False)),
        num_layers=num_layers,
        norm_before_residual=norm_before_residual,
        fc_norm=fc_norm,
        norm_before_fc=norm_before_fc,
        norm_output=norm_output,
        target_model_type=text.get("model_type", "llama"),
        target_architectures=list(t.get("architectures") or ["LlamaForCausalLM"]),
        target_name=Path(target_path).name,
    )
