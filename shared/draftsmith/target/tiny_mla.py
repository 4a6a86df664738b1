"""A tiny DeepSeek-V3-architecture target (MLA + MoE) with thinking tokens, built on CPU in minutes.

The seed's target family (Kimi-K2.5, DeepSeek-V3) differs from the embedded SmolLM2 (Llama) in ways every stage
meets: multi-head latent attention (MLA: q/kv LoRA ranks, separate rope and nope head dims), mixture-of-experts
layers after a dense first layer, a chat template with ``<think>`` reasoning, and a config whose ``head_dim`` is the
rope part only. This module writes such a checkpoint so the whole pipeline runs on it here (docs/mla.md).

What it builds (``TINY_MLA`` below):

- ``DeepseekV3ForCausalLM``: 8 layers, hidden 256, 4 heads; MLA with ``q_lora_rank`` 128, ``kv_lora_rank`` 512,
  ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` 32, ``v_head_dim`` 32; layer 0 dense, layers 1-7 MoE with 4 routed
  experts (2 per token) plus 1 shared expert. ``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 64 are DeepSeek-V3's own
  values and are required: vLLM's CPU MLA decode kernel only supports a 576-wide latent cache (512 + 64)
  (``vllm/v1/attention/backends/mla/cpu_mla.py``).
- Tokenizer: a byte-level BPE (2,048 entries) trained with ``tokenizers`` on the bundled prompt files, with the
  special tokens and chat template of the DeepSeek-V3.1 fixture (``tests/fixtures/templates/deepseek``). The one
  change to the template: thinking is on unless ``thinking=false`` is passed, as in DeepSeek-R1 / Kimi-K2-Thinking,
  so a plain chat request gets reasoning in ``<think>``...``</think>``.
- Weights: not random. A short supervised training (``steps`` AdamW steps on one CPU thread, about a second per
  step here) on the first GSM8K train questions, each answered with a short reasoning (the first step of its
  worked solution), ``</think>``, ``The answer is N.`` and end-of-sentence. The demo regenerates those same
  questions, so the target's greedy outputs there are that text, closed and ended; on other GSM8K questions they
  are GSM8K-like steps that also close and end (docs/mla.md, Measured). A drafter can learn them (acceptance then
  means something). It is not a distillation of SmolLM2 (a different tokenizer; running SmolLM2 on every prompt
  would cost minutes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

TINY_MLA_NAME = "tiny-mla-deepseek-v3"
DONE_MARKER = "draftsmith-prepared.json"
# DeepSeek-V3.1's chat template, package data (the same file as tests/fixtures/templates/deepseek/, checked by a test)
TEMPLATE = "templates/deepseek_v3.jinja"
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
THINK_TOKENS = ("<think>", "</think>")
SPECIALS = [BOS, EOS, "<｜User｜>", "<｜Assistant｜>", *THINK_TOKENS]
VOCAB_SIZE = 2048
# Bumped whenever the recipe changes, so a cached checkpoint from an older recipe is rebuilt.
RECIPE_VERSION = 2

TINY_MLA = dict(
    vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=True,
    max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    num_nextn_predict_layers=0,
    # DeepSeek-V3's router: sigmoid scores with a correction bias (vLLM creates the bias only for "noaux_tc")
    topk_method="noaux_tc", scoring_func="sigmoid",
)

_CALC = re.compile(r"<<[^>]*>>")


def tiny_mla_dir(cache_dir: Path) -> Path:
    """Folder the tiny MLA checkpoint is written into (``<cache>/models/tiny-mla-deepseek-v3``)."""
    return Path(cache_dir).expanduser() / "models" / TINY_MLA_NAME


@contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the folder that holds ``out`` (the cache's ``models``) while a tiny target is
    built, so that two processes building into the same cache (two test workers, a demo beside a test) do not write
    the same ``.tmp`` folder at once: the second waits, then finds the checkpoint current. The lock is on the
    folder itself, so nothing is left behind, and the kernel drops it if the holder dies.

    Raises:
        OSError: the folder cannot be created or opened.
    """
    parent = Path(out).parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is building a tiny target in %s: waiting for it", parent)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def is_current(path: Path, **recipe) -> bool:
    """True when ``path`` holds a complete checkpoint of the current recipe (and of ``recipe``'s values)."""
    f = Path(path) / DONE_MARKER
    if not f.is_file():
        return False
    try:
        marker = json.loads(f.read_text())
    except json.JSONDecodeError:
        return False
    return marker.get("recipe_version") == RECIPE_VERSION and all(marker.get(k) == v for k, v in recipe.items())


def gsm8k_examples(prompts_dir: Path, limit: int, reasoning_steps: int | None = 1) -> list[tuple[str, str, str]]:
    """(question, reasoning, answer) triples of the first ``limit`` rows of ``<prompts_dir>/gsm8k_train.jsonl``.

    The reasoning is the first ``reasoning_steps`` lines (one calculation step each) of the worked solution, joined
    by spaces, without their ``<<calc>>`` annotations (``None`` = the whole solution); the answer is
    ``The answer is N.``. One step keeps the target's reasoning short enough that a briefly trained target learns to
    close it (the whole solution left it looping in digits: docs/mla.md, Measured).

    Raises:
        ModelError: the bundled prompt file is missing.
    """
    path = Path(prompts_dir) / "gsm8k_train.jsonl"
    if not path.is_file():
        raise ModelError(f"{path} is missing", "set prompts_dir (DRAFTSMITH_PROMPTS_DIR) to the checkout's "
                         "data/prompts, or run from the checkout's root")
    out = []
    for line in path.read_text().splitlines()[:limit]:
        row = json.loads(line)
        work, _, final = row["answer"].rpartition("####")
        lines = [_CALC.sub("", ln).strip() for ln in work.strip().splitlines() if ln.strip()]
        out.append((row["question"].strip(), " ".join(lines[:reasoning_steps]), f"The answer is {final.strip()}."))
    return out


def chat_template() -> str:
    """The DeepSeek fixture's chat template with thinking on by default (off only with ``thinking=false``)."""
    from importlib.resources import files

    src = files("draftsmith.target").joinpath(TEMPLATE).read_text(encoding="utf-8")
    old = "{%- if thinking is defined and thinking %}{{- '<think>' }}{%- else %}{{- '</think>' }}{%- endif %}"
    new = "{%- if thinking is defined and not thinking %}{{- '</think>' }}{%- else %}{{- '<think>' }}{%- endif %}"
    if old not in src:
        raise ModelError(f"draftsmith/target/{TEMPLATE} changed", "update draftsmith.target.tiny_mla")
    return src.replace(old, new)


def build_tokenizer(out: Path, prompts_dir: Path):
    """Train the byte-level BPE and write ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``.

    The pre-tokenizer splits like Qwen2/Llama-3 (as the fixture tokenizers do); specials are the DeepSeek ones.

    Returns:
        The loaded ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = []
    pools = sorted(Path(prompts_dir).glob("*.jsonl"))
    if not pools:
        raise ModelError(f"no prompt pool (*.jsonl) in {prompts_dir}", "set prompts_dir (DRAFTSMITH_PROMPTS_DIR) "
                         "to the checkout's data/prompts")
    for f in pools:
        corpus += f.read_text().splitlines()
    tok.train_from_iterator(corpus, trainer)
    if tok.get_vocab_size() > VOCAB_SIZE:
        raise ModelError(f"tokenizer has {tok.get_vocab_size()} entries, more than {VOCAB_SIZE}")
    tok.save(str(out / "tokenizer.json"))
    # <think> / </think> are added tokens but not special ones, as in DeepSeek-R1's and DeepSeek-V3.1's released
    # tokenizers: a server decodes with skip_special_tokens, and vLLM's deepseek_r1 reasoning parser splits the
    # reasoning from the answer on the text "</think>"; as special tokens they vanished from the text and the whole
    # output landed in the reasoning (build-data then rendered a </think> the text did not have).
    spec = json.loads((out / "tokenizer.json").read_text())
    for t in spec["added_tokens"]:
        if t["content"] in THINK_TOKENS:
            t["special"] = False
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
           "model_max_length": TINY_MLA["max_position_embeddings"], "add_bos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(chat_template())
    return AutoTokenizer.from_pretrained(out)


def training_batches(tok, examples: list[tuple[str, str, str]], max_len: int = 256):
    """Token ids and loss masks (assistant span only) of the rendered examples; longer ones are left out.

    Returns:
        ``(ids, mask)``: lists of equal-length lists; ``mask[i][t]`` is 1 where token ``t`` is assistant output.
    """
    ids, masks = [], []
    for q, r, a in examples:
        user = [{"role": "user", "content": q}]
        prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(user + [{"role": "assistant", "content": a, "reasoning_content": r}],
                                       tokenize=False, thinking=True)
        if not full.startswith(prompt):
            raise ModelError("the tiny MLA chat template renders the prompt differently in the full conversation")
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        f = tok(full, add_special_tokens=False)["input_ids"]
        if len(f) > max_len:
            continue
        ids.append(f)
        masks.append([0] * len(p) + [1] * (len(f) - len(p)))
    return ids, masks


def train(model, ids, masks, steps: int, batch_size: int = 8, lr: float = 2e-3, seed: int = 0,
          threads: int = 1) -> float:
    """Supervised next-token training of ``model`` on the assistant spans (AdamW, one-cycle schedule).

    Runs on ``threads`` torch threads (restored afterwards). One is the default on purpose: the model is so small
    that a step is a few dozen small matrix products, and with two threads on a shared 2-core machine every one of
    them waits for the other core; measured here (docs/mla.md) the forward pass of a 6 x 192-token batch took 6 s
    with 2 threads under load and 0.4 s with 1, and a quiet machine gains less than 2x from the second thread.

    Args:
        model: a transformers causal LM (fp32, CPU).
        ids, masks: from :func:`training_batches`.
        steps: optimizer steps.
        batch_size: sequences per step (drawn with replacement).
        lr: peak learning rate.
        seed: seed of the batch order.
        threads: torch intra-op threads while training.

    Returns:
        The mean loss of the last 10 steps (nats per token).
    """
    import torch

    if not ids:
        raise ModelError("no training example fits the tiny MLA target's max_len")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    pad = model.config.eos_token_id or 0
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    model.train()
    losses = []
    t0 = time.time()
    try:
        for step in range(steps):
            pick = torch.randint(len(ids), (batch_size,), generator=g).tolist()
            n = max(len(ids[i]) for i in pick)
            x = torch.full((batch_size, n), pad, dtype=torch.long)
            y = torch.full((batch_size, n), -100, dtype=torch.long)
            for row, i in enumerate(pick):
                t = torch.tensor(ids[i])
                m = torch.tensor(masks[i], dtype=torch.bool)
                x[row, : len(t)] = t
                y[row, : len(t)] = torch.where(m, t, torch.full_like(t, -100))
            loss = model(input_ids=x, labels=y).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if step % 20 == 0 or step == steps - 1:
                log.info("tiny MLA training step %d/%d loss %.3f (%.2f s/step)", step + 1, steps, losses[-1],
                         (time.time() - t0) / (step + 1))
    finally:
        torch.set_num_threads(threads_before)
        model.eval()
    tail = losses[-10:]
    return sum(tail) / len(tail)


def make_tiny_mla(cache_dir: Path, prompts_dir: Path, steps: int = 200, examples: int = 32, force: bool = False,
                  seed: int = 0) -> Path:
    """Write the tiny DeepSeek-V3 checkpoint (idempotent: a current one is kept unless ``force``).

    The folder is written under a temporary name and renamed, so an interrupted run leaves no half checkpoint.

    Args:
        cache_dir: cache root (``target.cache_dir``); the folder is :func:`tiny_mla_dir`.
        prompts_dir: the bundled prompt pools (``prompts_dir``): the tokenizer is trained on all of them, the
            weights on the first ``examples`` GSM8K rows.
        steps: training steps (0 = random weights, for tests of shapes only).
        examples: GSM8K train rows to train on (the first ones: the demo regenerates the first 32).
        force: rebuild even if a current checkpoint exists.
        seed: seed of the weights and of the batch order.

    Returns:
        The checkpoint folder (config.json, model.safetensors, tokenizer files, chat_template.jinja).

    Raises:
        ModelError: the prompt pools are missing, or the packaged template changed.
    """
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.utils import SAFE_WEIGHTS_NAME

    out = tiny_mla_dir(cache_dir)
    # one build at a time per cache: a second process waits, then finds the checkpoint current
    with build_lock(out):
        if is_current(out, steps=steps, examples=examples, seed=seed) and not force:
            log.info("tiny MLA target already built at %s", out)
            return out
        t0 = time.time()
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            tok = build_tokenizer(tmp, prompts_dir)
            torch.manual_seed(seed)
            cfg = DeepseekV3Config(**TINY_MLA, bos_token_id=tok.convert_tokens_to_ids(BOS),
                                   eos_token_id=tok.convert_tokens_to_ids(EOS), pad_token_id=tok.convert_tokens_to_ids(EOS))
            model = DeepseekV3ForCausalLM(cfg).float()
            loss = None
            if steps > 0:
                ids, masks = training_batches(tok, gsm8k_examples(prompts_dir, examples))
                loss = train(model, ids, masks, steps, seed=seed)
            model.config.architectures = ["DeepseekV3ForCausalLM"]
            model.save_pretrained(tmp)
            digest = hashlib.sha256((tmp / SAFE_WEIGHTS_NAME).read_bytes()).hexdigest()
            # weights_sha256 is the target revision that features are pinned to (draftsmith.features.plan)
            marker = {"recipe_version": RECIPE_VERSION, "weights_sha256": digest, "steps": steps, "examples": examples, "seed": seed,
                      "final_train_loss": loss, "built_in_s": round(time.time() - t0, 1),
                      "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            (tmp / DONE_MARKER).write_text(json.dumps(marker, indent=2))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        log.info("tiny MLA target built at %s in %.0f s (loss %s)", out, time.time() - t0, loss)
        return out
