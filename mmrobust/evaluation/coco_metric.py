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
import types
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

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
        """mmdet's computation, with the backend's ``COCO`` and ``COCOeval``.

        Ground truth converted from the dataset (no ann_file) is parsed by the backend's ``COCO``
        too. mmdet's own ``compute_metrics`` runs with its ``COCOeval`` / ``COCOevalMP`` bound,
        for this call only, to the backend's (:func:`_mmdet_compute_metrics`): nothing shared
        is changed, so metrics of other backends may compute beside this one, and the COCOeval
        objects this call evaluates are its own (kept for the per-image matching).
        """
        if self._coco_api is None:
            gts = [gt for gt, _ in results]
            self._gt_from_dataset(gts)
        empty = all(len(pred['labels']) == 0 for _, pred in results)
        # NOTE: an empty set is scored in this process: mmdet-mp's workers would unpickle the
        # ground truth with the instance's loadRes of an empty set (a closure) otherwise
        cocoeval = (coco_backend('pycocotools').cocoeval if empty and self.backend.name ==
                    'mmdet-mp' else self.backend.cocoeval)
        evaluated: List[Any] = []

        def build(*args: Any, **kwargs: Any) -> Any:
            evaluation = cocoeval(*args, **kwargs)
            evaluated.append(evaluation)
            return evaluation

        with _empty_predictions_scored(self._coco_api, empty):
            metrics = _mmdet_compute_metrics(build)(self, results)
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


def _mmdet_compute_metrics(cocoeval: Callable[..., Any]) -> Callable[..., Dict[str, float]]:
    """mmdet's ``CocoMetric.compute_metrics`` with ``cocoeval`` as its ``COCOeval(MP)``.

    The function's code over a copy of its module's globals: mmdet's module stays as it is.
    """
    function = CocoMetric.compute_metrics
    names = {**function.__globals__, 'COCOeval': cocoeval, 'COCOevalMP': cocoeval}
    return types.FunctionType(function.__code__, names, function.__name__,
                              function.__defaults__, function.__closure__)


def _sort_categories(coco_api: Any) -> None:
    """mmdet's ``sort_categories``.

    The categories in id order, in the index and the dataset (``get_cat_ids``, hence each label's
    category, follows this order).
    """
    coco_api.cats = {i: coco_api.cats[i] for i in sorted(coco_api.cats)}
    coco_api.dataset['categories'] = sorted(coco_api.dataset['categories'],
                                            key=lambda c: c['id'])


@contextmanager
def _empty_predictions_scored(coco_api: Any, empty: bool) -> Iterator[None]:
    """``coco_api.loadRes([])`` gives a result set without detections instead of failing.

    pycocotools' ``loadRes`` indexes the first result, so mmdet's ``compute_metrics`` catches
    the IndexError, logs "results ... empty" and returns ``{}`` for a cell where the model
    detected nothing; faster-coco-eval scores it (zeros). Every backend now scores it. Only
    this metric's ground truth is changed, for the block, and only when the set is empty.
    """
    if not empty:
        yield
        return
    from mmengine.logging import print_log
    original = coco_api.loadRes

    def load_res(results: Any) -> Any:
        if isinstance(results, (list, tuple)) and len(results) == 0:
            print_log('no detection in the whole prediction set: scored as detections that '
                      'miss every object (AP 0 wherever there is ground truth)',
                      logger='current', level=30)
            scored = type(coco_api)()
            scored.dataset = {'images': list(coco_api.dataset['images']),
                              'categories': copy.deepcopy(coco_api.dataset['categories']),
                              'annotations': []}
            scored.createIndex()
            return scored
        return original(results)

    coco_api.loadRes = load_res
    try:
        yield
    finally:
        del coco_api.loadRes
