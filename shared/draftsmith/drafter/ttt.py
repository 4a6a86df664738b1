"""Training-time test (TTT): unroll the draft k steps and score each step against the target.

Source: EAGLE-3 paper (Li et al., 2025) section 3 and SpecForge's online/offline EAGLE-3 trainers. Step ``j``
(0-based) at row ``t`` reads the ground-truth token ``x[t+j+1]`` at position ``t+j`` with the hidden state its own
step ``j-1`` produced at that row (``fc(aux[t])`` at step 0), and predicts ``x[t+j+2]``. Its target is the target
model's next-token distribution at position ``t+j+1`` restricted to (and renormalised over) the draft vocabulary,
computed from the stored post-norm ``final_hidden`` through the target's ``lm_head`` rows of the draft vocabulary.

Loss: soft cross-entropy (forward KL up to a constant), averaged over rows where ``x[t+j+2]`` is target-generated
(loss mask) and the target's full-vocabulary top-1 is in the draft vocabulary; step weights ``decay ** j``
(0.8 in EAGLE and SpecForge). Accuracy ``acc_j`` counts every loss-masked row, so rows whose top-1 lies outside
the draft vocabulary count as misses (the drafter can never propose them when serving). Simulated acceptance
length of greedy chain drafting: ``1 + sum_j prod_{i<=j} acc_i`` (it includes the bonus token, like vLLM's
mean acceptance length).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TargetView:
    """What the loss needs from the target, per position ``t`` (for the token ``x[t+1]``).

    probs: ``[B, T, N]`` target softmax over the draft vocabulary. top: ``[B, T]`` argmax draft index.
    in_vocab: ``[B, T]`` bool, the full-vocabulary top-1 is in the draft vocabulary.
    """

    probs: torch.Tensor
    top: torch.Tensor
    in_vocab: torch.Tensor


@torch.no_grad()
def target_view(
    final_hidden: torch.Tensor,
    lm_head: torch.Tensor,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    chunk_rows: int = 512,
    in_vocab: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> TargetView:
    """Target distribution restricted to the draft vocabulary, never materialising ``[B, T, V]`` logits.

    Args:
        final_hidden: ``[B, T, H]`` target final hidden state after its final norm.
        lm_head: ``[V, H]`` the target's output head.
        d2t: ``[N]`` draft-to-target offsets; t2d: ``[V]`` bool.
        chunk_rows: rows per chunk for the full-vocabulary top-1 (``chunk_rows * V`` floats at a time).
        in_vocab: ``[B, T]`` precomputed full-vocabulary check (it is fixed per sample; the trainer caches it).
        rows: ``[N, H]`` the ``lm_head`` rows of the draft vocabulary (:func:`draft_rows`), fixed for a training
            run; gathered here when not given.

    The full-vocabulary top-1 follows the caller's autocast (the trainer runs it in bf16 where bf16 is native:
    a top-1, not a distribution); the draft-vocabulary distribution is always computed in float32.
    """
    B, T, H = final_hidden.shape
    f = final_hidden.to(lm_head.dtype)
    rows = draft_rows(lm_head, d2t) if rows is None else rows  # [N, H]
    with torch.autocast(f.device.type, enabled=False):
        logits = f @ rows.T  # [B, T, N], float32
    probs = torch.softmax(logits.float(), dim=-1)  # [B, T, N]
    if in_vocab is None:
        flat = f.reshape(B * T, H)
        top_full = torch.empty(B * T, dtype=torch.long, device=f.device)
        for s in range(0, B * T, chunk_rows):
            top_full[s : s + chunk_rows] = (flat[s : s + chunk_rows] @ lm_head.T).argmax(-1)  # [c, V] -> [c]
        in_vocab = t2d[top_full].view(B, T)
    return TargetView(probs=probs, top=logits.argmax(-1), in_vocab=in_vocab)


def greedy_mix(view: TargetView, weight: float) -> TargetView:
    """Move ``weight`` of each row's target distribution onto its top-1 draft token, in place.

    ``probs`` ``[B, T, N]`` becomes ``(1 - weight) * probs + weight * onehot(top)``: the soft cross-entropy against
    it is ``(1 - weight)`` x EAGLE-3's soft loss plus ``weight`` x the hard cross-entropy on the target's greedy
    token, the one a greedy verifier accepts. Rows whose full-vocabulary top-1 is outside the draft vocabulary are
    never in the loss, so ``top`` is the target's own greedy token wherever it counts. Why: the best
    divergence for a drafter depends on how it is verified (DistillSpec, Zhou et al., 2024, arXiv:2310.08461), and
    HASS (Zhang et al., 2024, arXiv:2408.15766) adds a loss on the target's top tokens to EAGLE's. ``weight`` 0
    leaves the view as it is.
    """
    if weight > 0:
        view.probs.mul_(1.0 - weight).scatter_add_(
            -1, view.top.unsqueeze(-1), view.probs.new_full((*view.top.shape, 1), weight))
    return view


def draft_rows(lm_head: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """``[V, H]`` target head -> ``[N, H]`` its rows of the draft vocabulary (draft id i is target id ``i + d2t[i]``)."""
    return lm_head[torch.arange(d2t.numel(), device=d2t.device) + d2t]


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """``y[:, t] = x[:, t + s]`` along dim 1, zero-padded at the end (same shape as ``x``)."""
    if s == 0:
        return x
    pad = torch.zeros_like(x[:, :s])
    return torch.cat([x[:, s:], pad], dim=1)


@dataclass
class StepStats:
    """Sums over batches for each TTT step, kept where they were computed (summable across batches and ranks).

    ``sums``: ``[4, k]`` float64 on the training device, rows loss_sum (soft-CE summed over loss rows), loss_rows
    (rows in the loss: mask and in-vocab), correct (draft top-1 == target top-1, in-vocab) and supervised
    (loss-masked rows, the accuracy denominator); ``None`` before the first batch. Adding stays on the device, so
    a training step never waits for the host; the list properties read the device once (a sync on a GPU) and are
    meant for the log interval, not the step.
    """

    sums: torch.Tensor | None = None

    @property
    def empty(self) -> bool:
        return self.sums is None

    def add(self, other: StepStats) -> None:
        if other.sums is not None:
            self.sums = other.sums.clone() if self.sums is None else self.sums + other.sums

    def as_tensor(self) -> torch.Tensor:
        """``[4, k]`` float64 on the device the sums live on (for all-reduce). Raises ValueError when empty."""
        if self.sums is None:
            raise ValueError("no TTT step has been added to these stats")
        return self.sums

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> StepStats:
        return cls(t.to(torch.float64))

    @classmethod
    def of(cls, loss_sum: list[float], loss_rows: list[float], correct: list[float],
           supervised: list[float]) -> StepStats:
        """Stats from per-step lists (each of length k), on the host."""
        return cls(torch.tensor([loss_sum, loss_rows, correct, supervised], dtype=torch.float64))

    def _rows(self) -> list[list[float]]:
        if self.sums is None:
            return [[], [], [], []]
        if getattr(self, "_host", None) is None or self._host[0] is not self.sums:
            self._host = (self.sums, self.sums.tolist())  # one device read per state of the sums
        return self._host[1]

    @property
    def loss_sum(self) -> list[float]:
        return self._rows()[0]

    @property
    def loss_rows(self) -> list[float]:
        return self._rows()[1]

    @property
    def correct(self) -> list[float]:
        return self._rows()[2]

    @property
    def supervised(self) -> list[float]:
        return self._rows()[3]

    @property
    def losses(self) -> list[float]:
        return [s / max(n, 1.0) for s, n in zip(self.loss_sum, self.loss_rows, strict=True)]

    @property
    def accs(self) -> list[float]:
        return [c / max(n, 1.0) for c, n in zip(self.correct, self.supervised, strict=True)]

    @property
    def acceptance_length(self) -> float:
        return simulated_acceptance_length(self.accs)


def simulated_acceptance_length(accs: list[float]) -> float:
    """``1 + sum_j prod_{i<=j} acc_i`` (greedy chain; includes the bonus token). Source: SpecForge; ``docs/evaluation.md``."""
    total, prod = 1.0, 1.0
    for a in accs:
        prod *= a
        total += prod
    return total


def acceptance_step_weights(accs: torch.Tensor) -> torch.Tensor:
    """TTT step weights proportional to what each step's accuracy is worth in greedy chain acceptance length.

    ``accs`` ``[k]`` per-step accuracies -> ``[k]`` weights ``w_j = dL/da_j`` of :func:`simulated_acceptance_length`
    ``L = 1 + sum_m prod_{i<=m} a_i``, i.e. ``w_j = sum_{m>=j} prod_{i<=m, i!=j} a_i``, divided by ``w_0`` so step 0
    weighs 1 as with ``decay ** j``. A later step is worth only as much as the steps before it are accepted, so the
    weights fall by about the accuracy from step to step (0.8 ** j falls much more slowly while a drafter accepts
    under half of its tokens).
    """
    k = accs.numel()
    w = torch.zeros_like(accs)
    for j in range(k):
        others = accs.clone()
        others[j] = 1.0
        w[j] = torch.cumprod(others, 0)[j:].sum()  # prod_{i<=m, i!=j} a_i summed over m >= j
    return w / w[0]


def hard_row_weights(logp: torch.Tensor, top: torch.Tensor, gamma: float) -> torch.Tensor | float:
    """Per-row loss weights ``(1 - q) ** gamma``, ``q`` the drafter's probability of the target's top-1 draft token.

    ``logp`` ``[B, T, N]`` the drafter's log-probabilities, ``top`` ``[B, T]`` the target's top-1 draft index ->
    ``[B, T]`` weights, detached (they scale each row's gradient, they are not optimised). Rows the drafter already
    gets right with confidence weigh little; rows it misses weigh up to 1: token-level reweighting of hard
    positions, the focal loss of Lin et al., 2017 (arXiv:1708.02002) applied to EAGLE's soft cross-entropy.
    ``gamma`` 0 returns ``1.0`` (no reweighting).
    """
    if not gamma:
        return 1.0
    with torch.no_grad():
        q = logp.gather(-1, top.unsqueeze(-1)).squeeze(-1).exp()  # [B, T]
        return (1.0 - q).clamp(min=0.0).pow(gamma)


def _step_weight(decay: float | torch.Tensor, j: int):
    return decay[j] if isinstance(decay, torch.Tensor) else decay**j


# Elements of one loss chunk's draft-vocabulary tensors ([B, rows, N]); 2**24 floats = 64 MiB in float32.
LOSS_CHUNK_ELEMENTS = 2**24
LOSS_MODES = ("chunked", "dense")


def ttt_loss(
    model,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden: torch.Tensor,
    lengths: torch.Tensor,
    view: TargetView,
    k: int,
    decay: float | torch.Tensor = 0.8,
    all_rows: bool = False,
    loss: str = "chunked",
    hard_row_gamma: float = 0.0,
) -> tuple[torch.Tensor, StepStats]:
    """Unroll ``k`` draft steps and return the weighted loss and per-step sums.

    Args:
        model: :class:`~draftsmith.drafter.families.eagle3.model.Eagle3Drafter` (or its DDP wrapper's ``.module``
            for ``step``).
        input_ids: ``[B, T]`` target ids (right-padded). loss_mask: ``[B, T]`` (1 = token t is target-generated).
        aux_hidden: ``[B, T, 3*H_t]``. lengths: ``[B]`` real lengths.
        view: :func:`target_view` of the same batch.
        k: unroll depth. decay: step weight base (step ``j`` weighs ``decay ** j``), or the ``[k]`` step weights
            themselves (:func:`acceptance_step_weights`).
        all_rows: put every in-range row in the loss (prompt tokens too), not only loss-masked ones; the
            returned accuracy still counts loss-masked rows only, so figures stay comparable.
        loss: ``"chunked"`` (``train.ttt_loss``' default): each step's logits, log-softmax and soft-CE are
            computed in sequence chunks of about :data:`LOSS_CHUNK_ELEMENTS` with their gradients taken at once
            (:class:`_ChunkedSoftCE`), so no ``[B, T, N]`` tensor of a step is kept for backward and nothing is
            recomputed; the target distribution is read in place, not shifted and copied per step. ``"dense"``:
            the whole step at once with its tensors kept for backward (the implementation before, the reference of
            ``tests/drafter/test_ttt_blockwise.py``).
        hard_row_gamma: token-level reweighting of hard rows (:func:`hard_row_weights`); 0 leaves every row at 1.

    Returns:
        ``(loss scalar, StepStats)``; the loss is ``sum_j decay**j * mean_rows(w * CE_j)`` (``w`` 1 unless
        ``hard_row_gamma``); the stats' loss sums are the plain soft-CE, so they compare across settings.
    """
    if loss not in LOSS_MODES:
        raise ValueError(f"ttt loss {loss!r} is not one of {LOSS_MODES}")
    B, T = input_ids.shape
    t_idx = torch.arange(T, device=input_ids.device).unsqueeze(0)  # [1, T]
    hidden = model.fuse(aux_hidden)  # [B, T, H]
    caches = model.new_caches()
    total = hidden.new_zeros(())
    per_step: list[torch.Tensor] = []  # [4] per TTT step, on the device
    lmask = loss_mask.bool()
    head = _HeadGrads(k) if loss == "chunked" and torch.is_grad_enabled() else None
    for j in range(k):
        ids_j = _shift(input_ids, j + 1)  # [B, T] token x[t+j+1]
        normed, prenorm = model.step(ids_j, hidden, j, caches)  # [B, T, H] each
        in_range = (t_idx + j + 2) < lengths.unsqueeze(1)  # [B, T]
        supervised = in_range & _shift(lmask, j + 2)  # [B, T]
        in_vocab = _shift(view.in_vocab, j + 1)  # [B, T]
        rows = (in_range if all_rows else supervised) & in_vocab  # [B, T] rows in the loss
        n_rows = rows.sum()
        if loss == "dense":
            logits = model.logits(normed).float()  # [B, T, N]
            tgt = _shift(view.probs, j + 1)  # [B, T, N]
            logp = F.log_softmax(logits, dim=-1)  # [B, T, N]
            ce = -(tgt * logp).sum(-1)  # [B, T]
            ce_sum = (ce * rows).sum()
            w = hard_row_weights(logp, _shift(view.top, j + 1), hard_row_gamma)  # [B, T]
            total = total + _step_weight(decay, j) * (ce * w * rows).sum() / n_rows.clamp(min=1)
            with torch.no_grad():
                correct = ((logits.argmax(-1) == _shift(view.top, j + 1)) & supervised & in_vocab).sum()
        else:
            weight = _step_weight(decay, j) / n_rows.clamp(min=1)
            step = _StepLoss(model, view, j, rows, supervised & in_vocab, weight, head, hard_row_gamma)
            params = head.params(model) if head is not None else []
            total = total + _ChunkedSoftCE.apply(step, normed, *params)
            ce_sum, correct = step.ce_sum, step.correct
        per_step.append(torch.stack([ce_sum.detach().double(), n_rows.double(), correct.double(),
                                     supervised.sum().double()]))
        hidden = prenorm
    return total, StepStats(torch.stack(per_step, dim=1))  # [4, k], no host read


class _HeadGrads:
    """Gradient buffers of the parameters behind ``model.logits``, shared by the ``k`` steps of one unroll.

    Each step adds ``weight_j * d(ce_sum_j)/d(param)`` in its forward; the loss is ``sum_j weight_j * ce_sum_j``
    built inside :func:`ttt_loss`, so every step's term gets the same upstream gradient ``g`` in backward and the
    first step to run backward hands out ``g *`` the sums (the others return none). A term differentiated on its
    own (a different ``g``) or a second backward through the same graph raises instead of giving wrong gradients.
    """

    def __init__(self, k: int) -> None:
        self.k, self.grads, self.g, self.seen = k, None, None, 0
        self._params: list[torch.Tensor] | None = None

    def params(self, model) -> list[torch.Tensor]:
        """The trainable parameters as the model holds them now (FSDP swaps in unsharded ones for forward)."""
        if self._params is None:
            self._params = [p for p in model.parameters() if p.requires_grad]
            self.grads = [None] * len(self._params)
        return self._params

    def add(self, grads) -> None:
        for i, g in enumerate(grads):
            if g is not None:
                self.grads[i] = g if self.grads[i] is None else self.grads[i].add_(g)

    def take(self, g: torch.Tensor) -> list[torch.Tensor | None] | None:
        """Called by each step's backward with its upstream gradient; the parameter gradients on the first call."""
        self.seen += 1
        if self.seen > self.k:
            raise RuntimeError("the chunked TTT loss cannot be backpropagated twice (set train.ttt_loss: dense)")
        if self.g is None:
            self.g = g
            grads, self.grads = self.grads, None
            return [None if t is None else t * g for t in grads]  # no host read of g (a sync on a GPU)
        # the sum's backward hands every term the same tensor, so only a foreign gradient is compared (a sync)
        if g is not self.g and not torch.equal(g, self.g):
            raise RuntimeError("the chunked TTT loss's step terms can only be differentiated through their sum")
        return None


class _StepLoss:
    """One step's inputs of :class:`_ChunkedSoftCE` and, after its forward, ``ce_sum`` and ``correct``."""

    def __init__(self, model, view: TargetView, j: int, rows: torch.Tensor, counted: torch.Tensor,
                 weight: torch.Tensor, head: _HeadGrads | None, gamma: float = 0.0) -> None:
        self.model, self.view, self.j, self.rows, self.counted = model, view, j, rows, counted
        self.weight, self.head, self.gamma = weight, head, gamma
        self.ce_sum: torch.Tensor | None = None
        self.correct: torch.Tensor | None = None


class _ChunkedSoftCE(torch.autograd.Function):
    """``weight_j * ce_sum_j`` of one TTT step, in sequence chunks, its gradients taken in forward.

    Row ``t``'s target is the view at ``t + j + 1``; rows ``t >= T - j - 1`` have none and are never in the loss
    (``t + j + 2 < length <= T`` fails), so they are skipped and the view is sliced, not shifted and copied. Per
    chunk: ``model.logits`` (so autocast and whatever the head does apply as in the dense loss), log-softmax,
    soft-CE, and ``torch.autograd.grad`` of the chunk's term for the chunk's rows of the input and the head's
    parameters: what backward would compute, done while the chunk's ``[B, c, N]`` tensors exist, so only the
    input's gradient ``[B, T, H]`` is kept (in place of the input, which the dense loss keeps) and the parameter
    gradients are summed over chunks and steps in one buffer (:class:`_HeadGrads`). The technique of fused
    linear-cross-entropy kernels (e.g. Liger Kernel, Hsu et al., 2024, arXiv:2410.10989).
    """

    @staticmethod
    def forward(ctx, step: _StepLoss, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        j, view, model = step.j, step.view, step.model
        n = max(T - j - 1, 0)  # rows with a target position
        N = view.probs.shape[-1]
        c = max(1, LOSS_CHUNK_ELEMENTS // (B * N))  # sequence positions per chunk
        grad = step.head is not None
        dx = torch.zeros_like(x) if grad else None
        ce_sum = torch.zeros((), dtype=torch.float32, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)  # the rows' weighted sum (= ce_sum unless gamma)
        correct = torch.zeros((), dtype=torch.long, device=x.device)
        for s in range(0, n, c):
            e = min(n, s + c)
            tgt, top = view.probs[:, s + j + 1 : e + j + 1], view.top[:, s + j + 1 : e + j + 1]
            with torch.set_grad_enabled(grad):
                xc = x[:, s:e].detach().requires_grad_(grad)
                logits = model.logits(xc).float()  # [B, c, N]
                logp = F.log_softmax(logits, dim=-1)
                ce = -(tgt * logp).sum(-1) * step.rows[:, s:e]  # [B, c]
                part = ce.sum()
                weighted = part if not step.gamma else (ce * hard_row_weights(logp, top, step.gamma)).sum()
                term = weighted * step.weight
            total += weighted.detach()
            correct += ((logits.detach().argmax(-1) == top) & step.counted[:, s:e]).sum()
            ce_sum += part.detach()
            if grad:
                g = torch.autograd.grad(term, [xc, *params], allow_unused=True)
                dx[:, s:e] = g[0]
                step.head.add(g[1:])
            del logits, logp, ce, part, weighted, term
        step.ce_sum, step.correct = ce_sum, correct
        ctx.step = step
        if grad:
            ctx.save_for_backward(dx)
        return step.weight * total

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        step, (dx,) = ctx.step, ctx.saved_tensors
        pgrads = step.head.take(g)
        dx = dx * g
        n_params = len(step.head.params(step.model))
        return (None, dx, *(pgrads if pgrads is not None else [None] * n_params))
