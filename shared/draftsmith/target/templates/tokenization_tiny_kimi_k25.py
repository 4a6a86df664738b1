"""The tokenizer of draftsmith's tiny Kimi-K2.5-layout target, shipped as the checkpoint's own code.

Kimi-K2 and K2.5 ship their tokenizer as Python (``tokenization_kimi.py`` over ``tiktoken.model``, no
``tokenizer.json``), so transformers, vLLM and SGLang load it only with ``trust_remote_code``. This file plays that
part for the tiny target (``draftsmith.target.tiny_kimi`` copies it into the checkpoint folder): byte-level BPE
ranks in ``tiktoken.model``, then Kimi-K2.5's special tokens (chat roles, thinking, media and tool-call markers) in
the order of ``SPECIAL_TOKENS``.

Tokens are byte strings; a token's text form is its bytes read as latin-1 (one character per byte), so every token
has a unique string.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

SPECIAL_TOKENS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<think>", "</think>",
    "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>",
]
# Kimi-K2's split pattern, shortened: letters, digits one by one, punctuation runs, newlines, spaces
PATTERN = r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


class TinyKimiK25Tokenizer(PreTrainedTokenizer):
    """Byte-level BPE over ``tiktoken.model`` with Kimi-K2.5's special tokens after the ranks."""

    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, **kwargs) -> None:
        self.vocab_file = vocab_file
        self.ranks = load_tiktoken_bpe(vocab_file)
        self.special_ids = {t: len(self.ranks) + i for i, t in enumerate(SPECIAL_TOKENS)}
        self.model = tiktoken.Encoding(name="tiny-kimi-k25", pat_str=PATTERN, mergeable_ranks=self.ranks,
                                       special_tokens=self.special_ids)
        self.id_to_token = {i: b.decode("latin-1") for b, i in self.ranks.items()}
        self.id_to_token.update({i: t for t, i in self.special_ids.items()})
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.ranks) + len(SPECIAL_TOKENS)

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in self.id_to_token.items()}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self.id_to_token[i] for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        if token in self.special_ids:
            return self.special_ids[token]
        try:
            return self.ranks[token.encode("latin-1")]
        except (KeyError, UnicodeEncodeError):
            return self.unk_token_id if self.unk_token_id is not None else -1

    def _convert_id_to_token(self, index: int) -> str:
        return self.id_to_token[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = b"".join(t.encode() if t in self.special_ids else t.encode("latin-1") for t in tokens)
        return out.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        out = Path(save_directory) / ((filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if Path(self.vocab_file).resolve() != out.resolve():
            shutil.copyfile(self.vocab_file, out)
        return (str(out),)
