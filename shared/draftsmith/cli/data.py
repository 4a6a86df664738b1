"""``draftsmith build-data`` and ``draftsmith draft-vocab``: training samples and the draft vocabulary."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.artifacts.status import write_snapshot
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.artifacts.vocab import read_meta
from draftsmith.cli import app, settings
from draftsmith.cli.options import setting_option
from draftsmith.cli.run_record import check_stage, record_stage, run_root, say_changes
from draftsmith.config import settings_to_yaml
from draftsmith.data.build import build_data
from draftsmith.data.vocab import write_draft_vocab
from draftsmith.generation.store import pull_records
from draftsmith.paths import RunPaths
from draftsmith.signals import keep
from draftsmith.staging import staged
from draftsmith.target.checkpoint import target_checkpoint
from draftsmith.target.defaults import apply_data_defaults


def _tokenizer_path(s) -> Path:
    """``data.tokenizer``, else ``target.path``, else the embedded target checkpoint folder."""
    if s.data.tokenizer:
        return Path(s.data.tokenizer).expanduser()

    return target_checkpoint(s)


@app.command("build-data")
def build_data_cmd(
    run: str = typer.Option(None, "--run", help="Run name (records under runs/<run>/records)."),
    max_length: int = setting_option("data.max_length", "--max-length"),
    draft_vocab_size: int = setting_option("data.draft_vocab_size", "--draft-vocab-size"),
    check: bool = typer.Option(False, "--check", help="Only render and validate token-exactly; write nothing."),
) -> None:
    """Render records with the target's chat template, mask, validate token-exactly, pack samples, build d2t/t2d."""
    s = settings(run=run, data={"max_length": max_length, "draft_vocab_size": draft_vocab_size})
    s, taken = check_stage(s, "build-data")  # before anything is read or written
    if taken:
        typer.echo(f"continuing with the run's recorded {', '.join(taken)} (set them to change the run)", err=True)
    root = run_root(s)
    with staged(s, (), () if check else ("data", "config.yaml", "status"), fetch=pull_records) as s:
        paths = RunPaths(s.runs_dir, s.run)
        keep(f"the records in {paths.records}; the training data is built again from them")
        tok_path = _tokenizer_path(s)
        for line in apply_data_defaults(s, tok_path):
            typer.echo(f"Default {line}")
        if not check:  # what the data is built with, its profile defaults included
            say_changes(record_stage(s, "build-data", root), lambda m: typer.echo(m, err=True))
        expected = s.target.model or tok_path.name
        res = build_data(paths.records, paths.data, tok_path, s.data, expected, check_only=check,
                         config_dump=s.model_dump(mode="json"), trust_remote_code=s.target.trust_remote_code)
        st = res.stats
        if check:
            typer.echo(f"check ok: {st['turns_checked']} turns token-exact of {st['records']} records "
                       f"(mismatched {st['turns_mismatched']}, dropped {st['dropped']} {st['dropped_by_reason']}); "
                       f"prompts as served {st['prompts_checked'] - st['prompts_mismatched']}/{st['prompts_checked']}")
            return
        paths.ensure()

        atomic_write_text(paths.config, settings_to_yaml(s))

        vocab = read_meta(paths.vocab, s.data.draft_vocab_size)
        typer.echo(
            f"samples {st['samples']}  tokens {st['tokens']}  supervised {st['supervised_tokens']}  "
            f"dropped {st['dropped']} {st['dropped_by_reason']}  truncated {st['truncations']}  "
            f"token-exact {st['turns_checked'] - st['turns_mismatched']}/{st['turns_checked']}  "
            f"prompts as served {st['prompts_checked'] - st['prompts_mismatched']}/{st['prompts_checked']}"
            + (f"  turns left out {st['dropped_turns_by_reason']}" if st["dropped_turns_by_reason"] else "")
        )
        if vocab:
            typer.echo(f"draft vocabulary N={vocab['size']}: coverage {100 * vocab['coverage']:.2f}%  -> {paths.data}")

        write_snapshot(paths.root, "data", "done",
                       f"samples {st['samples']}, tokens {st['tokens']}, supervised {st['supervised_tokens']}, dropped "
                       f"{st['dropped']}, token-exact {st['turns_checked'] - st['turns_mismatched']}/{st['turns_checked']}"
                       + (f", draft vocab {vocab['size']} coverage {100 * vocab['coverage']:.2f}%" if vocab else ""))


@app.command("draft-vocab")
def draft_vocab_cmd(
    run: str = typer.Option(None, "--run", help="Run name (uses runs/<run>/data/vocab/counts.safetensors)."),
    size: list[int] = typer.Option(..., "--size", "-n", help="Draft vocabulary size N (repeatable)."),
) -> None:
    """Rebuild the draft vocabulary with another N from the stored token counts (no regeneration, no features)."""
    s = settings(run=run)
    vocab_dir = RunPaths(s.runs_dir, s.run).vocab
    for n in size:
        meta = write_draft_vocab(vocab_dir, n)
        typer.echo(f"draft-{n}: coverage {100 * meta['coverage']:.2f}% of {meta['supervised_tokens']} supervised "
                   f"tokens ({meta['distinct_tokens']} distinct), data {meta['data_hash'][:12]}")
