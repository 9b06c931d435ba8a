"""Corruption registry (name → function, category) and the named evaluation protocols.

A protocol is an ordered set of (corruption, severity) cells. The published benchmarks differ in
which cells they use, so every tool names the protocol it runs (see the spec's table):

========================  ================================================  ===========
protocol                  corruptions                                       severities
========================  ================================================  ===========
``benchmark`` (COCO-C)    the 15 of ImageNet-C                              1–5
``cityscapes_c``          the 19 minus zoom, elastic, pixelate (SegFormer)  noise 1–3, else 1–5
``fan_coco_c``            FAN's 16 (4 per category)                         1–5
``fan_city_c``            FAN's Cityscapes-C script: all 19                 1–3
``all``                   all 19                                            1–5
========================  ================================================  ===========
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..utils.errors import UnknownNameError, UsageError
from . import functional as F

CATEGORIES = ('noise', 'blur', 'weather', 'digital')
#: What a protocol's source may file a corruption under: ImageNet-C's categories, or none of them
#: (FAN's Cityscapes-C script lists zoom blur and elastic transform as ``extra``).
PROTOCOL_CATEGORIES = CATEGORIES + ('extra', )
#: the protocol of a tool run that names none
DEFAULT_PROTOCOL = 'benchmark'
SEVERITIES = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class CorruptionInfo:
    """A registered corruption.

    Attributes:
        name: the reference's name (``gaussian_noise``, ...).
        fn: ``fn(rgb_uint8_hwc, severity, rng) -> hwc image in [0, 255]``.
        category: one of :data:`CATEGORIES`.
        held_out: one of the 4 validation corruptions of ImageNet-C.
        geometric: moves pixels, so dense labels no longer line up exactly.
    """
    name: str
    fn: Callable
    category: str
    held_out: bool = False
    geometric: bool = False


# name, category, held-out, geometric -- in the reference's order (its corruption numbers)
_TABLE = (
    ('gaussian_noise', 'noise', False, False),
    ('shot_noise', 'noise', False, False),
    ('impulse_noise', 'noise', False, False),
    ('defocus_blur', 'blur', False, False),
    ('glass_blur', 'blur', False, False),
    ('motion_blur', 'blur', False, False),
    ('zoom_blur', 'blur', False, True),
    ('snow', 'weather', False, False),
    ('frost', 'weather', False, False),
    ('fog', 'weather', False, False),
    ('brightness', 'weather', False, False),
    ('contrast', 'digital', False, False),
    ('elastic_transform', 'digital', False, True),
    ('pixelate', 'digital', False, False),
    ('jpeg_compression', 'digital', False, False),
    ('speckle_noise', 'noise', True, False),
    ('gaussian_blur', 'blur', True, False),
    ('spatter', 'weather', True, False),
    ('saturate', 'digital', True, False),
)

CORRUPTIONS: Dict[str, CorruptionInfo] = {
    name: CorruptionInfo(name, getattr(F, name), category, held_out, geometric)
    for name, category, held_out, geometric in _TABLE
}
BENCHMARK_CORRUPTIONS = tuple(n for n, info in CORRUPTIONS.items() if not info.held_out)
HELD_OUT_CORRUPTIONS = tuple(n for n, info in CORRUPTIONS.items() if info.held_out)


class UnknownCorruptionError(UnknownNameError):
    """An unknown corruption, category or protocol name (the message lists the valid ones)."""


def get_corruption(name: str) -> CorruptionInfo:
    """The registered corruption ``name``; the error lists the valid names."""
    try:
        return CORRUPTIONS[name]
    except KeyError:
        raise UnknownCorruptionError(
            f'Unknown corruption {name!r}. Valid corruptions: {", ".join(CORRUPTIONS)}.') from None


def corruptions_in(category: str) -> Tuple[str, ...]:
    """Names of the corruptions of a category (noise, blur, weather, digital)."""
    if category not in CATEGORIES:
        raise UnknownCorruptionError(
            f'Unknown category {category!r}. Valid categories: {", ".join(CATEGORIES)}.')
    return tuple(n for n, info in CORRUPTIONS.items() if info.category == category)


@dataclass(frozen=True)
class Protocol:
    """An ordered set of corruption cells.

    ``severities`` maps corruption → its severities; ``categories`` the corruptions its source files
    under another category than ImageNet-C does (SegFormer's Cityscapes-C puts brightness under
    digital).
    """
    name: str
    description: str
    severities: Mapping[str, Tuple[int, ...]]
    categories: Mapping[str, str] = field(default_factory=dict)

    @property
    def corruptions(self) -> Tuple[str, ...]:
        """The protocol's corruption names, in its order."""
        return tuple(self.severities)

    def category(self, corruption: str) -> str:
        """The corruption's category as this protocol's source groups it."""
        return self.categories.get(corruption) or CORRUPTIONS[corruption].category

    def cells(self) -> List[Tuple[str, int]]:
        """(corruption, severity) pairs in protocol order."""
        return [(c, s) for c, sevs in self.severities.items() for s in sevs]


def _protocol(name: str, description: str, corruptions: Iterable[str],
              low_severity_noise: bool = False,
              categories: Optional[Mapping[str, str]] = None,
              severities: Sequence[int] = SEVERITIES) -> Protocol:
    table = {}
    for c in corruptions:
        noise = CORRUPTIONS[c].category == 'noise'
        table[c] = (1, 2, 3) if (low_severity_noise and noise) else tuple(severities)
    return Protocol(name, description, table, dict(categories or {}))


PROTOCOLS: Dict[str, Protocol] = {
    p.name: p for p in (
        _protocol('benchmark', 'COCO-C / ImageNet-C: the 15 corruptions at severities 1-5 '
                  '(Michaelis et al. 2019)', BENCHMARK_CORRUPTIONS),
        _protocol('cityscapes_c', 'Cityscapes-C as in SegFormer: 16 corruptions (all 19 but '
                  'zoom_blur, elastic_transform, pixelate), noise at severities 1-3',
                  [c for c in CORRUPTIONS
                   if c not in ('zoom_blur', 'elastic_transform', 'pixelate')],
                  low_severity_noise=True,
                  # NOTE: SegFormer's table: digital = brightness, contrast, saturate, JPEG
                  categories={'brightness': 'digital'}),
        _protocol('fan_coco_c', "FAN's COCO-C: 16 corruptions, 4 per category, severities 1-5",
                  ['gaussian_noise', 'shot_noise', 'impulse_noise', 'speckle_noise',
                   'defocus_blur', 'motion_blur', 'gaussian_blur', 'glass_blur',
                   'snow', 'frost', 'fog', 'spatter',
                   'brightness', 'contrast', 'saturate', 'jpeg_compression'],
                  # NOTE: NVlabs/FAN detection/tools/dist_test_coco_c.sh lists them 4 per line:
                  # brightness with contrast, saturate and JPEG
                  categories={'brightness': 'digital'}),
        _protocol('fan_city_c', "FAN's Cityscapes-C (NVlabs/FAN segmentation/tools/test_city_c.py "
                  'at b7ced45, its HEAD): all 19 corruptions at severities 1-3, each averaged '
                  'over its severities',
                  ['gaussian_noise', 'shot_noise', 'speckle_noise', 'impulse_noise',
                   'zoom_blur', 'elastic_transform',
                   'gaussian_blur', 'motion_blur', 'glass_blur', 'defocus_blur',
                   'contrast', 'jpeg_compression', 'saturate', 'pixelate',
                   'snow', 'fog', 'frost', 'spatter', 'brightness'],
                  # NOTE: the script's groups and order: noise 4, extra (zoom blur, elastic
                  # transform; no category), blur 4, digital 4, weather 5 with brightness.
                  # Its first release (6467085, May 2022) ran severities 1-5; b7ced45 (June
                  # 2022, "Update test_city_c.py") changed the range to 1-3
                  categories={'zoom_blur': 'extra', 'elastic_transform': 'extra'},
                  severities=(1, 2, 3)),
        _protocol('all', 'All 19 corruptions at severities 1-5', CORRUPTIONS),
    )
}


@dataclass(frozen=True)
class PublishedSetup:
    """How a published table's corrupted images were made, and the flags that reproduce it."""
    bgr_compat: bool  # corrupted as mmcv's BGR array read as RGB
    source: str  # 'on-the-fly' or 'stored'
    jpeg_quality: Optional[int]  # the stored set's JPEG quality (None: lossless or on the fly)
    origin: str  # whose evaluation
    flags: str  # what reproduces it here


#: The published tables' set-ups, by protocol (where their code says; ``tools/analysis_tools/
#: model_zoo.py --check`` compares a run with them).
PUBLISHED_SETUPS: Dict[str, PublishedSetup] = {
    'benchmark': PublishedSetup(
        True, 'on-the-fly', None, "Michaelis et al. 2019 and DAT: mmdet's Corrupt on mmcv's BGR "
        'image, on the fly', 'tools/test_robustness.py --protocol benchmark --bgr-compat'),
    'fan_coco_c': PublishedSetup(
        True, 'stored', 95, "FAN: imagecorruptions on mmcv's BGR read, stored as JPEG quality 95",
        'tools/make_corrupted.py SRC OUT --protocol fan_coco_c --bgr-compat --jpeg-quality 95, '
        'then tools/test_robustness.py --protocol fan_coco_c --corrupted-root OUT'),
    'fan_city_c': PublishedSetup(
        True, 'stored', None, "FAN's gen_city_c.py: imagecorruptions on mmcv's BGR read. As "
        'released it reads and writes *.jpg (OpenCV JPEG, quality 95), which finds no '
        "Cityscapes image (PNG): it must have been edited to run, and PNG in, PNG out (lossless) "
        'is an inference, not what its code does',
        'tools/make_corrupted.py SRC OUT --protocol fan_city_c --bgr-compat '
        '(PNG stays PNG), then tools/test_robustness.py --protocol fan_city_c '
        '--corrupted-root OUT'),
}


def get_protocol(name: str) -> Protocol:
    """The named protocol; the error lists the valid names."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise UnknownCorruptionError(
            f'Unknown protocol {name!r}. Valid protocols: {", ".join(PROTOCOLS)}.') from None


def resolve_protocol(protocol: Optional[str] = None,
                     corruptions: Optional[Sequence[str]] = None,
                     severities: Optional[Sequence[int]] = None) -> Protocol:
    """A named protocol, or a custom one from explicit corruptions and/or severities.

    ``corruptions`` may also name categories (``noise``, ...). Given together with
    ``protocol``, the explicit lists restrict that protocol. Given nothing, it is the
    ``benchmark`` protocol itself (so its results files resume ``--protocol benchmark`` runs).
    """
    if not protocol and not corruptions and not severities:
        return get_protocol(DEFAULT_PROTOCOL)
    base = get_protocol(protocol) if protocol else None
    if corruptions:
        names: List[str] = []
        for item in corruptions:
            for name in (corruptions_in(item) if item in CATEGORIES
                         else (get_corruption(item).name,)):
                if name not in names:
                    names.append(name)
    else:
        names = list(base.corruptions if base else BENCHMARK_CORRUPTIONS)
    if severities:
        bad = [s for s in severities if s not in SEVERITIES]
        if bad:
            raise UsageError(f'Severities must be in 1..5, got {bad}.')
    table = {}
    for name in names:
        allowed = base.severities.get(name, ()) if base else SEVERITIES
        if base and name not in base.severities:
            raise UnknownCorruptionError(
                f'Corruption {name!r} is not part of protocol {base.name!r} '
                f'({", ".join(base.corruptions)}).')
        sevs = tuple(s for s in allowed if not severities or s in severities)
        if sevs:
            table[name] = sevs
    if not table:
        raise UsageError('The selection of corruptions and severities is empty.')
    if base and not corruptions and not severities:
        return base
    label = base.name if base else 'custom'
    return Protocol(f'{label}:custom' if base else 'custom',
                    f'{len(table)} corruptions' + (f' of {label}' if base else ''), table,
                    dict(base.categories) if base else {})
