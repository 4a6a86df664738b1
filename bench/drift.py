"""Benchmark: traffic drifts from chat to code; the refresh loop retrains on the captured code traffic; acceptance on
code prompts the refresh never saw, static drafter against refreshed, in vLLM CPU on the embedded target.

1. **Static drafter** (v1): the demo's stages (:class:`draftsmith.demo.Demo`: generate, build-data, extract, train,
   export) on chat prompts only (the bundled ``user_oriented_instructions`` and ``self_instruct_seed_tasks`` pools).
2. **Serving**: v1 on a vLLM CPU engine (K = 3, :func:`draftsmith.serving.canary.engine_spec`) behind the gateway
   (in this process, capture on, every request sampled), the run's routes naming it.
3. **Drift**: ``--traffic`` code prompts (the bundled ``python_stdlib_functions`` pool, shuffled with ``--seed``)
   sent through the gateway, greedy; capture writes them into the run's records.
4. **Refresh**: one cycle of the loop (:class:`draftsmith.serving.refresh.Loop`): the trigger counts the captured
   records, build-data over chat + code records, extract, train ``--refresh-steps`` steps from v1, export v2, and
   the canary replays ``--canary`` other code prompts to both engines and promotes or rolls back. Throughout, one
   short request at a time goes through the gateway; after a promotion the old engine is stopped (the gateway has
   moved) while they go on: ``SWAP_FAILED_REQUESTS`` counts every one that did not answer 200.
5. **Measure**: ``--heldout`` further code prompts (in neither the traffic nor the canary's replay) answered alone,
   greedy, by v1 and by v2, each on a fresh vLLM CPU engine (``bench/protocol.py``'s ``measure_in_vllm``);
   ``RATIO drift_refresh`` = v2's mean acceptance length / v1's, ``INTERVAL`` its 95 % paired bootstrap over the
   prompts (``seeded_ratio`` with one training seed per side).

    flock /tmp/draftsmith-heavy.lock .venv/bin/python bench/drift.py --redis redis://127.0.0.1:6379/5

``--workdir DIR`` keeps the run: run again with the same folder, step 1 is skipped (the static drafter is kept;
the versions, refresh folders and captured records of the earlier run are removed first).

Goal: ``RATIO drift_refresh`` >= 1.15 and ``SWAP_FAILED_REQUESTS 0``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHAT_POOLS = ("user_oriented_instructions.jsonl", "self_instruct_seed_tasks.jsonl")
CODE_POOL = "python_stdlib_functions.jsonl"


def code_split(prompts_dir: Path, seed: int, traffic: int, canary: int, heldout: int) -> tuple[list, list, list]:
    """The code pool's prompts shuffled with ``seed`` and cut into traffic, canary replay and held-out prompts.

    Raises:
        ValueError: the pool has fewer prompts than the three parts together.
    """
    rows = [json.loads(x) for x in (prompts_dir / CODE_POOL).read_text().splitlines() if x.strip()]
    random.Random(seed).shuffle(rows)
    if len(rows) < traffic + canary + heldout:
        raise ValueError(f"{CODE_POOL} has {len(rows)} prompts, fewer than {traffic + canary + heldout} asked")
    a, b = traffic, traffic + canary
    return rows[:a], rows[a:b], rows[b:b + heldout]


class SwapTraffic:
    """One short request at a time through the gateway, in a thread, until stopped: counts answers and failures
    (any status but 200, or no answer)."""

    def __init__(self, url: str, model: str, prompts: list[str], max_tokens: int = 16, pause_s: float = 0.5) -> None:
        self.url, self.model, self.prompts, self.max_tokens, self.pause_s = url, model, prompts, max_tokens, pause_s
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swap-traffic", daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=600) as client:
            i = 0
            while not self._stop.is_set():
                body = {"model": self.model, "temperature": 0.0, "max_tokens": self.max_tokens,
                        "messages": [{"role": "user", "content": self.prompts[i % len(self.prompts)]}]}
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=body)
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                i += 1
                self._stop.wait(self.pause_s)

    def __enter__(self) -> SwapTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=900)


def train_static(args, base: dict, say) -> tuple:
    """Step 1: the demo's stages on chat pools only; returns the demo (its run's paths and config file)."""
    from draftsmith.config import load_settings
    from draftsmith.demo import Demo
    from draftsmith.demo_sizes import SIZES, DemoSize

    small = SIZES["small"]
    config = {**small.config, "target": {**small.config["target"], "kv_cache_gib": 1},
              "generation": {**small.config["generation"], "max_tokens": args.max_tokens, "temperature": 0.0},
              "train": {**small.config["train"], "epochs": args.epochs, "seed": args.seed}}
    size = DemoSize(name="drift", pools={p: args.chat // len(CHAT_POOLS) for p in CHAT_POOLS}, config=config,
                    workers=small.workers)
    demo = Demo(load_settings(None, base), size, say=say)
    if (demo.paths.export / "eagle3" / "config.json").is_file() and demo.config_file.is_file():
        # a --workdir from an earlier run: its static drafter is kept, what serving and the refresh added is not
        shutil.rmtree(demo.paths.root / "drafters", ignore_errors=True)
        shutil.rmtree(demo.paths.root / "refresh", ignore_errors=True)
        for f in demo.paths.records.glob("traffic-*"):
            f.unlink()
        say(f"static drafter: kept from {demo.paths.root}")
        return demo
    demo.paths.ensure(demo.paths.logs)
    demo.write_config()
    for stage in ("prepare", "generate", "build-data", "extract", "train", "export"):
        t0 = time.time()
        if stage == "generate":
            demo.start_server()
            try:
                demo.stage_generate()
            finally:
                demo.server.stop()
                demo.server = None
        else:
            getattr(demo, "stage_" + stage.replace("-", "_"))()
        say(f"static drafter: {stage} {time.time() - t0:.0f} s")
    return demo


def drain(url: str, timeout_s: float = 600.0) -> None:
    """Wait until the engine at ``url`` has no request running or waiting (its ``vllm:num_requests_*`` gauges): a
    request may take many seconds on a loaded CPU, so a fixed wait can stop an engine under one."""
    import httpx
    from draftsmith.evaluation.prom import parse_text, total

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = parse_text(httpx.get(f"{url}/metrics", timeout=30).text)
        if not (total(samples, "vllm:num_requests_running") or 0) + (total(samples, "vllm:num_requests_waiting") or 0):
            return
        time.sleep(0.5)


def send(url: str, model: str, prompts: list[str], max_tokens: int) -> int:
    """Send each prompt through the gateway, greedy; returns how many did not answer 200."""
    import httpx

    failed = 0
    with httpx.Client(timeout=600) as client:
        for p in prompts:
            r = client.post(url + "/v1/chat/completions", json={
                "model": model, "temperature": 0.0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": p}]})
            failed += r.status_code != 200
    return failed


def serve_and_refresh(args, s, demo, traffic: list[str], say) -> tuple[str, dict, int, int]:
    """Steps 2-4; returns (the refreshed version, the canary's record, swap requests answered, swap failures)."""
    import redis
    from draftsmith.artifacts.export import EAGLE3, layout_dir
    from draftsmith.config import CaptureConfig
    from draftsmith.serving.canary import engine_spec
    from draftsmith.serving.capture import Capture
    from draftsmith.serving.gateway import Gateway, RouteTable, serve_in_background
    from draftsmith.serving.refresh import Loop
    from draftsmith.serving.routes import Routes, write_routes
    from draftsmith.serving.versions import add_version, write_serving
    from draftsmith.target.server import VLLMServer

    paths, target = demo.paths, demo.target_dir()
    client = redis.Redis.from_url(s.redis.url)
    v1 = add_version(paths, layout_dir(paths.export, EAGLE3), {"made_by": "bench/drift.py: chat prompts only"})
    stable = VLLMServer(engine_spec(s, target, v1.path), paths.logs / "stable-v1.log").start(timeout_s=900)
    loop = Loop(s, client)
    try:
        write_routes(client, s.redis.prefix, s.run, Routes(stable=stable.url, stable_drafter=v1.name))
        write_serving(paths.root, v1.name, stable.url)
        cap = Capture(CaptureConfig(enabled=True, sample_rate=1.0, flush_records=16, flush_s=2.0), paths.records,
                      0.0, s.run)
        table = RouteTable(client, s.redis.prefix, s.run, stable.url, 0.2)
        with serve_in_background(Gateway(table, cap, s.run)) as gw:
            t0 = time.time()
            failed = send(gw, target.name, traffic, args.max_tokens)
            time.sleep(3)  # past capture.flush_s: every captured record is written
            cap.flush()
            say(f"drift: {len(traffic)} code requests through the gateway in {time.time() - t0:.0f} s, "
                f"{failed} failed")
            with SwapTraffic(gw, target.name, traffic) as swap:
                t0 = time.time()
                result = loop.cycle()
                say(f"refresh cycle: {result.trigger.line()}; {time.time() - t0:.0f} s")
                if result.outcome is not None and result.outcome.engine is not None:
                    time.sleep(1.0)  # past the gateway's routes refresh (0.2 s): no new request reaches v1
                    drain(stable.url)  # the requests already on v1 end there
                    stable.stop()  # the old stable engine, as its owner stops it once the gateway has moved
                    time.sleep(5.0)  # requests go on after the swap
            for f in swap.failed:
                say(f"swap request failed: {f}")
        if result.outcome is None:
            raise RuntimeError("the refresh did not trigger: " + result.trigger.line())
        return result.version, result.outcome.record, swap.ok, len(swap.failed) + failed
    finally:
        loop.close()
        stable.stop()


def measure(s, target: Path, version: Path, heldout: list[str], max_tokens: int, log: Path) -> list:
    """Step 5 for one drafter: protocol's ``measure_in_vllm`` on the held-out code prompts."""
    from draftsmith.drafter.families import get_family
    from draftsmith.evaluation.checks import check_drafter_fits
    from draftsmith.evaluation.sets import EvalPrompt, EvalSet
    from protocol import measure_in_vllm

    spec = get_family(check_drafter_fits(target, version).family).speculative_config(version, s.eval.k)
    es = EvalSet("code_heldout", Path(CODE_POOL), tuple(EvalPrompt(f"c{i}", (p,)) for i, p in enumerate(heldout)))
    return measure_in_vllm(spec, target, [es], (0, len(heldout)), max_tokens, True, log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chat", type=int, default=64, help="chat prompts the static drafter is trained on")
    ap.add_argument("--traffic", type=int, default=64, help="code requests sent through the gateway (captured)")
    ap.add_argument("--canary", type=int, default=12, help="code prompts the canary replays to both engines")
    ap.add_argument("--heldout", type=int, default=20, help="code prompts measured, in neither of the two above")
    ap.add_argument("--max-tokens", type=int, default=80, help="new tokens per answer (generation, traffic, measure)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of the static drafter's training")
    ap.add_argument("--refresh-steps", type=int, default=150, help="training steps of the refresh (from v1)")
    ap.add_argument("--seed", type=int, default=0, help="code pool shuffle and training seed")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis (queues, routes, locks)")
    ap.add_argument("--workdir", type=Path, default=None, help="run folder parent, kept (default: a temporary folder, removed at the end)")
    args = ap.parse_args()

    from draftsmith.config import load_settings
    from protocol import acceptance_length, seeded_ratio

    def say(m: str) -> None:
        print(m, flush=True)

    t_all = time.time()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="drift-"))
    try:
        prompts_dir = Path(__file__).resolve().parents[1] / "data" / "prompts"
        traffic, canary, heldout = code_split(prompts_dir, args.seed, args.traffic, args.canary, args.heldout)
        canary_file = work / "canary-code.jsonl"
        work.mkdir(parents=True, exist_ok=True)
        canary_file.write_text("".join(json.dumps({"turns": [r["prompt"]]}) + "\n" for r in canary))
        base = {"runs_dir": str(work / "runs"), "run": "drift", "prompts_dir": str(prompts_dir),
                "redis": {"url": args.redis, "prefix": "draftsmith-drift"}}
        demo = train_static(args, base, say)
        s = load_settings(demo.config_file, {
            "redis": {"url": args.redis}, "eval": {"k": 3},
            "canary": {"sets": [str(canary_file)], "min_requests": args.canary, "max_tokens": 64},
            "refresh": {"min_new_records": max(1, args.traffic // 2), "max_steps": args.refresh_steps, "drain_s": 5.0}})
        version, record, swap_ok, swap_failed = serve_and_refresh(args, s, demo, [r["prompt"] for r in traffic], say)
        say(f"canary: {record['decision']} {record['candidate']} vs {record['current']}, ratio "
            f"{record['interval_ratio']:.3f} [{record['interval_low']:.3f}, {record['interval_high']:.3f}] over "
            f"{record['interval_pairs']} code prompts")
        from draftsmith.serving.versions import get_version

        prov = get_version(demo.paths.root, version).provenance
        say(f"{version} provenance: from {prov['from_version']}, trigger {prov['trigger']}, records {prov['records']}, "
            f"data manifest {str(prov['data_manifest_sha256'])[:12]}, records manifest "
            f"{str(prov['records_manifest_sha256'])[:12]}")
        target, vdir = demo.target_dir(), demo.paths.root / "drafters"
        held = [r["prompt"] for r in heldout]
        static = measure(s, target, vdir / "v1", held, args.max_tokens, demo.paths.logs / "measure-v1.log")
        fresh = measure(s, target, vdir / version, held, args.max_tokens, demo.paths.logs / f"measure-{version}.log")
        ratio, lo, hi = seeded_ratio({args.seed: fresh}, {args.seed: static})
        say(f"ACCEPT static v1 code_heldout {acceptance_length(static):.3f}")
        say(f"ACCEPT refreshed {version} code_heldout {acceptance_length(fresh):.3f}")
        say(f"swap: {swap_ok} requests answered during the refresh; total {time.time() - t_all:.0f} s"
            + (f"; run kept in {work}" if args.workdir else ""))
        say(f"RATIO drift_refresh {ratio:.3f}")
        say(f"INTERVAL drift_refresh {lo:.3f} {hi:.3f}")
        say(f"SWAP_FAILED_REQUESTS {swap_failed}")

    finally:
        if args.workdir is None:  # a folder of its own: nothing of the run is left behind (--workdir keeps it)
            shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    main()
