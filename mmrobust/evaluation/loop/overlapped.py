"""The robustness run's test loop: :class:`InferenceLoop`, which stops before the metrics.

:class:`~mmrobust.engine.runner.OverlappedTestLoop` (mmengine's ``TestLoop`` with the host's
per-batch work beside the model's, registered for any config) is the loop; the robustness run
uses its steps and stops where the metric worker takes over. mmengine's private names and
``runner._test_loop`` are used here and in :mod:`mmrobust.engine.runner` only.
"""
from typing import Any, List, Optional

from mmengine.dist import collect_results, get_dist_info
from mmengine.evaluator.metric import _to_cpu
from mmengine.logging import print_log
from typing_extensions import override

from ...engine.runner import (
    DEFAULT_POST_PROCESS_QUEUE,
    DEFAULT_PREFETCH,
    BatchPrefetcher,
    OverlappedTestLoop,
    PostProcessThread,
    split_test_step,
)

__all__ = ['DEFAULT_POST_PROCESS_QUEUE', 'DEFAULT_PREFETCH', 'BatchPrefetcher', 'InferenceLoop',
           'OverlappedTestLoop', 'PostProcessThread', 'gather_parts', 'split_test_step']


class InferenceLoop(OverlappedTestLoop):
    """:class:`OverlappedTestLoop` whose :meth:`run` stops before ``compute_metrics``.

    Every rank runs the batches and each metric's ``process``, then each metric's results are
    gathered to rank 0 (``collect_results``, every rank takes part).

    Returns (from :meth:`run`): on rank 0 the gathered results, one list per metric of the
    evaluator, in order; ``None`` on the other ranks.
    """

    @override
    def run(self) -> Optional[List[list]]:  # type: ignore[override]
        self.begin()
        self.run_batches()
        size = len(self.dataloader.dataset)
        parts = [gather_parts(metric, size) for metric in self.evaluator.metrics]
        self.end({})  # NOTE: the metrics are logged when they are recorded, maybe a cell later
        return parts if get_dist_info()[0] == 0 else None


def gather_parts(metric: Any, size: int) -> Optional[list]:
    """``BaseMetric.evaluate`` up to ``compute_metrics``: the results of every rank on rank 0."""
    if not metric.results:
        print_log(f'{type(metric).__name__} got no results from `process`.', logger='current',
                  level=30)
    if metric.collect_device == 'cpu':
        results = collect_results(metric.results, size, 'cpu', tmpdir=metric.collect_dir)
    else:
        results = collect_results(metric.results, size, metric.collect_device)
    metric.results.clear()
    return _to_cpu(results) if get_dist_info()[0] == 0 else None
