"""``draftsmith canary``: a candidate drafter version served by a second vLLM engine beside the serving one, the same
requests replayed to both, acceptance compared from each engine's own counters, then promoted or rolled back.

Order (``docs/serving.md``, "Canary, promote, roll back"):

1. Refuse what can be refused before any engine starts: a candidate that does not fit the target
   (:func:`draftsmith.evaluation.checks.check_drafter_fits`: missing files, other target, wrong hidden size or
   vocabulary), a run with no routes (nothing serves), prompt sets that do not load, another trial holding the run's
   lock (:class:`~draftsmith.serving.canary_lock.TrialLock`).
2. Start the candidate engine (same target, same K = ``eval.k``) and write it to the routes as ``canary`` with
   ``canary.share`` of live traffic (the gateway reads them).
3. Replay ``canary.min_requests`` prompts one at a time to both engines: each request's acceptance length is the
   difference of that engine's ``vllm:spec_decode_*`` counters around it (EAGLE-3's definition, bonus counted).
4. :func:`draftsmith.serving.canary_stats.paired_ratio_interval`, then :func:`~draftsmith.serving.canary_stats.decide`.
5. Promote: the routes' ``stable`` becomes the candidate engine (new requests go there, ones in flight finish where
   they started, so none fails) and ``drafters/serving.json`` names the version; the engine is handed to the caller.
   Roll back: the routes lose the canary, the candidate engine is stopped. Either way the decision, with its numbers,
   goes to ``drafters/decisions.jsonl``, the log and ``/metrics``.

Any failure mid-trial (an engine error, a signal) removes the canary from the routes and stops its engine: the
serving drafter keeps serving, and a process killed outright leaves its lock to expire.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from draftsmith.config import Settings
from draftsmith.drafter.families import get_family
from draftsmith.errors import ConfigError
from draftsmith.evaluation.checks import check_drafter_fits
from draftsmith.evaluation.runner import VLLMClient
from draftsmith.evaluation.sets import load_set
from draftsmith.evaluation.vllm_metrics import SpecCounters
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.serving.canary_lock import TrialLock
from draftsmith.serving.canary_stats import PROMOTE, decide, paired_ratio_interval
from draftsmith.serving.routes import Routes, read_routes, write_routes
from draftsmith.serving.versions import (
    Version,
    add_version,
    append_decision,
    get_version,
    read_serving,
    version_number,
    write_serving,
)
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port, resolve_model

log = get_logger(__name__)


@dataclass
class Replay:
    """Per-request acceptance lengths of both engines over the same replayed requests (pairs where both drafted)."""

    current: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    requests: int = 0
    identical_outputs: int = 0  # requests whose generated token ids were the same on both engines


@dataclass
class Outcome:
    """A trial's decision (the record written to ``decisions.jsonl``) and, when promoted, the candidate engine now
    on the stable route (the caller keeps it running; None otherwise)."""

    record: dict[str, Any]
    engine: VLLMServer | None = None

    @property
    def decision(self) -> str:
        return self.record["decision"]


def request_length(d: SpecCounters) -> float | None:
    """Mean acceptance length of one request from its counter difference (1 + accepted / drafts), None without a
    verify step (an answer of one token)."""
    return 1.0 + d.accepted / d.drafts if d.drafts > 0 else None


def replay(current: VLLMClient, candidate: VLLMClient, prompts: list[list[dict[str, str]]], max_tokens: int,
           temperature: float = 0.0) -> Replay:
    """Send each prompt to both engines, one request at a time, reading each engine's counters around it.

    Args:
        current, candidate: the two engines (OpenAI chat on vLLM, ``/metrics`` with ``vllm:spec_decode_*``).
        prompts: chat messages of each request.
        max_tokens: most new tokens per answer.
        temperature: 0 for greedy: both engines then emit the target's own tokens.

    Returns:
        :class:`Replay`. A counter difference counts every request the engine verified meanwhile, so the stable
        engine's figure includes live traffic served during the trial (``docs/serving.md``).

    Raises:
        EngineError: an engine failed a request or restarted (its counters went down).
    """
    out = Replay()
    for messages in prompts:
        lengths, ids = [], []
        for client in (current, candidate):
            before = client.counters()
            turn = client.generate(messages, max_tokens, temperature)
            lengths.append(request_length(client.counters() - before))
            ids.append(turn.token_ids)
        out.requests += 1
        out.identical_outputs += int(ids[0] is not None and ids[0] == ids[1])
        if None not in lengths:
            out.current.append(lengths[0])
            out.candidate.append(lengths[1])
    return out


def engine_spec(s: Settings, target: Path, drafter: Path) -> VLLMServerSpec:
    """The vLLM CPU server of a drafter version: the target's settings, the drafter's family's speculative config
    with ``eval.k`` tokens per step, listening on ``canary.engine_host`` and named in the routes by
    ``canary.engine_url_host`` (a container's service name: the gateway reaches it from another container)."""
    info = check_drafter_fits(target, drafter)
    spec_cfg = get_family(info.family).speculative_config(drafter, s.eval.k)
    # the stable engine's model name (target.model): after a promotion clients keep sending the name they used
    return VLLMServerSpec(model=target, served_name=s.target.model or target.name, host=s.canary.engine_host,
                          url_host=s.canary.engine_url_host, port=free_port(), dtype=s.target.dtype,
                          max_model_len=s.target.max_model_len, kv_cache_gib=s.target.kv_cache_gib,
                          enforce_eager=s.target.enforce_eager, speculative=spec_cfg, max_num_seqs=1,
                          extra_args=list(s.target.extra_args), trust_remote_code=s.target.trust_remote_code)


def candidate_version(paths: RunPaths, drafter: str | Path) -> Version:
    """The version to try: an existing one by name (``v3``), else a new version copied from an export folder."""
    if isinstance(drafter, str) and not Path(drafter).exists():
        return get_version(paths.root, drafter)
    return add_version(paths, Path(drafter), {"made_by": "draftsmith canary"})


def _prompts(s: Settings) -> list[list[dict[str, str]]]:
    sets = [load_set(x, None, s.eval.sets_dir) for x in s.canary.sets]
    firsts = [[{"role": "user", "content": p.turns[0]}] for es in sets for p in es.prompts]
    return firsts[: s.canary.min_requests]


def _record(s: Settings, routes: Routes, version: str, replayed: Replay, decision: str, interval,
            url: str) -> dict[str, Any]:
    return {"time": time.time(), "run": s.run, "decision": decision, "current": routes.stable_drafter,
            "candidate": version, "current_url": routes.stable, "candidate_url": url, "k": s.eval.k,
            "requests": replayed.requests, "identical_outputs": replayed.identical_outputs,
            "threshold": s.canary.threshold, **{f"interval_{k}": v for k, v in asdict(interval).items()}}


def _publish(s: Settings, record: dict[str, Any], serving: str | None) -> None:
    from draftsmith.metrics import CANARY_ACCEPT_LEN, CANARY_DECISIONS, SERVING_DRAFTER_VERSION

    CANARY_DECISIONS.labels(s.run, record["decision"]).inc()
    if record["current"]:
        CANARY_ACCEPT_LEN.labels(s.run, record["current"]).set(record["interval_current_mean"])
    CANARY_ACCEPT_LEN.labels(s.run, record["candidate"]).set(record["interval_candidate_mean"])
    if serving:
        SERVING_DRAFTER_VERSION.labels(s.run).set(version_number(serving))


def adopt(s: Settings, drafter: Path, url: str, client: redis.Redis | None = None) -> tuple[Version, bool]:
    """Record the drafter an engine already serves as the run's first version: the export folder ``drafter`` (the
    one the engine at ``url`` loaded) becomes the next version, the routes' stable side is ``url`` and
    ``serving.json`` names the version. No trial: this is where a run's canaries and refreshes start from. A run
    that a version already serves is left as it is (``make serve`` run again).

    Returns:
        (the serving version, True when this call adopted it; False: the run was already served, nothing written).

    Raises:
        ModelError: the export does not fit the target (the evaluator's checks), before anything is written.
    """
    client = client or redis.Redis.from_url(s.redis.url)
    paths = RunPaths(s.runs_dir, s.run)
    routes, serving = read_routes(client, s.redis.prefix, s.run), read_serving(paths.root)
    if routes is not None and serving is not None:
        log.info("canary %s: already served by %s at %s; nothing adopted (try a new drafter with `draftsmith "
                 "canary EXPORT_DIR`)", s.run, routes.stable_drafter, routes.stable)
        return get_version(paths.root, serving["version"]), False
    check_drafter_fits(target_checkpoint(s), drafter)
    version = add_version(paths, drafter, {"made_by": "draftsmith canary --adopt", "served_at": url})
    write_routes(client, s.redis.prefix, s.run, Routes(stable=url.rstrip("/"), stable_drafter=version.name))
    write_serving(paths.root, version.name, url)
    from draftsmith.metrics import SERVING_DRAFTER_VERSION

    SERVING_DRAFTER_VERSION.labels(s.run).set(version_number(version.name))
    log.info("canary %s: %s (from %s) serves at %s", s.run, version.name, drafter, url)
    return version, True


def run_canary(s: Settings, drafter: str | Path, client: redis.Redis | None = None) -> Outcome:
    """Try ``drafter`` beside the run's serving engine and promote or roll it back (module docstring).

    Args:
        s: settings (``canary``, ``eval.k``, ``target``, ``redis``, ``run``).
        drafter: an export folder (copied into a new version) or the name of one of the run's versions.
        client: Redis client for the routes and the lock (default: ``redis.url``).

    Returns:
        :class:`Outcome`; when promoted its ``engine`` serves the stable route and the caller must keep it running.

    Raises:
        ModelError: the candidate does not fit the target, or no such version (before any engine starts).
        ConfigError: the run has no routes (nothing serves it yet).
        DataError: a prompt set does not load, or too few requests gave an acceptance length.
        CanaryBusy: another trial holds the run's lock.
        EngineError: the candidate engine failed to start or to answer (routes restored, engine stopped).
    """
    client = client or redis.Redis.from_url(s.redis.url)
    paths = RunPaths(s.runs_dir, s.run)
    target = target_checkpoint(s)
    if isinstance(drafter, Path) or Path(drafter).exists():
        check_drafter_fits(target, Path(drafter))  # refused before it becomes a version
    routes = read_routes(client, s.redis.prefix, s.run)
    if routes is None:
        raise ConfigError(f"run {s.run} has no serving routes: no engine serves it yet",
                          "start the serving engine and pass --stable-url URL --stable-version vN once")
    prompts = _prompts(s)
    with TrialLock(client, s.redis.prefix, s.run, s.canary.lock_timeout_s):
        routes = read_routes(client, s.redis.prefix, s.run)  # what the lock's previous holder left
        version = candidate_version(paths, drafter)
        spec = engine_spec(s, target, version.path)
        paths.ensure(paths.logs)
        engine = VLLMServer(spec, paths.logs / f"canary-{version.name}.log")
        promoted = False
        try:
            engine.start(timeout_s=s.target.startup_timeout_s)
            write_routes(client, s.redis.prefix, s.run, routes.model_copy(update={
                "canary": engine.url, "canary_drafter": version.name, "canary_share": s.canary.share}))
            current = VLLMClient(routes.stable, resolve_model(routes.stable, s.target.model), s.eval.request_timeout_s)
            cand = VLLMClient(engine.url, resolve_model(engine.url, spec.served_name), s.eval.request_timeout_s)
            replayed = replay(current, cand, prompts, s.canary.max_tokens, s.eval.temperature)
            interval = paired_ratio_interval(replayed.current, replayed.candidate, s.canary.confidence,
                                             s.canary.resamples)
            decision = decide(interval, s.canary.threshold)
            record = _record(s, routes, version.name, replayed, decision, interval, engine.url)
            if decision == PROMOTE:
                write_routes(client, s.redis.prefix, s.run, Routes(stable=engine.url, stable_drafter=version.name))
                write_serving(paths.root, version.name, engine.url)
                promoted = True
        finally:
            if not promoted:
                write_routes(client, s.redis.prefix, s.run, routes.model_copy(update={
                    "canary": None, "canary_drafter": None, "canary_share": 0.0}))
                engine.stop()
    append_decision(paths.root, record)
    _publish(s, record, version.name if promoted else routes.stable_drafter)
    log.info("canary %s: %s vs %s on %d requests: mean acceptance length %.3f vs %.3f, ratio %.3f, %.0f%% interval "
             "[%.3f, %.3f], threshold %.2f -> %s", s.run, version.name, routes.stable_drafter, interval.pairs,
             interval.candidate_mean, interval.current_mean, interval.ratio, 100 * interval.confidence, interval.low,
             interval.high, s.canary.threshold, decision)
    return Outcome(record, engine if promoted else None)
