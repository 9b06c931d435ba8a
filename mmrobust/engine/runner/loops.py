"""OpenMMLab loops that overlap the host's per-batch work with the model's.

mmengine's ``TestLoop`` and ``ValLoop`` run, per batch and on the main thread: receive the batch
from the dataloader workers, the model's data preprocessor (to the device, normalise, pad), the
model, then ``evaluator.process`` (outputs to the host, a COCO metric's mask encoding, packing
the samples). On a GPU the model's kernels are only queued, so the host work before and after
them is time in which no kernel of the next batch is queued: every millisecond of it is a
millisecond per image. :class:`OverlappedTestLoop` and :class:`OverlappedValLoop` move it off
the main thread:

- a :class:`BatchPrefetcher` receives the next batches and runs the data preprocessor on them
  (one thread, ``prefetch`` batches ahead) while the model runs;
- a :class:`PostProcessThread` runs each batch's ``evaluator.process`` (one thread, a bounded
  queue: order kept, an exception raised in the loop) while the next batch runs.

A GPU's kernels, a dataloader's wait and a model that sleeps release the GIL, so the overlap is
real. Depth 0 does the work in the loop, as mmengine does; the metrics are computed once every
batch is post-processed, so the numbers are mmengine's loops'. The prefetch is used where the
model's ``test_step`` / ``val_step`` is ``BaseModel``'s (preprocessor, then ``predict``), plain or
under ``MMDistributedDataParallel``; elsewhere (FSDP, TTA, a model's own step) the batch goes to
the model's step as mmengine's loop gives it.

On CUDA the post-processing runs on a stream of its own that waits for an event recorded after
the batch's forward, so its copies and the mask encoding's kernels wait for that batch only,
not for the next batch's kernels queued since; the prefetch uses the loop's stream (its tensors
are then the loop's to free, as when the loop makes them).

Registered in mmrobust's ``LOOPS`` (and mmdet's and mmseg's), so any config names them::

    test_cfg = dict(type='mmrobust.OverlappedTestLoop')  # post_process_queue=2, prefetch=2
    val_cfg = dict(type='mmrobust.OverlappedValLoop')
"""
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModel, MMDistributedDataParallel, is_model_wrapper
from mmengine.runner import TestLoop, ValLoop
from mmengine.runner.amp import autocast
from mmengine.runner.loops import _parse_losses, _update_losses

from ...registry import LOOPS

__all__ = ['DEFAULT_POST_PROCESS_QUEUE', 'DEFAULT_PREFETCH', 'BatchPrefetcher',
           'OverlappedTestLoop', 'OverlappedValLoop', 'PostProcessThread', 'split_step',
           'split_test_step']

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


def split_step(model: Any, stage: str = 'test') -> Optional[Tuple[Callable, Callable]]:
    """``(preprocess, predict)`` whose composition is the model's ``<stage>_step``.

    None: the model's step is its own, or its wrapper's forward must see the batch: FSDP, TTA.
    """
    step = f'{stage}_step'
    module = model
    if is_model_wrapper(model):
        if getattr(type(model), step) is not getattr(MMDistributedDataParallel, step):
            return None
        module = model.module
    if not isinstance(module, BaseModel) or getattr(type(module), step) is not getattr(
            BaseModel, step):
        return None
    return (lambda batch: module.data_preprocessor(batch, False),
            lambda data: module._run_forward(data, mode='predict'))


def split_test_step(model: Any) -> Optional[Tuple[Callable, Callable]]:
    """:func:`split_step` of ``model.test_step``."""
    return split_step(model, 'test')


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


class _Overlapped:
    """What :class:`OverlappedTestLoop` and :class:`OverlappedValLoop` share (``stage``).

    Args:
        runner: the runner.
        dataloader: the dataloader (or its config).
        evaluator: the evaluator (or its config).
        fp16: inference under AMP's autocast.
        post_process_queue: batches whose ``evaluator.process`` may wait behind the model (0: in
            the loop).
        prefetch: batches received and preprocessed ahead of the model (0: in the loop).

    The steps, for a loop that stops elsewhere than :meth:`run` (the robustness run's
    ``InferenceLoop`` before ``compute_metrics``, its one-pass loop at each cell's end):
    :meth:`begin`, iterate :meth:`batches` and pass each batch to ``run_iter``,
    :meth:`finish_batches` (every submitted batch processed, before a metric's results are
    gathered), :meth:`close` (both threads ended), :meth:`end`.
    """

    stage = 'test'
    runner: Any
    dataloader: Any
    evaluator: Any
    fp16: bool

    def __init__(self, runner, dataloader, evaluator, fp16: bool = False,
                 post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                 prefetch: int = DEFAULT_PREFETCH) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)  # NOTE: TestLoop's or ValLoop's
        if prefetch < 0:
            raise ValueError(f'the prefetch depth must be >= 0, not {prefetch}')
        self.post_process = PostProcessThread(self.evaluator, post_process_queue)
        self.prefetch = prefetch
        self._prefetcher: Optional[BatchPrefetcher] = None
        self._predict: Optional[Callable] = None
        self._ready: Optional[Tuple[Any, Any]] = None  # NOTE: (batch, its preprocessed data)

    @property
    def _losses(self) -> dict:
        # NOTE: mmengine's loops keep their losses as test_loss / val_loss (a dict)
        losses = getattr(self, f'{self.stage}_loss', None)
        if losses is None:
            losses = {}
            setattr(self, f'{self.stage}_loss', losses)
        return losses

    def batches(self) -> Iterator[Any]:
        """The dataloader's batches, as mmengine's loop passes them to ``run_iter``.

        Preprocessed ahead, on a thread, where the model allows it (:func:`split_step`).
        """
        steps = split_step(self.runner.model, self.stage) if self.prefetch else None
        if steps is None:
            return iter(self.dataloader)
        preprocess, self._predict = steps
        self._prefetcher = BatchPrefetcher(self.dataloader, preprocess, self.prefetch)
        return self._ready_batches(self._prefetcher)

    def _ready_batches(self, prefetcher: 'BatchPrefetcher') -> Iterator[Any]:
        for batch, data in prefetcher:
            self._ready = (batch, data)
            yield batch

    def _outputs(self, data_batch: Any) -> Sequence[Any]:
        """The model's outputs of a batch: from its preprocessed data where it was prefetched."""
        ready, self._ready = self._ready, None
        with autocast(enabled=self.fp16):
            if ready is not None and ready[0] is data_batch:
                return self._predict(ready[1])
            return getattr(self.runner.model, f'{self.stage}_step')(data_batch)

    @torch.no_grad()
    def run_iter(self, idx: int, data_batch: Any) -> None:
        """mmengine's ``run_iter``: the batch's hooks, the model, its post-processing queued."""
        self.runner.call_hook(f'before_{self.stage}_iter', batch_idx=idx, data_batch=data_batch)
        outputs = self._outputs(data_batch)
        outputs, losses = _update_losses(outputs, self._losses)
        setattr(self, f'{self.stage}_loss', losses)
        self.post_process.submit(outputs, data_batch)
        self.runner.call_hook(f'after_{self.stage}_iter', batch_idx=idx, data_batch=data_batch,
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
        self._ready = None
        self.post_process.close(cancel)

    def begin(self) -> None:
        """mmengine's ``run``'s start: its hooks, the model in eval mode, no loss yet."""
        self.runner.call_hook(f'before_{self.stage}')
        self.runner.call_hook(f'before_{self.stage}_epoch')
        self.runner.model.eval()
        self._losses.clear()

    def run_batches(self, announce: bool = False) -> None:
        """Every batch of the dataloader, all of them post-processed; the threads ended after.

        Args:
            announce: log where the host's work runs (once per ``run``, as the runner runs it).
        """
        try:
            batches = self.batches()
            if announce:
                print_log(f'{type(self).__name__}: {self.describe()}', logger='current')
            for idx, data_batch in enumerate(batches):
                self.run_iter(idx, data_batch)
            self.finish_batches()
        finally:
            self.close(cancel=True)  # NOTE: finished, or stopping on an error

    def describe(self) -> str:
        """Where the host's per-batch work runs (after :meth:`batches`)."""
        if self._prefetcher is not None:
            ahead = f'batches received and preprocessed {self.prefetch} ahead on a thread'
        elif self.prefetch:
            ahead = (f"batches preprocessed in the loop (the model's {self.stage}_step is its "
                     'own, or its wrapper must see the batch)')
        else:
            ahead = 'batches preprocessed in the loop (prefetch=0)'
        depth = self.post_process.depth
        behind = (f'post-processed on a thread behind the model, at most {depth} waiting'
                  if depth else 'post-processed in the loop (post_process_queue=0)')
        return f'{ahead}; {behind}'

    def end(self, metrics: dict) -> None:
        """mmengine's ``run``'s end: its hooks, with ``metrics``."""
        self.runner.call_hook(f'after_{self.stage}_epoch', metrics=metrics)
        self.runner.call_hook(f'after_{self.stage}')

    def run(self) -> dict:
        """mmengine's ``run``: the metrics computed once every batch has been post-processed."""
        self.begin()
        # NOTE: drains: mmengine's own run() would compute the metrics with batches still waiting
        # in the post-processing queue
        self.run_batches(announce=True)
        metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
        if self._losses:
            metrics.update(_parse_losses(self._losses, self.stage))
        self.end(metrics)
        return metrics


@LOOPS.register_module()
class OverlappedTestLoop(_Overlapped, TestLoop):
    """mmengine's ``TestLoop`` with batches prepared ahead and finished behind.

    The same metrics as ``TestLoop``; the arguments are :class:`_Overlapped`'s.
    """

    stage = 'test'

    def as_runner_test_loop(self) -> 'OverlappedTestLoop':
        """This loop as its runner's test loop (mmengine's private ``runner._test_loop``).

        Hooks that ask ``runner.test_dataloader`` get this loop's dataloader, and the runner
        does not build (and parse) the config's own test set besides.
        """
        self.runner._test_loop = self
        return self


@LOOPS.register_module()
class OverlappedValLoop(_Overlapped, ValLoop):
    """mmengine's ``ValLoop`` with batches prepared ahead and finished behind.

    The validation during training, as :class:`OverlappedTestLoop` is the test; the same metrics
    as ``ValLoop``; the arguments are :class:`_Overlapped`'s.
    """

    stage = 'val'
