"""DFlash (Chen, Liang and Liu, 2026, arXiv 2602.06036): block diffusion over several target layers, one block of
draft tokens per pass.


``model`` (the ``nn.Module``), ``objective`` (anchors, masked blocks, loss), ``export`` (the ``dflash`` layout) and
``family`` (``FAMILY``).
"""
