"""A metric that reports the process computing it, for the metric worker's tests.

Imported by the worker from the run's ``imports`` (this folder is on the test process's path,
which the worker gets).
"""
import os
from typing import Dict, Sequence

from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

#: the variable whose value the probe reports (-1: unset)
PROBE_ENV = 'MMROBUST_PROBE'


@METRICS.register_module()
class ProcessProbeMetric(BaseMetric):
    """Its numbers: the computing process's pid, its parent's, :data:`PROBE_ENV` and its name."""

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        self.results.extend(data_samples)

    def compute_metrics(self, results: list) -> Dict[str, float]:
        with open('/proc/self/comm') as f:
            name = f.read().strip()
        return {'pid': os.getpid(), 'ppid': os.getppid(),
                'env': float(os.environ.get(PROBE_ENV, -1)), 'name': name}
