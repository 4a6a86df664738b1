"""Check: the chat-template round trip (docs/doctor.md, "template").

Offline, the ids each sample was trained on are compared with the prompt the server tokenized when it generated the
record (``turns[k].prompt_token_ids``). With ``--url``, the live server renders the record's messages itself (vLLM's
``/tokenize`` with ``messages`` and ``add_generation_prompt``, its own chat template) and that is compared too: a
server restarted with another template, or with thinking switched, serves contexts the drafter never saw. The
evidence names the first differing tokens and counts the thinking markers on both sides.
"""

from __future__ import annotations

from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView
from draftsmith.doctor.spans import first_difference, match, record_of
from draftsmith.errors import TargetUnavailable

CHECK = "template"
LIVE = "template_live"  # the live round trip's result; its findings name the cause "template" as the offline one
MAX_SHARE = 0.02  # samples whose prompt is not the server's; above: a systematic rendering difference
COST_SCALE = 0.6  # a foreign context per mismatched sample, estimated (SpecForge #455, speculators #751)
LIVE_SAMPLES = 8  # requests to the server's /tokenize
THINK_MARKERS = ("<think>", "</think>")


def _tokens(run: RunView, ids: list[int]) -> str:
    tok = run.tokenizer
    return repr(tok.convert_ids_to_tokens(ids)) if tok is not None else repr(ids)


def _markers(run: RunView, ids: list[int]) -> str:
    tok = run.tokenizer
    if tok is None:
        return ""
    found = {m: tok.convert_tokens_to_ids(m) for m in THINK_MARKERS}
    found = {m: i for m, i in found.items() if isinstance(i, int) and i != tok.unk_token_id}
    return ", ".join(f"{m} x{ids.count(i)}" for m, i in found.items())


def _evidence(run: RunView, sid: str, trained: list[int], served: list[int], source: str) -> str:
    i = first_difference(trained, served)
    ev = (f"sample {sid} position {i}: trained {_tokens(run, trained[i:i + 4])}, {source} "
          f"{_tokens(run, served[i:i + 4])}")
    tm, sm = _markers(run, trained[:len(served)]), _markers(run, served)
    return ev + (f"; thinking markers trained [{tm}], {source} [{sm}]" if tm and tm != sm else "")


def offline(run: RunView) -> CheckResult:
    """Trained ids against the prompt ids in the records."""
    if not run.samples or not run.records:
        return skipped(CHECK, "needs data/ and records/ with the server's token ids")
    checked, bad, first = 0, 0, None
    for sid, (ids, _) in run.samples.items():
        rec = run.records.get(record_of(sid))
        m = match(ids, rec) if rec else None
        if m is None:
            continue
        checked += 1
        if m.mismatch is not None:
            bad += 1
            if first is None:
                first = (sid, ids.tolist(), rec["turns"][0]["prompt_token_ids"])
    if not checked:
        return skipped(CHECK, "no record carries prompt_token_ids (vLLM's return_token_ids)")
    share = bad / checked
    if share <= MAX_SHARE:
        return CheckResult(CHECK, True)
    return CheckResult(CHECK, True, [Finding(
        CHECK, f"{share:.0%} of samples were rendered otherwise than the server's prompt (chat template)",
        COST_SCALE * share, f"{bad} of {checked} samples; " + _evidence(run, *first, "server"),
        "build the data with the template the server applies (data.chat_template unset uses the tokenizer's; "
        "data.template_kwargs for thinking) and re-extract and retrain")])


def live(run: RunView, url: str, timeout_s: float = 30.0) -> CheckResult:
    """The server's own rendering (``/tokenize``) of up to :data:`LIVE_SAMPLES` records' first prompts against
    the trained ids.

    Raises:
        TargetUnavailable: the server does not answer or has no ``/tokenize``.
    """
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    pairs = [(sid, ids) for sid, (ids, _) in run.samples.items() if record_of(sid) in run.records][:LIVE_SAMPLES]
    if not pairs:
        return skipped(LIVE, "needs data/ and records/ to send to the server", needs_server=True)
    try:
        with httpx.Client(timeout=timeout_s) as c:
            model = c.get(f"{base}/v1/models").raise_for_status().json()["data"][0]["id"]
            bad, first = 0, None
            for sid, ids in pairs:
                msgs = run.records[record_of(sid)]["messages"]
                prompt = msgs[: next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))]
                prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
                r = c.post(f"{base}/tokenize", json={"model": model, "messages": prompt,
                                                      "add_generation_prompt": True, "add_special_tokens": False})
                served = r.raise_for_status().json()["tokens"]
                trained = ids.tolist()
                if trained[: len(served)] != served:
                    bad += 1
                    first = first or (sid, trained, served)
    except (httpx.HTTPError, KeyError, IndexError) as e:
        raise TargetUnavailable(f"the server at {url} did not answer /v1/models and /tokenize ({e})",
                                "pass --url of a running vLLM server (SGLang has no /tokenize)") from e
    if not bad:
        return CheckResult(LIVE, True, needs_server=True)
    share = bad / len(pairs)
    return CheckResult(LIVE, True, [Finding(
        CHECK, f"the live server renders {share:.0%} of the checked prompts otherwise than the data (chat template "
        "or thinking)", COST_SCALE * share, f"{bad} of {len(pairs)} prompts via {base}/tokenize; "
        + _evidence(run, *first, "served"),
        "serve with the chat template (and chat_template_kwargs, e.g. enable_thinking) the data was built with, or "
        "rebuild the data from the server's rendering")], needs_server=True)


def check(run: RunView, url: str | None = None) -> list[CheckResult]:
    """The offline round trip, and the live one when ``url`` is given."""
    out = [offline(run)]
    out.append(live(run, url) if url else skipped(LIVE, "needs --url (the server's /tokenize)", needs_server=True))
    return out
