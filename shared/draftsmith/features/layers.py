"""The one layer-id convention of draftsmith's features, and how each engine names the same tensors.

Convention (``features/manifest.json`` ``layer_ids``, formats.md §4): id ``i`` is the OUTPUT of decoder layer ``i``
(0-based), the SpecForge / EAGLE-3-paper "output of layer X" naming. The default picks low / middle / high layers
from the target's depth as EAGLE-3 does: ``(1, L//2 - 1, L - 4)``, so ``(1, 14, 26)`` for SmolLM2 (L = 30).

The same tensor under other names (checked against the sources, and by tests):

============================  ==========================  ======================================================
where                         name of "output of layer i"  source
============================  ==========================  ======================================================
transformers                  ``hidden_states[i + 1]``     ``output_hidden_states=True``; ``hidden_states[0]`` is
                                                           the embedding output (tests/features/test_hf.py)
vLLM 0.32 aux layer id        ``i + 1``                    ``EagleModelMixin._maybe_add_hidden_state`` is called
                                                           with ``idx + 1`` after decoder layer ``idx``; default
                                                           ``(2, L//2, L-3)`` = EAGLE code's "input of layer"
SGLang, first id == 1        ``i``                        ``set_eagle3_layers_to_capture`` adds 1 (its capture
                                                           loop fires BEFORE layer ``k``)
SGLang, first id != 1        ``i + 1``                    no +1 (sglang PR 25454 keeps the +1 only when the
                                                           first id is 1): vLLM's numbering
============================  ==========================  ======================================================

So a drafter trained on our ``(1, 14, 26)`` must be exported to vLLM with ``eagle_aux_hidden_state_layer_ids =
[2, 15, 27]`` (:func:`vllm_aux_ids`); writing ``[1, 14, 26]`` makes vLLM feed the outputs of layers 0, 13, 25: the
silent off-by-one of vLLM PR 43671. ``[2, 15, 27]`` is also what current SGLang reads as the same tensors.

Layouts (checked in the sources): vLLM reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` of the ``eagle3``
layout (``gpu_model_runner``) and the top-level key of the ``speculators`` layout (``configs/speculators/algos.py``)
the same way, ``i + 1``. SGLang loads only the ``eagle3`` layout. When our first layer is 0, vLLM's ids start at 1
and SGLang takes them for output-of-layer ids: every layer one too deep. No id list means output of layer 0 to both
engines (``[0, ...]`` is the embedding to SGLang), so :func:`eagle3_layout_ids` refuses it and the ``speculators``
layout (vLLM only) carries such a drafter.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftsmith.errors import ConfigError

NUM_AUX_LAYERS = 3  # EAGLE-3 fuses three target layers: fc is Linear(3*H -> H)


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / middle / high layers for a target of ``num_layers`` decoder layers.

    Returns ``(1, L//2 - 1, L - 4)`` (outputs of decoder layers; SpecForge's default, the EAGLE code's
    ``(2, L//2, L-3)`` in its "input of layer" naming).

    Raises:
        ConfigError: the target has fewer than 6 layers (the three ids would not be distinct and increasing).
    """
    if num_layers < 6:
        raise ConfigError(
            f"the target has {num_layers} decoder layers; the default EAGLE-3 layers need at least 6",
            "pass explicit --layers a,b,c",
        )
    return (1, num_layers // 2 - 1, num_layers - 4)


def parse_layer_ids(spec: str | Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    """Validate layer ids (``"1,14,26"``, a sequence, or None for the default) against the target's depth.

    Args:
        spec: comma-separated ids, a sequence of ints, or None (= :func:`default_layer_ids`).
        num_layers: decoder layers of the target (``config.num_hidden_layers``).

    Returns:
        Three strictly increasing ids in ``[0, num_layers - 1)`` (the last layer's output only exists after the
        final norm, which is stored separately as ``final_hidden``).

    Raises:
        ConfigError: not three integers, out of range, or not strictly increasing; the message gives the range.
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return default_layer_ids(num_layers)
    try:
        ids = tuple(int(x) for x in (spec.split(",") if isinstance(spec, str) else spec))
    except ValueError as e:
        raise ConfigError(f"layer ids {spec!r} are not integers", "pass e.g. --layers 1,14,26") from e
    fix = f"pass three increasing ids in 0..{num_layers - 2} (default {default_layer_ids(num_layers)})"
    if len(ids) != NUM_AUX_LAYERS:
        raise ConfigError(f"EAGLE-3 takes exactly {NUM_AUX_LAYERS} layer ids, got {len(ids)} ({spec})", fix)
    bad = [i for i in ids if not 0 <= i < num_layers - 1]
    if bad:
        raise ConfigError(f"layer ids {bad} are out of range for a target with {num_layers} decoder layers", fix)
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise ConfigError(f"layer ids {ids} are not strictly increasing", fix)
    return ids


def hf_hidden_index(layer_id: int) -> int:
    """Index into transformers' ``output_hidden_states`` tuple of the output of decoder layer ``layer_id``."""
    return layer_id + 1


def vllm_aux_ids(layer_ids: Sequence[int]) -> list[int]:
    """vLLM's ``eagle_aux_hidden_state_layer_ids`` that make vLLM read the tensors named by ``layer_ids``.

    vLLM 0.32 records aux id ``k`` after decoder layer ``k - 1`` (``_maybe_add_hidden_state(..., idx + 1, ...)``),
    so the output of layer ``i`` is vLLM id ``i + 1``. Proven by ``tests/features/test_vllm_backend.py``.
    """
    return [int(i) + 1 for i in layer_ids]


def sglang_reads(config_ids: Sequence[int]) -> list[int]:
    """The decoder layers whose OUTPUTS SGLang feeds the drafter for ``eagle_aux_hidden_state_layer_ids``.

    SGLang's ``set_eagle3_layers_to_capture`` (after PR 25454): when the first id is 1 the ids are taken as
    output-of-layer ids (``+1`` onto its capture-before-layer loop); otherwise as capture-before-layer ids, so id
    ``k`` is the output of layer ``k - 1`` (id 0 would be the embedding, returned as -1).
    """
    ids = [int(i) for i in config_ids]
    return ids if ids and ids[0] == 1 else [i - 1 for i in ids]


def eagle3_layout_ids(layer_ids: Sequence[int]) -> list[int]:
    """``eagle_aux_hidden_state_layer_ids`` for the ``eagle3`` layout, read by vLLM and SGLang alike.

    Raises:
        ConfigError: the first layer is 0: vLLM's ids then start at 1, which SGLang reads one layer too deep, and
        no other id list names the output of layer 0 to both engines.
    """
    ids = vllm_aux_ids(layer_ids)
    if sglang_reads(ids) != [int(i) for i in layer_ids]:
        raise ConfigError(
            f"layer ids {list(layer_ids)} start at layer 0: the eagle3 layout would hold {ids}, which SGLang reads "
            f"as the outputs of layers {sglang_reads(ids)}",
            "serve this drafter in vLLM from the speculators layout (export --format speculators), or train with "
            "a first layer >= 1 (the default is 1) for SGLang",
        )
    return ids
