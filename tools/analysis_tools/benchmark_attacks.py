r"""The cost of an attack cell against a clean cell: attacked inference over clean inference.

    python tools/analysis_tools/benchmark_attacks.py                 # toy SegFormer, PGD-10
    python tools/analysis_tools/benchmark_attacks.py CONFIG --attacks pgd_linf fgsm_linf \\
        --steps 10 --images 8 --rounds 5

Per test image (batch size 1, as test loaders run), one round times the model's ``test_step``
on the clean image and on the same image attacked (:func:`~mmrobust.evaluation.attacks.
attack_batch`, then ``test_step``), the cases taking their steps in turn (interleaved, the order
rotated each round); ratios are formed per round and shown as the median and range over the
rounds. Data loading and the metric are the same for both cells and left out, so the ratio is
an upper bound on the ratio of whole cells. The model has its initial weights (the same cost as
trained ones). Compare ratios, not seconds across runs: this machine kind is noisy.
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
from typing import Callable, Dict, List

import torch

from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary, summary

DEFAULT_CONFIG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG)
    parser.add_argument('--attacks', nargs='+', default=['pgd_linf'])
    parser.add_argument('--epsilon', default='4/255')
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--images', type=int, default=4, help='test images per round')
    parser.add_argument('--rounds', type=int, default=5)
    return parser.parse_args()


def main() -> None:
    """Time the attacks against clean inference and print the table."""
    args = parse_args()
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner import Runner

    import mmrobust  # noqa: F401
    from mmrobust.evaluation.attacks import Attack, attack_batch, gt_at_file_scale

    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    loader = Runner.build_dataloader(dict(cfg.test_dataloader, batch_size=1, num_workers=0,
                                          persistent_workers=False))
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == args.images:
            break
    late_gt = gt_at_file_scale(cfg)
    attacks = {name: Attack.from_name(name, args.epsilon, steps=args.steps)
               for name in args.attacks}

    def clean() -> None:
        with torch.no_grad():
            for batch in batches:
                model.test_step(batch)

    def attacked(attack: Attack) -> Callable[[], None]:
        def step() -> None:
            for batch in batches:
                data = model.data_preprocessor(batch, False)
                data = attack_batch(model, data, attack, gt_at_file_scale=late_gt).data
                with torch.no_grad():
                    model(**data, mode='predict')
        return step

    cases: Dict[str, Callable[[], None]] = {'clean': clean}
    cases.update({name: attacked(a) for name, a in attacks.items()})
    times: Dict[str, List[float]] = interleave(cases, rounds=args.rounds, warmup=1)
    load = os.getloadavg()[0]
    print(f'{args.config}: {len(batches)} images per round, {args.rounds} rounds, '
          f'epsilon {args.epsilon}, load average {load:.1f} on {os.cpu_count()} cores')
    print('| cell | seconds per image | x clean (median, range over rounds) |')
    print('|---|---|---|')
    per_image = {k: [t / len(batches) for t in v] for k, v in times.items()}
    print(f'| clean | {fmt_range(summary(per_image["clean"]), ".3f")} | 1 |')
    for name, attack in attacks.items():
        label = f'{name} ({attack.steps} step{"s" if attack.steps > 1 else ""})'
        print(f'| {label} | {fmt_range(summary(per_image[name]), ".3f")} | '
              f'{fmt_range(ratio_summary(times[name], times["clean"]), ".1f", "x")} |')


if __name__ == '__main__':
    run_tool(main)
