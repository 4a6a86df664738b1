"""Blockwise TTT attention and the chunked loss against the dense reference (the implementation before them).

Same loss, same per-step statistics and the same gradient of every trainable parameter, in float32, within
``rtol 1e-5`` and ``atol 1e-5 x`` the largest magnitude of the compared tensor (the two sum in different orders, so
they differ by float32 rounding, ~1e-7 relative here), over: sequence lengths that are a multiple of the tile, not
a multiple, and shorter than one tile; TTT depth 1 and 3; grouped-query ratio 1 and 4; a right-padded batch with a
partial loss mask and out-of-vocabulary rows. Tiles and loss chunks are shrunk (16 positions, 10 rows) so that
small shapes still cross many tiles and chunks. A drafter of its own (hidden 64), so it runs in a few seconds and
needs no target checkpoint.
"""

from __future__ import annotations

import math

import pytest
import torch
from draftsmith.drafter import ttt, ttt_attention
from draftsmith.drafter.config import DraftConfig
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.ttt import target_view, ttt_loss
from draftsmith.drafter.ttt_attention import (
    set_ttt_attention,
    ttt_attention_blockwise,
    ttt_attention_reference,
)
from transformers.models.llama.modeling_llama import repeat_kv

V, N, H = 300, 64, 64
TILE = 16


def _cfg(kv_heads: int) -> DraftConfig:
    return DraftConfig(
        hidden_size=H, intermediate_size=96, num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16,
        rms_norm_eps=1e-6, max_position_embeddings=4096, vocab_size=V, draft_vocab_size=N,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, target_hidden_size=H, target_num_layers=8,
        layer_ids=[1, 3, 5],
    )


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(ttt_attention, "MAX_BLOCK", TILE)
    monkeypatch.setattr(ttt_attention, "MIN_BLOCK", TILE)
    monkeypatch.setattr(ttt, "LOSS_CHUNK_ELEMENTS", 3 * N * 10)  # 10 positions per chunk at B = 3


def _model(kv_heads: int) -> Eagle3Drafter:
    torch.manual_seed(0)
    m = Eagle3Drafter(_cfg(kv_heads))
    torch.nn.init.normal_(m.embed_tokens.weight, std=0.5)
    with torch.no_grad():
        for p in m.trainable_parameters():  # norms away from 1, projections large enough for peaked attention
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05))
        m.d2t.copy_(torch.arange(N) * 3 - torch.arange(N))  # draft i -> target 3*i
        m.t2d[torch.arange(N) * 3] = True
    return m.train()


def _batch(T: int, seed: int = 1):
    """Three right-padded rows (lengths T, T-5, T//2), partial loss masks, some out-of-vocabulary rows."""
    g = torch.Generator().manual_seed(seed)
    B = 3
    lengths = torch.tensor([T, max(T - 5, 2), max(T // 2, 2)])
    ids = torch.randint(0, V, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * H, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    for b, n in enumerate(lengths.tolist()):  # padding as collate writes it
        ids[b, n:], aux[b, n:], mask[b, n:] = 0, 0.0, False
    head = torch.randn(V, H, generator=g) * 0.2
    head[torch.arange(N) * 3] *= 1.5  # most top-1s in the draft vocabulary, not all
    final = torch.randn(B, T, H, generator=g)
    return ids, mask, aux, lengths, final, head


def _run(m, mode: str, batch, k: int, all_rows: bool = False):
    ids, mask, aux, lengths, final, head = batch
    set_ttt_attention(m, "blockwise" if mode == "new" else "dense")
    view = target_view(final, head, m.d2t, m.t2d)
    m.zero_grad(set_to_none=True)
    loss, stats = ttt_loss(m, ids, mask, aux, lengths, view, k, all_rows=all_rows,
                           loss="chunked" if mode == "new" else "dense")
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    return loss.detach(), stats, grads, view


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()) + 1e-12, msg=what)


@pytest.mark.parametrize("T", [48, 45, 7])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kv_heads", [4, 1])
def test_blockwise_matches_dense_loss_and_gradients(T, k, kv_heads):
    m = _model(kv_heads)
    batch = _batch(T)
    ref_loss, ref_stats, ref_grads, view = _run(m, "dense", batch, k)
    assert bool(view.in_vocab.any()) and (T < TILE or not bool(view.in_vocab.all()))  # the filter is exercised
    loss, stats, grads, _ = _run(m, "new", batch, k)
    _close(loss, ref_loss, "loss")
    assert stats.loss_rows == ref_stats.loss_rows and stats.supervised == ref_stats.supervised
    assert stats.correct == ref_stats.correct
    assert stats.loss_sum == pytest.approx(ref_stats.loss_sum, rel=1e-5)
    assert len(grads) == len(ref_grads) >= 10
    assert all(float(g.abs().max()) > 0 for g in ref_grads.values())
    for name, g in ref_grads.items():
        _close(grads[name], g, name)


def test_all_rows_and_eval_mode_match():
    """``loss_rows: all`` and the no-grad (held-out evaluation) path give the same figures too."""
    m = _model(1)
    batch = _batch(45, seed=2)
    ref_loss, ref_stats, ref_grads, _ = _run(m, "dense", batch, 3, all_rows=True)
    loss, stats, grads, _ = _run(m, "new", batch, 3, all_rows=True)
    _close(loss, ref_loss, "loss")
    for name, g in ref_grads.items():
        _close(grads[name], g, name)
    ids, mask, aux, lengths, final, head = batch
    view = target_view(final, head, m.d2t, m.t2d)
    with torch.no_grad():
        out = {}
        for mode, loss_mode in (("dense", "dense"), ("blockwise", "chunked")):
            set_ttt_attention(m, mode)
            out[mode] = ttt_loss(m, ids, mask, aux, lengths, view, 3, loss=loss_mode)
    _close(out["blockwise"][0], out["dense"][0], "eval loss")
    assert out["blockwise"][1].correct == out["dense"][1].correct


def _exact_reference(q, cache):
    """The dense attention with its softmax left in the inputs' dtype (the reference casts it to float32)."""
    T, d = q.shape[-2:]
    rep = q.shape[1] // cache[0][0].shape[1]
    k0, v0 = repeat_kv(cache[0][0], rep), repeat_kv(cache[0][1], rep)
    s0 = (q @ k0.transpose(-1, -2) / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    sd = torch.stack([(q * repeat_kv(kk, rep)).sum(-1) for kk, _ in cache[1:]], -1) / math.sqrt(d)
    p = torch.softmax(torch.cat([s0, sd], -1), -1)
    out = p[..., :T] @ v0
    for i, (_, vv) in enumerate(cache[1:]):
        out = out + p[..., T + i, None] * repeat_kv(vv, rep)
    return out


@pytest.mark.parametrize("block", [16, 13, 64])
def test_attention_is_exact_in_float64(block):
    """In float64 the tiled forward and hand-written backward agree with autograd through the dense formula to
    ~1e-14: the algorithm is exact, only rounding differs."""
    torch.manual_seed(0)
    B, h, hkv, T, d, j = 2, 8, 2, 50, 8, 3
    q = (3 * torch.randn(B, T, h, d, dtype=torch.float64)).transpose(1, 2).requires_grad_()  # model's strides
    cache = [(torch.randn(B, hkv, T, d, dtype=torch.float64, requires_grad=True),
              torch.randn(B, hkv, T, d, dtype=torch.float64, requires_grad=True)) for _ in range(j + 1)]
    leaves = [q] + [t for kv in cache for t in kv]
    g = torch.randn(B, h, T, d, dtype=torch.float64)
    ref = _exact_reference(q, cache)
    ref_grads = torch.autograd.grad((ref * g).sum(), leaves)
    out = ttt_attention_blockwise(q, cache, block)
    grads = torch.autograd.grad((out * g).sum(), leaves)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    torch.testing.assert_close(ttt_attention_reference(q, cache), ref, rtol=1e-6, atol=1e-6)  # float32 softmax


def test_mixed_dtypes_meet_in_the_wider_one():
    """A step's float32 queries over bf16 keys of step 0 (the EAGLE-3.1 norms under bf16 autocast give that):
    computed in float32, as the exact formula over the same values."""
    torch.manual_seed(0)
    B, h, hkv, T, d = 1, 4, 2, 20, 8
    q = torch.randn(B, h, T, d)
    cache = [(torch.randn(B, hkv, T, d).bfloat16(), torch.randn(B, hkv, T, d).bfloat16()) for _ in range(3)]
    out = ttt_attention_blockwise(q, cache, 8)
    assert out.dtype == torch.float32
    ref = _exact_reference(q.double(), [(k.double(), v.double()) for k, v in cache])
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_stays_close():
    """Under bf16 autocast (the trainer on GPUs and AMX CPUs) both follow the same dtypes: close, not equal."""
    m = _model(1)
    batch = _batch(45)
    losses = {}
    for mode in ("dense", "new"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses[mode] = _run(m, mode, batch, 3)[0]
    assert torch.isfinite(losses["new"])
    torch.testing.assert_close(losses["new"], losses["dense"], rtol=2e-2, atol=0)


def _saved_bytes(m, mode: str, T: int) -> int:
    """Bytes of the distinct storages autograd holds for backward after one TTT forward (k = 3)."""
    storages: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    ids, mask, aux, lengths, final, head = _batch(T)
    set_ttt_attention(m, "blockwise" if mode == "new" else "dense")
    view = target_view(final, head, m.d2t, m.t2d)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ttt_loss(m, ids, mask, aux, lengths, view, 3, loss="chunked" if mode == "new" else "dense")
    return sum(storages.values())


def test_saved_memory_is_linear_in_sequence_length(monkeypatch):
    """Doubling T at most doubles what the new path keeps for backward (parameters are a constant part); the
    reference's [T, T] softmax makes it grow faster (2.3x from 128 to 256 here, 4x in the limit)."""
    monkeypatch.setattr(ttt_attention, "MAX_BLOCK", 32)
    monkeypatch.setattr(ttt_attention, "MIN_BLOCK", 32)
    m = _model(4)
    new = _saved_bytes(m, "new", 256) / _saved_bytes(m, "new", 128)
    dense = _saved_bytes(m, "dense", 256) / _saved_bytes(m, "dense", 128)
    assert 1.8 < new <= 2.0, new
    assert dense > 2.2, dense


def test_chunked_loss_refuses_a_second_backward():
    """Its parameter gradients are handed out once per unroll (``ttt._HeadGrads``): a second backward through the
    same graph raises instead of adding wrong gradients."""
    m = _model(1)
    ids, mask, aux, lengths, final, head = _batch(20)
    loss, _ = ttt_loss(m, ids, mask, aux, lengths, target_view(final, head, m.d2t, m.t2d), 2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


def test_a_training_step_reads_nothing_back_from_the_device():
    """Forward and backward of the TTT loss (blockwise attention, chunked loss) make no host read of a tensor's
    value: on a GPU each would be a device sync. Counted at the dispatcher, where ``float()``, ``bool()``,
    ``.item()`` and ``torch.equal`` land (``_local_scalar_dense``, ``equal``, ``is_nonzero``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads: list[str] = []

    class HostReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("_local_scalar_dense", "equal", "is_nonzero"):
                reads.append(func.__name__)
            return func(*args, **(kwargs or {}))

    m = _model(1)
    ids, mask, aux, lengths, final, head = _batch(45)
    set_ttt_attention(m, "blockwise")
    view = target_view(final, head, m.d2t, m.t2d)
    with HostReads():
        loss, stats = ttt_loss(m, ids, mask, aux, lengths, view, 3, loss="chunked")
        (loss * 0.5).backward()
    assert reads == []
    assert stats.sums.shape == (4, 3) and stats.loss_rows[0] > 0  # read once, outside the step
