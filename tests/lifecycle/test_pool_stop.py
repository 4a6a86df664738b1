"""A stopped worker pool stops even when one of its workers missed the stop signal.

In a CI run under load, ``draftsmith worker`` got SIGTERM while its one rq worker was still starting; the worker's
SIGINT from the pool was lost, the worker went on idling and the pool printed "Waiting for workers to shutdown..."
until the test's 60 s ran out. Here a real pool runs a real rq worker that ignores its first stop signal (the lost
one, made certain), over the real Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import sys
    from rq.serializers import JSONSerializer
    from draftsmith.jobqueue.pool import DraftsmithPool
    from draftsmith.jobqueue.queues import connect, get_queue
    from draftsmith.jobqueue.worker import DraftsmithWorker

    class MissesFirstStop(DraftsmithWorker):
        missed = False

        def request_stop(self, signum, frame):
            if not MissesFirstStop.missed:
                MissesFirstStop.missed = True
                print("worker: first stop signal lost", flush=True)
                return
            super().request_stop(signum, frame)

    url, prefix = sys.argv[1:3]
    client = connect(url)
    pool = DraftsmithPool([get_queue(client, prefix, "generate")], connection=client, num_workers=1,
                          serializer=JSONSerializer, worker_class=MissesFirstStop)
    pool.restop_every_s = 2.0
    pool.start()
    print("pool: stopped", flush=True)
""")


def test_a_worker_that_missed_its_stop_signal_is_stopped(redis_url):
    from draftsmith.jobqueue.queues import connect, get_queue
    from rq import Worker

    prefix = "dspoolstop"
    queue = get_queue(connect(redis_url), prefix, "generate")
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, redis_url, prefix], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not any(w.get_state() == "idle" for w in Worker.all(queue=queue)):
            time.sleep(0.2)
        assert any(w.get_state() == "idle" for w in Worker.all(queue=queue)), "the worker never became idle"
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=30)[0]
        took = time.time() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert "worker: first stop signal lost" in out, out[-2000:]
    assert "stop signal sent again" in out, out[-2000:]
    assert "pool: stopped" in out and p.returncode == 0, out[-2000:]
    assert took < 15, f"the pool took {took:.0f} s to stop\n{out[-2000:]}"
    assert Worker.all(queue=queue) == [], "the stopped worker is still registered"


def test_a_burst_worker_never_starts_a_scheduler_process(redis_url):
    """rq's maintenance starts a worker's scheduler as a process when the scheduler lock is free; a burst worker
    must not have one, or the process keeps it (and `make demo`'s generation, seen hung with every prompt
    answered) alive after its last job. Real worker object over the real Redis, maintenance run at once."""
    import psutil
    from draftsmith.jobqueue.queues import connect, get_queue
    from draftsmith.jobqueue.worker import DraftsmithWorker
    from rq.serializers import JSONSerializer

    client = connect(redis_url)
    queue = get_queue(client, "dsburst", "generate")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    w = DraftsmithWorker([queue], connection=client, serializer=JSONSerializer)
    w._start_scheduler(burst=True)
    assert w.scheduler is None
    w.run_maintenance_tasks()  # with a scheduler kept, this forked one (the lock is free)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    assert w.work(burst=True) is False  # an empty queue: returns at once
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_a_stopping_worker_does_not_wait_out_its_command_channel_read(redis_url):
    """rq's command-channel thread blocks up to 60 s per read and is woken at exit by the reply to UNSUBSCRIBE; when
    the thread has already read that reply and blocked again, the worker's exit waited out the read (a burst pool of
    the Kimi demo stopped 60 s after its last job, seen once). Here that order is made certain: the reply is read
    first, then the worker unsubscribes. Real worker object, real Redis; rq's own worker class waits 59.5 s."""
    from draftsmith.jobqueue.queues import connect, get_queue
    from draftsmith.jobqueue.worker import PUBSUB_READ_S, DraftsmithWorker
    from rq.serializers import JSONSerializer

    client = connect(redis_url)
    w = DraftsmithWorker([get_queue(client, "dschan", "generate")], connection=client, serializer=JSONSerializer)
    w.subscribe()
    time.sleep(0.3)
    w.pubsub.unsubscribe()  # the thread reads this reply and blocks in its next read
    time.sleep(0.5)
    t0 = time.monotonic()
    w.unsubscribe()
    waited = time.monotonic() - t0
    assert not w.pubsub_thread.is_alive()
    assert waited < 10 * PUBSUB_READ_S, f"the worker waited {waited:.1f} s for its channel thread"
