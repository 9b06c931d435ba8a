"""Benchmarks that hold on a shared, noisy machine: cases alternate step by step.

Timing case A for a while and then case B compares two moments of the machine's load, not two
implementations. Here every case takes one step in turn (A, B, C, A, B, C, ... with the order
rotated each round so that no case always runs first), and each figure comes with its median
and range over the rounds; ratios are formed round by round, between steps taken seconds apart.

- :func:`interleave` alternates callables in this process (cases that can share it).
- :class:`StepWorker` / :func:`interleave_processes` alternate cases that each live in their own
  process (so that peak memory is their own): the parent asks one worker at a time to take a
  step and waits for it, so only one case runs at any moment.
"""
import multiprocessing as mp
import resource
import statistics
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ['interleave', 'StepWorker', 'interleave_processes', 'summary', 'ratio_summary',
           'fmt_range']

Step = Callable[[], Any]


def summary(values: Sequence[float]) -> Dict[str, float]:
    """Median, min and max of ``values``."""
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values)}


def ratio_summary(a: Sequence[float], b: Sequence[float]) -> Dict[str, float]:
    """Median and range of the round-by-round ratios ``a[i] / b[i]``."""
    return summary([x / y for x, y in zip(a, b)])


def fmt_range(s: Mapping[str, float], fmt: str = '.2f', unit: str = '') -> str:
    """``median (min-max)`` of a :func:`summary`."""
    return f'{s["median"]:{fmt}}{unit} ({s["min"]:{fmt}}{unit}-{s["max"]:{fmt}}{unit})'


def _order(names: List[str], round_index: int) -> List[str]:
    k = round_index % len(names)
    return names[k:] + names[:k]


def interleave(cases: Mapping[str, Step], rounds: int, warmup: int = 1,
               sync: Optional[Callable[[], None]] = None,
               offset: int = 0) -> Dict[str, List[float]]:
    """Seconds per step of each case, the cases alternating step by step in this process.

    Args:
        cases: name → a callable that runs one step; one that returns a float reports its own
            duration in seconds (a step timed in another process), else the wall time counts.
        rounds: timed rounds (each case takes one step per round).
        warmup: untimed rounds first (compilation, caches).
        sync: called before and after each step (e.g. ``torch.cuda.synchronize``).
        offset: rotates the order of the first round (for callers that interleave one round at
            a time, so that the first case alternates between calls).

    Returns:
        name → the ``rounds`` step times, in round order (so ratios can be formed per round).
    """
    names = list(cases)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        for name in _order(names, r + offset):
            if sync:
                sync()
            start = time.perf_counter()
            reported = cases[name]()
            if sync:
                sync()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[name].append(reported if isinstance(reported, float) else elapsed)
    return times


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _serve(setup: Callable[..., Any], args: tuple, conn) -> None:
    """Worker loop: build the case, then run one step per request."""
    try:
        built = setup(*args)
        step, info = built if isinstance(built, tuple) else (built, {})
        sync, extra = info.get('sync'), info.get('stats')
        baseline = info.get('rss_baseline_mb', _peak_rss_mb())
        conn.send(('ready', {k: v for k, v in info.items() if not callable(v)}))
        while True:
            command = conn.recv()
            if command == 'step':
                if sync:
                    sync()
                start = time.perf_counter()
                step()
                if sync:
                    sync()
                conn.send(('time', time.perf_counter() - start))
            elif command == 'stats':
                stats = {'peak_rss_mb': _peak_rss_mb(), 'rss_growth_mb': _peak_rss_mb() - baseline}
                if extra is not None:
                    stats.update(extra())
                conn.send(('stats', stats))
            else:
                break
    except Exception:
        conn.send(('error', traceback.format_exc()))
    finally:
        conn.close()


class StepWorker:
    """One benchmark case in its own (spawned) process, stepped on request.

    ``setup(*args)`` runs in the worker and returns ``step`` or ``(step, info)``; ``info`` is
    sent back (minus callables), may hold ``sync`` (called around each step), ``stats`` (a
    callable whose dict joins :meth:`stats`, e.g. the GPU's peak memory) and
    ``rss_baseline_mb`` (what ``rss_growth_mb`` counts from; default: the peak RSS once set
    up). ``setup`` must be importable by the child: a module-level function.
    """

    def __init__(self, name: str, setup: Callable[..., Any], args: tuple = ()) -> None:
        ctx = mp.get_context('spawn')
        self.name = name
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(setup, args, child), daemon=True)
        self._proc.start()
        child.close()
        self.info = self._expect('ready')

    def _expect(self, kind: str) -> Any:
        try:
            tag, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f'benchmark case {self.name!r}: its process died '
                               f'(exit code {self._proc.exitcode})') from None
        if tag == 'error':
            raise RuntimeError(f'benchmark case {self.name!r} failed:\n{value}')
        assert tag == kind, (tag, kind)
        return value

    def step(self) -> float:
        """One timed step in the worker: its seconds."""
        self._conn.send('step')
        return self._expect('time')

    def stats(self) -> Dict[str, float]:
        """The worker's statistics (peak memory)."""
        self._conn.send('stats')
        return self._expect('stats')

    def close(self) -> None:
        """Stop the worker and wait for it."""
        try:
            self._conn.send('stop')
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()


def interleave_processes(cases: Mapping[str, Tuple[Callable[..., Any], tuple]], rounds: int,
                         warmup: int = 1) -> Dict[str, Dict[str, Any]]:
    """:func:`interleave` for cases in their own processes.

    Args:
        cases: name → ``(setup, args)`` of a :class:`StepWorker`.
        rounds: timed rounds, each case one step per round, in alternating order.
        warmup: untimed rounds before them.

    Returns:
        name → ``{'times': [...], 'info': ..., 'stats': ...}`` (times in round order).
    """
    workers: Dict[str, StepWorker] = {}
    try:
        for name, (setup, args) in cases.items():
            workers[name] = StepWorker(name, setup, args)
        times = interleave({n: w.step for n, w in workers.items()}, rounds, warmup)
        return {n: {'times': times[n], 'info': w.info, 'stats': w.stats()}
                for n, w in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
