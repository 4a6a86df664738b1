"""Benchmark: what the gateway with capture on adds to a request, against the same requests sent to the engine
directly, in one process, on the real vLLM CPU server with the embedded target.

Each round sends one request directly and one through the gateway (capture on, every request sampled, records
written to a temporary run), alternating which goes first, for ``--requests`` rounds of short answers (the
smaller the answer, the larger the gateway's share). Latency: the median wall time of a request, streamed and not.
CPU: this process's CPU time (client, gateway and capture all run here) per gateway request minus per direct
request.

    .venv/bin/python bench/capture.py [--requests 60] [--url http://127.0.0.1:8000]

Last line: ``RATIO capture_latency <median through the gateway / median direct>`` (goal <= 1.10).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import redis
from draftsmith.config import CaptureConfig
from draftsmith.serving.capture import Capture
from draftsmith.serving.gateway import Gateway, RouteTable, serve_in_background
from draftsmith.target.embedded import EMBEDDED_NAME


def _timed(client: httpx.Client, url: str, body: dict) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one chat request, its answer read to the end."""
    w, c = time.perf_counter(), time.process_time()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for _ in r.iter_bytes():
            pass
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60, help="rounds (one direct and one gateway request each)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--url", default=None, help="a running vLLM server on the embedded target (default: start one)")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis for the routes (only read)")
    args = ap.parse_args()
    server = None
    url = args.url
    if url is None:
        from draftsmith.target.embedded import prepare_embedded
        from draftsmith.target.server import VLLMServer, VLLMServerSpec, free_port

        path = prepare_embedded(Path.home() / ".cache" / "draftsmith")
        spec = VLLMServerSpec(model=path, served_name=EMBEDDED_NAME, port=free_port(), max_model_len=2048,
                              kv_cache_gib=1, enforce_eager=True)
        server = VLLMServer(spec, Path(tempfile.mkdtemp()) / "vllm.log").start(timeout_s=900)
        url = server.url
    try:
        with tempfile.TemporaryDirectory() as d:
            cap = Capture(CaptureConfig(enabled=True, sample_rate=1.0, flush_records=16), Path(d) / "records", 0.0,
                          "bench")
            table = RouteTable(redis.Redis.from_url(args.redis), "draftsmith-bench", "bench", url)
            with serve_in_background(Gateway(table, cap, "bench")) as gw, httpx.Client(timeout=300) as client:
                res: dict[tuple[str, bool], list[tuple[float, float]]] = {}
                for i in range(args.requests + 2):
                    stream = i % 2 == 0
                    body = {"model": EMBEDDED_NAME, "temperature": 0.0, "max_tokens": args.max_tokens,
                            "stream": stream, "messages": [{"role": "user", "content": f"Say a word about {i}."}]}
                    order = [("direct", url), ("gateway", gw)] if i % 4 < 2 else [("gateway", gw), ("direct", url)]
                    for side, base in order:
                        t = _timed(client, base, body)
                        if i >= 2:  # the first round of each kind warms connections and caches
                            res.setdefault((side, stream), []).append(t)
            captured = sum(1 for _ in (Path(d) / "records").glob("traffic-*.jsonl"))
    finally:
        if server is not None:
            server.stop()
    med = {k: statistics.median(w for w, _ in v) for k, v in res.items()}
    cpu = {side: statistics.fmean(c for k, v in res.items() if k[0] == side for _, c in v)
           for side in ("direct", "gateway")}
    for stream in (False, True):
        d_, g_ = med[("direct", stream)], med[("gateway", stream)]
        print(f"{'streamed' if stream else 'whole   '}  direct {d_ * 1e3:7.1f} ms  gateway {g_ * 1e3:7.1f} ms  "
              f"added {(g_ - d_) * 1e3:6.1f} ms")
    print(f"CPU per request: direct {cpu['direct'] * 1e3:.2f} ms, gateway {cpu['gateway'] * 1e3:.2f} ms, "
          f"added {(cpu['gateway'] - cpu['direct']) * 1e3:.2f} ms; {captured} capture shards written")
    direct_all = statistics.median(w for k, v in res.items() if k[0] == "direct" for w, _ in v)
    gateway_all = statistics.median(w for k, v in res.items() if k[0] == "gateway" for w, _ in v)
    print(f"RATIO capture_latency {gateway_all / direct_all:.3f}")


if __name__ == "__main__":
    main()
