"""The test loop of a robustness run, with the host's per-batch work beside the model's.

mmengine's ``TestLoop`` runs, per batch and on the main thread: receive the batch from the
dataloader workers, the model's data preprocessor (to the device, normalise, pad), the model,
then ``evaluator.process`` (outputs to the host, a COCO metric's mask encoding, packing the
samples). On a GPU the model's kernels are only queued, so the host work before and after
them is time in which no kernel of the next batch is queued: every millisecond of it is a
millisecond per image. :class:`OverlappedTestLoop` moves it off the main thread:

- a :class:`BatchPrefetcher` receives the next batches and runs the data preprocessor on them
  (one thread, ``prefetch`` batches ahead) while the model runs;
- a :class:`PostProcessThread` runs each batch's ``evaluator.process`` (one thread, a bounded
  queue: order kept, an exception raised in the loop) while the next batch runs.

A GPU's kernels, a dataloader's wait and a model that sleeps release the GIL, so the overlap is
real. Depth 0 does the work in the loop, as mmengine does. The prefetch is used where the
model's ``test_step`` is ``BaseModel``'s (preprocessor, then ``predict``), plain or under
``MMDistributedDataParallel``; attack cells, whose preprocessor attacks the batch with the
model's gradients, preprocess in the loop.

On CUDA the post-processing runs on a stream of its own that waits for an event recorded after
the batch's forward, so its copies and the mask encoding's kernels wait for that batch only,
not for the next batch's kernels queued since; the prefetch uses the loop's stream (its tensors
are then the loop's to free, as when the loop makes them).
"""
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from mmengine.dist import collect_results, get_dist_info
from mmengine.evaluator.metric import _to_cpu
from mmengine.logging import print_log
from mmengine.model import BaseModel, MMDistributedDataParallel, is_model_wrapper
from mmengine.runner import TestLoop
from mmengine.runner.amp import autocast
from mmengine.runner.loops import _parse_losses, _update_losses
from typing_extensions import override

__all__ = ['DEFAULT_POST_PROCESS_QUEUE', 'DEFAULT_PREFETCH', 'BatchPrefetcher', 'InferenceLoop',
           'OverlappedTestLoop', 'PostProcessThread', 'gather_parts', 'split_test_step']

#: Batches whose post-processing may wait in the queue while the loop runs the next ones.
DEFAULT_POST_PROCESS_QUEUE = 2
#: Batches received and preprocessed ahead of the model.
DEFAULT_PREFETCH = 2

_STOP = object()


class PostProcessThread:
    """``evaluator.process(outputs, data_batch)`` of each submitted batch, in order.

    They run on one background thread (``depth`` batches at most waiting; 0: at once, in the
    caller).

    ``wait_s`` counts the seconds the caller waited for it (a full queue, :meth:`drain`).
    The first exception of the thread is raised by the next :meth:`submit` or :meth:`drain`;
    the batches after it are not processed.
    """

    def __init__(self, evaluator: Any, depth: int = DEFAULT_POST_PROCESS_QUEUE) -> None:
        if depth < 0:
            raise ValueError(f'the post-processing queue depth must be >= 0, not {depth}')
        self.evaluator, self.depth = evaluator, depth
        self.wait_s = 0.0
        self._queue: 'queue.Queue' = queue.Queue(maxsize=max(depth, 1))
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._cancelled = False
        self._streams: dict = {}

    def submit(self, outputs: Sequence[Any], data_batch: Any) -> None:
        """Post-process a batch (in the background where ``depth`` > 0)."""
        self._raise()
        if self.depth == 0:
            self.evaluator.process(data_samples=outputs, data_batch=data_batch)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name='mmrobust-post-process',
                                            daemon=True)
            self._thread.start()
        event = device = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()  # NOTE: a thread's current device is its own
            event = torch.cuda.Event()
            event.record()  # NOTE: after this batch's forward, on the loop's stream
        start = time.perf_counter()
        self._queue.put((outputs, data_batch, device, event))
        self.wait_s += time.perf_counter() - start

    def drain(self) -> None:
        """Wait until every submitted batch is processed; raise the thread's exception."""
        if self._thread is not None:
            start = time.perf_counter()
            self._queue.join()
            self.wait_s += time.perf_counter() - start
        self._raise()

    def close(self, cancel: bool = False) -> None:
        """End the thread (``cancel``: without processing what waits)."""
        if self._thread is None:
            return
        self._cancelled = cancel
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        self._cancelled = False

    def _raise(self) -> None:
        # NOTE: the error stays: no batch after the failed one is processed, however often
        # the loop asks
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None and not self._cancelled:
                    self._process(*item)
            except BaseException as err:  # NOTE: raised in the loop, by submit() or drain()
                self._error = err
            finally:
                del item  # NOTE: the batch's tensors freed before the next wait
                self._queue.task_done()

    @torch.no_grad()  # NOTE: grad mode is per thread: the loop's no_grad does not reach here
    def _process(self, outputs: Sequence[Any], data_batch: Any, device: Optional[int],
                 event: Optional['torch.cuda.Event']) -> None:
        if event is None:
            self.evaluator.process(data_samples=outputs, data_batch=data_batch)
            return
        with torch.cuda.device(device):
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream()
            stream.wait_event(event)
            with torch.cuda.stream(stream):
                self.evaluator.process(data_samples=outputs, data_batch=data_batch)
            # NOTE: the tensors made on the loop's stream stay referenced until this stream
            # is done with them, so the caching allocator cannot hand them out under it
            stream.synchronize()


def split_test_step(model: Any) -> Optional[Tuple[Callable, Callable]]:
    """``(preprocess, predict)`` whose composition is ``model.test_step``.

    None: the model's ``test_step`` is its own, or its wrapper's forward must see the batch: FSDP,
    TTA.
    """
    module = model
    if is_model_wrapper(model):
        if type(model).test_step is not MMDistributedDataParallel.test_step:
            return None
        module = model.module
    if not isinstance(module, BaseModel) or type(module).test_step is not BaseModel.test_step:
        return None
    return (lambda batch: module.data_preprocessor(batch, False),
            lambda data: module._run_forward(data, mode='predict'))


class BatchPrefetcher:
    """Iterates ``batches`` and preprocesses each on one background thread, ``depth`` batches ahead.

    Yields ``(batch, preprocessed)`` in order, raising the thread's exception where its batch would
    have come. ``close()`` stops the thread early.
    """

    def __init__(self, batches: Iterable, preprocess: Callable, depth: int = DEFAULT_PREFETCH
                 ) -> None:
        self.preprocess = preprocess
        self._source = iter(batches)
        self._queue: 'queue.Queue' = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        stream = device = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device, stream = torch.cuda.current_device(), torch.cuda.current_stream()
        self._thread = threading.Thread(target=self._run, args=(device, stream), daemon=True,
                                        name='mmrobust-prefetch')
        self._thread.start()

    def _run(self, device: Optional[int], stream: Any) -> None:
        try:
            if device is not None:  # NOTE: the loop's device and stream (per thread in torch)
                torch.cuda.set_device(device)
                torch.cuda.set_stream(stream)
            with torch.no_grad():
                for batch in self._source:
                    if self._stop.is_set():
                        return
                    self._put((True, (batch, self.preprocess(batch))))
        except BaseException as err:  # NOTE: raised in the loop, where its batch was due
            self._put((False, err))
            return
        self._put((True, _STOP))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        return self

    def __next__(self) -> Tuple[Any, Any]:
        ok, value = self._queue.get()
        if not ok:
            self.close()
            raise value
        if value is _STOP:
            raise StopIteration
        return value

    def close(self) -> None:
        """Stop the thread (it ends after the batch it is preprocessing)."""
        self._stop.set()
        self._thread.join()


class OverlappedTestLoop(TestLoop):
    """mmengine's ``TestLoop`` with batches prepared ahead and finished behind.

    mmengine's ``TestLoop`` with the batches received and preprocessed ahead
    (:class:`BatchPrefetcher`, ``prefetch`` batches, 0: in the loop) and post-processed behind
    (:class:`PostProcessThread` of depth ``post_process_queue``, 0: in the loop).

    :meth:`run` is ``TestLoop.run`` whose metrics are computed after every batch's
    post-processing has drained. The steps, for a loop that stops elsewhere (:class:`InferenceLoop`
    before ``compute_metrics``, the one-pass loop at each cell's end): :meth:`begin`, iterate
    :meth:`batches` and pass each item to :meth:`run_iter`, :meth:`finish_batches` (every
    submitted batch processed, before a metric's results are gathered), :meth:`close` (both
    threads ended), :meth:`end`.
    """

    def __init__(self, runner, dataloader, evaluator, fp16: bool = False,
                 post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                 prefetch: int = DEFAULT_PREFETCH) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)
        if prefetch < 0:
            raise ValueError(f'the prefetch depth must be >= 0, not {prefetch}')
        self.post_process = PostProcessThread(self.evaluator, post_process_queue)
        self.prefetch = prefetch
        self._prefetcher: Optional[BatchPrefetcher] = None
        self._predict: Optional[Callable] = None

    def batches(self) -> Iterator[Any]:
        """The dataloader's batches, as :meth:`run_iter` takes them.

        Preprocessed ahead where the model allows it, :func:`split_test_step`.
        """
        steps = split_test_step(self.runner.model) if self.prefetch else None
        if steps is None:
            return iter(self.dataloader)
        preprocess, self._predict = steps
        self._prefetcher = BatchPrefetcher(self.dataloader, preprocess, self.prefetch)
        return iter(self._prefetcher)

    @torch.no_grad()
    @override
    def run_iter(self, idx: int, item: Any) -> None:
        data_batch, data = item if self._prefetcher is not None else (item, None)
        self.runner.call_hook('before_test_iter', batch_idx=idx, data_batch=data_batch)
        with autocast(enabled=self.fp16):
            if data is not None:
                outputs = self._predict(data)
            else:
                outputs = self.runner.model.test_step(data_batch)
        outputs, self.test_loss = _update_losses(outputs, self.test_loss)
        self.post_process.submit(outputs, data_batch)
        self.runner.call_hook('after_test_iter', batch_idx=idx, data_batch=data_batch,
                              outputs=outputs)

    def finish_batches(self) -> None:
        """Every submitted batch processed (raises the post-processing's exception)."""
        self.post_process.drain()

    def close(self, cancel: bool = False) -> None:
        """End the prefetch and post-processing threads.

        Args:
            cancel: end without processing what waits.
        """
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self.post_process.close(cancel)

    def as_runner_test_loop(self) -> 'OverlappedTestLoop':
        """This loop as its runner's test loop (mmengine's private ``runner._test_loop``).

        Hooks that ask ``runner.test_dataloader`` get this loop's dataloader, and the runner
        does not build (and parse) the config's own test set besides.
        """
        self.runner._test_loop = self
        return self

    def begin(self) -> None:
        """``TestLoop.run``'s start: its hooks, the model in eval mode, no test loss yet."""
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        self.runner.model.eval()
        self.test_loss.clear()

    def run_batches(self) -> None:
        """Every batch of the dataloader, all of them post-processed; the threads ended after."""
        try:
            for idx, item in enumerate(self.batches()):
                self.run_iter(idx, item)
            self.finish_batches()
        finally:
            self.close(cancel=True)  # NOTE: finished, or stopping on an error

    def end(self, metrics: dict) -> None:
        """``TestLoop.run``'s end: its hooks, with ``metrics``."""
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')

    @override
    def run(self) -> dict:
        """``TestLoop.run``: the metrics computed once every batch has been post-processed."""
        self.begin()
        self.run_batches()  # NOTE: drains: TestLoop's own run() would compute the metrics with
        # batches still waiting in the post-processing queue
        metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
        if self.test_loss:
            metrics.update(_parse_losses(self.test_loss, 'test'))
        self.end(metrics)
        return metrics


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
