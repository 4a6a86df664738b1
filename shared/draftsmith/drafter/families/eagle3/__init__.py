"""EAGLE-3 (Li et al., 2025, arXiv:2503.01840): the chain drafter, one draft token per pass.

``model`` (the ``nn.Module``), ``objective`` (the training-time-test objective, feature noise), ``export`` (the
``eagle3`` and ``speculators`` layouts) and ``family`` (``FAMILY``, what the trainer, export and eval ask for). P-EAGLE
builds on this drafter, objective and export; the shared loaders (``drafter/load.py``) read its layouts.
"""
