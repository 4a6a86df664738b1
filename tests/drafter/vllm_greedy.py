"""Greedy answers of vLLM's CPU build on a target, with or without a drafter, and the spec-decode counters after.

The families' end-to-end tests serve the target alone and then with the trained drafter and compare the two token
for token: at temperature 0 a drafter must never change the target's output, only how many forward passes it takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from draftsmith.evaluation.vllm_metrics import SpecCounters
from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port


def greedy_token_ids(
    speculative: dict[str, Any] | None,
    target: Path | str,
    log: Path,
    prompts: list[str] | list[list[dict[str, str]]],
    max_tokens: int = 32,
) -> tuple[list[list[int]], SpecCounters]:
    """Serve ``target`` (float32, eager, one sequence at a time) with ``speculative`` as vLLM's
    ``--speculative-config`` (None: the target alone), ask each prompt greedily and stop the server.

    Args:
        prompts: user questions, or whole message lists.
        max_tokens: most new tokens per answer.

    Returns:
        The generated token ids per prompt, and the server's ``vllm:spec_decode_*`` counters read after the last
        answer (``has_spec`` False without a drafter).

    Raises:
        httpx.HTTPStatusError: a request the server refused.
    """
    spec = VLLMServerSpec(
        model=Path(target),
        served_name="t",
        port=free_port(),
        max_model_len=1024,
        kv_cache_gib=1,
        enforce_eager=True,
        max_num_seqs=1,
        dtype="float32",
        speculative=speculative,
    )
    ids = []
    with VLLMServer(spec, log).start(timeout_s=900) as server:
        for p in prompts:
            messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
            r = httpx.post(
                f"{server.url}/v1/chat/completions",
                timeout=600,
                json={"model": "t", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                      "return_token_ids": True},
            )
            r.raise_for_status()
            ids.append(r.json()["choices"][0]["token_ids"])
        counters = SpecCounters.from_text(httpx.get(f"{server.url}/metrics", timeout=30).text)
    return ids, counters
