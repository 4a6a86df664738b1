"""P-EAGLE: EAGLE-3's drafter drafting K tokens from one pass, K - 1 of them from mask slots (vLLM's
``parallel_drafting``).

``model`` (the drafter, its mask inputs and the serve-time reference pass) and ``family`` (``FAMILY``); the objective
and export are EAGLE-3's (:mod:`draftsmith.drafter.families.eagle3`).
"""
