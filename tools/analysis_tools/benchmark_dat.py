"""The cost of Discrete Adversarial Training: DAT steps against the plain step of the same config.

    python tools/analysis_tools/benchmark_dat.py                       # toy FAN-T Mask R-CNN
    python tools/analysis_tools/benchmark_dat.py CONFIG --iters 5 --batch-size 2

Times a full training step (``model.train_step``: preprocessing, forward, backward, optimizer) of
the config without the hook, with ``DATHook(mode='replace')`` and with ``mode='append'``, each in
its own process on the same batches, the three taking their steps in turn (interleaved, one at
a time; ratios are the median and range of the per-round ratios), and splits the DAT steps into
the tokenizer's round trips, the attack's forward/backward and the rest. Peak memory is
``torch.cuda.max_memory_allocated`` on a GPU and, on a CPU, the process's peak RSS above what it
held after its imports (model, optimizer state, batches and activations, as the GPU figure).
The tokenizer is the config's hook tokenizer; without its checkpoint it runs with random
weights (same cost). Compare the ratios, not milliseconds across runs: this machine kind is noisy.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import contextlib
import copy
import os.path as osp
import resource
import time
from typing import Dict

import torch

from mmrobust.utils.benchmark import fmt_range, interleave_processes, ratio_summary, summary

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


def _setup(config: str, mode: str, batch_size: int, num_batches: int, threads: int):
    """Worker side: the config's model, optimizer and batches, and one training step."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner import Runner

    import mmrobust  # noqa: F401  (registers mmrobust and its hook)
    from mmrobust.engine import DATHook

    torch.set_num_threads(threads)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # after the imports
    cfg = Config.fromfile(config)
    init_default_scope(cfg.default_scope)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.to(device).train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    loader_cfg = dict(cfg.train_dataloader, num_workers=0, persistent_workers=False)
    if batch_size:
        loader_cfg['batch_size'] = batch_size
    loader = iter(Runner.build_dataloader(loader_cfg, seed=0))
    batches = [next(loader) for _ in range(num_batches)]

    hook, timers = None, {}
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
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    state = {'i': 0, 'total': 0.0}

    def step() -> None:
        i = state['i']
        start = time.perf_counter()
        with hook.at_iteration(i) if hook is not None else contextlib.nullcontext():
            model.train_step(batches[i % len(batches)], optim)
        _sync()
        state['i'], state['total'] = i + 1, state['total'] + time.perf_counter() - start

    def stats() -> Dict[str, float]:
        # NOTE: shares of the worker's own step time (warm-up steps included on both sides)
        out = {f'{k}_share': t.total / state['total'] for k, t in timers.items()}
        if device == 'cuda':
            out['gpu_peak_mb'] = torch.cuda.max_memory_allocated() / 2**20
        return out

    return step, dict(sync=_sync, stats=stats, rss_baseline_mb=rss_start)


def main() -> None:
    """Time a DAT training step against a plain one; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG,
                        help='a config with a DATHook in custom_hooks')
    parser.add_argument('--batch-size', type=int, default=0, help="default: the config's")
    parser.add_argument('--iters', type=int, default=5,
                        help='timed rounds (median and range); the modes alternate per round')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    args = parser.parse_args()

    results = interleave_processes(
        {m: (_setup, (args.config, m, args.batch_size, args.warmup + args.iters, args.threads))
         for m in MODES}, rounds=args.iters, warmup=args.warmup)
    rows = []
    for mode in MODES:
        res, stats = results[mode], results[mode]['stats']
        rows.append(dict(mode=mode, times=res['times'],
                         ms=1000 * summary(res['times'])['median'],
                         peak_mb=stats.get('gpu_peak_mb', stats['rss_growth_mb']),
                         **{k: v for k, v in stats.items() if k.endswith('_share')}))
    plain = rows[0]
    device = 'cuda' if torch.cuda.is_available() else f'cpu ({args.threads} threads)'
    print(f'\n{args.config}, training step, {device}, median (range) of {args.iters} '
          'interleaved rounds\n')
    print('| step | ms | x plain | tokenizer share | attack fwd+bwd share | peak MB | '
          'mem x plain |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        shares = (f'{100 * r["tokenizer_share"]:.0f}% | {100 * r["attack_share"]:.0f}%'
                  if 'tokenizer_share' in r else '- | -')
        ratio = fmt_range(ratio_summary(r['times'], plain['times']))
        print(f'| {r["mode"]} | {r["ms"]:.0f} | {ratio} | {shares} | '
              f'{r["peak_mb"]:.0f} | {r["peak_mb"] / max(plain["peak_mb"], 1):.2f} |')


if __name__ == '__main__':
    run_tool(main)
