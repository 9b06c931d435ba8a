"""Forward+backward time and peak memory of backbones, against baselines measured in the same run.

    python tools/analysis_tools/benchmark_backbones.py                      # every FAN variant
    python tools/analysis_tools/benchmark_backbones.py --models fan_hybrid_tiny fan_hybrid_small \
        --size 512 --batch 1 --iters 5

Each model lives in its own process (so peak memory is its own), at the same input, in the same
run as mmdet's Swin-T and ResNet-50; the models take their steps in turn (interleaved, one at a
time), and the table gives every time as the median and range of the per-round ratios to both
(this machine kind is noisy: compare ratios, not milliseconds across runs). Peak memory is
``torch.cuda.max_memory_allocated`` on a GPU and the growth of the process's peak RSS on a CPU.
GFLOPs are one forward pass as counted by ``torch.utils.flop_counter`` (matmuls, convolutions and
attention; 2 FLOPs per multiply-add), so time per GFLOP tells slow code from big models.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import resource
from typing import Dict, List

import torch

from mmrobust.utils.benchmark import fmt_range, interleave_processes, ratio_summary, summary
from mmrobust.utils.flops import count_flops

BASELINES = ('swin_t', 'resnet50')
FAN_MODELS = tuple(f'fan_{family}_{arch}' for family in ('hybrid', 'swin')
                   for arch in ('tiny', 'small', 'base', 'large'))


def build(name: str) -> torch.nn.Module:
    """A dense backbone by benchmark name."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import mmrobust  # noqa: F401  (registers the FAN backbones)
    init_default_scope('mmdet')
    if name == 'swin_t':
        cfg = dict(type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                   num_heads=[3, 6, 12, 24], window_size=7, out_indices=(0, 1, 2, 3))
    elif name == 'resnet50':
        cfg = dict(type='ResNet', depth=50, out_indices=(0, 1, 2, 3), frozen_stages=-1,
                   norm_eval=False)
    elif name.startswith('fan_hybrid_'):
        cfg = dict(type='FANHybrid', arch=name.rsplit('_', 1)[1], out_type='det')
    elif name.startswith('fan_swin_'):
        cfg = dict(type='FANSwin', arch=name.rsplit('_', 1)[1])
    else:
        raise KeyError(f'unknown model {name!r}; choose from {BASELINES + FAN_MODELS}')
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def _setup(name: str, size: int, batch: int, threads: int):
    """Worker side: build ``name`` and return its forward+backward step."""
    torch.set_num_threads(threads)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model = build(name).to(device)
    model.train()  # NOTE: mmdet's Swin returns None from train()
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(batch, 3, size, size, device=device)
    rss_baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # NOTE: counted before the timing, and its no-grad forward stays below the training peak
    flops = count_flops(lambda: model(x))
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()

    def step() -> None:
        outs = model(x)
        sum(o.float().mean() for o in outs).backward()
        model.zero_grad(set_to_none=True)

    info = dict(params_m=params / 1e6, gflops=flops / 1e9,
                rss_baseline_mb=rss_baseline_mb)
    if device == 'cuda':
        info.update(sync=torch.cuda.synchronize, stats=lambda: dict(
            gpu_peak_mb=torch.cuda.max_memory_allocated() / 2**20))
    return step, info


def main() -> None:
    """Time the backbones and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=list(FAN_MODELS),
                        choices=list(FAN_MODELS), help='FAN variants to time')
    parser.add_argument('--size', type=int, default=512, help='square input size')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--iters', type=int, default=5,
                        help='timed rounds (median and range); the models alternate per round')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    args = parser.parse_args()

    names = (*BASELINES, *args.models)
    results = interleave_processes(
        {n: (_setup, (n, args.size, args.batch, args.threads)) for n in names},
        rounds=args.iters, warmup=args.warmup)
    rows: List[Dict] = []
    for name in names:
        res = results[name]
        stats = res['stats']
        rows.append(dict(name=name, times=res['times'], ms=1000 * summary(res['times'])['median'],
                         peak_mb=stats.get('gpu_peak_mb', stats['rss_growth_mb']), **res['info']))
    base = {r['name']: r for r in rows if r['name'] in BASELINES}
    device = 'cuda' if torch.cuda.is_available() else f'cpu ({args.threads} threads)'
    print(f'\nforward+backward, {args.batch}x3x{args.size}x{args.size}, {device}, median (range) '
          f'of {args.iters} interleaved rounds\n')
    # NOTE: 'ms/GFLOP x Swin-T' separates the work a model does from how efficiently it does it
    swin_ms_per_gflop = base['swin_t']['ms'] / base['swin_t']['gflops']
    print('| model | params (M) | GFLOPs | ms | x Swin-T | x ResNet-50 | ms/GFLOP x Swin-T '
          '| peak MB | mem x Swin-T |')
    print('|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        # NOTE: ratios are formed round by round, between steps taken seconds apart
        swin = ratio_summary(r['times'], base['swin_t']['times'])
        resnet = ratio_summary(r['times'], base['resnet50']['times'])
        print(f'| {r["name"]} | {r["params_m"]:.1f} | {r["gflops"]:.2f} | {r["ms"]:.1f} | '
              f'{fmt_range(swin)} | {fmt_range(resnet)} | '
              f'{r["ms"] / r["gflops"] / swin_ms_per_gflop:.2f} | '
              f'{r["peak_mb"]:.0f} | {r["peak_mb"] / max(base["swin_t"]["peak_mb"], 1):.2f} |')


if __name__ == '__main__':
    run_tool(main)
