"""mmrobust: corruption-robust dense prediction for MMDetection 3.x and MMSegmentation 1.x.

Importing the package registers every mmrobust module in both the ``mmdet`` and the ``mmseg``
scopes (configs load it with ``custom_imports = dict(imports=['mmrobust'],
allow_failed_imports=False)``) and makes mmengine load local checkpoints through the safe,
allow-listed loader of :mod:`mmrobust.utils.checkpoint`; mmengine's FLOP counter gets a handle
for fused attention (:mod:`mmrobust.utils.flops`).
"""
from .utils.checkpoint import install_safe_checkpoint_loader
from .utils.flops import register_flop_handles
from .version import __version__

install_safe_checkpoint_loader()
register_flop_handles()

from . import datasets, engine, evaluation, models, registry  # noqa: E402,F401  (registers)

__all__ = ['__version__']
