"""Runner hooks: discrete adversarial training, strict checkpoint loading, tokenizer export."""
from .dat import DATHook
from .strict_load import StrictLoadHook
from .tokenizer_export import TokenizerExportHook

__all__ = ['DATHook', 'StrictLoadHook', 'TokenizerExportHook']
