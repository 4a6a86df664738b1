"""The EAGLE-3 drafter: model, training-time test, trainer, checkpoints, export, offline acceptance estimate.

One file per concept: ``config`` (shape copied from the target), ``model`` (plain nn.Module), ``vocab`` (draft
vocabulary, init from the target), ``data`` (samples and the FeatureSource protocol), ``ttt`` (unroll and loss),
``trainer``, ``checkpoint``, ``export``, ``load``, ``offline``, ``hf_features`` (the target loaded in transformers).
"""
