"""The drafter: what every family shares (data, training-time test, trainer, checkpoints, loading) and, under
``families/``, one folder per drafter family with its model, objective, export and ``FAMILY``.

One file per concept: ``config`` (shape copied from the target), ``vocab`` (draft vocabulary, init from the target),
``data`` and ``loader`` (samples, the FeatureSource protocol, batches), ``ttt`` and ``ttt_attention`` (unroll, loss,
attention), ``optimizer`` (optimizers, learning-rate schedule), ``trainer``, ``checkpoint``, ``load``, ``offline``,
``hf_features`` (the target loaded in transformers); ``families/eagle3``, ``families/peagle``, ``families/dflash``
(docs/architecture.md, "The drafter").
"""
