"""The cost of Discrete Adversarial Training: DAT steps against the plain step of the same config.

    python tools/analysis_tools/benchmark_dat.py                       # toy FAN-T Mask R-CNN
    python tools/analysis_tools/benchmark_dat.py CONFIG --iters 5 --batch-size 2

Times a full training step (`model.train_step`: preprocessing, forward, backward, optimizer) of
the config without the hook, with `DATHook(mode='replace')` and with `mode='append'`, each in
its own process on the same batches, and splits the DAT steps into the tokenizer's round trips,
the attack's forward/backward and the rest. Peak memory is `torch.cuda.max_memory_allocated` on
a GPU and, on a CPU, the process's peak RSS above what it held after its imports (model,
optimizer state, batches and activations, as the GPU figure). The tokenizer is
the config's hook tokenizer; without its checkpoint it runs with random weights (same cost).
Compare the ratios, not milliseconds across runs: this machine kind is noisy.
"""
import argparse
import copy
import multiprocessing as mp
import os.path as osp
import resource
import statistics
import time
from typing import Dict, List

import torch

DEFAULT_CONFIG = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_dat_toy-coco.py'
MODES = ('plain', 'replace', 'append')


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Timer:
    """Accumulates the wall time of a wrapped method."""

    def __init__(self, obj, name: str) -> None:
        self.total, fn = 0.0, getattr(obj, name)

        def timed(*args, **kwargs):
            _sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            _sync()
            self.total += time.perf_counter() - start
            return out
        setattr(obj, name, timed)


def _measure(config: str, mode: str, args: argparse.Namespace, queue: mp.Queue) -> None:
    import mmrobust  # noqa: F401  (registers mmrobust and its hook)
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner import Runner
    from mmrobust.engine import DATHook

    torch.set_num_threads(args.threads)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # after the imports
    cfg = Config.fromfile(config)
    init_default_scope(cfg.default_scope)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.to(device).train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    loader_cfg = dict(cfg.train_dataloader, num_workers=0, persistent_workers=False)
    if args.batch_size:
        loader_cfg['batch_size'] = args.batch_size
    loader = iter(Runner.build_dataloader(loader_cfg, seed=0))
    batches = [next(loader) for _ in range(args.warmup + args.iters)]

    hook = timers = None
    if mode != 'plain':
        hooks = [h for h in cfg.get('custom_hooks', []) if h['type'] == 'DATHook']
        if not hooks:
            raise SystemExit(f'{config} has no DATHook in custom_hooks')
        hook_cfg = copy.deepcopy(hooks[0])
        hook_cfg.pop('type')
        init = hook_cfg['tokenizer'].get('init_cfg') or {}
        if not osp.isfile(init.get('checkpoint', '')):
            hook_cfg['tokenizer']['init_cfg'] = None  # random weights: the same cost
        hook = DATHook(**dict(hook_cfg, mode=mode))
        hook.attach(model)
        timers = dict(tokenizer=_Timer(hook, 'quantize'), attack=_Timer(hook, 'input_gradient'))

    times: List[float] = []
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    for i, batch in enumerate(batches):
        if i == args.warmup and timers:
            for t in timers.values():
                t.total = 0.0
        if hook is not None:
            hook._iter = i
        _sync()
        start = time.perf_counter()
        model.train_step(batch, optim)
        _sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    peak_mb = (torch.cuda.max_memory_allocated() / 2**20 if device == 'cuda' else
               (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_start) / 1024)
    row = dict(mode=mode, ms=1000 * statistics.median(times), peak_mb=peak_mb)
    if timers:
        total = sum(times)
        row.update({f'{k}_share': t.total / total for k, t in timers.items()})
    queue.put(row)


def measure(config: str, mode: str, args: argparse.Namespace) -> Dict:
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(config, mode, args, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f'benchmarking {mode} failed (exit code {proc.exitcode})')
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG,
                        help='a config with a DATHook in custom_hooks')
    parser.add_argument('--batch-size', type=int, default=0, help="default: the config's")
    parser.add_argument('--iters', type=int, default=5, help='timed steps (median)')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    args = parser.parse_args()

    rows = []
    for mode in MODES:
        rows.append(measure(args.config, mode, args))
        print(f'{mode:8s} {rows[-1]["ms"]:9.1f} ms  {rows[-1]["peak_mb"]:8.0f} MB', flush=True)
    plain = rows[0]
    device = 'cuda' if torch.cuda.is_available() else f'cpu ({args.threads} threads)'
    print(f'\n{args.config}, training step, {device}, median of {args.iters}\n')
    print('| step | ms | x plain | tokenizer share | attack fwd+bwd share | peak MB | mem x plain |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        shares = (f'{100 * r["tokenizer_share"]:.0f}% | {100 * r["attack_share"]:.0f}%'
                  if 'tokenizer_share' in r else '- | -')
        print(f'| {r["mode"]} | {r["ms"]:.0f} | {r["ms"] / plain["ms"]:.2f} | {shares} | '
              f'{r["peak_mb"]:.0f} | {r["peak_mb"] / max(plain["peak_mb"], 1):.2f} |')


if __name__ == '__main__':
    main()
