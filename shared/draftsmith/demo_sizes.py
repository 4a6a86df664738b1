"""The demo's sizes: one preset per scale of the main job on the embedded default (``small`` for CI, ``default``
for the best drafter the 45-minute budget allows on 2 CPU cores) and per tiny reasoning target (``mla``, ``kimi``).

A preset is the prompts per bundled pool, the config the stages run with (checked against the one config schema,
:meth:`DemoSize.settings`), the generation worker count and the target. :mod:`draftsmith.demo` runs one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from draftsmith.config import Settings, load_settings


@dataclass(frozen=True)
class DemoSize:
    """One demo scale: prompts per bundled pool, and the config the stages run with."""

    name: str
    pools: dict[str, int]
    config: dict[str, Any]
    # generation worker processes; None = the pool's own rule, ceil(concurrency / batch_size) + 1. The SmolLM2 sizes
    # set one fewer: on 2 cores the extra process took CPU from the server and gave no throughput (4 vs 5 processes
    # for 64 / 16: 456 and 470 vs 446 and 406 out tok/s, docs/benchmarks.md)
    workers: int | None = None
    # embedded (SmolLM2) | tiny-mla (draftsmith.target.tiny_mla, docs/mla.md) | tiny-kimi (draftsmith.target.tiny_kimi)
    target: str = "embedded"
    # where the CPU computes bf16 natively (draftsmith.precision: each stage 1.6-4.0x faster, bench/precision.py),
    # the same budget buys more data: these pools and per-section config keys replace the ones above
    native_bf16: dict[str, Any] | None = None

    def settings(self, **overrides: Any) -> Settings:
        """The preset's config as :class:`Settings` (validated: a wrong key or value raises ConfigError), with
        ``overrides`` (top-level keys such as ``run``) on top."""
        return load_settings(None, {**self.config, **overrides})

    def for_this_machine(self) -> DemoSize:
        """This size as it runs here: :attr:`native_bf16`'s pools and config merged in on a CPU with AMX."""
        from draftsmith.precision import native_bf16

        if not self.native_bf16 or not native_bf16("cpu"):
            return self
        over = self.native_bf16
        config = {k: dict(v) if isinstance(v, dict) else v for k, v in self.config.items()}
        for section, keys in over.get("config", {}).items():
            config[section] = {**config.get(section, {}), **keys}
        return replace(self, pools=dict(over.get("pools", self.pools)), config=config, native_bf16=None)


# The training recipe of both SmolLM2 sizes (measured in bench/recipe.py, docs/benchmarks.md): residual
# carries the normed feature, TTT depth = the K served, micro-batches of 4, a cosine floor of 0.1 x the peak, and
# every extracted row in the loss (prompt rows too), and Muon on the hidden matrices (1.455 -> 1.521 in vLLM on
# 1,115 regenerated samples at one epoch, ahead of speculators' defaults, 1.489; 1.8 % ahead of speculators tuned as
# much, docs/benchmarks.md's fair protocol) at a peak of 3e-3 whatever the size's lr
# (held out on the same data: Muon at 1e-3 / 2e-3 / 3e-3 / 5e-3 gave 1.71 / 1.81 / 1.84 / 1.79; docs/benchmarks.md,
# the peer section).
RECIPE: dict[str, Any] = {"norm_before_residual": True, "ttt_steps": 3, "batch_size": 4, "min_lr_ratio": 0.1,
                          "loss_rows": "all", "optimizer": "muon", "muon_lr": 3e-3}

# The stages of both tiny reasoning targets (the MLA and the Kimi-K2.5-layout sizes), float32 throughout: the MLA
# path was built and measured in float32 (docs/mla.md)
TINY_TARGET_STAGES: dict[str, Any] = {
    "extract": {"compute_dtype": "float32"},
    "generation": {"max_tokens": 256, "batch_size": 16, "concurrency": 32},
    # a turn cut inside <think> never generated </think>, which the template renders: drop cut turns
    "data": {"max_length": 512, "draft_vocab_size": 1024, "require_reasoning": True,
             "truncated_answers": "drop", "max_drop_rate": 0.5},
    "train": {"draft_vocab_size": 1024, "epochs": 6, "lr": 2e-3, "batch_size": 8, "batch_tokens": 4096,
              "precision": "fp32", "eval_every": 20, "log_every": 5, "save_every": 50, "warmup_ratio": 0.05},
    "eval": {"sets": ["gsm8k"], "limit": 4, "max_tokens": 96, "concurrency": 4, "k": 3},
}

# The data mix of both SmolLM2 sizes: GSM8K, Self-Instruct, code-completion prompts from Python's
# standard library and two-turn conversations (scripts/make_prompt_pools.py), in the same proportions; the small
# demo's mix was measured in vLLM against the old three pools (docs/benchmarks.md: HumanEval 1.09 -> 1.28).
SIZES: dict[str, DemoSize] = {
    # CI: a few dozen prompts and a short training; under 10 minutes here
    "small": DemoSize(
        name="small",
        pools={"gsm8k_train.jsonl": 16, "self_instruct_seed_tasks.jsonl": 8, "user_oriented_instructions.jsonl": 8,
               "python_stdlib_functions.jsonl": 10, "multi_turn_followups.jsonl": 6},
        config={
            "target": {"enforce_eager": True, "max_model_len": 2048},
            "generation": {"max_tokens": 128, "batch_size": 16, "concurrency": 48},
            "data": {"max_length": 512, "draft_vocab_size": 4096},
            "train": {**RECIPE, "draft_vocab_size": 4096, "epochs": 10, "lr": 5e-4, "batch_tokens": 4096,
                      "eval_every": 40, "log_every": 10, "save_every": 100, "warmup_ratio": 0.05},
            "eval": {"sets": ["mt_bench", "gsm8k", "humaneval", "alpaca"], "limit": 2, "max_tokens": 64,
                     "concurrency": 4, "k": 3},
        },
        workers=3,
    ),
    # the best drafter the 45-minute budget allows on 2 CPU cores (sizing in docs/benchmarks.md). float32 (no AMX):
    # 647 prompts, answers up to 256 tokens, 2 epochs: 1.42 in vLLM in 38 min on an AVX2 EPYC (4 epochs and 320
    # tokens reached 1.51 but take ~55 min there). bf16 on AMX (native_bf16): 1,717 prompts, 320 tokens, 2 epochs,
    # 1.61 in vLLM (held-out 2.05) in 44 min on a Xeon
    "default": DemoSize(
        name="default",
        pools={"gsm8k_train.jsonl": 215, "self_instruct_seed_tasks.jsonl": 108, "user_oriented_instructions.jsonl": 108,
               "python_stdlib_functions.jsonl": 135, "multi_turn_followups.jsonl": 81},
        config={
            "target": {"enforce_eager": False, "max_model_len": 4096, "kv_cache_gib": 4},
            "generation": {"max_tokens": 256, "batch_size": 16, "concurrency": 64},
            "data": {"max_length": 1024, "draft_vocab_size": 8192, "shard_samples": 128},
            "train": {**RECIPE, "draft_vocab_size": 8192, "epochs": 2, "lr": 1e-3, "batch_tokens": 4096,
                      "eval_every": 200, "log_every": 20, "save_every": 400, "warmup_ratio": 0.03},
            "eval": {"sets": ["mt_bench", "gsm8k", "humaneval", "alpaca"], "limit": 10, "max_tokens": 128,
                     "concurrency": 4, "k": 3},
        },
        workers=4,
        native_bf16={
            "pools": {"gsm8k_train.jsonl": 560, "self_instruct_seed_tasks.jsonl": 175,
                      "user_oriented_instructions.jsonl": 252, "python_stdlib_functions.jsonl": 400,
                      "multi_turn_followups.jsonl": 330},
            "config": {"generation": {"max_tokens": 320}, "train": {"epochs": 2}},
        },
    ),
    # the seed's target family: a tiny DeepSeek-V3 (MLA + MoE, thinking tokens) through every stage (docs/mla.md)
    "mla": DemoSize(
        name="mla",
        pools={"gsm8k_train.jsonl": 32},
        config={
            # float32 throughout, on every CPU: the MLA path was built and measured in float32 (docs/mla.md)
            "target": {"enforce_eager": True, "max_model_len": 1024, "kv_cache_gib": 1, "dtype": "float32",
                       "extra_args": ["--reasoning-parser", "deepseek_r1"]},
            **TINY_TARGET_STAGES,
        },
        workers=2,
        target="tiny-mla",
    ),
    # the seed's own checkpoint layout: a tiny Kimi-K2.5 (multimodal wrapper, language_model.* weights, its own
    # tiktoken tokenizer code) through every stage with the flags `draftsmith target flags` derives for it
    # (docs/targets.md); text prompts only, so vLLM serves its language model alone
    "kimi": DemoSize(
        name="kimi",
        pools={"gsm8k_train.jsonl": 32},
        config={
            "target": {"enforce_eager": True, "max_model_len": 1024, "kv_cache_gib": 1, "dtype": "float32",
                       "trust_remote_code": True,
                       "extra_args": ["--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
                                      "--mm-encoder-tp-mode", "data", "--language-model-only"]},
            **TINY_TARGET_STAGES,
        },
        workers=2,
        target="tiny-kimi",
    ),
}
