"""What a DFlash drafter is trained on: blocks at anchor positions of the target's answers, one pass per batch.

Source: DFlash (Chen, Liang and Liu, 2026, arXiv 2602.06036), section 4: several anchors per sequence are drafted
in parallel, each block ``[x_a, MASK, ..., MASK]`` at positions ``a .. a + S - 1`` (S = block size) seeing the
context of positions ``< a`` and its own block (both directions), never another block; slot ``i`` (1 <= i < S)
predicts the token ``x[a + i]`` with a cross-entropy weighted ``exp(-(i - 1) / gamma)`` (earlier slots matter more:
a rejected slot ends the accepted prefix). Here the cross-entropy is against the target's own distribution over the
draft vocabulary at that position, as EAGLE-3's (``drafter/ttt.py``: same loss mask, same draft-vocabulary rows). This is what vLLM's proposer serves (``vllm/v1/spec_decode/dflash.py``):
after the target verified positions ``..a-1`` and sampled ``x_a``, the drafter's context holds the target hidden
states of positions ``0..a-1`` and its queries are ``x_a`` then K masks at ``a+1..a+K``.

Anchors: positions ``a >= 1`` whose next token ``x[a + 1]`` is in the loss mask (target-generated). Training draws up
to ``anchors`` of them per row at random (seeded by the run's seed and the micro-batch: resumable); evaluation takes up to ``anchors`` evenly
spaced ones, the same every time. A slot is supervised when its token is inside the row and in the loss mask.

Metrics, as :class:`~draftsmith.drafter.ttt.StepStats` with one column per masked slot (``S - 1`` columns):
``loss`` is the slot's mean CE; ``acc`` is the slot's conditional acceptance, the share of blocks whose draft is
right at slot ``i`` among those right at every slot before it (vLLM's per-position acceptance at temperature 0), so
``StepStats.acceptance_length`` = 1 + the mean accepted prefix of a block (the simulated acceptance length, bonus
token included). "Right" means equal to the target's greedy token at that position (a slot whose target top-1 is
outside the draft vocabulary counts as wrong: the drafter can never propose it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsmith.drafter.families.dflash.model import DFlashDrafter
from draftsmith.drafter.ttt import StepStats, TargetView

# Rows of one logits chunk ([rows, V] floats are recomputed in backward, never kept): 2**24 floats = 64 MiB.
LOGIT_CHUNK_ELEMENTS = 2**24


def pick_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, n: int, generator: torch.Generator | None):
    """Up to ``n`` anchor positions per row.

    Args:
        loss_mask: ``[B, T]`` bool (True = target-generated token).
        lengths: ``[B]`` real lengths.
        n: most anchors per row.
        generator: CPU generator for a random draw; None = evenly spaced (evaluation).

    Returns:
        ``(anchors [B, N] long, valid [B, N] bool)``; N = the largest count any row got (at least 1); invalid
        entries hold anchor 0 and are left out of the loss.
    """
    B, T = loss_mask.shape
    t = torch.arange(T, device=loss_mask.device)
    nxt = torch.zeros_like(loss_mask)
    nxt[:, :-1] = loss_mask[:, 1:]  # [B, T]: x[a + 1] is supervised
    ok = nxt & (t >= 1) & (t + 1 < lengths.unsqueeze(1))  # [B, T]
    rows = []
    for b in range(B):
        cand = ok[b].nonzero().squeeze(1).cpu()  # [c]
        if cand.numel() > n:
            if generator is None:
                cand = cand[torch.linspace(0, cand.numel() - 1, n).round().long()]
            else:
                cand = cand[torch.randperm(cand.numel(), generator=generator)[:n]].sort().values
        rows.append(cand)
    N = max(1, max(r.numel() for r in rows))
    anchors = torch.zeros(B, N, dtype=torch.long)
    valid = torch.zeros(B, N, dtype=torch.bool)
    for b, r in enumerate(rows):
        anchors[b, : r.numel()], valid[b, : r.numel()] = r, True
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """The blocks of a batch laid side by side.

    Args:
        input_ids: ``[B, T]``. anchors: ``[B, N]``.

    Returns:
        ``(block_ids [B, N*S], block_pos [B, N*S], mask [B, 1, N*S, T + N*S])``: ids ``[x_a, MASK, ...]``,
        positions ``a + i`` and the attention mask (context ``< a``, own block only).
    """
    B, T = input_ids.shape
    N, S, dev = anchors.shape[1], block_size, input_ids.device
    offs = torch.arange(S, device=dev)  # [S]
    pos = (anchors.unsqueeze(-1) + offs).view(B, N * S)  # [B, N*S]
    ids = torch.full((B, N, S), mask_token_id, dtype=input_ids.dtype, device=dev)
    ids[:, :, 0] = input_ids.gather(1, anchors)  # [B, N] the anchor tokens
    q_anchor = anchors.repeat_interleave(S, dim=1)  # [B, N*S]
    ctx = torch.arange(T, device=dev).view(1, 1, T) < q_anchor.unsqueeze(-1)  # [B, N*S, T]
    blk = torch.arange(N, device=dev).repeat_interleave(S)  # [N*S]
    own = (blk.view(-1, 1) == blk.view(1, -1)).unsqueeze(0).expand(B, -1, -1)  # [B, N*S, N*S]
    return ids.view(B, N * S), pos, torch.cat([ctx, own], dim=-1).unsqueeze(1)


def _ce_chunk(h: torch.Tensor, head: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h`` ``[c, H]``, ``head`` ``[N, H]``, ``probs`` ``[c, N]`` -> ``(soft CE [c] float32, argmax [c])``."""
    logits = (h @ head.to(h.dtype).T).float()  # [c, N]
    return -(probs * F.log_softmax(logits, dim=-1)).sum(-1), logits.argmax(-1)


def block_ce(
    normed: torch.Tensor, head: torch.Tensor, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy and greedy draft of rows ``normed`` ``[R, H]`` against the target distributions ``probs``
    ``[R, N]`` over the draft vocabulary, in chunks whose ``[c, N]`` logits are recomputed in backward, not kept.

    Returns:
        ``(CE [R] float32, argmax [R] long)``.
    """
    R, N = normed.shape[0], head.shape[0]
    step = max(1, LOGIT_CHUNK_ELEMENTS // N)
    ces, tops = [], []
    for s in range(0, R, step):
        args = (normed[s : s + step], head, probs[s : s + step])
        ce, top = (
            checkpoint(_ce_chunk, *args, use_reentrant=False) if torch.is_grad_enabled() else _ce_chunk(*args)
        )
        ces.append(ce)
        tops.append(top)
    if not ces:
        return normed.new_zeros(0, dtype=torch.float32), torch.zeros(
            0, dtype=torch.long, device=normed.device
        )
    return torch.cat(ces), torch.cat(tops)


def dflash_loss(
    model: DFlashDrafter,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux: torch.Tensor,
    lengths: torch.Tensor,
    view: TargetView,
    anchors: int,
    decay: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, StepStats]:
    """The weighted block soft cross-entropy of one micro-batch and its per-slot sums (module docstring).

    Args:
        model: the drafter (``block_size`` S, ``mask_token_id``).
        input_ids: ``[B, T]`` right-padded target ids. loss_mask: ``[B, T]`` (True = target-generated).
        aux: ``[B, T, n*H_t]`` target hidden states at the drafter's ``layer_ids``. lengths: ``[B]``.
        view: the target's distribution over the draft vocabulary per position (:func:`~draftsmith.drafter.ttt.
            target_view`): position ``t`` gives the target's next token ``x[t + 1]``.
        anchors: most blocks per row. decay: slot ``i`` (1-based) weighs ``decay ** (i - 1)``, the paper's
            ``exp(-(i - 1) / gamma)`` with ``gamma = -1 / ln(decay)`` (0.8: gamma 4.5).
        generator: random anchors (training); None = evenly spaced (evaluation).

    Returns:
        ``(loss scalar, StepStats [4, S - 1])``; the loss is ``sum_i decay**(i-1) * mean CE of slot i``, over slots
        that are loss-masked and whose target top-1 is in the draft vocabulary.
    """
    S = model.block_size
    B, T = input_ids.shape
    lmask = loss_mask.bool()
    a, valid = pick_anchors(lmask, lengths, anchors, generator)  # [B, N] each
    N = a.shape[1]
    ids, pos, mask = block_inputs(input_ids, a, S, model.mask_token_id)
    ctx_pos = torch.arange(T, device=input_ids.device).unsqueeze(0).expand(B, T)  # [B, T]
    normed = model(ids, pos, aux, ctx_pos, mask).view(B, N, S, -1)[:, :, 1:]  # [B, N, S-1, H]
    tpos = a.unsqueeze(-1) + torch.arange(1, S, device=a.device)  # [B, N, S-1] position of the drafted token
    inside = tpos < lengths.view(B, 1, 1)  # [B, N, S-1]
    tpos = tpos.clamp(max=T - 1)
    prev = (tpos - 1).view(B, -1)  # [B, N*(S-1)]: the target's distribution for x[tpos] sits one row earlier
    sup = valid.unsqueeze(-1) & inside & lmask.gather(1, tpos.view(B, -1)).view_as(tpos)  # [B, N, S-1]
    rows = sup & view.in_vocab.gather(1, prev).view_as(tpos)  # [B, N, S-1] in the loss
    b_idx = torch.arange(B, device=a.device).view(B, 1, 1).expand_as(tpos)
    p_rows = view.probs[b_idx[rows], (tpos - 1)[rows]]  # [R, N_vocab]
    ce, top = block_ce(normed[rows], model.lm_head.weight, p_rows)  # [R] each
    slot = torch.arange(S - 1, device=a.device).expand_as(tpos)[rows]  # [R] slot index (0 = first mask)
    ce_slot = torch.zeros(S - 1, device=a.device, dtype=torch.float32).index_add(0, slot, ce)  # [S-1]
    n_slot = torch.bincount(slot, minlength=S - 1)  # [S-1]
    w = decay ** torch.arange(S - 1, device=a.device, dtype=torch.float32)  # [S-1]
    loss = (w * ce_slot / n_slot.clamp(min=1)).sum()
    with torch.no_grad():
        right = torch.zeros_like(sup)
        right[rows] = top == view.top.gather(1, prev).view_as(tpos)[rows]  # [B, N, S-1]
        alive = (
            torch.cat([valid.unsqueeze(-1), right[..., :-1]], dim=-1).long().cumprod(-1).bool()
        )  # [B, N, S-1]
        sums = torch.stack(
            [
                ce_slot.detach(),
                n_slot.float(),
                (alive & right).sum((0, 1)).float(),
                (alive & sup).sum((0, 1)).float(),
            ]
        ).double()  # [4, S-1]
    return loss, StepStats(sums)


class DFlashObjective(nn.Module):
    """One ``forward(batch, view)`` per micro-batch (what DDP/FSDP wrap), drawing anchors from a seeded generator.

    Args:
        drafter: the model. anchors, decay: see :func:`dflash_loss`. seed: the run's seed (``train.seed``).
    """

    def __init__(self, drafter: DFlashDrafter, anchors: int, decay: float, seed: int = 0) -> None:
        super().__init__()
        self.drafter, self.anchors, self.decay, self.seed = drafter, anchors, decay, seed

    def generator(self, input_ids: torch.Tensor) -> torch.Generator:
        """The anchor draw of a micro-batch, seeded by ``seed`` and the batch's tokens: a resumed run draws what
        the uninterrupted one drew (each epoch draws a micro-batch's anchors alike)."""
        w = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)  # [T]
        digest = int((input_ids * w).sum().item()) % (2**61 - 1)
        return torch.Generator().manual_seed((self.seed * 1_000_003 + digest) % (2**63 - 1))

    def forward(self, batch: dict[str, torch.Tensor], view: TargetView) -> tuple[torch.Tensor, StepStats]:
        """``batch``: ``input_ids``, ``loss_mask``, ``aux``, ``lengths`` (:func:`draftsmith.drafter.data.collate`)."""
        ids = batch["input_ids"]
        return dflash_loss(
            self.drafter,
            ids,
            batch["loss_mask"],
            batch["aux"],
            batch["lengths"],
            view,
            self.anchors,
            self.decay,
            self.generator(ids) if self.training else None,
        )
