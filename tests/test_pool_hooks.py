"""The worker pool's stage hooks (draftsmith.jobqueue.hooks): the generation stage registers its warm-ups when its
job module is imported (as `draftsmith worker` does), the pool runs them in order with the job's kwargs, and a
hook that fails is logged and skipped, never failing the job."""

from __future__ import annotations

import logging

from draftsmith.jobqueue import hooks


def test_importing_the_generation_jobs_registers_its_warm_ups():
    import draftsmith.generation.jobs as jobs
    from draftsmith.generation.client import warm_http

    assert warm_http in hooks._AT_POOL_START and jobs.warm_run_caches in hooks._BEFORE_JOB


def test_hooks_run_in_order_and_a_failing_one_is_skipped(monkeypatch, caplog):
    monkeypatch.setattr(hooks, "_AT_POOL_START", [])
    monkeypatch.setattr(hooks, "_BEFORE_JOB", [])
    seen = []

    def broken(kwargs):
        raise OSError("no such run")

    hooks.at_pool_start(lambda: seen.append("start"))
    hooks.before_job(broken)
    hooks.before_job(lambda kwargs: seen.append(kwargs["run_root"]))
    hooks.before_job(broken)  # registered once
    assert len(hooks._BEFORE_JOB) == 2
    hooks.run_at_pool_start()
    with caplog.at_level(logging.WARNING, logger="draftsmith.jobqueue.hooks"):
        hooks.run_before_job({"run_root": "/runs/r"})
    assert seen == ["start", "/runs/r"]
    assert "broken skipped (OSError: no such run)" in caplog.text
