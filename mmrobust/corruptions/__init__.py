"""Fast, seedable image corruptions (ImageNet-C / COCO-C / Cityscapes-C) and their protocols.

>>> from mmrobust.corruptions import corrupt, derive_seed
>>> out = corrupt(img, 'glass_blur', 3, seed=derive_seed(0, 'img_0001.jpg', 'glass_blur', 3))
"""
from .core import MIN_SIZE, corrupt, derive_seed
from .protocols import (
    BENCHMARK_CORRUPTIONS,
    CATEGORIES,
    CORRUPTIONS,
    HELD_OUT_CORRUPTIONS,
    PROTOCOL_CATEGORIES,
    PROTOCOLS,
    PUBLISHED_SETUPS,
    SEVERITIES,
    CorruptionInfo,
    Protocol,
    PublishedSetup,
    UnknownCorruptionError,
    corruptions_in,
    get_corruption,
    get_protocol,
    resolve_protocol,
)

__all__ = ['MIN_SIZE', 'corrupt', 'derive_seed', 'BENCHMARK_CORRUPTIONS', 'CATEGORIES',
           'CORRUPTIONS', 'HELD_OUT_CORRUPTIONS', 'PROTOCOL_CATEGORIES', 'PROTOCOLS',
           'PUBLISHED_SETUPS', 'SEVERITIES',
           'CorruptionInfo', 'PublishedSetup',
           'Protocol', 'UnknownCorruptionError', 'corruptions_in', 'get_corruption',
           'get_protocol', 'resolve_protocol']
