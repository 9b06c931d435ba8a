"""Layers shared by the backbones (FAN's channel processing, MLPs, norms, positions)."""
from .channel_processing import ChannelProcessing, DWConvBN, MlpDWBN
from .mlp import ConvMlp, Mlp
from .norm import LayerNorm2d
from .pos_embed import PositionalEncodingFourier, fourier_features
from .separable_conv import BN_TF, SeparableConv

__all__ = ['ChannelProcessing', 'DWConvBN', 'MlpDWBN', 'ConvMlp', 'Mlp', 'LayerNorm2d',
           'PositionalEncodingFourier', 'fourier_features', 'BN_TF', 'SeparableConv']
