"""``draftsmith eval`` end to end: check the drafter, load the sets, measure in each engine (with and without the
drafter), write the reports.

Order matters: everything that can be refused cheaply (drafter/target fit, unknown set names) is refused before
any engine starts. Engines started here are stopped in ``finally``; a server that fails to start raises
:class:`EngineError` carrying the tail of its log.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from draftsmith.artifacts.export import DFLASH, EAGLE3, SPECULATORS, layout_dir
from draftsmith.config import Settings
from draftsmith.drafter.families import get_family
from draftsmith.errors import ConfigError, EngineError, ModelError
from draftsmith.evaluation.checks import DrafterInfo, check_drafter_fits, check_engine_reads_layout
from draftsmith.evaluation.report import build_report, engine_result, write_reports
from draftsmith.evaluation.runner import SetMeasure, SGLangClient, VLLMClient, overall, run_set
from draftsmith.evaluation.sets import EvalSet, load_set
from draftsmith.evaluation.sglang import SGLangServerSpec, require_sglang
from draftsmith.log import get_logger
from draftsmith.paths import RunPaths
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port, resolve_model

log = get_logger(__name__)


def target_dir(s: Settings) -> Path:
    """The target checkpoint folder (:func:`draftsmith.target.checkpoint.target_checkpoint`).

    Raises:
        ModelError: no checkpoint there.
    """
    return target_checkpoint(s)


def drafter_dir(s: Settings, paths: RunPaths) -> Path:
    """The drafter to evaluate: ``eval.drafter`` (either layout, ours or a peer's), else the run's
    ``export/eagle3`` (which SGLang loads too), else its ``export/speculators``, else its ``export/dflash``.

    Raises:
        ModelError: the folder does not exist.
    """
    if s.eval.drafter:
        path = Path(s.eval.drafter)
    else:
        found = [layout_dir(paths.export, lay) for lay in (EAGLE3, SPECULATORS)] + [paths.export / DFLASH]
        path = next((p for p in found if p.is_dir()), layout_dir(paths.export, EAGLE3))
    if not path.is_dir():
        raise ModelError(f"no drafter export at {path}", "run `draftsmith export` first or pass --drafter DIR")
    return path


def _vllm_server(s: Settings, target: Path, speculative: dict | None, log_path: Path):
    spec = VLLMServerSpec(
        model=target, served_name=target.name, port=free_port(), dtype=s.target.dtype,
        max_model_len=s.target.max_model_len, kv_cache_gib=s.target.kv_cache_gib,
        enforce_eager=s.target.enforce_eager, speculative=speculative, max_num_seqs=max(s.eval.concurrency, 1),
        extra_args=list(s.target.extra_args), trust_remote_code=s.target.trust_remote_code,
    )
    return VLLMServer(spec, log_path).start(timeout_s=s.target.startup_timeout_s)


def draft_vocab_ids(drafter: Path) -> frozenset[int] | None:
    """Target ids of the draft vocabulary of an exported drafter: the true entries of its ``t2d`` ``[V]``, else
    ``i + d2t[i]`` (a peer's export may carry ``d2t`` only), or None when its weights carry neither (a drafter over
    the whole target vocabulary)."""
    import torch
    from safetensors import safe_open

    d2t = None
    for f in sorted(Path(drafter).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            if "t2d" in st.keys():
                return frozenset(st.get_tensor("t2d").nonzero().flatten().tolist())
            if "d2t" in st.keys():
                d2t = st.get_tensor("d2t").long()
    if d2t is None:
        return None
    return frozenset((d2t + torch.arange(d2t.numel())).tolist())


def _measure(client, sets: list[EvalSet], s: Settings, speculative: bool,
             draft_vocab: frozenset[int] | None = None) -> tuple[list[SetMeasure], SetMeasure]:
    e = s.eval
    ms = [run_set(client, es, e.k, e.concurrency, e.temperature, e.max_tokens, speculative=speculative,
                  draft_vocab=draft_vocab) for es in sets]
    return ms, overall(ms, client.engine, e.k)


def engine_url(e, engine: str) -> str | None:
    """URL of the running ``engine`` (with the drafter loaded) to measure, or None to start one here:
    ``eval.sglang_url`` for SGLang, else ``eval.url`` when SGLang is the only engine measured (``make eval`` and
    the compose evaluator pass the stack's target as ``--url`` whichever engine it runs); ``eval.url`` for vLLM."""
    if engine == "sglang":
        return e.sglang_url or (e.url if e.engine == "sglang" else None)
    return e.url


def wait_for_engine(url: str, timeout_s: float, every_s: float = 5.0) -> None:
    """Wait until the engine at ``url`` answers ``/health`` with 200 (vLLM and SGLang both serve it).

    Why: ``make up && make eval`` starts the evaluator while the target still loads (a 1T-parameter checkpoint takes
    many minutes); the evaluator waits as long as ``target.startup_timeout_s`` instead of failing at once.

    Raises:
        EngineError: no 200 within ``timeout_s`` seconds, with the last answer or error.
    """
    t0, last, said = time.monotonic(), "no answer yet", False
    while True:
        try:
            r = httpx.get(f"{url.rstrip('/')}/health", timeout=10)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() - t0 > timeout_s:
            raise EngineError(f"the engine at {url} did not answer /health within {timeout_s:.0f} s ({last})",
                              "see the target's log (make logs SERVICE=target-...), or raise "
                              "target.startup_timeout_s if it is still loading")
        if not said:
            log.info("waiting for the engine at %s to answer /health (up to %.0f s, target.startup_timeout_s): %s",
                     url, timeout_s, last)
            said = True
        time.sleep(every_s)


def measure_vllm(s: Settings, target: Path, drafter: Path, sets: list[EvalSet], logs: Path) -> dict[str, Any]:
    """Measure in vLLM: with the drafter (``eval.url`` or a server started here), then the baseline without it."""
    e = s.eval
    info = check_drafter_fits(target, drafter)
    spec_cfg = get_family(info.family).speculative_config(drafter, e.k)
    with ExitStack() as stack:
        if e.url:
            url = e.url
            wait_for_engine(url, s.target.startup_timeout_s)
        else:
            url = stack.enter_context(_vllm_server(s, target, spec_cfg, logs / "eval-vllm-drafter.log")).url
        client = VLLMClient(url, resolve_model(url, s.target.model if e.url else target.name), e.request_timeout_s)
        measures, total = _measure(client, sets, s, speculative=True, draft_vocab=draft_vocab_ids(drafter))
    base, base_total = None, None
    if e.baseline and e.url and not e.baseline_url:
        log.warning("no vLLM baseline: the drafter is measured at eval.url, so the baseline is a URL too "
                    "(eval.baseline_url, a server without drafter) or off; no second engine is started beside it")
    elif e.baseline:
        with ExitStack() as stack:
            if e.baseline_url:
                burl = e.baseline_url
            else:
                burl = stack.enter_context(_vllm_server(s, target, None, logs / "eval-vllm-baseline.log")).url
            bclient = VLLMClient(burl, resolve_model(burl, s.target.model if e.baseline_url else target.name),
                                 e.request_timeout_s)
            base, base_total = _measure(bclient, sets, s, speculative=False)
    return engine_result("vllm", e.k, e.temperature, measures, total, base, base_total)


def measure_sglang(s: Settings, target: Path, drafter: Path, sets: list[EvalSet], logs: Path) -> dict[str, Any]:
    """Measure in SGLang: ``eval.sglang_url`` (with the drafter loaded) or a server started here (needs SGLang)."""
    e = s.eval
    sglang_url = engine_url(e, "sglang")
    spec = SGLangServerSpec(model=target, drafter=drafter, k=e.k, context_length=s.target.max_model_len,
                            trust_remote_code=s.target.trust_remote_code)
    with ExitStack() as stack:
        if sglang_url:
            url = sglang_url
            wait_for_engine(url, s.target.startup_timeout_s)
        else:
            require_sglang()
            # VLLMServer only runs spec.command() in a process group and polls /v1/models: SGLang serves that too.
            url = stack.enter_context(VLLMServer(spec, logs / "eval-sglang.log").start(s.target.startup_timeout_s)).url
        client = SGLangClient(url, target, e.request_timeout_s, s.target.trust_remote_code)
        measures, total = _measure(client, sets, s, speculative=True)
    base, base_total = None, None
    if e.baseline and e.baseline_url:
        bclient = SGLangClient(e.baseline_url, target, e.request_timeout_s, s.target.trust_remote_code)
        base, base_total = _measure(bclient, sets, s, speculative=False)
    elif e.baseline:
        log.warning("no SGLang baseline: pass eval.baseline_url of an SGLang server without drafter for the speedup")
    return engine_result("sglang", e.k, e.temperature, measures, total, base, base_total)


def offline_estimate(target: Path, drafter: Path, sets: list[EvalSet], k: int, max_new_tokens: int,
                     trust_remote_code: bool = False) -> dict:
    """The offline estimate (transformers, greedy chain, no engine) from ``draftsmith.drafter.offline``.

    Raises:
        EngineError: the offline estimator is not installed in this version.
    """
    try:
        from draftsmith.drafter.offline import estimate_acceptance
    except ImportError as e:
        raise EngineError("the offline estimator (draftsmith.drafter.offline) is not available", "drop --offline") from e
    prompts = [[{"role": "user", "content": p.turns[0]}] for es in sets for p in es.prompts]
    out = estimate_acceptance(target, drafter, prompts, k, max_new_tokens, trust_remote_code)
    out.pop("generated_ids")  # the report keeps figures, not every generated token
    return out


def run_evaluation(s: Settings, offline: bool = False) -> dict[str, Path]:
    """Evaluate the run's drafter as configured in ``s.eval`` and write the reports.

    Returns:
        Paths of ``report.json``, ``report.md``, ``report.png`` and ``metrics.prom``.

    Raises:
        ModelError: missing target or drafter, or a drafter that does not fit the target (before any engine starts).
        ConfigError: an engine that cannot serve the drafter's family, or the offline estimate of a family that
            does not draft a chain (before any engine starts).
        DataError: an unknown or malformed eval set (before any engine starts).
        EngineError: an engine failed to start (with its log tail) or to answer.
    """
    paths = RunPaths(s.runs_dir, s.run)
    target = target_dir(s)
    drafter = drafter_dir(s, paths)
    info: DrafterInfo = check_drafter_fits(target, drafter)
    check_engine_reads_layout(s.eval.engine, info)
    family = get_family(info.family)
    family.check_engine(s.eval.engine)  # an engine that cannot serve the family
    if offline and not getattr(family, "chain_drafting", False):
        raise ConfigError(f"the offline estimate drafts a greedy chain, EAGLE-3's way; {drafter} is a "
                          f"{family.name} drafter", "drop --offline: the engine's counters measure it")
    if info.code_version is None:
        log.warning("the drafter %s records no code_version (a peer's export, or an older draftsmith's); the report "
                    "cannot say which build made it", drafter)
    sets = [load_set(x, s.eval.limit, s.eval.sets_dir) for x in s.eval.sets]
    log.info("drafter %s fits %s (hidden %d, draft vocab %d, layers %s); %d sets, %d prompts",
             drafter, target.name, info.hidden_size, info.draft_vocab_size, list(info.layer_ids), len(sets),
             sum(len(x.prompts) for x in sets))
    engines = ["vllm", "sglang"] if s.eval.engine == "both" else [s.eval.engine]
    if "sglang" in engines and not engine_url(s.eval, "sglang"):
        require_sglang()
    paths.ensure(paths.logs)
    results = []
    for engine in engines:
        fn = measure_vllm if engine == "vllm" else measure_sglang
        results.append(fn(s, target, drafter, sets, paths.logs))
    off = offline_estimate(target, drafter, sets, s.eval.k, s.eval.max_tokens,
                           s.target.trust_remote_code) if offline else None
    report = build_report(s.run, s.eval.engine, s.eval.k, s.eval.temperature, results, str(target), str(drafter),
                          off, s.model_dump(mode="json"), info.code_version,
                          info.family)
    out = Path(s.eval.out) if s.eval.out else paths.eval
    return write_reports(report, out, s.eval.pushgateway_url)
