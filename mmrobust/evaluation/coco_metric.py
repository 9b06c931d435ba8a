"""mmdet's COCO metric with a choice of COCO evaluation library.

``RobustCocoMetric`` is mmdet's ``CocoMetric`` (same arguments, same keys, same rounding) whose
masks are run-length encoded faster (:mod:`.mask_rle`, byte-identical) and whose ``COCO`` /
``COCOeval`` come from the backend it is given:

- ``pycocotools``: the reference (mmdet's own default);
- ``faster-coco-eval``: a drop-in reimplementation of pycocotools' evaluate / accumulate in C++
  (tests/test_evaluation/test_coco_metric.py checks that all 12 numbers of bbox and segm
  equal pycocotools' to 1e-4 on sets with crowd regions, empty images and masks); the
  default of robustness runs;
- ``mmdet-mp``: pycocotools with mmdet's multi-process ``COCOevalMP`` (``use_mp_eval=True``).

``tools/analysis_tools/benchmark_coco_metric.py`` times them on the same predictions. Which
backend an evaluator config's COCO metrics use is chosen in :mod:`.evaluator_cfg`.
"""
import copy
import importlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Dict, Iterator, List, Optional, Sequence

from mmdet.evaluation.metrics import CocoMetric

from ..registry import METRICS
from ..utils.errors import MMRobustError, UsageError

__all__ = ['COCO_BACKENDS', 'DEFAULT_ROBUSTNESS_BACKEND', 'CocoBackend', 'UnknownBackendError',
           'BackendNotInstalledError', 'coco_backend', 'RobustCocoMetric']


@dataclass(frozen=True)
class _Spec:
    package: str  # the distribution pip installs
    install: str  # what to run when it is missing
    summary: str


# NOTE: the pin is requirements.txt's (tools/setup_env.sh installs it)
COCO_BACKENDS: Dict[str, _Spec] = {
    'pycocotools': _Spec('pycocotools', 'pip install pycocotools',
                         "the reference COCO API (mmdet's default)"),
    'faster-coco-eval': _Spec('faster-coco-eval', 'pip install faster-coco-eval==1.8.0',
                              "pycocotools' evaluate/accumulate in C++ (same numbers)"),
    'mmdet-mp': _Spec('pycocotools', 'pip install pycocotools',
                      "pycocotools with mmdet's multi-process COCOevalMP (use_mp_eval)"),
}
DEFAULT_ROBUSTNESS_BACKEND = 'faster-coco-eval'


class UnknownBackendError(UsageError):
    """A COCO backend name that is not one of :data:`COCO_BACKENDS`."""


class BackendNotInstalledError(MMRobustError, ImportError):
    """The library of a known COCO backend is not installed."""


@dataclass(frozen=True)
class CocoBackend:
    """A COCO evaluation library: its ``COCO`` and ``COCOeval`` classes and its version."""
    name: str
    version: str
    coco: type
    cocoeval: type

    @property
    def label(self) -> str:
        """``name version``, as results files record it."""
        return f'{self.name} {self.version}'


def coco_backend(name: str) -> CocoBackend:
    """The backend called ``name``.

    Raises:
        UnknownBackendError: ``name`` is not a backend (the message lists them).
        BackendNotInstalledError: its library is missing (the message says how to install it).
    """
    if name not in COCO_BACKENDS:
        choices = ', '.join(f'{k} ({v.summary})' for k, v in COCO_BACKENDS.items())
        raise UnknownBackendError(f'unknown COCO backend {name!r}; choose one of: {choices}')
    spec = COCO_BACKENDS[name]
    try:
        if name == 'faster-coco-eval':
            module = importlib.import_module('faster_coco_eval')
            coco, cocoeval = module.COCO, module.COCOeval_faster
        else:
            from mmdet.datasets.api_wrappers import COCO, COCOeval, COCOevalMP
            coco, cocoeval = COCO, (COCOevalMP if name == 'mmdet-mp' else COCOeval)
        lib_version = version(spec.package)
    except (ImportError, PackageNotFoundError) as err:
        raise BackendNotInstalledError(
            f'the COCO backend {name!r} needs the package {spec.package!r}, which is not '
            f'installed ({err}); install it with `{spec.install}` (tools/setup_env.sh does), or '
            f"choose another backend (test_evaluator.backend / --coco-backend): "
            f'{", ".join(COCO_BACKENDS)}') from err
    return CocoBackend(name, lib_version, coco, cocoeval)


# mmdet's compute_metrics names COCOeval through its module's globals
_SWAP_LOCK = threading.RLock()  # NOTE: re-entered: the COCOeval and the loadRes swaps


@contextmanager
def _mmdet_cocoeval(cocoeval: type) -> Iterator[None]:
    from mmdet.evaluation.metrics import coco_metric as module
    with _SWAP_LOCK:  # NOTE: one metric at a time in a process swaps the class
        saved = module.COCOeval, module.COCOevalMP
        # NOTE: mmdet names COCOevalMP when use_mp_eval is set (backend 'mmdet-mp')
        module.COCOeval = module.COCOevalMP = cocoeval
        try:
            yield
        finally:
            module.COCOeval, module.COCOevalMP = saved


@METRICS.register_module()
class RobustCocoMetric(CocoMetric):
    """mmdet's ``CocoMetric`` evaluated by the COCO library ``backend``.

    Args:
        backend: one of :data:`COCO_BACKENDS`; the ground truth is parsed by the backend's own
            ``COCO`` and evaluated by its own ``COCOeval``.
        ann_file: as ``CocoMetric``'s.
        per_image: also return, under :data:`~.per_image.PER_IMAGE_KEY`, each evaluated IoU
            type's per-image matching (:func:`~.per_image.coco_block`) for the bootstrap of
            ``tools/robustness_report.py`` (robustness runs set it).
        sort_categories: as ``CocoMetric``'s: sort the annotation file's categories by id
            (Objects365 v1 lists them out of order), as mmdet does after parsing it.
        use_mp_eval: not an argument here: choose ``backend='mmdet-mp'``.
        **kwargs: the other arguments of mmdet's ``CocoMetric`` (metric, classwise, ...).

    A prediction set without a single detection (a cell where the model finds nothing) is
    scored as COCOeval scores detections that miss every object (AP 0 where there is ground
    truth), with a log line, by every backend; mmdet's ``CocoMetric`` returns no numbers at all
    for it under pycocotools, which would drop the cell out of a mean.
    """

    def __init__(self, backend: str = 'pycocotools', ann_file: Optional[str] = None,
                 per_image: bool = False, sort_categories: bool = False, **kwargs) -> None:
        if 'use_mp_eval' in kwargs:
            raise TypeError("RobustCocoMetric: instead of use_mp_eval choose "
                            "backend='mmdet-mp'")
        self.backend = coco_backend(backend)
        self.per_image = per_image
        # NOTE: mmdet would parse ann_file with pycocotools; the backend parses it below
        super().__init__(ann_file=None, use_mp_eval=backend == 'mmdet-mp',
                         sort_categories=sort_categories, **kwargs)
        self.ann_file = ann_file
        if ann_file is not None:
            from mmengine.fileio import get_local_path
            with get_local_path(ann_file, backend_args=self.backend_args) as local_path:
                self._coco_api = self.backend.coco(local_path)
            if sort_categories:
                _sort_categories(self._coco_api)

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """mmdet's ``process`` with the masks run-length encoded by :func:`encode_masks`.

        Byte-identical RLE, 2.6x less time in the test loop.
        """
        import torch

        from .mask_rle import encode_masks
        encoded = []
        for sample in data_samples:
            pred = sample['pred_instances']
            if isinstance(pred.get('masks'), torch.Tensor):
                # NOTE: copies: the next metric of the evaluator gets the sample as it was
                sample = {**sample, 'pred_instances': {**pred,
                                                       'masks': encode_masks(pred['masks'])}}
            encoded.append(sample)
        super().process(data_batch, encoded)

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """mmdet's computation, with the backend's ``COCO``.

        mmdet's computation; ground truth converted from the dataset (no ann_file) is parsed by the
        backend's ``COCO`` too.
        """
        if self._coco_api is None:
            gts = [gt for gt, _ in results]
            self._gt_from_dataset(gts)
        cocoeval = _keeping(self.backend.cocoeval) if self.per_image else self.backend.cocoeval
        with _mmdet_cocoeval(cocoeval), _empty_results_scored(self._coco_api):
            start = len(_KEPT)  # NOTE: the swap's lock is held: no other metric appends
            metrics = super().compute_metrics(results)
            evaluated = _KEPT[start:]
            del _KEPT[start:]
        if self.per_image:
            from .per_image import PER_IMAGE_KEY, coco_block
            metrics[PER_IMAGE_KEY] = [coco_block(e, f'{e.params.iouType}_') for e in evaluated
                                      if e.params.useCats]
        return metrics

    def _gt_from_dataset(self, gts) -> None:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            prefix = self.outfile_prefix or f'{tmp}/results'
            self._coco_api = self.backend.coco(self.gt_to_coco_json(gts, prefix))


#: The COCOeval objects of the running metric, kept after ``evaluate`` (see :func:`_keeping`).
_KEPT: List[Any] = []
_KEEPING_PREFIX = '_Keeping'


def _kept_evaluate(self: Any) -> None:
    super(type(self), self).evaluate()
    _KEPT.append(self)


def _keeping(cocoeval: type) -> type:
    """The backend's COCOeval whose objects are kept after ``evaluate``.

    They are kept for their per-image matching. It is a class of this module: mmdet-mp pickles the
    object to its processes, which find the class by name (see the module's ``__getattr__``).
    """
    name = f'{_KEEPING_PREFIX}{cocoeval.__name__}'
    cls = globals().get(name)
    if cls is None or cls.__bases__[0] is not cocoeval:
        cls = type(name, (cocoeval, ), {'evaluate': _kept_evaluate, '__module__': __name__,
                                        '__qualname__': name})
        globals()[name] = cls
    return cls


def __getattr__(name: str) -> type:
    """A :func:`_keeping` class by name, in a process that unpickles it before building it."""
    if name.startswith(_KEEPING_PREFIX):
        for backend in COCO_BACKENDS:
            cocoeval = coco_backend(backend).cocoeval
            if f'{_KEEPING_PREFIX}{cocoeval.__name__}' == name:
                return _keeping(cocoeval)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _sort_categories(coco_api: Any) -> None:
    """mmdet's ``sort_categories``.

    The categories in id order, in the index and the dataset (``get_cat_ids``, hence each label's
    category, follows this order).
    """
    coco_api.cats = {i: coco_api.cats[i] for i in sorted(coco_api.cats)}
    coco_api.dataset['categories'] = sorted(coco_api.dataset['categories'],
                                            key=lambda c: c['id'])


@contextmanager
def _empty_results_scored(coco_api: Any) -> Iterator[None]:
    """``coco_api.loadRes([])`` gives a result set without detections instead of failing.

    pycocotools' ``loadRes`` indexes the first result, so mmdet's ``compute_metrics`` catches
    the IndexError, logs "results ... empty" and returns ``{}`` for a cell where the model
    detected nothing; faster-coco-eval scores it (zeros). Every backend now scores it. The
    class is patched for the block (not the instance: mmdet-mp pickles the instance to its
    processes), one metric at a time.
    """
    if coco_api is None:
        yield
        return
    from mmengine.logging import print_log
    cls = type(coco_api)
    original = cls.loadRes

    def load_res(self: Any, results: Any) -> Any:
        if isinstance(results, (list, tuple)) and len(results) == 0:
            print_log('no detection in the whole prediction set: scored as detections that '
                      'miss every object (AP 0 wherever there is ground truth)',
                      logger='current', level=30)
            empty = type(self)()
            empty.dataset = {'images': list(self.dataset['images']),
                             'categories': copy.deepcopy(self.dataset['categories']),
                             'annotations': []}
            empty.createIndex()
            return empty
        return original(self, results)

    with _SWAP_LOCK:
        cls.loadRes = load_res
        try:
            yield
        finally:
            cls.loadRes = original
