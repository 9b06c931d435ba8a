"""What rank 0 decides, and how every rank waits for it.

Only rank 0 reads and writes the results file (it may be node-local) and runs the metric
queue. The other ranks take its outcomes in short broadcasts at points every rank reaches (the
lock, the plan, each wait between two cells), never sitting in a collective for as long as rank
0 works (a process-group timeout), and rank 0's error is raised on every rank at once.
"""
import os
import os.path as osp
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from mmengine.dist import broadcast_object_list, get_dist_info
from mmengine.logging import print_log

from ..utils.errors import shareable
from ..utils.io import TMP_MARK, FileLockedError, exclusive_lock
from .predictions_file import saved_cells
from .results import ResultsLayout, RobustnessResults, identity_sha256, planned_cells
from .shards import shard_cells

__all__ = ['RANK0_POLL_S', 'Plan', 'broadcast_plan', 'from_rank0', 'plan_on_rank0',
           'rank0_until_done', 'results_lock']

#: Seconds between the short broadcasts of every rank while rank 0 waits (on its metric
#: worker, a metric computed in place, a predictions file being written).
RANK0_POLL_S = 1.0


def from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a broadcast: every rank must call it)."""
    box = [value]
    broadcast_object_list(box)
    return box[0]


@contextmanager
def results_lock(path: str, wait: bool = False, poll_s: float = 5.0) -> Iterator[None]:
    """One writer per results location: rank 0 holds its lock for the with-block.

    The lock is the location's (:attr:`~.results.ResultsLayout.owner`): ``X`` and ``X.json``,
    or a symlink to either, are one location with one lock. A second run on it stops with who
    holds it, that run's command included (or, with ``wait``, queues behind it). Every outcome
    on rank 0 (held, locked, or any error making the lock) reaches every rank in a short
    broadcast, and waiting polls (every ``poll_s`` seconds, one broadcast per round), so no rank
    sits in a collective while rank 0 waits or after it failed.
    """
    rank, world = get_dist_info()
    with ExitStack() as stack:
        told = False
        while True:
            outcome: Any = None  # None: held; else the error that stops every rank
            if rank == 0:
                try:
                    stack.enter_context(exclusive_lock(
                        ResultsLayout(path).owner, named=path,
                        waiting=lambda msg: print_log(msg, logger='current', level=30)))
                except FileLockedError as err:
                    outcome = err
                except Exception as err:
                    outcome = shareable(err)
            if world > 1:  # NOTE: every rank is here, before any cell: the collective is safe
                outcome = from_rank0(outcome)
            if outcome is None:
                break
            if not (wait and isinstance(outcome, FileLockedError)):
                raise outcome
            if not told:
                print_log(f'waiting (polling every {poll_s:g} s): {outcome}', logger='current')
                told = True
            time.sleep(poll_s)
        yield


@dataclass
class Plan:
    """What remains of a protocol, decided on rank 0 and broadcast to every rank."""
    infer: List[Tuple[str, int]]  # cells to run inference on, in order
    saved: Dict[Tuple[str, int], str] = field(default_factory=dict)  # metric only (rank 0)
    error: Optional[BaseException] = None  # raised on every rank


def plan_on_rank0(results: RobustnessResults, folder: str,
                  shard: Optional[Tuple[int, int]] = None, use_saved: bool = True,
                  refresh: Optional[Callable[[Tuple[str, int]], bool]] = None) -> Plan:
    """The cells left to do (of ``shard`` only, if given).

    Predictions a killed run saved are used instead of inference (``use_saved``; otherwise they
    are removed, and their cells inferred again). ``refresh``: recorded cells it accepts are
    inferred again too.
    """
    cells = planned_cells(results.identity)
    if shard is not None:
        cells = shard_cells(cells, *shard)
    saved, unused = saved_cells(folder, identity_sha256(results.identity), cells)
    if saved and not use_saved:
        print_log(f'{len(saved)} saved predictions in {folder} are not used: the metric\'s '
                  'files they point to belong to the run that wrote them; their cells are '
                  'inferred again', logger='current', level=30)
        unused += list(saved.values())
        saved = {}
    for path in unused:
        print_log(f'removing {path} (not of this evaluation, see above)', logger='current',
                  level=30)
        os.remove(path)
    if osp.isdir(folder):
        for name in os.listdir(folder):  # NOTE: half-written by a killed run, never used
            if TMP_MARK in name:
                os.remove(osp.join(folder, name))
    for cell in [c for c in saved if results.done(*c)]:  # killed after recording, before removal
        os.remove(saved.pop(cell))
    todo = [(c, s) for c, s in cells
            if not results.done(c, s) or (refresh is not None and refresh((c, s)))]
    if saved:
        print_log(f'{len(saved)} cell(s) resume from their saved predictions in {folder} '
                  f'without inference: {", ".join(f"{c} {s}" for c, s in saved)}',
                  logger='current')
    return Plan(infer=[c for c in todo if c not in saved],
                saved={c: saved[c] for c in todo if c in saved})


def broadcast_plan(plan: Optional[Plan]) -> Plan:
    """Rank 0's plan (or its error) on every rank.

    No rank then plans another loop or waits alone in a collective.
    """
    _, world = get_dist_info()
    if world > 1:
        if plan is not None and plan.error is not None:
            plan.error = shareable(plan.error)
        plan = from_rank0(plan)
    assert plan is not None
    if plan.error is not None:
        raise plan.error
    return plan


def rank0_until_done(steps: Optional[Iterator[None]]) -> None:
    """Run rank 0's ``steps`` while the other ranks wait in short broadcasts.

    Every rank: rank 0 runs ``steps`` (a generator that yields each time it has waited up to
    :data:`RANK0_POLL_S` without finishing) to its end; the other ranks (``steps`` None) wait for it
    in one short broadcast per step, instead of sitting in the next collective for as long as rank 0
    waits (a process-group timeout), and rank 0's error (a dead worker, a full disk) is raised on
    every rank at once.
    """
    rank, world = get_dist_info()
    while True:
        state: Any = None  # None: done; True: still waiting; else the error
        if rank == 0:
            assert steps is not None
            try:
                next(steps)
                state = True
            except StopIteration:
                state = None
            except BaseException as err:
                state = shareable(err)
        if world > 1:  # NOTE: every rank is here, between two cells: the collective is safe
            state = from_rank0(state)
        if state is None:
            return
        if isinstance(state, BaseException):
            raise state
