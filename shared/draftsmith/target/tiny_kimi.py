"""A tiny Kimi-K2.5-layout target: the seed's own checkpoint layout, small enough to run every stage on CPU.

Kimi-K2.5 is not a plain causal LM checkpoint, and each difference is one that a stage can trip on (docs/targets.md):

- ``config.json`` is a multimodal wrapper: ``architectures`` ``KimiK25ForConditionalGeneration``, ``model_type``
  ``kimi_k25``, the language model under ``text_config`` (``model_type`` ``kimi_k2``, DeepSeek-V3's MLA + MoE) beside
  a ``vision_config``; ``preprocessor_config.json`` configures the media processor that vLLM builds at start-up.
- Weights are named ``language_model.model.*`` / ``language_model.lm_head.weight`` beside ``vision_tower.*`` and
  ``mm_projector.*`` (the final norm is ``language_model.model.norm.weight``, not ``model.norm.weight``).
- The tokenizer is the checkpoint's own Python code over ``tiktoken.model`` (no ``tokenizer.json``), loaded only with
  ``trust_remote_code``, with Kimi's special tokens (roles, ``<think>``, media and tool-call markers).

What it builds: the language model of :data:`draftsmith.target.tiny_mla.TINY_MLA` (8 layers, hidden 256, MLA with
DeepSeek-V3's 576-wide latent cache that vLLM's CPU MLA kernel requires, 4 routed experts) over a 2,048-rank
byte-level BPE trained on the bundled prompt pools, with a one-layer vision tower (random; text stages never run
it); the chat template is the Kimi-K2-Thinking layout (``templates/kimi_k25.jinja``). The language model is trained
as the tiny MLA target is (:func:`draftsmith.target.tiny_mla.train`: GSM8K questions answered with a short
reasoning, ``</think>``, ``The answer is N.``), so its greedy answers close their reasoning and end, and a drafter
has something to learn. Transformers (``Kimi_K25ForConditionalGeneration``) and vLLM load the folder natively; vLLM
serves it with ``--language-model-only`` here (text prompts only; the vision encoder's start-up profiling is left
out on CPU).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from importlib.resources import files
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.log import get_logger
from draftsmith.target import tiny_mla
from draftsmith.target.checkpoint import target_config_path

log = get_logger(__name__)

TINY_KIMI_NAME = "tiny-kimi-k25"
DONE_MARKER = tiny_mla.DONE_MARKER
TOKENIZER_CODE = "tokenization_tiny_kimi_k25.py"  # package data in draftsmith/target/templates, copied as is
TOKENIZER_CLASS = "TinyKimiK25Tokenizer"
TEMPLATE = "kimi_k25.jinja"
BPE_RANKS = 2048
# Bumped whenever the recipe changes, so a cached checkpoint from an older recipe is rebuilt.
RECIPE_VERSION = 1
# vLLM's media processor reads these at start-up (KimiK25FusedVisionProcessor); Kimi-K2.5's published values
MEDIA_PROC_CFG = {
    "patch_size": 14, "merge_kernel_size": [2, 2], "in_patch_limit": 16384, "patch_limit_on_one_side": 512,
    "fixed_output_tokens": None, "in_patch_limit_each_frame": 4096, "temporal_merge_kernel_size": 4,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
TINY_VISION = dict(patch_size=14, pos_emb_height=8, pos_emb_width=8, pos_emb_time=4, num_attention_heads=2,
                   num_hidden_layers=1, hidden_size=64, intermediate_size=128, merge_kernel_size=[2, 2])


def tiny_kimi_dir(cache_dir: Path) -> Path:
    """Folder the tiny Kimi-K2.5-layout checkpoint is written into (``<cache>/models/tiny-kimi-k25``)."""
    return Path(cache_dir).expanduser() / "models" / TINY_KIMI_NAME


def special_tokens() -> list[str]:
    """Kimi-K2.5's special tokens as the packaged tokenizer code declares them (ids follow the BPE ranks)."""
    import ast

    src = files("draftsmith.target").joinpath(f"templates/{TOKENIZER_CODE}").read_text(encoding="utf-8")
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SPECIAL_TOKENS":
            return list(ast.literal_eval(node.value))
    raise ModelError(f"draftsmith/target/templates/{TOKENIZER_CODE} declares no SPECIAL_TOKENS",
                     "restore the packaged file")


def build_tokenizer(out: Path, prompts_dir: Path):
    """Train a byte-level BPE on the prompt pools and write it in Kimi's layout: ``tiktoken.model`` (one
    ``base64(bytes) rank`` per line, ranks in merge order), the tokenizer's code, ``tokenizer_config.json`` (with
    ``auto_map`` and the special tokens after the ranks) and ``chat_template.jinja``.

    The BPE is trained with ``tokenizers`` on the pre-tokenizer that the tiktoken pattern of the code file splits
    by, so tiktoken's rank-ordered merges reproduce it.

    Returns:
        The tokenizer, loaded through its own code (``trust_remote_code``).

    Raises:
        ModelError: no prompt pool in ``prompts_dir``.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pools = sorted(Path(prompts_dir).glob("*.jsonl"))
    if not pools:
        raise ModelError(f"no prompt pool (*.jsonl) in {prompts_dir}", "set prompts_dir (DRAFTSMITH_PROMPTS_DIR) "
                         "to the checkout's data/prompts")
    code = files("draftsmith.target").joinpath(f"templates/{TOKENIZER_CODE}").read_text(encoding="utf-8")
    pattern = next(line.split('r"""', 1)[1].rsplit('"""', 1)[0] for line in code.splitlines()
                   if line.startswith("PATTERN = "))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=BPE_RANKS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [line for f in pools for line in f.read_text().splitlines()]
    tok.train_from_iterator(corpus, trainer)
    unbyte = {c: b for b, c in bytes_to_unicode().items()}
    vocab = sorted((i, t) for t, i in tok.get_vocab().items())
    lines = [base64.b64encode(bytes(unbyte[c] for c in t)).decode() + f" {rank}" for rank, (_, t) in enumerate(vocab)]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")
    (out / TOKENIZER_CODE).write_text(code)
    specials = special_tokens()
    added = {str(len(vocab) + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": True} for i, t in enumerate(specials)}
    cfg = {"tokenizer_class": TOKENIZER_CLASS, "added_tokens_decoder": added,
           "auto_map": {"AutoTokenizer": [f"{TOKENIZER_CODE[:-3]}.{TOKENIZER_CLASS}", None]},
           "bos_token": "[BOS]", "eos_token": "<|im_end|>", "pad_token": "[EOS]", "unk_token": None,
           "model_max_length": tiny_mla.TINY_MLA["max_position_embeddings"]}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(
        files("draftsmith.target").joinpath(f"templates/{TEMPLATE}").read_text(encoding="utf-8"))
    return AutoTokenizer.from_pretrained(out, trust_remote_code=True)


def _hub_names(state: dict) -> dict:
    """Kimi-K2.5's published weight names for a saved ``DeepseekV3ForCausalLM`` state dict (its language model):
    ``model.X`` -> ``language_model.model.X``, ``lm_head.weight`` -> ``language_model.lm_head.weight``."""
    return {("language_model." + k): v.contiguous() for k, v in state.items()}


def make_tiny_kimi(cache_dir: Path, prompts_dir: Path, steps: int = 200, examples: int = 32, force: bool = False,
                   seed: int = 0) -> Path:
    """Write the tiny Kimi-K2.5-layout checkpoint (idempotent: a current one is kept unless ``force``).

    The folder is written under a temporary name and renamed, so an interrupted run leaves no half checkpoint.

    Args:
        cache_dir: cache root (``target.cache_dir``); the folder is :func:`tiny_kimi_dir`.
        prompts_dir: the bundled prompt pools: the tokenizer is trained on all of them, the language model on the
            first ``examples`` GSM8K rows.
        steps: training steps of the language model (0 = random weights, for tests of shapes only).
        examples: GSM8K train rows to train on.
        force: rebuild even if a current checkpoint exists.
        seed: seed of the weights and of the batch order.

    Returns:
        The checkpoint folder (config.json, model.safetensors with its index, preprocessor_config.json,
        generation_config.json, tiktoken.model, the tokenizer's code and config, chat_template.jinja).

    Raises:
        ModelError: the prompt pools are missing, or the written folder does not load back whole.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        GenerationConfig,
        Kimi_K25Config,
        Kimi_K25ForConditionalGeneration,
    )
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    out = tiny_kimi_dir(cache_dir)
    # one build at a time per cache: a second process waits, then finds the checkpoint current
    with tiny_mla.build_lock(out):
        if tiny_mla.is_current(out, steps=steps, examples=examples, seed=seed, kimi_recipe=RECIPE_VERSION) and not force:
            log.info("tiny Kimi-K2.5-layout target already built at %s", out)
            return out
        t0 = time.time()
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            tok = build_tokenizer(tmp, prompts_dir)
            ids = {t: tok.convert_tokens_to_ids(t) for t in ("[BOS]", "<|im_end|>", "[EOS]", "<|media_pad|>",
                                                              "<|media_begin|>", "<|media_end|>")}
            torch.manual_seed(seed)
            text = DeepseekV3Config(**{**tiny_mla.TINY_MLA, "vocab_size": len(tok)}, bos_token_id=ids["[BOS]"],
                                    eos_token_id=ids["<|im_end|>"], pad_token_id=ids["[EOS]"])
            lm = DeepseekV3ForCausalLM(text).float()
            loss = None
            if steps > 0:
                batch_ids, masks = tiny_mla.training_batches(tok, tiny_mla.gsm8k_examples(prompts_dir, examples))
                loss = tiny_mla.train(lm, batch_ids, masks, steps, seed=seed)
            text_cfg = {**lm.config.to_dict(), "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}
            cfg = Kimi_K25Config(text_config=text_cfg, vision_config=TINY_VISION, projection_hidden_size=64,
                                 image_token_id=ids["<|media_pad|>"], video_token_id=ids["<|media_pad|>"],
                                 vision_start_token_id=ids["<|media_begin|>"], vision_end_token_id=ids["<|media_end|>"],
                                 tie_word_embeddings=False)
            # published names on both sides, from transformers' own save mappings (which unfuse the MoE experts into
            # experts.N.*_proj as vLLM's loader reads them): the language model saved alone, then prefixed; the vision
            # tower and projector from a scratch save of the whole wrapper
            from safetensors.torch import load_file

            scratch = tmp / "scratch"
            lm.save_pretrained(scratch / "lm")
            Kimi_K25ForConditionalGeneration(cfg).float().save_pretrained(scratch / "kimi")
            state = _hub_names(load_file(str(scratch / "lm" / SAFE_WEIGHTS_NAME)))
            state.update({k.removeprefix("model."): v for k, v in load_file(str(scratch / "kimi" / SAFE_WEIGHTS_NAME))
                          .items() if k.removeprefix("model.").startswith(("vision_tower.", "mm_projector."))})
            shutil.rmtree(scratch)
            save_file(state, str(tmp / SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
            size = sum(v.numel() * v.element_size() for v in state.values())
            index = {"metadata": {"total_size": size}, "weight_map": {k: SAFE_WEIGHTS_NAME for k in sorted(state)}}
            (tmp / SAFE_WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
            config = cfg.to_dict()
            # the published config names vLLM's class (transformers' own is Kimi_K25ForConditionalGeneration)
            config["architectures"] = ["KimiK25ForConditionalGeneration"]
            config["text_config"]["model_type"] = "kimi_k2"
            # the published config's name for the media token, which vLLM's EAGLE-3 proposer reads from a Kimi-K2.5
            # target (transformers' Kimi_K25Config calls it image_token_id)
            config["media_placeholder_token_id"] = ids["<|media_pad|>"]
            target_config_path(tmp).write_text(json.dumps(config, indent=2) + "\n")
            GenerationConfig(bos_token_id=ids["[BOS]"], eos_token_id=ids["<|im_end|>"],
                             pad_token_id=ids["[EOS]"]).save_pretrained(tmp)
            (tmp / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=2) + "\n")
            _check_loads(tmp)
            digest = hashlib.sha256((tmp / SAFE_WEIGHTS_NAME).read_bytes()).hexdigest()
            marker = {"recipe_version": tiny_mla.RECIPE_VERSION, "kimi_recipe": RECIPE_VERSION, "weights_sha256": digest,
                      "steps": steps, "examples": examples, "seed": seed, "final_train_loss": loss,
                      "built_in_s": round(time.time() - t0, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            (tmp / DONE_MARKER).write_text(json.dumps(marker, indent=2))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        log.info("tiny Kimi-K2.5-layout target built at %s in %.0f s (loss %s)", out, time.time() - t0, loss)
        return out


def _check_loads(folder: Path) -> None:
    """Load ``folder`` with transformers (published names mapped by its conversion) and fail on any missing or
    unexpected weight.

    Raises:
        ModelError: a weight the model has is not in the file, or the reverse.
    """
    from transformers import AutoModelForImageTextToText

    _, info = AutoModelForImageTextToText.from_pretrained(folder, output_loading_info=True)
    bad = {k: sorted(v)[:5] for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys")}
    if bad:
        raise ModelError(f"the tiny Kimi-K2.5-layout checkpoint does not load back whole: {bad}",
                         "transformers' Kimi-K2.5 weight names changed; update draftsmith.target.tiny_kimi")
