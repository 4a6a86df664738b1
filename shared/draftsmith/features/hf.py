"""The ``hf`` extraction backend: the target in transformers (CPU or GPU), batched by length.

Forward hooks on the three aux decoder layers capture their outputs; the base model (``model.model``, no
``lm_head``) returns the last hidden state after the final norm, so no full-vocabulary logits are ever built.
Layer-id convention: :mod:`draftsmith.features.layers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.allocator import keep_freed_memory
from draftsmith.data.render import remote_code_error
from draftsmith.errors import ModelError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import read_target_config

log = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (the names used in config and manifests)."""
    return _DTYPES[name]


def target_config(path: Path) -> dict:
    """The language-model part of the target's ``config.json``
    (:func:`draftsmith.target.checkpoint.read_target_config` with ``text=True``).

    Raises:
        ModelError: the folder has no readable ``config.json``.
    """
    return read_target_config(path, text=True)


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sample indices into batches of similar length whose padded size stays under ``batch_tokens``.

    Samples are sorted longest first (ties by index, so the plan is deterministic); a batch grows while
    ``n_samples * longest <= batch_tokens``. A sample longer than ``batch_tokens`` gets a batch of its own.

    Returns:
        List of batches, each a list of indices into ``lengths``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


@dataclass
class SampleFeatures:
    """Features of one sample, on CPU in the compute dtype.

    Attributes:
        aux: ``[T, 3*H]`` outputs of the three aux layers, concatenated low|mid|high.
        final: ``[T, H]`` last layer's output after the final norm (logits = ``final @ lm_head.T``).
    """

    aux: torch.Tensor
    final: torch.Tensor


def text_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a transformers model whose layers the hooks attach to: ``model.model`` for a causal
    LM (Llama-like: ``.layers``, ``.norm``), ``model.model.language_model`` for a multimodal wrapper such as
    Kimi-K2.5's ``Kimi_K25ForConditionalGeneration`` (its vision tower is never run).

    Raises:
        ModelError: no such stack.
    """
    base = getattr(model, "model", None)
    for cand in (base, getattr(base, "language_model", None), getattr(model, "language_model", None)):
        if cand is not None and hasattr(cand, "layers") and hasattr(cand, "norm"):
            return cand
    raise ModelError(f"{type(model).__name__} exposes no decoder layers (.model.layers or "
                     ".model.language_model.layers) to capture hidden states from",
                     "use a Llama-like causal LM or a multimodal wrapper of one, or the vllm backend")


class HFExtractor:
    """Captures aux and final hidden states of a transformers causal LM.

    Args:
        model: a loaded ``*ForCausalLM`` whose base model exposes ``.layers`` and ``.norm`` (Llama-like).
        layer_ids: validated aux layer ids (output of decoder layer i).
        batch_tokens: padded-token budget of one forward pass.

    Raises:
        ModelError: the model does not expose decoder layers the hooks can attach to.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int], batch_tokens: int = 4096) -> None:
        keep_freed_memory()  # glibc: no mmap/munmap per forward pass (draftsmith.allocator)
        self.model = model.eval()
        self.base = text_decoder(model)
        self.layer_ids = tuple(layer_ids)
        self.batch_tokens = batch_tokens
        self.hidden_size = int(model.config.get_text_config().hidden_size)
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, path: Path, layer_ids: Sequence[int], device: str = "cpu", dtype: str = "float32",
             batch_tokens: int = 4096, trust_remote_code: bool = False) -> HFExtractor:
        """Load the target from a local folder (no hub access) and wrap it (``trust_remote_code``: run the model
        code the checkpoint ships).

        Raises:
            ModelError: the folder cannot be loaded by transformers, or its model is its own code and
                ``trust_remote_code`` is off.
        """
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

        try:
            cfg = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
            # a multimodal wrapper (Kimi-K2.5: Kimi_K25ForConditionalGeneration) is no causal LM to transformers;
            # its image-text-to-text class holds the language model whose hidden states are captured
            wrapped = getattr(cfg, "text_config", None) is not None and cfg.get_text_config() is not cfg
            auto = AutoModelForImageTextToText if wrapped else AutoModelForCausalLM
            model = auto.from_pretrained(str(path), dtype=torch_dtype(dtype), local_files_only=True,
                                         trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            if not trust_remote_code and "trust_remote_code" in str(e):
                raise remote_code_error(path, "model") from e
            raise ModelError(f"transformers cannot load the target at {path}: {e}", "check target.path") from e
        return cls(model.to(device), layer_ids, batch_tokens)

    @torch.no_grad()  # not inference_mode: streamed features must be usable in the trainer's autograd graph
    def forward_batch(self, seqs: Sequence[torch.Tensor]) -> list[SampleFeatures]:
        """One padded forward pass over ``seqs`` (right padding; causal attention keeps real tokens exact).

        Args:
            seqs: token ids, each ``[T_s]`` integer.

        Returns:
            One :class:`SampleFeatures` per sequence, in order, unpadded, on CPU.
        """
        lens = [int(s.numel()) for s in seqs]
        t_max = max(lens)
        ids = torch.zeros(len(seqs), t_max, dtype=torch.long)  # [B, T]
        mask = torch.zeros(len(seqs), t_max, dtype=torch.long)  # [B, T]
        for b, s in enumerate(seqs):
            ids[b, : lens[b]] = s.long()
            mask[b, : lens[b]] = 1
        captured: dict[int, torch.Tensor] = {}
        hooks = [
            self.base.layers[i].register_forward_hook(
                lambda _m, _in, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out)
            )
            for i in self.layer_ids
        ]
        try:
            out = self.base(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        final = out.last_hidden_state  # [B, T, H], after the final norm
        aux = torch.cat([captured[i] for i in self.layer_ids], dim=-1)  # [B, T, 3*H]
        return [SampleFeatures(aux[b, : lens[b]].cpu(), final[b, : lens[b]].cpu()) for b in range(len(seqs))]

    def extract(self, seqs: Sequence[torch.Tensor]) -> list[SampleFeatures]:
        """Features of every sequence, batched by length under ``batch_tokens``; results in input order.

        The batch plan depends only on the lengths, so the same samples always meet the same kernels: stored and
        streamed features of the same samples are bit-identical.
        """
        result: list[SampleFeatures | None] = [None] * len(seqs)
        for batch in plan_batches([int(s.numel()) for s in seqs], self.batch_tokens):
            for i, feats in zip(batch, self.forward_batch([seqs[i] for i in batch]), strict=True):
                result[i] = feats
        return result  # type: ignore[return-value]

    def lm_head_weight(self) -> torch.Tensor:
        """The target's output head ``[V, H]`` (to recompute logits from ``final_hidden``)."""
        return self.model.get_output_embeddings().weight
