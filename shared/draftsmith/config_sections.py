"""The config schema's sections, one per stage (and the queue, the target, metrics); the root that holds them and
the loader are :mod:`draftsmith.config`.

Every field has a default and a one-line doc; unknown keys are rejected (``extra="forbid"``) and values are checked
on assignment. Each stage adds its fields to its own section.

Every key has a kind, run or host (:mod:`draftsmith.config_kinds`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from draftsmith.artifacts.data import STATS_FILE
from draftsmith.config_kinds import Host, Kind, Run, Section

MASK = "**********"


def redact_url(url: str) -> str:
    """``url`` with the password of its user info masked (``redis://:****@host:6379/0``); other URLs unchanged."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
    except ValueError:
        return url
    if u.password is None:
        return url
    user = u.username or ""
    host = u.netloc.rsplit("@", 1)[1]
    return urlunsplit(u._replace(netloc=f"{user}:{MASK}@{host}"))


def secret_value(value: SecretStr | str | None) -> str | None:
    """The plain text of a secret field (``SecretStr``), a plain string, or None."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


class RedisConfig(Section):
    """Where the queue lives."""

    section_kind: ClassVar[Kind] = "host"

    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (redis://[:password@]host:port/db); "
                     "its password is masked in every written config, manifest and checkpoint.")
    prefix: str = Field("draftsmith", description="Prefix of every Redis key and rq queue name of draftsmith.")

    @field_serializer("url", when_used="json")
    def _redact_url(self, url: str) -> str:
        return redact_url(url)


class TargetConfig(Section):
    """The target model and the OpenAI-compatible server in front of it."""

    url: str = Host("http://127.0.0.1:8000", description="Base URL of the target server (without /v1).")
    model: str | None = Run(None, description="Served model name; None takes the only model the server serves.")
    api_key: SecretStr | None = Host(None, description="Bearer token for the server, if it needs one (give it in the "
                                      "environment: DRAFTSMITH_TARGET__API_KEY; it is masked wherever it is written).")
    path: str | None = Host(
        None, description="Local folder of the target checkpoint (tokenizer, weights); None = the embedded default."
    )
    cache_dir: Path = Host(
        Path(os.path.expanduser("~/.cache/draftsmith")), description="Where `target prepare` writes checkpoints."
    )

    @field_serializer("url", when_used="json")
    def _redact_url(self, url: str) -> str:
        return redact_url(url)
    host: str = Host("127.0.0.1", description="Address `target serve` binds to.")
    port: int = Host(8000, ge=1, le=65535, description="Port `target serve` listens on.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Host(
        "auto", description="Serving dtype; auto = bfloat16 on CPUs with AMX, float32 on other CPUs (where bf16 "
        "is emulated and slower), the engine's own choice on CUDA (draftsmith.precision).",
    )
    max_model_len: int = Host(4096, ge=128, description="Context length the server accepts (prompt + output).")
    kv_cache_gib: int = Host(2, ge=1, description="VLLM_CPU_KVCACHE_SPACE for the CPU build, in GiB.")
    enforce_eager: bool = Host(False, description="Skip torch.compile warm-up (faster start, slower serving).")
    startup_timeout_s: float = Host(900.0, gt=0, description="How long `target serve` waits for the server.")
    extra_args: list[str] = Host(default_factory=list, description="Extra arguments passed to the server.")
    trust_remote_code: bool = Host(
        False, description="Run the Python code a target checkpoint ships (classes its auto_map names: Kimi-K2's "
        "tiktoken tokenizer, its model): honoured by every tokenizer, config and model load of every stage and "
        "passed to the servers as --trust-remote-code. Off unless you trust the checkpoint.")


class GenerationConfig(Section):
    """Regeneration of answers by the target through the rq worker pool."""

    max_tokens: int = Run(1024, ge=1, description="Most new tokens per assistant turn.")
    temperature: float = Run(0.0, ge=0.0, description=(
        "Sampling temperature (0 = greedy). Unless set, the target's generation_config.json value when it has one "
        "(a long-reasoning target loops under greedy decoding until max_tokens), else 0."))
    top_p: float = Run(1.0, gt=0.0, le=1.0, description=(
        "Nucleus sampling threshold; unless set, the target's generation_config.json value when it has one."))
    top_k: int | None = Run(None, ge=-1, description=(
        "Top-k sampling (-1 = off); unless set, the target's generation_config.json value when it has one; None "
        "sends none (the server's default)."))
    seed: int | None = Run(0, description="Per-request sampling seed; None lets the server pick.")
    concurrency: int = Host(128, ge=1, description="In-flight request cap shared by all workers (the seed: 128).")
    batch_size: int = Run(64, ge=1, description=(
        "Prompts per rq job (one record shard per job). Each job pays a fixed cost (a forked work-horse, an HTTP "
        "client); 64 keeps it small against a fast server (docs/benchmarks.md, generation_scale)."))
    request_timeout_s: float | None = Host(None, gt=0, description=(
        "Client timeout of one request, in seconds; None derives it from the lengths: max_tokens at "
        "generation.decode_tok_s, twice, and never under 3,600 s (32,768 tokens at 10 tok/s: 6,554 s)."))
    decode_tok_s: float = Host(10.0, gt=0, description=(
        "Slowest decode rate one sequence is expected to see at full concurrency, in tokens/s: sizes the derived "
        "request_timeout_s (measure it on the target's dashboard and set it for a faster or slower server)."))
    stream: bool = Host(True, description=(
        "Stream answers (server-sent events): the client then sees each answer's first token, and handoff_after_s "
        "counts from it rather than from the time the request waited in the engine's queue."))
    handoff_after_s: float = Host(600.0, ge=0, description=(
        "A request of a batch job still running this many seconds after its first token (streamed; unstreamed: "
        "after it was sent) is cancelled and its prompt handed to a "
        "tail job of its own (stragglers run together, so one long answer does not hold a worker process and its "
        "job's finished slots); its partial answer is discarded. 0 = off. 600 s is 10x the mean latency of a "
        "2,048-token answer at ~35 tok/s per sequence, so only the far tail is cut (docs/generation.md)."))
    connect_timeout_s: float = Host(10.0, gt=0, description="Client connect timeout, in seconds.")
    max_retries: int = Host(5, ge=0, description="Retries of one request on resets, timeouts, 5xx and 429.")
    backoff_s: float = Host(1.0, ge=0, description="First retry delay; doubles per retry (with jitter).")
    job_timeout_s: int | None = Host(None, ge=10, description=(
        "rq timeout of a generation job, in seconds; None derives it from one request's retries (max_retries + 1 "
        "attempts of request_timeout_s, with back-off) plus 600 s, never under 6 h: 32,768-token answers get "
        "39,968 s. A value shorter than the retries is said at enqueue."))
    job_retries: int = Host(3, ge=0, description="rq Retry count of a failed job.")
    return_token_ids: bool = Host(True, description="Ask the server for generated token ids (vLLM: streamed or not; "
                                  "SGLang: on unstreamed requests only, so its requests then go unstreamed).")
    min_free_disk_gb: float = Host(1.0, ge=0, description="Refuse to start below this much free disk, in GB.")
    system_prompt: str | None = Run(None, description="System message added to prompts that have none.")


class DataConfig(Section):
    """Training samples built from records."""

    max_length: int = Run(2048, ge=16, description="Longest training sample, in tokens.")
    too_long: Literal["truncate", "drop"] = Run(
        "truncate", description=f"Policy for samples longer than max_length (both counted in {STATS_FILE})."
    )
    truncated_answers: Literal["keep", "drop"] = Run(
        "keep", description="Policy for turns cut by finish_reason=length (kept turns supervise no end-of-turn); "
        "unless set, drop for a reasoning target (its profile has a reasoning parser or its chat template <think>)."
    )
    tokenizer: str | None = Host(
        None, description="Tokenizer folder; None = target.path, else the embedded target checkpoint."
    )
    chat_template: str | None = Host(
        None, description="Jinja file replacing the tokenizer's chat template (None = the tokenizer's own)."
    )
    template_kwargs: dict[str, Any] = Run(
        default_factory=dict, description="Extra chat-template variables (e.g. enable_thinking); default per turn."
    )
    check_model: bool = Run(True, description="Fail when a record's model differs from the tokenizer's model.")
    max_mismatch_rate: float = Run(
        0.0, ge=0.0, le=1.0, description="Fail when more than this fraction of checked turns is not token-exact."
    )
    max_drop_rate: float = Run(
        0.1, ge=0.0, le=1.0, description="Fail when more than this fraction of records is dropped (any reason)."
    )
    require_reasoning: bool = Run(False, description="Drop turns with empty reasoning (for reasoning targets).")
    draft_vocab_size: int = Run(
        8192, ge=1, description="Draft vocabulary size N (top-N supervised tokens); see docs/data.md."
    )
    shard_samples: int = Run(1024, ge=1, description="Samples per samples-XXXXX.safetensors shard.")

    @field_validator("template_kwargs", mode="before")
    @classmethod
    def _template_kwargs_from_env(cls, v: Any) -> Any:
        """Environment values are strings: ``DRAFTSMITH_DATA__TEMPLATE_KWARGS='{"enable_thinking": false}'`` is
        read as JSON, and each ``DRAFTSMITH_DATA__TEMPLATE_KWARGS__ENABLE_THINKING=false`` value as a JSON scalar
        (the template must see ``false``, not the truthy string ``"false"``)."""
        import json

        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"not a JSON object: {v[:60]!r}") from e
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if isinstance(x, str):
                    try:
                        x = json.loads(x)
                    except json.JSONDecodeError:
                        pass  # a plain string value stays a string
                out[k] = x
            return out
        return v


class ExtractConfig(Section):
    """Hidden-state extraction."""

    backend: Literal["hf", "vllm"] = Host("hf", description="Extraction backend.")
    layers: list[int] | None = Run(
        None, description="Aux layer ids (output of decoder layer i); None = EAGLE-3 default (1, L//2-1, L-4)."
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Run("bfloat16", description="Dtype of stored features.")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Host(
        "auto", description="Dtype the target runs in; auto = bfloat16 on CUDA and on CPUs with AMX, float32 on "
        "other CPUs (draftsmith.precision).",
    )
    device: str = Host("cpu", description="Torch device of the hf backend (cpu, cuda, cuda:1, ...).")
    batch_tokens: int = Host(4096, ge=16, description="Most padded tokens per forward pass (batched by length).")
    write_tokens: int | None = Host(
        None, ge=16, description="Most tokens whose features are held in memory before they are written to the shard "
        "file, and the most one call to the vllm engine gets; None = a quarter of the free memory at each shard's "
        "start over 40 x H bytes per token (docs/extraction.md, Memory).")
    job_timeout_s: int = Host(6 * 3600, ge=10, description="rq timeout of one extraction job, in seconds.")
    disk_margin: float = Host(1.1, ge=1.0, description="Required free disk = estimated feature bytes x this.")
    vllm_port: int = Host(0, ge=0, le=65535, description="Port of the vllm backend's own server (0 = a free one).")
    tensor_parallel_size: int = Host(
        1, ge=1, description="vllm backend: GPUs (or, on vLLM's CPU build, processes) the target is split over.")
    enable_expert_parallel: bool = Host(
        False, description="vllm backend: spread a MoE target's experts over the tensor-parallel ranks.")
    release_idle_s: float = Host(
        300, ge=0, description="Seconds a resident extraction worker's queue may stay empty before it frees the "
        "target (its GPUs: training and the target service need them); the next job loads it again. 0 = never.")


class TrainConfig(Section):
    """Drafter training (EAGLE-3 and the other families, drafter/families/)."""

    family: Literal["eagle3", "peagle", "dflash"] = Run(
        "eagle3", description="Drafter family: eagle3 (chain drafting), peagle (P-EAGLE: K = ttt_steps tokens from "
        "one drafter pass, served by vLLM with parallel_drafting) or dflash (block diffusion); docs/families.md.")
    ttt_steps: int = Run(7, ge=1, description="Training-time-test unroll depth k.")
    dflash_anchors: int = Run(
        64, ge=1, description="train.family=dflash: most blocks drafted per sequence in one training pass (anchor "
        "positions in the answer; the block size is ttt_steps + 1: the anchor token and ttt_steps masks).")
    ttt_attention: Literal["blockwise", "dense"] = Host(
        "blockwise", description="Attention of TTT steps >= 1: blockwise (online softmax over tiles, memory "
        "linear in the sequence length) or dense (explicit [T, T] scores, the reference; drafter/ttt_attention.py).",
    )
    ttt_loss: Literal["chunked", "dense"] = Host(
        "chunked", description="Per-step soft-CE over the draft vocabulary: chunked (sequence chunks under "
        "activation checkpointing, no [T, N] tensor kept for backward) or dense (the reference; drafter/ttt.py).",
    )
    draft_vocab_size: int | None = Run(
        None, ge=1, description="Draft vocabulary size N (data/vocab/draft-N must exist); None = data.draft_vocab_size."
    )
    layer_ids: list[int] | None = Run(
        None, description="Aux target layer ids (output_hidden_states index); None = the features' ids."
    )
    num_layers: int = Run(1, ge=1, description="Decoder layers of the drafter (1 for EAGLE-3).")
    norm_before_residual: bool = Run(False, description="Residual carries the normed feature (vLLM flag).")
    fc_norm: bool = Run(False, description="One RMSNorm per aux feature before fc (vLLM's fc_norm flag).")
    norm_before_fc: bool = Run(
        False, description="One RMSNorm over the concatenated aux features before fc (EAGLE-3.1; vLLM's "
        "norm_before_fc flag, weight input_norm.weight); not with fc_norm.",
    )
    norm_output: bool = Run(
        False, description="Feed the normed hidden state, not the pre-norm sum, to the next draft step (EAGLE-3.1; "
        "vLLM's norm_output flag).",
    )
    norm_init: Literal["target", "ones"] = Run(
        "ones", description="Init the drafter's final norm from the target's final norm, or to ones."
    )
    feature_noise: float = Run(
        0.0, ge=0, description="Gaussian noise on the aux features while training, as a share of each feature's RMS."
    )
    loss_rows: Literal["generated", "all"] = Run(
        "generated", description="Rows in the loss: target-generated tokens only, or every extracted row "
        "(accuracy is always reported on generated tokens).",
    )
    lm_head_init: Literal["target", "random"] = Run(
        "target", description="Init lm_head from the target's rows of the draft vocabulary, or randomly."
    )
    freeze_lm_head: bool = Run(
        False, description="Keep lm_head fixed at its init (the target's rows, or init_from's head; needs "
        "lm_head_init=target): the drafter learns to produce states that head reads, as in EAGLE-1, and skips the "
        "head's weight gradient.",
    )
    init_from: str | None = Host(None, description="Pretrained drafter folder to fine-tune (EAGLE or speculators).")
    remap_vocab: bool = Run(
        True, description="When init_from's draft vocabulary differs from the run's, copy its lm_head rows of the "
        "tokens both share (the others keep lm_head_init's rows) and log the overlap; false = refuse any other "
        "draft vocabulary.")
    remap_min_overlap: float = Run(
        0.5, ge=0, le=1, description="Least share of the run's draft tokens init_from's draft vocabulary must hold "
        "for a remap; below it fine-tuning refuses (the pretrained head would start mostly from scratch).")
    init_rope: Literal["refuse", "drafter", "target"] = Run(
        "refuse", description="When init_from's rotary settings (rope theta, scaling) differ from the target's: "
        "refuse, keep the drafter's (its weights were trained with them; the export carries them) or take the "
        "target's (fine-tuning adapts).")
    optimizer: Literal["adamw", "muon"] = Run(
        "adamw", description="adamw (every parameter) or muon (PyTorch's Muon on the hidden weight matrices, AdamW on "
        "the output head and the norms; drafter/optimizer.py).")
    lr: float = Run(1e-4, gt=0, description="Peak learning rate (AdamW; Muon's too unless muon_lr is set).")
    muon_lr: float | None = Run(None, gt=0, description="Peak Muon learning rate (update RMS matched to AdamW's); "
                                  "None = lr.")
    muon_momentum: float = Run(0.95, gt=0, lt=1, description="Muon's momentum.")
    muon_weight_decay: float = Run(0.1, ge=0, description="Muon's decoupled weight decay.")
    warmup_ratio: float = Run(0.015, ge=0, le=1, description="Share of steps with linear warm-up.")
    min_lr_ratio: float = Run(0.0, ge=0, le=1, description="Cosine floor as a share of the peak lr.")
    weight_decay: float = Run(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Run((0.9, 0.95), description="AdamW betas.")
    grad_clip: float = Run(0.5, gt=0, description="Gradient-norm clipping threshold.")
    grad_accum: int = Run(1, ge=1, description="Micro-batches per optimizer step.")
    batch_tokens: int = Run(8192, ge=16, description="Most padded tokens per micro-batch (length bucketing).")
    batch_size: int = Run(8, ge=1, description="Most samples per micro-batch.")
    epochs: int = Run(1, ge=1, description="Passes over the training split.")
    max_steps: int | None = Run(None, ge=1, description="Stop after this many optimizer steps (None = epochs).")
    loss_decay: float = Run(0.8, gt=0, le=1, description="Weight of TTT step j is loss_decay**j.")
    step_weights: Literal["decay", "acceptance"] = Run(
        "decay", description="TTT step weights: loss_decay**j, or 'acceptance': each step weighted by what its "
        "accuracy is worth in greedy acceptance length at the running training accuracies (steps after a likely "
        "rejection count for less).",
    )
    greedy_target_weight: float = Run(
        0.0, ge=0, le=1, description="Share of each row's target distribution moved onto the target's top-1 token "
        "while training (0: soft cross-entropy against the target's distribution, as EAGLE-3; 1: hard cross-entropy "
        "on the token greedy verification accepts). Held-out losses stay soft.",
    )
    hard_row_gamma: float = Run(
        0.0, ge=0, description="Token-level reweighting of hard positions while training: each row's loss times "
        "(1 - q)**gamma, q the drafter's probability of the target's top-1 (focal loss; 0 = off). Held-out losses "
        "stay unweighted.",
    )
    eval_fraction: float = Run(0.05, ge=0, lt=1, description="Share of samples held out for evaluation.")
    eval_every: int = Run(200, ge=1, description="Held-out evaluation every N optimizer steps (and at the end).")
    curve_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Run(
        [0.125, 0.25, 0.5], description="Also evaluate on the held-out split at the steps ending these fractions of "
        "the run that come before the first eval_every step: the learning curve `draftsmith doctor` reads "
        "(drafter/curve.py; [] = eval_every's points only).")
    log_every: int = Host(10, ge=1, description="One progress line every N optimizer steps.")
    peak_tflops: float | None = Host(
        None, gt=0, description="Peak dense TFLOP/s of one training device, for the MFU in the progress line; None = "
        "the published bf16 peak of a known GPU (A100, H100, H200, B200), else no MFU (draftsmith.drafter.flops).")
    save_every: int = Host(500, ge=1, description="Checkpoint every N optimizer steps (and at the end).")
    keep: int = Host(3, ge=1, description="Checkpoints kept (oldest removed).")
    seed: int = Run(0, description="Seed of init, shuffling and every random generator.")
    resume: bool = Host(True, description="Continue from the run's latest checkpoint when one exists.")
    device: str = Host("auto", description="cpu, cuda, cuda:N or auto.")
    precision: Literal["auto", "fp32", "bf16"] = Host(
        "auto", description="auto = bf16 autocast on CUDA and on CPUs with AMX, fp32 on other CPUs "
        "(draftsmith.precision)."
    )
    features: Literal["offline", "stream"] = Host(
        "offline", description="Read features/ shards, or stream them from the extractor."
    )
    loader_workers: int = Host(
        1, ge=0, description="Processes that read stored features ahead of the training step (torch DataLoader "
        "workers, pinned memory on a GPU); 0 = read in the training process when a step needs them "
        "(drafter/loader.py).",
    )
    parallel: Literal["ddp", "fsdp"] = Host(
        "ddp", description="Data parallelism under torchrun: ddp replicates the drafter; fsdp shards weights, "
        "gradients and optimizer state (FSDP2) for drafters too big to replicate.",
    )
    nnodes: int = Host(
        1, ge=1, description="Machines that train together (`draftsmith train-launch`): 1 runs torchrun "
        "--standalone; more join a c10d rendezvous at train.rdzv_endpoint (drafter/launch.py).",
    )
    rdzv_endpoint: str | None = Host(
        None, description="host:port of the c10d rendezvous when train.nnodes > 1: an address of one node that "
        "every node reaches (torchrun --rdzv-endpoint).",
    )

    @model_validator(mode="after")
    def _frozen_head_needs_target_rows(self) -> TrainConfig:
        if self.freeze_lm_head and self.lm_head_init != "target":
            raise ValueError("train.freeze_lm_head needs train.lm_head_init=target (a frozen random head "
                             "cannot learn); set lm_head_init: target or drop freeze_lm_head")
        return self

    @model_validator(mode="after")
    def _one_norm_before_fc(self) -> TrainConfig:
        # speculators' Eagle3SpeculatorConfig refuses the pair, so such an export would not load there
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("train.norm_before_fc and train.fc_norm are both set; choose one (a single RMSNorm "
                             "over the concatenated aux features, or one per feature)")
        return self


class ExportConfig(Section):
    """Drafter export for serving engines."""

    section_kind: ClassVar[Kind] = "run"

    format: Literal["eagle3", "speculators", "both"] = Field("both", description="Checkpoint layout(s) to write.")
    speculative_tokens: int = Field(3, ge=1, description="speculators proposal_methods speculative_tokens.")


class EvalConfig(Section):
    """Acceptance measured in serving engines."""

    engine: Literal["vllm", "sglang", "both"] = Host("vllm", description="Engine(s) to measure in.")
    k: int = Run(3, ge=1, description="Speculative tokens per step (chain drafting).")
    sets: list[str] = Run(
        default_factory=lambda: ["mt_bench", "gsm8k", "humaneval", "alpaca"],
        description="Eval sets: bundled names (mt_bench, gsm8k, humaneval, alpaca) or JSONL paths (EAGLE layout).",
    )
    sets_dir: Path | None = Host(None, description="Folder of the bundled eval sets; None = the ones shipped in the package.")
    limit: int | None = Run(None, ge=1, description="Questions per set (None = all 80); small for CPU smoke runs.")
    concurrency: int = Host(4, ge=1, description="Prompts in flight at once during the measurement.")
    temperature: float = Run(0.0, ge=0.0, description="Sampling temperature of the eval requests (0 = greedy).")
    max_tokens: int = Run(256, ge=1, description="Most new tokens per assistant turn.")
    baseline: bool = Run(True, description="Also run the prompts without the drafter to measure the speedup.")
    drafter: Path | None = Host(None, description="Drafter folder (EAGLE layout); None = runs/<run>/export/eagle3.")
    url: str | None = Host(None, description="Engine URL with the drafter already loaded; None = start one.")
    baseline_url: str | None = Host(None, description="Engine URL without drafter for the baseline; None = start one.")
    sglang_url: str | None = Host(None, description="SGLang URL (with the drafter) when engine is sglang or both.")
    out: Path | None = Host(None, description="Report folder; None = runs/<run>/eval.")
    pushgateway_url: str | None = Host(None, description="Push the eval gauges to this Pushgateway (None = only "
                                        "the textfile runs/<run>/eval/metrics.prom).")
    request_timeout_s: float = Host(600.0, gt=0, description="Client timeout of one eval request, in seconds.")


class MetricsConfig(Section):
    """Prometheus metrics of draftsmith's own processes."""

    section_kind: ClassVar[Kind] = "host"

    port: int = Field(9400, ge=0, le=65535, description="Port of /metrics of a worker pool, the queue exporter "
                      "and training (0 = no server).")
    addr: str = Field("127.0.0.1", description="Address /metrics binds: this host only by default; 0.0.0.0 inside a "
                      "container that Prometheus scrapes (compose sets it; it publishes no metrics port).")
    multiproc_dir: Path | None = Field(
        None, description="PROMETHEUS_MULTIPROC_DIR for forked rq work-horses; None = a temporary folder that the "
        "worker pool removes when it stops."
    )
