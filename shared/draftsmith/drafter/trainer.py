"""The training loop: AdamW (or Muon + AdamW) + cosine warm-up, accumulation, clipping, DDP/FSDP, checkpoints, held-out evaluation.

Run under ``torchrun`` for data parallelism (gloo on CPU, NCCL on GPU): each rank takes every ``world``-th
micro-batch of the same deterministic, length-bucketed order. ``train.parallel=ddp`` replicates the drafter;
``fsdp`` applies PyTorch's FSDP2 ``fully_shard`` to the whole TTT objective as one unit, so weights, gradients and
AdamW state live sharded between steps and are gathered for each micro-batch (the TTT unroll calls the decoder
layer k times, so finer units would gather it k times). Ranks stay in lockstep: a micro-batch that has to be
skipped (NaN features) is replaced by a stand-in whose loss is multiplied by 0. Prints one fixed-format progress line
per ``train.log_every`` steps, mirrors it as Prometheus metrics (``draftsmith.metrics`` training section) and as
``runs/<run>/status/train.json``. Everything is validated before the first write (NaN features: SpecForge
#104; full-vocabulary logits: SpecForge #466; resume: SpecForge PRs 243/496/587; ``docs/training.md``).
"""

from __future__ import annotations

import itertools
import time
from contextlib import closing, nullcontext
from typing import Any

import torch
from torch import nn

from draftsmith.allocator import keep_freed_memory_for
from draftsmith.artifacts.checkpoint_store import checkpoint_store
from draftsmith.artifacts.checkpoints import CheckpointStore
from draftsmith.artifacts.status import write_snapshot
from draftsmith.drafter.checkpoint import (
    full_model_state,
    full_optimizer_state,
    load_model_weights,
    load_optimizer_state,
    model_state,
    read_state,
    save_checkpoint,
)
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.curve import add_point, curve_point, curve_steps, seen
from draftsmith.drafter.data import (
    FeatureSource,
    OfflineFeatures,
    StreamedFeatures,
    TrainSamples,
    make_batches,
    usable_split,
)
from draftsmith.drafter.distributed import all_sum, setup_distributed
from draftsmith.drafter.families import state_of_family, usable_family
from draftsmith.drafter.flops import mfu, peak_flops, train_flops_per_token
from draftsmith.drafter.load import fit_to_pretrained, load_pretrained
from draftsmith.drafter.loader import HostBatch, host_batch, read_ahead, shared_memory_workers
from draftsmith.drafter.optimizer import LRSchedule, Optimizers, lr_lambda
from draftsmith.drafter.progress import StepTiming, peak_memory_gb, progress_line, set_train_metrics
from draftsmith.drafter.target_top1 import TargetTop1
from draftsmith.drafter.ttt import StepStats, greedy_mix, target_view
from draftsmith.drafter.ttt_attention import set_ttt_attention
from draftsmith.drafter.vocab import init_from_target, load_draft_vocab, mapping_hash
from draftsmith.errors import DataError, Interrupted, TrainingError
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.precision import native_bf16
from draftsmith.signals import StopRequest
from draftsmith.target.checkpoint import target_checkpoint

log = get_logger(__name__)


class Trainer:
    """Build everything from the settings (validating inputs first), then :meth:`run`; ``checkpoints``: the run's
    :class:`CheckpointStore` (default: that of ``runs_dir/run``; a run on an object store passes its URL's).

    Raises (from the constructor):
        DataError: missing/empty data, features of another target or data, a missing draft vocabulary.
        ModelError: bad target folder, pretrained drafter or checkpoint that does not fit.
        TrainingError: a resume state that does not match this run (another draft vocabulary).
    """

    def __init__(self, settings, features: FeatureSource | None = None,
                 checkpoints: CheckpointStore | None = None) -> None:
        self.s, self.tc, self.paths = settings, settings.train, RunPaths(settings.runs_dir, settings.run)
        self.checkpoints = checkpoints or checkpoint_store(self.paths.root, settings.stage_dir)
        self.dist = setup_distributed(self.tc.device)
        torch.manual_seed(self.tc.seed)
        self.target_path = str(target_checkpoint(settings))
        self.samples = TrainSamples(self.paths.data)
        self.features = features or self._feature_source()
        self.vocab_size = self.tc.draft_vocab_size or settings.data.draft_vocab_size
        self.family = usable_family(settings, self.features)  # train.family's model and objective, or refused
        self.d2t, self.t2d, _ = load_draft_vocab(self.paths.data, self.vocab_size)
        self.vocab_hash = mapping_hash(self.d2t)
        layer_ids = self.tc.layer_ids or self.features.layer_ids
        if list(layer_ids) != list(self.features.layer_ids):
            raise DataError(f"train.layer_ids {layer_ids} differ from the features' {self.features.layer_ids}",
                            "re-extract features with these layers or drop train.layer_ids")
        self.cfg = derive_config(self.target_path, self.vocab_size, layer_ids, self.tc.num_layers,
                                 self.tc.norm_before_residual, self.tc.fc_norm, self.tc.norm_before_fc,
                                 self.tc.norm_output)
        if self.features.hidden_size != self.cfg.target_hidden_size:
            raise DataError(f"features have hidden size {self.features.hidden_size}, the target "
                            f"{self.cfg.target_hidden_size}", "the features come from another target; re-extract")
        if self.tc.init_from:
            self.cfg = fit_to_pretrained(self.cfg, self.tc.init_from, self.tc.init_rope)
        self.model = self.family.build_model(self.cfg, self.target_path)
        self.lm_head = init_from_target(self.model, self.target_path, self.d2t, self.t2d, self.tc.lm_head_init,
                                        self.tc.norm_init)
        if self.tc.init_from:
            load_pretrained(self.model, self.tc.init_from, remap=self.tc.remap_vocab, rope=self.tc.init_rope,
                            min_overlap=self.tc.remap_min_overlap)
        if self.tc.freeze_lm_head:  # EAGLE-1's choice: the target's own head reads the drafter's state
            self.model.lm_head.weight.requires_grad_(False)
        self._resume_at, self.curve = (0, 0, 0), []  # step, epoch, micro-batch position; drafter/curve.py
        ckpt = self.checkpoints.latest() if self.tc.resume else None
        if ckpt is not None:
            self._resume_weights(ckpt)  # before sharding: the file holds whole tensors
        self.model.to(self.dist.device)
        self.lm_head = self.lm_head.to(self.dist.device)
        split = usable_split(self.samples, self.features, self.tc.eval_fraction)
        self.train_ids, self.held_ids, self.extract_skipped = split
        self.lengths = {i: self.samples.samples[i].input_ids.numel() for i in self.train_ids}
        mean_len = sum(self.lengths.values()) / max(len(self.lengths), 1)
        self._flops_per_token = train_flops_per_token(self.cfg, int(mean_len), self.tc.ttt_steps)
        self._peak_flops = peak_flops(str(self.dist.device), self.tc.peak_tflops)
        self._batch_tokens = 0
        # glibc: no mmap/munmap per step for short micro-batches, its defaults for long ones (draftsmith.allocator)
        keep_freed_memory_for(min(self.tc.batch_tokens, self.tc.batch_size * max(self.lengths.values(), default=0)))
        set_ttt_attention(self.model, self.tc.ttt_attention)
        self.objective = self.family.objective(self.model, self.tc)
        self.ddp = self.objective
        self.sharded = self.dist.world > 1 and self.tc.parallel == "fsdp"
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.objective)  # in place: self.model's parameters become DTensor shards
        elif self.dist.world > 1:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.objective, device_ids=[self.dist.device] if self.dist.device.type == "cuda" else None)
        self._standin_batch: dict[str, torch.Tensor] | None = None
        self.top1 = TargetTop1(self.lm_head, self.model)
        self.opt = Optimizers(self.model, self.tc)
        per_epoch = len(self._rank_batches(0)) // self.tc.grad_accum
        if per_epoch == 0:
            raise DataError("fewer micro-batches per rank than train.grad_accum", "lower grad_accum or batch size")
        self.steps_per_epoch, self.total_steps = per_epoch, self.tc.max_steps or per_epoch * self.tc.epochs
        warm = int(self.tc.warmup_ratio * self.total_steps)
        self.sched = LRSchedule(self.opt, lr_lambda(self.total_steps, warm, self.tc.min_lr_ratio))
        self.step, self.epoch, self.position = self._resume_at
        self.nan_features = 0
        if ckpt is not None:
            load_optimizer_state(ckpt, self.model, self.opt, self.sched)
            log.info("resumed from %s: step %d, epoch %d, micro-batch %d", ckpt.name, self.step, self.epoch,
                     self.position)

    def _feature_source(self) -> FeatureSource:
        if self.tc.features == "stream":
            return StreamedFeatures(self.s, self.paths.root, self.samples)
        src = OfflineFeatures(self.paths.features)
        want = self.samples.target_model
        if want and src.target_model and want != src.target_model:
            raise DataError(f"features come from target {src.target_model!r}, the data from {want!r}",
                            "re-run `draftsmith extract` for this run's target")
        return src

    def _resume_weights(self, ckpt) -> None:
        """Check ``ckpt`` belongs to this run, load its weights and position (optimizer state comes later)."""
        state = state_of_family(read_state(ckpt), self.tc.family, ckpt.name)  # a checkpoint of another family: refused
        if state.get("vocab_hash") not in (None, self.vocab_hash):
            raise TrainingError(f"checkpoint {ckpt.name} was trained with another draft vocabulary",
                                "train into a new run, or set train.resume=false to start over in this one")
        load_model_weights(self.model, ckpt)
        self._resume_at, self.curve = (state["step"], state["epoch"], state["position"]), state.get("learning_curve", [])

    def close(self) -> None:
        """Leave the torchrun process group together: a barrier, then its teardown (no-op on one process).

        A rank that tears gloo down while its peer is still writing files aborted at exit here ("terminate called
        without an active exception", SIGABRT) about one time in three on a loaded 2-core machine, and torchrun
        then reports the whole finished run as failed."""
        if self.dist.world > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def weights(self) -> dict[str, torch.Tensor]:
        """The drafter's stored weights (:func:`model_state`), whole even under FSDP (collective there: every rank
        calls it, rank 0 receives the tensors)."""
        if self.sharded:
            return model_state(self.model, full_model_state(self.model))
        return model_state(self.model)

    def _standin(self) -> dict[str, torch.Tensor]:
        """A valid micro-batch run in place of a skipped one so that every rank joins the same collectives."""
        if self._standin_batch is None:
            for sid in self.train_ids:
                self._standin_batch = self._batch([sid])
                if self._standin_batch is not None:
                    break
            else:
                raise DataError("no training sample has finite features", "re-extract the features")
        return self._standin_batch

    def _sync(self, last: bool):
        """Context of one micro-batch's backward: gradients are reduced across ranks on the last one only."""
        if self.sharded:
            self.objective.set_requires_gradient_sync(last)
        elif self.dist.world > 1 and not last:
            return self.ddp.no_sync()
        return nullcontext()

    def _rank_batches(self, epoch: int) -> list[list[str]]:
        b = make_batches(self.lengths, self.tc.batch_tokens, self.tc.batch_size, self.tc.seed, epoch)
        n = len(b) // self.dist.world * self.dist.world  # every rank gets the same count (DDP needs lockstep)
        return b[self.dist.rank : n : self.dist.world]

    def _batch(self, ids: list[str]) -> dict[str, torch.Tensor] | None:
        """One micro-batch read in this process and moved to the device (held-out passes, stand-ins)."""
        return self._on_device(host_batch(self.samples, self.features, ids))

    def _on_device(self, hb: HostBatch) -> dict[str, torch.Tensor] | None:
        """A :class:`HostBatch` on the training device with its ``in_vocab``; ``None`` when no sample was kept."""
        if hb.skipped:
            self.nan_features += hb.skipped
            log.warning("skipped %d sample(s) with NaN/Inf features (%d so far)", hb.skipped, self.nan_features)
        if hb.tensors is None:
            return None
        self._batch_tokens = hb.tokens  # counted on the host, before the batch moves to the device
        b = {k: v.to(self.dist.device, non_blocking=True) for k, v in hb.tensors.items()}
        with self._autocast():  # a top-1 over the whole vocabulary: bf16 where it is native
            b["in_vocab"] = self.top1.in_vocab(hb.kept, b["final"], b["lengths"]).to(self.dist.device)
        return b

    def _reader(self, batches: list[list[str]]):
        """:func:`read_ahead` over this rank's next micro-batches (stored features only: a streamed source holds
        the target model in this process)."""
        workers = self.tc.loader_workers if isinstance(self.features, OfflineFeatures) else 0
        if workers and not hasattr(self, "_workers_fit"):  # float32 aux [T, 3H] + final [T, H] per padded token
            self._workers_fit = shared_memory_workers(workers, self.tc.batch_tokens * 4 * 4 * self.features.hidden_size)
        workers = min(workers, getattr(self, "_workers_fit", workers))
        return read_ahead(self.samples, self.features, batches, workers, pin=self.dist.device.type == "cuda")

    @property
    def precision(self) -> str:
        """``"bf16"`` (autocast) or ``"fp32"``: ``train.precision``, with ``auto`` resolved by :mod:`draftsmith.precision`."""
        bf16 = self.tc.precision == "bf16" or (self.tc.precision == "auto" and native_bf16(self.dist.device))
        return "bf16" if bf16 else "fp32"

    def _autocast(self):
        return torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def _forward(self, batch, module) -> tuple[torch.Tensor, StepStats]:
        view = target_view(batch["final"], self.lm_head, self.model.d2t, self.model.t2d, in_vocab=batch["in_vocab"],
                           rows=self.top1.rows)
        if self.objective.training:  # held-out losses stay the soft cross-entropy, comparable across settings
            greedy_mix(view, self.tc.greedy_target_weight)
        with self._autocast():
            return module(batch, view)

    @torch.no_grad()
    def evaluate(self) -> StepStats:
        """TTT loss/accuracy on the held-out split (summed over ranks)."""
        self.objective.eval()
        total = StepStats()
        mine = self.held_ids[self.dist.rank :: self.dist.world]
        per_rank = -(-len(self.held_ids) // self.dist.world)  # every rank runs as many batches (FSDP gathers)
        for s in range(0, per_rank, self.tc.batch_size):
            ids = mine[s : s + self.tc.batch_size]
            batch = self._batch(ids) if ids else None
            if batch is not None:
                total.add(self._forward(batch, self.objective)[1])
            elif self.sharded:
                self._forward(self._standin(), self.objective)
        self.objective.train()
        return StepStats.from_tensor(all_sum(self._sums(total), self.dist))

    def _held_out(self, train: StepStats) -> StepStats:
        """:meth:`evaluate`, kept as a point of the learning curve (:mod:`draftsmith.drafter.curve`)."""
        t0, held = time.time(), self.evaluate()
        done = seen(self.lengths, self.tc, self.dist.world, self.epoch, self.position)
        add_point(self.curve, curve_point(self.step, self.epoch, *done, held, train, time.time() - t0))
        return held

    def _sums(self, stats: StepStats) -> torch.Tensor:
        """``[4, k]`` of ``stats``, zeros when no batch was added (every rank joins the all-reduce)."""
        if stats.empty:
            return torch.zeros(4, self.tc.ttt_steps, dtype=torch.float64, device=self.dist.device)
        return stats.as_tensor()

    def _save(self) -> None:
        full_model = full_model_state(self.model) if self.sharded else None  # collectives under FSDP:
        full_optim = full_optimizer_state(self.model, self.opt)  # every rank calls them
        if self.dist.main:
            from draftsmith import metrics

            save_checkpoint(self.checkpoints, model_state(self.model, full_model), full_optim, self.sched, {
                "step": self.step, "epoch": self.epoch, "position": self.position, "learning_curve": self.curve,
                "config": self.s.model_dump(mode="json"), "drafter": self.cfg.to_dict(),
                "vocab_hash": self.vocab_hash, "target": self.target_path}, self.tc.keep)
            metrics.TRAIN_CHECKPOINTS.labels(self.s.run).inc()
        if self.dist.world > 1:
            torch.distributed.barrier()

    def _report(
        self, interval: StepStats, tokens: float, t_int: float, t0: float, held: StepStats | None, line: bool = True,
        timing: StepTiming | None = None,
    ) -> None:
        lr = self.sched.get_last_lr()[-1]  # AdamW's (every recipe has it)
        tps = tokens / max(t_int, 1e-9)
        if timing is not None and timing.mfu is None and tps:
            timing.mfu = mfu(tps, self._flops_per_token, self.dist.world, self._peak_flops)
        text = progress_line(self.step, self.total_steps, self.epoch, interval, lr, tps, time.time() - t0, timing)
        if self.dist.main and line:
            log.info(text)
        set_train_metrics(self.s.run, self.step, self.epoch, lr, tps, interval, held)
        if self.dist.main:
            done = not line  # the closing report after the last step
            write_snapshot(
                self.paths.root, "train", "done" if done else "running",
                text + ("" if held is None else f" | held-out accept_len {held.acceptance_length:.3f}"),
                step=self.step, total_steps=self.total_steps, epoch=self.epoch, lr=lr, tokens_per_s=tps,
                elapsed_s=time.time() - t0, precision=self.precision,
                train={"loss": interval.losses, "acc": interval.accs, "accept_len": interval.acceptance_length},
                heldout=None if held is None else {"loss": held.losses, "acc": held.accs,
                                                   "accept_len": held.acceptance_length},
                nan_feature_samples=self.nan_features, extract_skipped_samples=self.extract_skipped)

    def run(self, stop_at: int | None = None) -> dict[str, Any]:
        """Train until ``max_steps`` or the last epoch; returns the final train / held-out figures.

        ``stop_at`` ends the loop after that optimizer step without the final checkpoint or evaluation (it
        simulates a crash; tests use it to prove exact resume).

        SIGINT, SIGTERM or SIGHUP stop it at the end of the current optimizer step: that step is saved as a
        checkpoint (resumed exactly by the next run) and :class:`Interrupted` is raised; a second signal stops at once.

        Raises:
            TrainingError: a NaN or Inf loss or gradient (the last good checkpoint is kept, nothing is saved).
            Interrupted: a signal stopped training; the checkpoint of the last finished step is saved.
        """
        with StopRequest() as stop:
            return self._run(stop, stop_at)

    def _stop_agreed(self, stop) -> bool:
        """Whether a stop signal reached this process (any rank under DDP/FSDP: every rank stops at the same step)."""
        if self.dist.world == 1:
            return stop.requested
        flag = torch.tensor([1.0 if stop.requested else 0.0], device=self.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _interrupted(self, stop, saved: bool) -> Interrupted:
        """Save the finished step (unless it was just saved) and build the one line the CLI prints."""
        import signal

        if not saved:
            self._save()
        signum = stop.signum or signal.SIGTERM  # another rank's signal under DDP
        ckpt = self.checkpoints.latest()
        return Interrupted(f"checkpoint {ckpt.name if ckpt else '?'} (step {self.step}/{self.total_steps}) in "
                           f"{self.checkpoints.folder}",
                           f"run `draftsmith train --run {self.s.run}` again to resume from it", signum=int(signum))

    def _run(self, stop, stop_at: int | None) -> dict[str, Any]:
        from draftsmith import metrics

        tc, t0 = self.tc, time.time()
        curve_at = curve_steps(self.total_steps, tc.curve_fractions, tc.eval_every)  # drafter/curve.py
        self.objective.train()
        interval, tokens, t_int = StepStats(), 0.0, time.time()
        last_gnorm, steps_in_interval = torch.zeros(()), 0
        run_tokens = 0.0  # this process's tokens: the closing report's tok/s is their average rate
        held = None
        last_train = StepStats()
        while self.step < self.total_steps:
            batches = self._rank_batches(self.epoch)
            usable = len(batches) // tc.grad_accum * tc.grad_accum
            with closing(self._reader(batches[self.position : usable])) as reader:
                while self.position < usable and self.step < self.total_steps:
                    group = batches[self.position : self.position + tc.grad_accum]
                    bad_loss = torch.zeros((), dtype=torch.bool, device=self.dist.device)
                    for m, hb in enumerate(itertools.islice(reader, len(group))):
                        batch, scale = self._on_device(hb), 1.0
                        if batch is None and self.dist.world > 1:
                            batch, scale = self._standin(), 0.0  # keeps the ranks in step, adds no gradient
                        with self._sync(m == len(group) - 1):
                            if batch is None:
                                continue
                            loss, st = self._forward(batch, self.ddp)
                            # kept on the device: read with the gradient norm, once per optimizer step
                            bad_loss = bad_loss | ~torch.isfinite(loss.detach())
                            (loss * scale / tc.grad_accum).backward()
                        if not scale:
                            continue
                        interval.add(st)
                        n_tok = float(self._batch_tokens)  # counted on the host when the batch was built
                        tokens += n_tok
                        run_tokens += n_tok
                        metrics.TRAIN_TOKENS.labels(self.s.run).inc(n_tok)
                    gnorm = torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), tc.grad_clip)
                    gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm  # FSDP: a DTensor
                    # a NaN or Inf must stop before it reaches the weights: this guard is the one read of the device
                    # per optimizer step (a NaN loss makes a NaN gradient; every figure of the progress line is read
                    # once per log interval instead)
                    if not bool(torch.isfinite(gnorm) & ~bad_loss):
                        what = "loss is nan or inf" if bool(bad_loss) else f"gradient norm is {gnorm.item()}"
                        raise TrainingError(f"{what} at step {self.step}",
                                            "the last good checkpoint is kept; lower train.lr or check features")
                    last_gnorm = gnorm.detach()
                    steps_in_interval += 1
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad()
                    self.step += 1
                    self.position += len(group)
                    if self.held_ids and (self.step % tc.eval_every == 0 or self.step in curve_at):
                        held = self._held_out(last_train)
                    if self.step % tc.log_every == 0 or self.step == self.total_steps:
                        red = StepStats.from_tensor(all_sum(self._sums(interval), self.dist))
                        gn = float(last_gnorm)
                        metrics.TRAIN_GRAD_NORM.labels(self.s.run).set(gn)
                        timing = StepTiming(grad_norm=gn, step_s=(time.time() - t_int) / max(steps_in_interval, 1),
                                            peak_gb=peak_memory_gb(self.dist.device))
                        self._report(red, tokens * self.dist.world, time.time() - t_int, t0, held, timing=timing)
                        last_train, interval, tokens, t_int = red, StepStats(), 0.0, time.time()
                        steps_in_interval = 0
                    saved = self.step % tc.save_every == 0 and self.step < self.total_steps
                    if saved:
                        self._save()
                    if stop_at is not None and self.step >= stop_at:
                        return {"step": self.step, "stopped": True}
                    if self.step < self.total_steps and self._stop_agreed(stop):
                        raise self._interrupted(stop, saved)
            if self.position >= usable:
                self.epoch, self.position = self.epoch + 1, 0
            if tc.max_steps is None and self.epoch >= tc.epochs:
                break
        if not interval.empty:
            last_train = StepStats.from_tensor(all_sum(self._sums(interval), self.dist))
        train_s = time.time() - t0  # before the held-out pass, which moves no training tokens
        held = self._held_out(last_train) if self.held_ids else None
        self._report(last_train, run_tokens * self.dist.world, train_s, t0, held, line=False)
        if self.dist.main and held is not None:
            log.info("held-out: loss %s acc %s accept_len %.3f", "/".join(f"{x:.3f}" for x in held.losses),
                     "/".join(f"{x:.3f}" for x in held.accs), held.acceptance_length)
        self._save()
        return {"step": self.step, "epoch": self.epoch, "extract_skipped_samples": self.extract_skipped,
                "nan_feature_samples": self.nan_features,
                "train": {"loss": last_train.losses, "acc": last_train.accs,
                          "accept_len": None if last_train.empty else last_train.acceptance_length},
                "heldout": None if held is None else {"loss": held.losses, "acc": held.accs,
                                                      "accept_len": held.acceptance_length},
                "checkpoint": str(self.checkpoints.latest())}
