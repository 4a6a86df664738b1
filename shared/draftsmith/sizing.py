"""``draftsmith plan``: a whole job sized for a host before any GPU is used.

From the target's folder (``config.json``, tokenizer files, the weight index; no weights are read) and the host
(GPUs, memory per GPU, free disk under ``runs_dir``) it works out what each stage needs and says, one line per
problem, what would stop the job: the engine flags (:mod:`draftsmith.target.profile`), the GPU split, the context
every request needs, the drafter's size and the longest micro-batch that trains on one GPU, and the feature store's
bytes. The arithmetic and its sources are in docs/targets.md ("Planning a job").
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.artifacts.export import WEIGHTS_INDEX_FILE
from draftsmith.artifacts.storage import free_gb
from draftsmith.config import Settings
from draftsmith.data.render import tokenizer_files
from draftsmith.drafter.config import derive_config, is_mla
from draftsmith.errors import DraftsmithError
from draftsmith.target.checkpoint import read_target_config, target_config_path, weights_bytes
from draftsmith.target.profile import target_profile

GB = 1e9
# Share of a GPU's memory a stage may plan for (the engines' own default utilisation is 0.9).
USABLE = 0.9
# Training state per trainable parameter: float32 weight, gradient and AdamW's two moments.
TRAIN_BYTES_PER_PARAM = 16
# Activations per token of a micro-batch, float32, measured for the Llama-3.1-8B drafter shape (hidden 4096) by
# bench/ttt_memory.py (docs/training.md), scaled by hidden size; bf16 autocast on a GPU roughly halves it.
ACT_BYTES_PER_TOKEN_4096 = 1.37e6
FEATURE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The trainer also holds the target's token embedding (frozen, in the drafter) and its output head (the target's
# distribution), both float32 (drafter/vocab.py load_target_head), and, under DDP, gradient buckets: a float32
# copy of every trainable gradient (torch's DistributedDataParallel).
FROZEN_BYTES_PER_PARAM = 4
DDP_BYTES_PER_PARAM = 4
# KV cache entries in bf16 (the engines' default for a bf16 or INT4-weight target)
KV_BYTES = 2


@dataclass
class Host:
    """The machine a job is planned for: GPUs, memory per GPU (GB) and free disk under ``runs_dir`` (GB)."""

    gpus: int
    gpu_memory_gb: float
    disk_free_gb: float


def detect_host(runs_dir: Path) -> Host:
    """This machine: GPUs and their memory from ``nvidia-smi`` (none found: 0), free disk of ``runs_dir`` (or of
    its nearest existing parent)."""
    gpus, mem = 0, 0.0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
        gpus, mem = len(out), min(float(x) for x in out) / 1024 if out else 0.0  # MiB -> GiB, the smallest GPU
    except (OSError, subprocess.SubprocessError, ValueError):
        pass

    return Host(gpus, mem, free_gb(runs_dir))  # GB; infinite on an object store: no local disk to fill


@dataclass
class Job:
    """The regeneration job: prompts, their mean length and the mean answer length (tokens)."""

    prompts: int
    prompt_tokens: int
    answer_tokens: int


@dataclass
class JobPlan:
    """What :func:`plan_job` found: ``lines`` to print (the plan) and ``problems`` (each one line with its fix)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def drafter_parameters(cfg) -> tuple[int, int]:
    """``(all, trainable)`` parameters of the drafter ``cfg`` describes, counted on the meta device (no memory);
    the embedding is the target's and frozen."""
    import torch

    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter

    with torch.device("meta"):
        model = Eagle3Drafter(cfg)
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.embed_tokens.weight.numel()


def plan_job(s: Settings, target: Path, host: Host, job: Job) -> JobPlan:
    """Size ``job`` on ``host`` for the target folder ``target`` with settings ``s``: the target, its tokenizer and
    code, the GPU split, the context, the drafter's memory and the feature store, one line each, and one problem
    line per thing found that would stop the job.

    Returns:
        A :class:`JobPlan`; an empty ``problems`` means nothing found would stop the job.
    """
    out = JobPlan()
    if not target_config_path(target).is_file():
        out.problems.append(f"{target} has no {target_config_path(target).name} -> point target.path at the "
                            "target's checkpoint folder")
        return out
    prof = target_profile(target)
    text = (cfg := read_target_config(target)).get("text_config") or cfg
    hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
    out.lines.append(f"target {target.name}: {prof.family or prof.model_type}, hidden {hidden}, {layers} layers, "
                     f"vocabulary {vocab}{', MLA' if is_mla(text) else ''}")
    _plan_code(s, target, prof, out)
    usable = _plan_gpus(target, host, out)
    _plan_context(s, job, out)
    _plan_kv(s, target, text, host, usable, job, out)
    dcfg = _plan_drafter(s, target, host, vocab, usable, out)
    if dcfg is not None:
        _plan_features(s, host, job, dcfg.layer_ids, hidden, out)
    return out


def _plan_code(s: Settings, target: Path, prof, out: JobPlan) -> None:
    """The tokenizer files, the target's own code, each engine's flags."""
    if not tokenizer_files(target) and not (target / "tokenizer_config.json").is_file():
        out.problems.append(f"{target} has no tokenizer files (tokenizer.json, tiktoken.model, ...) -> download the "
                            "whole checkpoint folder")
    if prof.trust_remote_code and not s.target.trust_remote_code:
        out.problems.append(f"the target ships its own code ({', '.join(prof.remote_code_files) or 'auto_map'}) -> "
                            "read it, then set TRUST_REMOTE_CODE=1 in .env (target.trust_remote_code=true)")
    for engine in ("vllm", "sglang"):
        out.lines.append(f"{engine} flags: {' '.join(prof.engine_args(engine)) or '(none)'}")


def _plan_gpus(target: Path, host: Host, out: JobPlan) -> float:
    """The weights over the GPUs (the engine and the extractor split the target over every GPU); returns the usable
    GB of one GPU."""
    wb = weights_bytes(target)
    usable = host.gpu_memory_gb * USABLE
    if host.gpus < 1:
        out.problems.append("no GPU found (nvidia-smi) -> run on the GPU host, or pass --gpus and --gpu-memory-gb to "
                            "plan for it")
    if wb is None:
        out.problems.append(f"{target} has no weight index ({WEIGHTS_INDEX_FILE}) and no *.safetensors -> download "
                            "the weights")
    elif host.gpus:
        per_gpu = wb / GB / host.gpus
        out.lines.append(f"weights {wb / GB:.0f} GB: {per_gpu:.1f} GB per GPU at tensor parallel {host.gpus} "
                         f"(TENSOR_PARALLEL_SIZE={host.gpus}, EXTRACT_GPUS={host.gpus}); {usable - per_gpu:.1f} GB "
                         "left per GPU for the KV cache")
        if per_gpu > usable:
            out.problems.append(f"the weights need {per_gpu:.0f} GB per GPU over {host.gpus} GPUs of "
                                f"{host.gpu_memory_gb:.0f} GB -> more GPUs, or a quantized checkpoint")
    return usable


def _plan_context(s: Settings, job: Job, out: JobPlan) -> None:
    """The context every request needs against ``target.max_model_len``; a mean sample against
    ``data.max_length``."""
    need = job.prompt_tokens + s.generation.max_tokens
    out.lines.append(f"context: prompt {job.prompt_tokens} + generation.max_tokens {s.generation.max_tokens} = "
                     f"{need} tokens; target.max_model_len {s.target.max_model_len} (MAX_MODEL_LEN)")
    if s.target.max_model_len < need:
        out.problems.append(f"MAX_MODEL_LEN {s.target.max_model_len} < {need} (prompt + generation.max_tokens) -> "
                            f"raise MAX_MODEL_LEN to at least {need}, or lower generation.max_tokens")
    sample = job.prompt_tokens + job.answer_tokens
    if s.data.max_length < sample:
        out.problems.append(f"data.max_length {s.data.max_length} < a mean sample of {sample} tokens: most samples "
                            f"would be cut ({s.data.too_long}) -> set data.max_length to at least {sample}")


def kv_bytes_per_token(text: dict, tp: int) -> tuple[int, str]:
    """Bytes of KV cache one token takes on one GPU at tensor parallel ``tp``, and how it was counted. MLA
    (DeepSeek-V3, Kimi-K2) caches one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, whole on every GPU
    (vLLM and SGLang replicate it under tensor parallelism); other attention caches a key and a value per KV head,
    the heads split over the GPUs."""
    layers = int(text["num_hidden_layers"])
    if is_mla(text):
        width = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
        return width * layers * KV_BYTES, f"MLA latent {width} x {layers} layers, on every GPU"
    heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
    per_gpu = -(-heads // max(tp, 1))
    return 2 * per_gpu * head_dim * layers * KV_BYTES, f"K and V of {per_gpu} of {heads} KV heads x {layers} layers"


def _plan_kv(s: Settings, target: Path, text: dict, host: Host, usable: float, job: Job, out: JobPlan) -> None:
    """How many sequences the KV cache holds at the planned lengths (what the GPUs keep after the weights), against
    ``generation.concurrency``."""
    wb = weights_bytes(target)
    if not host.gpus or wb is None:
        return
    room = usable - wb / GB / host.gpus  # GB per GPU
    per_token, how = kv_bytes_per_token(text, host.gpus)
    tokens = max(room, 0.0) * GB / per_token
    mean_len = job.prompt_tokens + job.answer_tokens
    longest = job.prompt_tokens + s.generation.max_tokens
    fits, fits_longest = int(tokens // mean_len), int(tokens // longest)
    c = s.generation.concurrency
    out.lines.append(f"KV cache: {per_token / 1e3:.1f} KB per token ({how}, bf16); {max(room, 0):.1f} GB per GPU hold "
                     f"{int(tokens):,} tokens: {fits} sequences of {mean_len} (prompt + mean answer), {fits_longest} of "
                     f"{longest} (prompt + generation.max_tokens); generation.concurrency {c}")
    if fits_longest < 1:
        out.problems.append(f"one request of {longest} tokens (prompt + generation.max_tokens) does not fit the KV "
                            f"cache ({int(tokens):,} tokens per GPU) -> more GPUs, or a lower generation.max_tokens")
    elif c > fits:
        out.problems.append(f"generation.concurrency {c} is over the {fits} sequences of {mean_len} tokens the KV cache "
                            "holds: the engine queues the rest and preempts running ones when answers grow -> set "
                            f"GENERATOR_CONCURRENCY={max(fits, 1)} in .env (generation.concurrency; more GPUs per "
                            "replica hold more)")


def _plan_drafter(s: Settings, target: Path, host: Host, vocab: int, usable: float, out: JobPlan):
    """The drafter's size and training memory (one drafter per GPU): the longest micro-batch that fits; returns
    its config, or None when none can be derived (a problem line says why)."""
    n_draft = s.train.draft_vocab_size or s.data.draft_vocab_size
    try:
        dcfg = derive_config(target, min(n_draft, vocab), s.train.layer_ids or s.extract.layers,
                             s.train.num_layers)
    except DraftsmithError as e:
        out.problems.append(str(e))
        return None
    total, trainable = drafter_parameters(dcfg)
    cfg = read_target_config(target)
    tied = bool(cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings", False)))
    state = trainable * TRAIN_BYTES_PER_PARAM / GB
    # the frozen embedding is in the drafter (total - trainable); the target's head is its own tensor unless tied
    frozen = ((total - trainable) + (0 if tied else vocab * dcfg.target_hidden_size)) * FROZEN_BYTES_PER_PARAM / GB
    ddp = trainable * DDP_BYTES_PER_PARAM / GB if host.gpus > 1 and s.train.parallel == "ddp" else 0.0
    fixed = state + frozen + ddp
    act = ACT_BYTES_PER_TOKEN_4096 * dcfg.hidden_size / 4096 / (2 if host.gpus else 1) / GB  # bf16 on a GPU
    fits = int((usable - fixed) / act) if usable > fixed else 0
    out.lines.append(f"drafter: {total / 1e9:.2f} B parameters ({trainable / 1e9:.2f} B trained), draft vocabulary "
                     f"{n_draft}; {fixed:.1f} GB per GPU before activations: {state:.1f} GB of weights, gradients "
                     f"and AdamW, {frozen:.1f} GB the frozen embedding and the target's output head"
                     f"{' (tied)' if tied else ''} in float32" + (f", {ddp:.1f} GB DDP gradient buckets" if ddp else "")
                     + f"; about {act * 1e3:.2f} MB per token: the longest micro-batch on one GPU is about {fits} "
                     "tokens")
    if host.gpus and fits < s.data.max_length:
        out.problems.append(f"a {s.data.max_length}-token sample (data.max_length) does not fit one GPU (about "
                            f"{fits} tokens do) -> lower data.max_length, or a GPU with more memory")
    elif host.gpus and fits < s.train.batch_tokens:
        out.problems.append(f"train.batch_tokens {s.train.batch_tokens} is over the {fits} tokens that fit one GPU "
                            f"-> set train.batch_tokens to {max(s.data.max_length, fits // 1024 * 1024)}")
    out.lines.append(f"training: {max(host.gpus, 1)} ranks (TRAIN_GPUS), {s.train.parallel}; stop the target first")
    return dcfg


def _plan_features(s: Settings, host: Host, job: Job, ids, hidden: int, out: JobPlan) -> None:
    """The feature store's bytes (aux layers and the final one per token) against the free disk."""
    sample = job.prompt_tokens + job.answer_tokens
    per_token = (len(ids) + 1) * hidden * FEATURE_BYTES[s.extract.dtype]
    tokens = job.prompts * sample
    need_gb = tokens * per_token / GB * s.extract.disk_margin
    out.lines.append(f"feature store: {job.prompts} prompts x {sample} tokens x {per_token / 1e3:.1f} KB per token "
                     f"({len(ids)} aux layers + the final one, {s.extract.dtype}) = {tokens * per_token / GB:.0f} GB "
                     f"({need_gb:.0f} GB with extract.disk_margin); {host.disk_free_gb:.0f} GB free under "
                     f"{s.runs_dir}")
    if need_gb > host.disk_free_gb:
        out.problems.append(f"the features need {need_gb:.0f} GB, {host.disk_free_gb:.0f} GB are free under "
                            f"{s.runs_dir} -> free disk, point runs_dir at a larger disk, or extract fewer samples")
