#!/usr/bin/env python3
"""Hand the GPUs over between the stack's stages before `make up`, `make train` and `make eval` (Makefile).

One host's GPUs serve one stage at a time: the target engine (target-vllm or target-sglang: every GPU, and
127.0.0.1:8000), the extractor while it holds the target (EXTRACT_GPUS; it frees them after EXTRACT_RELEASE_IDLE_S
seconds with an empty queue, and its /metrics says whether: draftsmith_extract_target_held), and the trainer
(every GPU). This script reads which services run (`<compose> ps --services --filter status=running`, every
profile), and for the stage asked:

- up:    stops a target of another engine first (ENGINE=vllm and ENGINE=sglang want the same GPUs and the same
         port; the cpu target the same port); refuses while the extractor holds the target.
- train: refuses while a GPU target runs or the extractor holds the target, naming each and the command that
         frees it.
- eval:  refuses when no target of the engine runs (the evaluator measures the running target).

Stdlib only: it runs on the GPU host without the project's venv. Exit 0 = go on, 1 = refused (the reasons and
fixes on stderr). Where Compose cannot say what runs (no engine, an old client), it warns and goes on.

Tests give it what Compose would print (--running, --extractor-held) instead of a running stack.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys

TARGETS = {"vllm": "target-vllm", "sglang": "target-sglang", "cpu": "target-cpu"}
GPU_ENGINES = ("vllm", "sglang")
PROFILES = ("vllm", "sglang", "cpu", "train", "eval", "s3")
SERVICE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# run inside the extractor: its own /metrics (not published on the host), the sum of the held gauge's samples
HELD_PROBE = ("import urllib.request as u; t = u.urlopen('http://127.0.0.1:9400/metrics', timeout=5).read().decode(); "
              "print(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith('draftsmith_extract_target_held')))")


def parse_services(ps_output: str) -> set[str]:
    """Service names from ``ps --services`` (one per line; docker-compose 1.29.2 prints
    ``'\\n'.join(service.name ...)``, compose/cli/main.py); other lines (warnings) are ignored."""
    return {line.strip() for line in ps_output.splitlines() if SERVICE.match(line.strip())}


def running_services(compose: list[str]) -> set[str] | None:
    """Services with a running container, or None when Compose cannot say."""
    profiles = [a for p in PROFILES for a in ("--profile", p)]
    try:
        out = subprocess.run([*compose, *profiles, "ps", "--services", "--filter", "status=running"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_services(out.stdout) if out.returncode == 0 else None


def extractor_held(compose: list[str]) -> float | None:
    """draftsmith_extract_target_held of the running extractor (targets it holds), or None when unknown."""
    try:
        out = subprocess.run([*compose, "exec", "-T", "extractor", "python", "-c", HELD_PROBE],
                             capture_output=True, text=True, timeout=60)
        return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def decide(stage: str, engine: str, running: set[str], held: float | None,
           compose: str) -> tuple[list[str], list[str], list[str]]:
    """What the stage needs done first.

    Args:
        stage: up, train or eval. engine: ENGINE (vllm, sglang, cpu). running: services with a running container.
        held: the extractor's draftsmith_extract_target_held (None: unknown). compose: the Compose command, for fixes.

    Returns:
        ``(services to stop first, refusals, warnings)``; a refusal names what holds the GPUs and the command that
        frees it.
    """
    stop, refuse, warn = [], [], []
    gpu = engine in GPU_ENGINES
    extractor = "extractor" in running and gpu
    if extractor and held is None and stage in ("up", "train"):  # eval measures the running target only
        warn.append("the extractor runs and whether it holds the target is unknown (its /metrics did not answer): "
                    "if it extracts, it holds EXTRACT_GPUS GPUs")
    elif extractor and (held or 0) > 0 and stage in ("up", "train"):
        refuse.append(f"the extractor holds the target on its GPUs (draftsmith_extract_target_held {held:g}): it "
                      "frees them after EXTRACT_RELEASE_IDLE_S seconds with an empty queue (make status shows "
                      f"extraction); or stop it now: {compose} stop extractor")
    if stage == "up":
        stop = sorted(svc for e, svc in TARGETS.items() if e != engine and svc in running)
    elif stage == "train" and gpu:
        for svc in sorted(TARGETS[e] for e in GPU_ENGINES if TARGETS[e] in running):
            refuse.append(f"{svc} holds every GPU the trainer needs: stop it: {compose} stop {svc} (make up "
                          "starts it again for eval)")
    elif stage == "eval" and TARGETS[engine] not in running:
        others = sorted(svc for svc in TARGETS.values() if svc in running)
        refuse.append(f"no {TARGETS[engine]} runs: the evaluator measures the running target"
                      + (f" ({', '.join(others)} runs: another ENGINE)" if others else "")
                      + f": set DRAFTER_DIR in .env, then make up ENGINE={engine}")
    return stop, refuse, warn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("up", "train", "eval"))
    ap.add_argument("--engine", required=True, choices=tuple(TARGETS))
    ap.add_argument("--compose", required=True, help="the Compose command of the Makefile ($(COMPOSE))")
    ap.add_argument("--running", help="a file with `ps --services` output instead of asking Compose (tests)")
    ap.add_argument("--extractor-held", help="draftsmith_extract_target_held instead of asking the extractor (tests)")
    ap.add_argument("--dry-run", action="store_true", help="print the stop commands instead of running them")
    a = ap.parse_args(argv)
    compose = shlex.split(a.compose)
    if a.running:
        with open(a.running) as f:
            running = parse_services(f.read())
    else:
        running = running_services(compose)
    if running is None:
        print("gpu-handover: Compose did not say which services run; not checked", file=sys.stderr)
        return 0
    held = None
    if a.extractor_held is not None:
        held = float(a.extractor_held) if a.extractor_held != "unknown" else None
    elif "extractor" in running and a.engine in GPU_ENGINES and a.stage != "eval":
        held = extractor_held(compose)
    stop, refuse, warn = decide(a.stage, a.engine, running, held, a.compose)
    for w in warn:
        print(f"gpu-handover: {w}", file=sys.stderr)
    if refuse:
        for r in refuse:
            print(f"gpu-handover: make {a.stage} ENGINE={a.engine} refused: {r}", file=sys.stderr)
        return 1
    for svc in stop:
        cmd = [*compose, "stop", svc]
        print(f"gpu-handover: stopping {svc} first: ENGINE={a.engine} wants its GPUs and 127.0.0.1:8000 "
              f"({shlex.join(cmd)})", file=sys.stderr)
        if not a.dry_run:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
