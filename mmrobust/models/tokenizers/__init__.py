"""Vector-quantized tokenizers (VQGAN) and their training model."""
from ..checkpoint import load_tokenizer_checkpoint
from .trainer import VQTokenizerTrainer
from .vqgan import VQGAN, VQGAN_ARCHS, VectorQuantizer, checkpoint_filter_fn, quantize_images

__all__ = ['VQGAN', 'VQGAN_ARCHS', 'VQTokenizerTrainer', 'VectorQuantizer', 'checkpoint_filter_fn',
           'load_tokenizer_checkpoint', 'quantize_images']
