r"""Peak memory and time per image of a segmentor attack through the slide predictor.

Against the same attack through the whole-image forward.

    python tools/analysis_tools/benchmark_slide_attack.py                   # 512x1024, PGD-2
    python tools/analysis_tools/benchmark_slide_attack.py --size 1024 2048 --crop 1024 \\
        --stride 768 --steps 10 --rounds 3 --device cuda                     # Cityscapes' shape

Attacks differentiate the predictor the config scores (``test_cfg``): with ``mode='slide'`` the
backward pass runs window by window, with ``mode='whole'`` over the whole image at once. Each
case lives in its own process (so its peak memory is its own: the peak RSS growth over the
built model on a CPU, ``torch.cuda.max_memory_allocated`` on a GPU) and the cases take their
steps in turn (interleaved, the order rotated each round); the time ratio is formed per round
and shown as the median and range over the rounds. The model is the toy SegFormer (MiT-B0) with
its initial weights, on one synthetic image of ``--size`` with random labels: the cost of an
attack does not depend on the weights or the picture.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os
from typing import Callable, Dict, Sequence, Tuple

import torch

from mmrobust.utils.benchmark import fmt_range, interleave_processes, ratio_summary, summary

CONFIG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', type=int, nargs=2, default=(512, 1024), metavar=('H', 'W'),
                        help='the input image (512 1024)')
    parser.add_argument('--crop', type=int, default=256, help='slide window (256)')
    parser.add_argument('--stride', type=int, default=192, help='slide stride (192)')
    parser.add_argument('--attack', default='pgd_linf')
    parser.add_argument('--steps', type=int, default=2, help='attack iterations (2)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--device', default='cpu')
    return parser.parse_args()


def setup(mode: str, size: Sequence[int], crop: int, stride: int, attack_name: str, steps: int,
          device: str) -> Tuple[Callable[[], None], Dict]:
    """One case, built in its worker.

    The toy segmentor with a ``mode`` test_cfg and one preprocessed synthetic image; the step
    attacks it.
    """
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    import mmrobust  # noqa: F401
    from mmrobust.evaluation.attacks import Attack, attack_batch

    cfg = Config.fromfile(CONFIG)
    init_default_scope(cfg.default_scope)
    cfg.model.test_cfg = (dict(mode='slide', crop_size=(crop, crop), stride=(stride, stride))
                          if mode == 'slide' else dict(mode='whole'))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).to(device).eval()
    height, width = size
    sample = SegDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                         pad_shape=(height, width)))
    sample.gt_sem_seg = PixelData(data=torch.randint(0, 19, (1, height, width)))
    raw = dict(inputs=[torch.randint(0, 256, (3, height, width), dtype=torch.uint8)],
               data_samples=[sample])
    data = model.data_preprocessor(raw, False)
    attack = Attack.from_name(attack_name, '8/255', steps=steps)
    cuda = device.startswith('cuda')

    def step() -> None:
        attack_batch(model, data, attack)

    info: Dict = {}  # NOTE: the RSS growth counts from the peak once built
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        info['sync'] = torch.cuda.synchronize
        info['stats'] = lambda: {'cuda_peak_mb': torch.cuda.max_memory_allocated() / 2 ** 20}
    return step, info


def main() -> None:
    """Time the slide and whole-image attacks; print the table."""
    args = parse_args()
    common = (tuple(args.size), args.crop, args.stride, args.attack, args.steps, args.device)
    runs = interleave_processes({mode: (setup, (mode,) + common) for mode in ('slide', 'whole')},
                                rounds=args.rounds, warmup=1)
    load = os.getloadavg()[0]
    print(f'toy SegFormer (MiT-B0), one {args.size[0]}x{args.size[1]} image, {args.attack} '
          f'({args.steps} steps), slide windows {args.crop} every {args.stride}; '
          f'{args.rounds} rounds on {args.device}, load average {load:.1f} on '
          f'{os.cpu_count()} cores')
    memory = 'cuda_peak_mb' if args.device.startswith('cuda') else 'rss_growth_mb'
    print(f'| predictor | seconds per image | x whole (time) | peak memory, MB ({memory}) |')
    print('|---|---|---|---|')
    for mode in ('slide', 'whole'):
        times = runs[mode]['times']
        ratio = ratio_summary(times, runs['whole']['times'])
        print(f'| {mode} | {fmt_range(summary(times), ".2f")} | {fmt_range(ratio, ".2f", "x")} '
              f'| {runs[mode]["stats"][memory]:.0f} |')
    whole = runs['whole']['stats'][memory]
    if whole > 0:
        print(f'peak memory, slide / whole: {runs["slide"]["stats"][memory] / whole:.2f}')


if __name__ == '__main__':
    run_tool(main)
