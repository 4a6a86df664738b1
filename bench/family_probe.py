"""Which drafter families vLLM serves on this host: a randomly initialised drafter per family, served beside the
target, checked for loading, drafting and greedy output identical to the target alone.

Families (``vllm/config/speculative.py``, ``max_num_new_slots_for_drafting``):

- ``eagle3``: draftsmith's own EAGLE-3 export, chain drafting (``method: eagle3``).
- ``peagle``: the same export plus ``mask_token_id`` in ``config.json`` and a ``mask_hidden`` tensor [1, 3*H] (the
  aux-feature input of the masked slots), served with ``parallel_drafting: true`` (vLLM's ``llama_eagle3.py``
  refuses parallel drafting without ``mask_hidden``; the proposer reads the mask token from the config).
- ``dflash``: a Qwen3-shaped block drafter (``architectures: [DFlashDraftModel]``, ``model_type: qwen3``, loaded by
  ``model_executor/models/qwen3_dflash.py``) with ``dflash_config.target_layer_ids`` / ``mask_token_id``; it shares
  the target's embedding and LM head (none shipped), its ``fc`` takes the concatenated target layers [T, n*H].
- ``dspark``: the DFlash drafter plus DSpark's low-rank Markov head (``markov_head.markov_w1`` [V, r] and
  ``markov_w2`` [V, r], ``model_executor/models/qwen3_dspark.py``), ``architectures: [Qwen3DSparkModel]``.
- ``pard``: a small standalone Llama draft LM with ``pard_token`` in its config, served as ``method: draft_model``
  with ``parallel_drafting: true``.

Prints one line per family, e.g.::

    FAMILY dflash load=yes drafts=62 draft_tokens=186 accepted=0 identical=yes acceptance_rate=0.000
    FAMILY peagle load=no error="ValueError: ..."

A random drafter is (nearly) never accepted: a non-zero draft count and identical output are the evidence here.
Run under the heavy lock, it starts one vLLM server for the target alone and one per family::

    flock /tmp/draftsmith-heavy.lock .venv/bin/python bench/family_probe.py --family dflash --family peagle
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import torch

FAMILIES = ("eagle3", "peagle", "dflash", "dspark", "pard")
PROMPTS = [
    "What is the capital of France?",
    "Give three tips for staying healthy.",
    "Explain what a noun is in one sentence.",
]
MARKOV_RANK = 16  # DSpark's Markov head rank r
DRAFT_VOCAB = 64  # EAGLE-3 families: a small draft vocabulary keeps the random export tiny


def target_text_config(target: Path) -> dict:
    """The target's language-model config (``text_config`` of a multimodal wrapper, else the whole file)."""
    t = json.loads((Path(target) / "config.json").read_text())
    return t.get("text_config", t)


def mask_token_id(target: Path) -> int:
    """The token fed to masked draft slots: the target's ``unk_token_id`` (a vocabulary row chat text never uses),
    else its last id. A trained drafter learns its embedding; the random one only needs a valid id."""
    t = target_text_config(target)
    return int(t["unk_token_id"]) if t.get("unk_token_id") is not None else int(t["vocab_size"]) - 1


def eagle3_drafter(target: Path, out: Path, parallel: bool) -> Path:
    """draftsmith's EAGLE-3 export of a random drafter; with ``parallel`` the P-EAGLE additions (see module doc)."""
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    m = Eagle3Drafter(derive_config(target, DRAFT_VOCAB))
    with torch.no_grad():
        m.d2t.copy_(torch.arange(DRAFT_VOCAB) * 2)  # draft i -> target 3 * i (vLLM stores the offset)
        m.t2d[torch.arange(DRAFT_VOCAB) * 3] = True
    out = write_export(m, out, "eagle3")
    if parallel:
        cfg = json.loads((out / "config.json").read_text())
        cfg["mask_token_id"] = mask_token_id(target)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        w = load_file(str(out / "model.safetensors"))
        fc_in = w["fc.weight"].shape[1]
        w["mask_hidden"] = torch.randn(1, fc_in) * 0.02  # [1, n_aux*H]: the masked slots' aux features
        save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def dflash_config(target: Path, layers: int = 1, block_size: int = 4) -> dict:
    """``config.json`` of a DFlash drafter for ``target``: Qwen3 decoder fields sized like the target, the aux
    layers as ``dflash_config.target_layer_ids`` (vLLM ids, the same as EAGLE-3's ``eagle_aux_hidden_state_layer_ids``
    since both are read by ``get_eagle3_aux_layers_from_config``)."""
    from draftsmith.drafter.config import derive_config
    from draftsmith.features.layers import eagle3_layout_ids

    t = target_text_config(target)
    d = derive_config(target, int(t["vocab_size"]))
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_attention_heads": d.num_attention_heads,
        "num_key_value_heads": d.num_key_value_heads,
        "head_dim": d.head_dim,
        "hidden_act": d.hidden_act,
        "rms_norm_eps": d.rms_norm_eps,
        "max_position_embeddings": d.max_position_embeddings,
        "vocab_size": d.vocab_size,
        "rope_parameters": dict(d.rope_parameters),
        "attention_bias": False,
        "num_hidden_layers": layers,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "target_hidden_size": d.hidden_size,
        "num_target_layers": int(t["num_hidden_layers"]),
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(eagle3_layout_ids(d.layer_ids)),
                          "mask_token_id": mask_token_id(target)},
    }


def dflash_weights(cfg: dict) -> dict[str, torch.Tensor]:
    """Random DFlash weights under the names ``qwen3_dflash.py`` loads (no ``embed_tokens``/``lm_head``: the
    target's are shared). H = hidden, n = len(target_layer_ids)."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, ff = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    n = len(cfg["dflash_config"]["target_layer_ids"])
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    w = {"fc.weight": rnd(h, n * h),  # [H, n*H]: concatenated target layers -> H
         "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w |= {p + "self_attn.q_proj.weight": rnd(q, h), p + "self_attn.k_proj.weight": rnd(kv, h),
              p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, q),
              p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
              p + "mlp.gate_proj.weight": rnd(ff, h), p + "mlp.up_proj.weight": rnd(ff, h),
              p + "mlp.down_proj.weight": rnd(h, ff),
              p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    return w


def pard_config(target: Path, layers: int = 1) -> dict:
    """``config.json`` of a PARD draft LM: a Llama with the target's width and vocabulary, ``layers`` decoder
    layers and ``pard_token`` (the id of its masked slots, read by vLLM's proposer)."""
    t = target_text_config(target)
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_act", "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_parameters",
            "bos_token_id", "eos_token_id", "tie_word_embeddings")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{k: t[k] for k in keep if k in t},
            "num_hidden_layers": layers, "torch_dtype": "float32", "pard_token": mask_token_id(target)}


def write_drafter(family: str, target: Path, out: Path) -> Path:
    """Write a random drafter of ``family`` for ``target`` into ``out`` (``config.json`` + ``model.safetensors``).

    Raises:
        ValueError: an unknown family.
    """
    from safetensors.torch import save_file

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: pick one of {FAMILIES}")
    if family in ("eagle3", "peagle"):
        return eagle3_drafter(target, out, parallel=family == "peagle")
    out.mkdir(parents=True, exist_ok=True)
    if family in ("dflash", "dspark"):
        cfg = dflash_config(target)
        w = dflash_weights(cfg)
        if family == "dspark":
            cfg |= {"architectures": ["Qwen3DSparkModel"], "markov_rank": MARKOV_RANK,
                    "dspark_block_size": cfg["block_size"]}
            g = torch.Generator().manual_seed(1)
            for m in ("markov_w1", "markov_w2"):  # [V, r]: token -> r-dim embedding, r -> vocabulary bias
                w[f"markov_head.{m}.weight"] = torch.randn(cfg["vocab_size"], MARKOV_RANK, generator=g) * 0.02
        save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = pard_config(target)
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def speculative_config(family: str, drafter: Path, k: int) -> dict:
    """vLLM's ``--speculative-config`` for ``family`` with K = ``k`` draft tokens."""
    method = {"eagle3": "eagle3", "peagle": "eagle3", "dflash": "dflash", "dspark": "dspark", "pard": "draft_model"}[family]
    spec = {"method": method, "model": str(drafter), "num_speculative_tokens": k}
    if family in ("peagle", "pard"):
        spec["parallel_drafting"] = True
    return spec


def serve_and_generate(target: Path, spec: dict | None, log: Path, max_tokens: int, dtype: str) -> dict:
    """Serve ``target`` (with drafter ``spec``), answer :data:`PROMPTS` greedily; returns token ids and counters.

    Raises:
        EngineError: the server did not start (the log tail is in the message).
    """
    import httpx
    from draftsmith.evaluation.vllm_metrics import SpecCounters
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    s = VLLMServerSpec(model=target, served_name="t", port=free_port(), max_model_len=1024, kv_cache_gib=1,
                       enforce_eager=True, max_num_seqs=1, dtype=dtype, speculative=spec)
    ids = []
    with VLLMServer(s, log).start(timeout_s=900) as server:
        for q in PROMPTS:
            r = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
                "model": "t", "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
                "temperature": 0.0, "return_token_ids": True})
            r.raise_for_status()
            ids.append(r.json()["choices"][0]["token_ids"])
        c = SpecCounters.from_text(httpx.get(f"{server.url}/metrics", timeout=30).text)
    return {"ids": ids, "counters": c}


def last_error(log: Path) -> str:
    """The cause of a failed start: the last line of the server log that raises (``...Error: ...``, or pydantic's
    ``Value error, ...`` line of a refused config, without its ``[type=...]`` tail)."""
    pat = re.compile(r"\b\w*(Error|Exception)\b: |Value error, ")
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if pat.search(x) and " WARNING " not in x]
    return lines[-1].split(" [type=")[0][-400:] if lines else "(no error line in the log)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", action="append", choices=FAMILIES, help="repeatable; default: every family")
    p.add_argument("--target", type=Path, default=Path.home() / ".cache/draftsmith/models/SmolLM2-135M-Instruct")
    p.add_argument("--k", type=int, default=3, help="draft tokens per step")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", help="float32: the same verify math with and without a drafter")
    p.add_argument("--keep", type=Path, default=None, help="write drafters and logs here (default: a temp folder)")
    a = p.parse_args()
    from draftsmith.errors import EngineError

    with tempfile.TemporaryDirectory(prefix="family-probe-") as tmp:
        root = a.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        base = serve_and_generate(a.target, None, root / "vllm-target.log", a.max_tokens, a.dtype)
        for fam in a.family or FAMILIES:
            drafter = write_drafter(fam, a.target, root / f"{fam}-random")
            log = root / f"vllm-{fam}.log"
            try:
                got = serve_and_generate(a.target, speculative_config(fam, drafter, a.k), log, a.max_tokens, a.dtype)
            except EngineError:
                print(f'FAMILY {fam} load=no error="{last_error(log)}"', flush=True)
                continue
            c = got["counters"]
            rate = c.accepted / c.draft_tokens if c.draft_tokens else 0.0
            same = "yes" if got["ids"] == base["ids"] else "no"
            n = sum(map(len, got["ids"]))
            print(f"FAMILY {fam} load=yes tokens={n} drafts={c.drafts:.0f} draft_tokens={c.draft_tokens:.0f} "
                  f"accepted={c.accepted:.0f} identical={same} acceptance_rate={rate:.3f}", flush=True)


if __name__ == "__main__":
    main()
