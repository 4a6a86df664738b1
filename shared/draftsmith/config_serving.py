"""The config sections of serving: capture of served traffic, the gateway in front of the engines and the canary
(docs/serving.md). Kept apart from :mod:`draftsmith.config_sections` so that each file stays small; the root that
holds them is :mod:`draftsmith.config`."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from draftsmith.config_kinds import Host, Kind, Run, Section


class CaptureConfig(Section):
    """Capture of served traffic by the gateway into the run's records (docs/serving.md); off by default."""

    section_kind: ClassVar[Kind] = "host"

    enabled: bool = Field(False, description="Capture sampled requests served through `draftsmith gateway`.")
    sample_rate: float = Field(0.1, ge=0.0, le=1.0, description="Fraction of chat requests captured (0 to 1).")
    retention_days: float | None = Field(
        30.0, gt=0, description="Captured records older than this many days are pruned (None = kept for ever).")
    mask: list[Literal["api_key", "email", "phone", "card", "ip"]] = Field(
        default_factory=lambda: ["api_key", "email", "phone", "card", "ip"],
        description="Built-in kinds of secret or personal data replaced by a placeholder before anything is written.")
    mask_regex: list[str] = Field(
        default_factory=list, description="More regular expressions to mask (Python syntax), e.g. customer ids.")
    flush_records: int = Field(64, ge=1, description="Captured records held before they are written as one shard.")
    flush_s: float = Field(30.0, gt=0, description="Longest time, in seconds, a captured record waits to be written.")

    @field_validator("mask_regex")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"mask_regex {p!r} is not a regular expression ({e}); fix or remove it") from e
        return patterns


class GatewayConfig(Section):
    """The OpenAI-compatible pass-through in front of the engines (`draftsmith gateway`, docs/serving.md)."""

    section_kind: ClassVar[Kind] = "host"

    addr: str = Field("127.0.0.1", description="Address the gateway listens on (0.0.0.0 inside a container).")
    port: int = Field(8100, ge=1, le=65535, description="Port the gateway listens on (/v1/... and /metrics).")
    upstream: str | None = Field(
        None, description="Engine base URL (without /v1) used while the run has no stored routes; None = target.url.")
    routes_refresh_s: float = Field(1.0, gt=0, description="Longest age, in seconds, of the routes a request uses.")
    request_timeout_s: float = Field(600.0, gt=0, description="Timeout of one upstream request, in seconds.")


class CanaryConfig(Section):
    """A drafter version tried beside the serving one, then promoted or rolled back (docs/serving.md)."""

    share: float = Host(0.0, ge=0.0, le=1.0, description="Share of live traffic the gateway sends to the candidate "
                        "during a trial (0 = replayed prompts only).")
    sets: list[str] = Run(default_factory=lambda: ["alpaca"], description="Prompts replayed to both engines: "
                          "bundled eval set names or JSONL paths with a turns list (e.g. captured traffic).")
    min_requests: int = Run(16, ge=2, description="Requests replayed to both engines (and the fewest a decision "
                            "is made on).")
    max_tokens: int = Run(64, ge=1, description="Most new tokens per replayed answer.")
    threshold: float = Run(1.0, gt=0.0, description="Promote when the interval's low end of candidate / current "
                           "mean acceptance length is above this.")
    confidence: float = Run(0.9, gt=0.0, lt=1.0, description="Confidence level of the paired bootstrap interval.")
    resamples: int = Run(2000, ge=100, description="Bootstrap resamples.")
    lock_timeout_s: float = Host(60.0, gt=0, description="The trial lock expires this long after its holder stops "
                                 "renewing it (a crashed canary frees the run).")
    engine_host: str = Host("127.0.0.1", description="Address the candidate's vLLM engine listens on (0.0.0.0 "
                            "when the gateway runs in another container or host).")
    engine_url_host: str | None = Host(None, description="Host name the gateway and the loop reach the candidate's "
                                       "engine by, written into the routes (in Compose: the service name, refresh); "
                                       "None = engine_host.")


class RefreshConfig(Section):
    """The refresh loop: a new drafter version trained on captured traffic mixed with the run's data, continued
    from the serving version, then tried on the canary (`draftsmith refresh`, docs/serving.md)."""

    min_new_records: int = Run(64, ge=1, description="Refresh once this many answered traffic records were captured "
                               "after the data of the serving version was built.")
    acceptance_floor: float | None = Run(None, gt=1.0, description="Also refresh when the stable engine's mean "
                                         "acceptance length on live traffic (its vllm:spec_decode_* counters since "
                                         "the last poll) falls below this, with at least one new traffic record; "
                                         "None = the count alone decides.")
    min_drafts: int = Run(32, ge=1, description="Fewest verify steps a live acceptance reading is judged on.")
    poll_s: float = Host(60.0, gt=0, description="Seconds between two checks in watch mode.")
    max_steps: int | None = Run(None, ge=1, description="Optimizer steps of a refresh's training (None = "
                                "train.epochs over the new data).")
    drain_s: float = Host(30.0, ge=0, description="After a promotion, seconds the engine it replaced (if this loop "
                          "started it) keeps serving the requests already on it before it is stopped.")
    lock_timeout_s: float = Host(60.0, gt=0, description="The refresh lock expires this long after its holder "
                                 "stops renewing it (a crashed loop frees the run).")
