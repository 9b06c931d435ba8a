"""A gloo process group of spawned ranks on this machine, for the distributed tests."""
import datetime
import multiprocessing
import pickle
import socket
import traceback
from typing import Any, Callable, Dict, List


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _rank_entry(fn: Callable, rank: int, world: int, port: int, args: tuple, queue,
                timeout_s: float = 60) -> None:
    import torch.distributed as dist
    try:
        dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            # NOTE: plain pickle: a queue shares tensors by file descriptor with a process
            # that may have exited by the time they are read
            queue.put((rank, None, pickle.dumps(fn(rank, world, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, traceback.format_exc(), None))


def run_ranks(fn: Callable, *args: Any, world: int = 2, limit: float = 180,
              group_timeout_s: float = 60) -> List[Any]:
    """``[fn(rank, world, *args) for each rank]``.

    Run in ``world`` spawned processes joined in a gloo group whose collectives time out after
    ``group_timeout_s`` (``fn`` a module-level function, its results picklable); a rank's exception
    fails the test with its traceback.
    """
    context = multiprocessing.get_context('spawn')
    queue = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank_entry,
                             args=(fn, r, world, port, args, queue, group_timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, error, result = queue.get(timeout=limit)
            if error is not None:
                raise AssertionError(f'rank {rank} of {world} failed:\n{error}')
            results[rank] = pickle.loads(result)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]
