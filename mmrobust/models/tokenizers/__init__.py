from .checkpoint import load_tokenizer_checkpoint
from .vqgan import VQGAN, VQGAN_ARCHS, VectorQuantizer, checkpoint_filter_fn

__all__ = ['VQGAN', 'VQGAN_ARCHS', 'VectorQuantizer', 'checkpoint_filter_fn',
           'load_tokenizer_checkpoint']
