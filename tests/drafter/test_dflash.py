"""The DFlash family: the drafter computes what vLLM's ``qwen3_dflash.py`` computes with the same weights, its
training blocks see exactly what a served block sees, the family refuses what it cannot train, and (slow) a drafter
trained a few steps on real SmolLM2 features is served by vLLM's CPU build: greedy output identical to the target
alone, with drafting (K draft tokens every verify step). Whether the few-step drafter is accepted is printed, not
asserted: 40 steps of one layer learn little of slot 1's two-positions-ahead task; that the served drafter computes
what was trained is the first test's, against vLLM's own model.

The reference of the forward is vLLM's own model class, built on CPU from the export by vLLM's config and loader code
(``dflash_vllm_reference.py``, in a subprocess): only the attention kernel is replaced, by plain non-causal attention
over the context K/V that vLLM's ``precompute_and_store_context_kv`` computed and the block's own K/V.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from draftsmith.config import load_settings
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families import get_family, usable_family
from draftsmith.drafter.families.dflash.export import export_weights, load_dflash_export, write_dflash_export
from draftsmith.drafter.families.dflash.model import DFlashDrafter
from draftsmith.drafter.families.dflash.objective import DFlashObjective, block_inputs, pick_anchors
from draftsmith.drafter.ttt import target_view
from draftsmith.drafter.vocab import load_target_head
from draftsmith.errors import ConfigError
from vllm_greedy import greedy_token_ids

HERE = Path(__file__).resolve().parent
N_DRAFT = 64
H, V = 576, 49152  # SmolLM2-135M


def random_drafter(target: Path, layers: int = 1, block: int = 4) -> DFlashDrafter:
    """A drafter with random weights, non-unit norms and a 64-token draft vocabulary (draft i = target 3i)."""
    torch.manual_seed(0)
    m = DFlashDrafter(derive_config(target, N_DRAFT, num_layers=layers), block, 0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        m.embed_tokens.weight.copy_(load_target_head(target)[0])
        m.d2t.copy_(torch.arange(N_DRAFT) * 2)
        m.t2d[torch.arange(N_DRAFT) * 3] = True
    return m.eval()


def vllm_reference(target: Path, export: Path, aux, ids, pos, tmp: Path) -> dict:
    torch.save({"aux": aux, "ids": ids, "pos": pos, "embed": load_target_head(target)[0]}, tmp / "in.pt")
    subprocess.run(
        [
            sys.executable,
            str(HERE / "dflash_vllm_reference.py"),
            str(target),
            str(export),
            str(tmp / "in.pt"),
            str(tmp / "out.pt"),
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return torch.load(tmp / "out.pt")


def test_forward_and_weight_names_are_vllms(embedded_target, tmp_path):
    m = random_drafter(embedded_target)
    out = write_dflash_export(m, tmp_path / "dflash")
    w = export_weights(m)
    assert "embed_tokens.weight" not in w and tuple(w["fc.weight"].shape) == (H, 3 * H)  # [H, n*H_t]
    assert tuple(w["lm_head.weight"].shape) == (N_DRAFT, H) and tuple(w["d2t"].shape) == (N_DRAFT,)
    assert tuple(w["layers.0.self_attn.k_norm.weight"].shape) == (64,)  # [head_dim], per head
    conf = json.loads((out / "config.json").read_text())
    assert conf["dflash_config"] == {"target_layer_ids": [2, 15, 27], "mask_token_id": 0}  # vLLM's i + 1
    assert (conf["architectures"], conf["block_size"], conf["draft_vocab_size"]) == (
        ["DFlashDraftModel"],
        4,
        64,
    )
    a, S = 23, 4  # one block: anchor at position 23, context 0..22
    torch.manual_seed(1)
    aux = torch.randn(a, 3 * H)  # [T, 3H]
    ids = torch.tensor([1234, 0, 0, 0])  # [S]: the anchor token, then the mask token
    pos = torch.arange(a, a + S)
    ref = vllm_reference(embedded_target, out, aux, ids, pos, tmp_path)
    assert ref["cls"] == "DFlashQwen3ForCausalLM"
    # every exported tensor landed in one of vLLM's parameters (q/k/v and gate/up are stacked there)
    stacked = {
        "q_proj": "qkv_proj",
        "k_proj": "qkv_proj",
        "v_proj": "qkv_proj",
        "gate_proj": "gate_up_proj",
        "up_proj": "gate_up_proj",
        "d2t": "draft_id_to_target_id",
    }
    for name in w:
        if name == "t2d":  # vLLM's loader skips it
            continue
        mapped = ".".join(stacked.get(part, part) for part in name.split("."))
        assert ("model." + mapped in ref["params"]) or (mapped in ref["params"]), name
    with torch.no_grad():
        hidden = m(
            ids[None],
            pos[None],
            aux[None],
            torch.arange(a)[None],
            torch.ones(1, 1, S, a + S, dtype=torch.bool),
        )[0]  # [S, H]
        logits = m.logits(hidden)  # [S, N]
    torch.testing.assert_close(hidden, ref["hidden"], atol=1e-4, rtol=1e-4)
    target_ids = torch.arange(N_DRAFT) * 3
    torch.testing.assert_close(logits, ref["logits"][:, target_ids], atol=1e-3, rtol=1e-4)
    others = torch.ones(V, dtype=torch.bool)
    others[target_ids] = False
    assert torch.isneginf(ref["logits"][:, others]).all()  # vLLM proposes draft-vocabulary tokens only
    back = load_dflash_export(out, embedded_target)
    assert back.block_size == 4 and all(
        torch.equal(back.state_dict()[k], v) for k, v in m.state_dict().items()
    )


def test_eval_reads_the_export_and_serves_it_as_dflash(embedded_target, tmp_path):
    from draftsmith.evaluation.checks import check_drafter_fits

    out = write_dflash_export(random_drafter(embedded_target, block=4), tmp_path / "dflash")
    info = check_drafter_fits(embedded_target, out)
    assert (info.family, info.layout, info.layer_ids, info.draft_vocab_size) == (
        "dflash",
        "dflash",
        (2, 15, 27),
        64,
    )
    fam = get_family(info.family)
    assert fam.speculative_config(out, 3) == {
        "method": "dflash",
        "model": str(out),
        "num_speculative_tokens": 3,
    }
    with pytest.raises(
        ConfigError, match="K = 4 draft tokens asked of a DFlash drafter trained with 3 masked slots"
    ):
        fam.speculative_config(out, 4)


def test_cpu_vllm_norms_every_layers_context_keys_with_layer_0s_k_norm(embedded_target, tmp_path):
    """Why a multi-layer DFlash drafter is not served exactly on vLLM's CPU build (``dflash_model``'s docstring):
    the grouped ``ops.rms_norm`` of ``_normalize_context_k`` applies layer 0's ``k_norm`` weight to layer 1's keys."""
    m = random_drafter(embedded_target, layers=2)
    out = write_dflash_export(m, tmp_path / "dflash2")
    a = 9
    aux = torch.randn(a, 3 * H)
    ref = vllm_reference(
        embedded_target, out, aux, torch.tensor([5, 0, 0, 0]), torch.arange(a, a + 4), tmp_path
    )
    with torch.no_grad():
        ctx = m.context(aux[None])  # [1, T, H]
        cos, sin = m.rotary(ctx, torch.arange(a)[None])
        k0 = m.layers[0].self_attn._kv(ctx, cos, sin)[0][0].transpose(0, 1)  # [T, h_kv, d]
        k1 = m.layers[1].self_attn._kv(ctx, cos, sin)[0][0].transpose(0, 1)
        m.layers[1].self_attn.k_norm.weight.copy_(m.layers[0].self_attn.k_norm.weight)
        k1_with_0 = m.layers[1].self_attn._kv(ctx, cos, sin)[0][0].transpose(0, 1)
    torch.testing.assert_close(ref["context_k"][0], k0, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ref["context_k"][1], k1_with_0, atol=1e-4, rtol=1e-4)
    assert (ref["context_k"][1] - k1).abs().max() > 0.1


def test_training_blocks_see_what_a_served_block_sees(embedded_target):
    """Several anchored blocks in one pass give each block what it gets alone with the context cut at its anchor
    (vLLM's proposer: context = verified positions < anchor, the block non-causal), in float64."""
    m = random_drafter(embedded_target, layers=2, block=4).double()
    T = 30
    torch.manual_seed(2)
    ids = torch.randint(1, 1000, (1, T))
    aux = torch.randn(1, T, 3 * H, dtype=torch.float64)
    anchors = torch.tensor([[5, 11, 12, 26]])
    b_ids, b_pos, mask = block_inputs(ids, anchors, 4, 0)
    assert b_ids[0, :8].tolist() == [ids[0, 5].item(), 0, 0, 0, ids[0, 11].item(), 0, 0, 0]
    assert b_pos[0, :8].tolist() == [5, 6, 7, 8, 11, 12, 13, 14]
    with torch.no_grad():
        together = m(b_ids, b_pos, aux, torch.arange(T)[None], mask)  # [1, 16, H]
        for n, a in enumerate(anchors[0].tolist()):
            alone = m(
                b_ids[:, 4 * n : 4 * n + 4],
                b_pos[:, 4 * n : 4 * n + 4],
                aux[:, :a],
                torch.arange(a)[None],
                torch.ones(1, 1, 4, a + 4, dtype=torch.bool),
            )
            torch.testing.assert_close(together[:, 4 * n : 4 * n + 4], alone, atol=1e-10, rtol=1e-10)


def test_anchors_and_the_objective_count_accepted_prefixes(embedded_target):
    lm = torch.zeros(2, 12, dtype=torch.bool)
    lm[0, 4:] = True
    lm[1, 8:10] = True
    a, valid = pick_anchors(lm, torch.tensor([12, 10]), 100, None)
    assert a[0][valid[0]].tolist() == list(range(3, 11))  # x[a+1] generated and inside the row
    assert a[1][valid[1]].tolist() == [7, 8]
    m = random_drafter(embedded_target, block=4)
    torch.manual_seed(3)
    ids = torch.randint(0, N_DRAFT * 3, (2, 12))
    final = torch.randn(2, 12, H)
    head = load_target_head(embedded_target)[1]
    view = target_view(final, head, m.d2t, m.t2d, in_vocab=torch.ones(2, 12, dtype=torch.bool))
    obj = DFlashObjective(m, anchors=100, decay=0.8).train()
    batch = {
        "input_ids": ids,
        "loss_mask": lm,
        "aux": torch.randn(2, 12, 3 * H),
        "lengths": torch.tensor([12, 10]),
    }
    loss, st = obj(batch, view)
    loss.backward()
    assert m.fc.weight.grad.abs().sum() > 0 and m.embed_tokens.weight.grad is None
    supervised_slot0 = 8 + 2  # every valid anchor's first mask is a generated token
    assert st.sums.shape == (4, 3) and st.supervised[0] == supervised_slot0
    assert all(c <= s for c, s in zip(st.correct, st.supervised, strict=True))
    assert 1.0 <= st.acceptance_length <= 4.0
    again = obj(batch, view)[1]  # the same micro-batch draws the same anchors (resumable)
    assert torch.equal(again.sums, st.sums)


def test_dflash_family_refuses_what_it_cannot_train(tmp_path):
    class Features:
        layer_ids = [1, 14, 26]

    def settings(**over):
        return load_settings(
            None, {"runs_dir": str(tmp_path), "run": "r", "train": {"family": "dflash", **over}}
        )

    with pytest.raises(ConfigError, match=r"not the extracted layers \[1, 14, 26\].*extract.layers=2,15,27"):
        usable_family(settings(layer_ids=[2, 15, 27]), Features())
    with pytest.raises(ConfigError, match="norm_before_fc is an EAGLE-3 option"):
        usable_family(settings(norm_before_fc=True), Features())
    with pytest.raises(ConfigError, match="cannot serve DFlash"):
        usable_family(
            load_settings(
                None,
                {
                    "runs_dir": str(tmp_path),
                    "run": "r",
                    "train": {"family": "dflash"},
                    "eval": {"engine": "sglang"},
                },
            ),
            Features(),
        )
    fam = usable_family(settings(), Features())
    assert (fam.name, fam.method) == ("dflash", "dflash")


@pytest.mark.e2e
@pytest.mark.slow
def test_trained_dflash_drafter_is_served_by_vllm(reference_run, embedded_target, draft_vocab, tmp_path):
    from draftsmith.drafter.checkpoint import list_checkpoints
    from draftsmith.drafter.trainer import Trainer

    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "d")
    s = load_settings(
        None,
        {
            "runs_dir": str(runs),
            "run": "d",
            "target": {"path": str(embedded_target)},
            "train": {
                "family": "dflash",
                "draft_vocab_size": draft_vocab,
                "ttt_steps": 3,
                "dflash_anchors": 32,
                "max_steps": 40,
                "batch_size": 4,
                "batch_tokens": 640,
                "lr": 2e-3,
                "warmup_ratio": 0.05,
                "log_every": 10,
                "eval_every": 1000,
                "norm_init": "target",
            },
        },
    )
    trainer = Trainer(s)
    before = trainer.evaluate()  # the untrained drafter on the held-out split
    result = trainer.run()
    assert result["heldout"]["loss"][0] < before.losses[0] - 0.5, (before.losses, result)  # it learned
    ckpt = list_checkpoints(runs / "d" / "checkpoints")[-1]
    family = get_family("dflash")
    [out] = family.export_checkpoint(ckpt, str(embedded_target), runs / "d" / "export", "both", 3)
    assert out.name == "dflash"
    prompts = [
        "What is the capital of France?",
        "Give three tips for staying healthy.",
        "If a train travels 60 miles in 1.5 hours, what is its average speed?",
    ]
    alone, _ = greedy_token_ids(None, embedded_target, tmp_path / "vllm-target.log", prompts, 32)
    served, c = greedy_token_ids(
        family.speculative_config(out, 3), embedded_target, tmp_path / "vllm-dflash.log", prompts, 32
    )
    print(
        json.dumps(
            {
                "train": result["train"],
                "heldout": result["heldout"],
                "heldout_before": {"loss": before.losses, "acc": before.accs},
                "vllm": {"drafts": c.drafts, "draft_tokens": c.draft_tokens, "accepted": c.accepted},
                "vllm_mean_acceptance_length": 1 + c.accepted / max(c.drafts, 1),
            }
        )
    )
    assert served == alone
    assert c.drafts > 0 and c.draft_tokens == 3 * c.drafts
