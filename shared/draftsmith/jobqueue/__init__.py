"""Queue plumbing every stage shares: the Redis connection and rq queues (:mod:`.queues`), the worker
pool (:mod:`.pool`) of draftsmith's rq worker (:mod:`.worker`), the per-stage in-flight caps (:mod:`.inflight`) and
the queue metrics exporter (:mod:`.exporter`). Stages put their jobs on these queues by import string
(``draftsmith.generation.jobs.generate_job``, ``draftsmith.features.jobs.extract_job``); nothing here knows a
stage's records or features.
"""
