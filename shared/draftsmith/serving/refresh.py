"""``draftsmith refresh``: a new drafter version from captured traffic, continued from the serving one, then tried on
the canary (``docs/serving.md``, "Refresh").

One cycle, under the run's refresh lock (:class:`~draftsmith.serving.canary_lock.TrialLock` named ``refresh``: two
loops on one run refuse each other):

1. Decide (:mod:`draftsmith.serving.refresh_trigger`): enough answered traffic records since the serving version's
   data, or the stable engine's live acceptance below ``refresh.acceptance_floor``.
2. Build data over every record of the run (the generated ones the serving version was trained on plus the captured
   traffic: that is the mix that keeps it from forgetting) into a work folder of its own,
   ``runs/<run>/refresh/<cycle>/`` (``data``, ``features``, ``checkpoints``, ``export``). Captured prompts without
   an answer are counted and skipped, not regenerated (build-data counts them as ``record_error:unanswered``).
3. Extract, train with ``train.init_from`` = the serving version's folder (continuing from the serving drafter),
   export.
4. Check the export fits the target, copy it into the next version with its provenance (the work folder's data
   manifest, the run's records manifest, the cutoff and counts of the records it took, the version it continued
   from), then the canary (:func:`draftsmith.serving.canary.run_canary`) promotes or rolls it back.

Nothing before step 4's canary touches ``drafters/serving.json`` or the routes, so a cycle that fails or is killed
at any stage leaves the serving drafter serving; its work folder stays for inspection, and its lock is released (or
expires ``refresh.lock_timeout_s`` after a kill).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from draftsmith.artifacts.checkpoint_store import checkpoint_store
from draftsmith.artifacts.checkpoints import read_state
from draftsmith.artifacts.export import EAGLE3, layout_dir
from draftsmith.config import Settings
from draftsmith.data.build import build_data
from draftsmith.drafter.families import family_of_state, get_family
from draftsmith.errors import ConfigError, DraftsmithError, Interrupted
from draftsmith.evaluation.checks import check_drafter_fits
from draftsmith.evaluation.runner import VLLMClient
from draftsmith.evaluation.vllm_metrics import SpecCounters
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.serving.canary import Outcome, run_canary
from draftsmith.serving.canary_lock import TrialLock
from draftsmith.serving.refresh_trigger import (
    Trigger,
    count_traffic,
    data_cutoff,
    decide_refresh,
    live_acceptance,
)
from draftsmith.serving.routes import read_routes
from draftsmith.serving.versions import add_version, get_version, read_serving
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.server import resolve_model

log = get_logger(__name__)

WORK_DIR = "refresh"  # runs/<run>/refresh/<cycle>/: each cycle's data, features, checkpoints and export


class RefreshBusy(DraftsmithError):
    """Another refresh loop holds the run's refresh lock."""


@dataclass
class CycleResult:
    """One cycle: the trigger it decided on, and when it refreshed, the version made and the canary's outcome."""

    trigger: Trigger
    version: str | None = None
    outcome: Outcome | None = None
    work_dir: Path | None = None


class LiveAcceptance:
    """The stable engine's acceptance between two reads of its counters (the first read: since it started)."""

    def __init__(self) -> None:
        self._last: dict[str, SpecCounters] = {}

    def read(self, s: Settings, url: str) -> float | None:
        """Mean acceptance length on ``url`` since the last read, None when it cannot be read or too few drafts."""
        try:
            now = VLLMClient(url, resolve_model(url, s.target.model), 30.0).counters()
        except Exception as e:  # an engine that does not answer: the traffic count alone decides
            log.warning("refresh: could not read the stable engine's counters at %s: %s", url, e)
            return None
        before = self._last.get(url, SpecCounters(has_spec=now.has_spec))
        self._last[url] = now
        return live_acceptance(now - before, s.refresh.min_drafts)


STAGES = ("idle", "build", "extract", "train", "canary")  # the values of draftsmith_refresh_stage's stage label


@contextmanager
def stage(run: str, name: str):
    """Mark ``name`` as the run's refresh stage on ``/metrics`` while the block runs, record its seconds, and mark
    the loop idle after it (whether the block ended or raised)."""
    from draftsmith.metrics import REFRESH_STAGE, REFRESH_STAGE_SECONDS

    for st in STAGES:
        REFRESH_STAGE.labels(run, st).set(1 if st == name else 0)
    t0 = time.monotonic()
    try:
        yield
    finally:
        REFRESH_STAGE_SECONDS.labels(run, name).set(time.monotonic() - t0)
        for st in STAGES:
            REFRESH_STAGE.labels(run, st).set(1 if st == "idle" else 0)


def work_settings(s: Settings, work_root: Path, init_from: Path) -> Settings:
    """The settings a cycle's stages run with: the work folder as the run, training continued from ``init_from``
    (a fresh training, not a resume), the refresh's length when set, the draft vocabulary the data builds."""
    train = {"init_from": str(init_from), "resume": False, "draft_vocab_size": s.data.draft_vocab_size}
    if s.refresh.max_steps:
        train["max_steps"] = s.refresh.max_steps
    return s.model_copy(update={"runs_dir": Path(work_root.parent), "run": work_root.name,
                                "train": s.train.model_copy(update=train)})


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def build_stage(s: Settings, w: Settings, records: Path) -> dict[str, Any]:
    """Build data over every record of the run into the work folder; returns the build's stats.

    Raises:
        DataError: as :func:`draftsmith.data.build.build_data` (no records, a record of another model, ...).
    """
    work = RunPaths(w.runs_dir, w.run)
    tok = Path(s.data.tokenizer).expanduser() if s.data.tokenizer else target_checkpoint(s)
    res = build_data(records, work.data, tok, w.data, s.target.model or tok.name,
                     config_dump=w.model_dump(mode="json"), trust_remote_code=s.target.trust_remote_code)
    st = res.stats
    if st.get("dropped_by_reason", {}).get("record_error:unanswered"):
        log.info("refresh: %d captured prompts without an answer skipped (not regenerated)",
                 st["dropped_by_reason"]["record_error:unanswered"])
    return st


def extract_stage(w: Settings) -> None:
    """Extract every data shard of the work folder in this process (the stage's own functions, as ``extract
    --sync``).

    Raises:
        DataError / ModelError / StorageError: as :func:`draftsmith.features.jobs.extract_into_store`.
    """
    from draftsmith.features.jobs import extract_into_store
    from draftsmith.features.on_store import feature_store, plan_of
    from draftsmith.features.store import check_compatible

    work = RunPaths(w.runs_dir, w.run)
    store = feature_store(work.root, w.stage_dir)
    plan = plan_of(store, w)
    check_compatible(plan)
    work.ensure(work.features, work.status)
    store.rebuild_manifest(plan.manifest_header())
    done = store.done_shards()
    for i in range(len(plan.shards)):
        if i not in done:
            extract_into_store(w, store, plan, i)
    store.rebuild_manifest(plan.manifest_header())


def train_export_stage(w: Settings) -> Path:
    """Train in the work folder (from ``train.init_from``) and export its latest checkpoint as EAGLE-3; returns the
    export folder.

    Raises:
        DataError / ModelError: as :class:`draftsmith.drafter.trainer.Trainer` and the family's export.
    """
    from draftsmith.drafter.trainer import Trainer

    work = RunPaths(w.runs_dir, w.run)
    checkpoints = checkpoint_store(work.root, w.stage_dir)
    trainer = Trainer(w, checkpoints=checkpoints)
    result = trainer.run()
    trainer.close()
    ckpt = checkpoints.resolve(None)
    family = get_family(family_of_state(read_state(ckpt)))
    family.export_checkpoint(ckpt, str(target_checkpoint(w)), work.export, EAGLE3, w.export.speculative_tokens)
    log.info("refresh: trained %s steps from %s -> %s", result.get("step"), w.train.init_from, work.export)
    return layout_dir(work.export, EAGLE3)


def check_trigger(s: Settings, client: redis.Redis, live: LiveAcceptance | None = None) -> Trigger:
    """The trigger decision for the run now (:func:`~draftsmith.serving.refresh_trigger.decide_refresh`).

    Raises:
        ConfigError: no version serves the run (``drafters/serving.json``) or it has no routes.
    """
    paths = RunPaths(s.runs_dir, s.run)
    serving = read_serving(paths.root)
    routes = read_routes(client, s.redis.prefix, s.run)
    if serving is None or routes is None:
        raise ConfigError(f"run {s.run} has no serving drafter version or no routes: a refresh continues from the "
                          "serving version", "serve a version first (`draftsmith canary ... --stable-url URL "
                          "--stable-version v1`)")
    since = data_cutoff(get_version(paths.root, serving["version"]).provenance)
    acceptance = live.read(s, routes.stable) if live is not None and s.refresh.acceptance_floor else None
    return decide_refresh(s.refresh, count_traffic(paths.records, since), acceptance)


def refresh_cycle(s: Settings, client: redis.Redis | None = None, live: LiveAcceptance | None = None,
                  force: bool = False) -> CycleResult:
    """Check the trigger and, when it says so (or ``force``), make and try a new version (module docstring).

    Args:
        s: settings (``refresh``, ``data``, ``extract``, ``train``, ``export``, ``canary``, ``target``, ``redis``).
        client: Redis client for the routes and locks (default: ``redis.url``).
        live: the live acceptance reader kept across a watch loop's cycles (None: acceptance not read).
        force: refresh whatever the trigger says.

    Returns:
        :class:`CycleResult`; when the canary promoted, ``outcome.engine`` serves the stable route and the caller
        must keep it running.

    Raises:
        RefreshBusy: another loop holds the run's refresh lock.
        ConfigError: nothing serves the run.
        DataError / ModelError / EngineError / CanaryBusy: a stage failed (serving.json and the routes untouched).
    """
    client = client or redis.Redis.from_url(s.redis.url)
    with TrialLock(client, s.redis.prefix, s.run, s.refresh.lock_timeout_s, name="refresh", busy=RefreshBusy,
                   holder="refresh loop"):
        trigger = check_trigger(s, client, live)
        log.info("refresh %s: %s", s.run, trigger.line())
        if not (trigger.refresh or force):
            return CycleResult(trigger)
        paths = RunPaths(s.runs_dir, s.run)
        serving = get_version(paths.root, read_serving(paths.root)["version"])
        cutoff, records_digest = time.time(), _digest(paths.records_manifest)  # what build-data reads next
        work_root = paths.root / WORK_DIR / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(cutoff))}-from-{serving.name}"
        w = work_settings(s, work_root, serving.path)
        from draftsmith.metrics import REFRESH_CYCLES

        try:
            with stage(s.run, "build"):
                stats = build_stage(s, w, paths.records)
            with stage(s.run, "extract"):
                extract_stage(w)
            with stage(s.run, "train"):
                export = train_export_stage(w)
            version = new_version(s, paths, export, {
                "made_by": "draftsmith refresh", "from_version": serving.name, "trigger": trigger.reason,
                "records_cutoff": cutoff, "records_manifest_sha256": records_digest,
                "records": {"traffic_answered": trigger.traffic.answered,
                            "traffic_unanswered": trigger.traffic.unanswered, "samples": stats.get("samples"),
                            "dropped_by_reason": stats.get("dropped_by_reason")},
                "work_dir": str(work_root)})
            with stage(s.run, "canary"):
                outcome = run_canary(s, version, client)
        except Exception:
            REFRESH_CYCLES.labels(s.run, "failed").inc()
            raise
        REFRESH_CYCLES.labels(s.run, "promoted" if outcome.engine is not None else "rolled_back").inc()
        return CycleResult(trigger, version, outcome, work_root)


def new_version(s: Settings, paths: RunPaths, export: Path, extra: dict[str, Any]) -> str:
    """Refuse an export that does not fit the target (before it becomes a version or reaches the canary), then
    copy it into the run's next version with ``extra`` in its provenance; returns the version's name.

    Raises:
        ModelError: the export is missing files or was made for another target (the evaluator's checks).
    """
    check_drafter_fits(target_checkpoint(s), export)
    return add_version(paths, export, extra).name


class Loop:
    """The watch mode: a cycle every ``refresh.poll_s``; the engine a promotion hands over is kept serving, and the
    one it replaced (when this loop started it) is stopped ``refresh.drain_s`` later, once the gateway has moved
    and the requests on it have ended. Every engine it holds is stopped when the loop ends. ``run_settings`` (the
    CLI's: the run's recorded data, extraction and training settings, ``runs/<run>/run-settings.json``) is applied
    before each cycle, so that a loop started in another container refreshes with the run's recipe."""

    def __init__(self, s: Settings, client: redis.Redis | None = None,
                 run_settings: Callable[[Settings], Settings] | None = None) -> None:
        self.s = s
        self.run_settings = run_settings  # the run's recorded settings taken into ``s`` before each cycle
        self.client = client or redis.Redis.from_url(s.redis.url)
        self.live = LiveAcceptance()
        self.engine = None  # the promoted engine this loop keeps serving
        self._retiring: list[tuple[float, Any]] = []  # (stop after, engine)

    def cycle(self, force: bool = False) -> CycleResult:
        """One cycle (:func:`refresh_cycle`); a promotion's engine is kept, the one it replaced retired."""
        s = self.run_settings(self.s) if self.run_settings else self.s
        result = refresh_cycle(s, self.client, self.live, force)
        if result.outcome is not None and result.outcome.engine is not None:
            if self.engine is not None:
                self._retiring.append((time.monotonic() + self.s.refresh.drain_s, self.engine))
            self.engine = result.outcome.engine
        self.retire()
        return result

    def retire(self, now: float | None = None) -> None:
        """Stop the replaced engines whose drain time is over."""
        now = time.monotonic() if now is None else now
        for item in [x for x in self._retiring if x[0] <= now]:
            item[1].stop()
            self._retiring.remove(item)

    def run(self, say=log.info) -> None:
        """Cycle until a signal (which raises out of the sleep, as every service stops); a failed cycle, or a run
        nothing serves yet, is logged and the next check tries again; another loop holding the run's lock ends it.

        Raises:
            RefreshBusy: another refresh loop holds the run's lock."""
        while True:
            try:
                say(self.cycle().trigger.line())
            except (RefreshBusy, Interrupted):  # a stop during training comes back as Interrupted: it ends the loop
                raise
            except ConfigError as e:
                log.warning("refresh: nothing to refresh yet: %s", e)
            except DraftsmithError as e:
                log.error("refresh cycle failed, the serving drafter keeps serving: %s", e)
            deadline = time.monotonic() + self.s.refresh.poll_s
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                self.retire()

    def close(self) -> None:
        """Stop every engine this loop holds (the promoted one included: run the loop as long as it serves)."""
        for _, e in self._retiring:
            e.stop()
        self._retiring.clear()
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
