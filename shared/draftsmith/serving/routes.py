"""Which engine serves a run's traffic: the routes the gateway reads and the canary writes.

One JSON document per run in Redis, under ``<prefix>:serving:<run>:routes``. The gateway reads it (at most a second
old) and sends each new request to ``stable``, or to ``canary`` with probability ``canary_share``; a request already
in flight finishes on the engine it started on, so a change of routes fails no request. The canary writes it when it
starts a trial, promotes or rolls back; ``version`` counts the writes so that a reader can tell a change happened.
"""

from __future__ import annotations

import redis
from pydantic import BaseModel, Field


class Routes(BaseModel):
    """A run's serving routes.

    Attributes:
        stable: base URL (without ``/v1``) of the engine that serves every request not sent to the canary.
        stable_drafter: the drafter version the stable engine serves (a folder name under the run's drafters), or
            None for the target alone.
        canary: base URL of the engine serving the candidate drafter, or None when no trial runs.
        canary_drafter: the candidate drafter version, or None.
        canary_share: fraction of new requests sent to ``canary`` (0 to 1); ignored without one.
        version: incremented by every :func:`write_routes`.
    """

    stable: str
    stable_drafter: str | None = None
    canary: str | None = None
    canary_drafter: str | None = None
    canary_share: float = Field(0.0, ge=0.0, le=1.0)
    version: int = 0


def routes_key(prefix: str, run: str) -> str:
    """The Redis key of ``run``'s routes (``run``: the run's name, the last part of its location)."""
    return f"{prefix}:serving:{run}:routes"


def read_routes(client: redis.Redis, prefix: str, run: str) -> Routes | None:
    """``run``'s routes, or None when none were written.

    Raises:
        pydantic.ValidationError: the stored document is not a :class:`Routes`.
    """
    raw = client.get(routes_key(prefix, run))
    return None if raw is None else Routes.model_validate_json(raw)


def write_routes(client: redis.Redis, prefix: str, run: str, routes: Routes) -> Routes:
    """Store ``routes`` for ``run`` with ``version`` one above the stored one's; returns what was stored.

    The read and the write are one Redis transaction (WATCH), so two writers never store the same version.
    """
    key = routes_key(prefix, run)
    with client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                before = 0 if raw is None else Routes.model_validate_json(raw).version
                stored = routes.model_copy(update={"version": before + 1})
                pipe.multi()
                pipe.set(key, stored.model_dump_json())
                pipe.execute()
                return stored
            except redis.WatchError:
                continue
