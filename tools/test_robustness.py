r"""Corruption robustness of a detector or segmentor: P_clean, mPC and rPC over a protocol.

    python tools/test_robustness.py CONFIG CKPT --protocol benchmark          # COCO-C, on the fly
    python tools/test_robustness.py CONFIG CKPT --protocol cityscapes_c \\
        --corrupted-root data/cityscapes-c                                     # stored set
    python tools/test_robustness.py CONFIG CKPT --corruptions fog snow --severities 3 5
    python tools/test_robustness.py CONFIG CKPT --attacks pgd_linf \
        --epsilons 1/255 2/255 4/255 8/255 --attack-steps 10             # adversarial cells
    TOOL=test_robustness.py bash tools/dist_test.sh CONFIG CKPT 8 --protocol benchmark

The model is built and the checkpoint loaded once, the test dataset once: one dataloader serves
every cell (its workers live through the protocol; the cell reaches them as data), with one
progress bar in images for the whole protocol. A cell's metric is computed by a worker
process while the next cells infer (--metric-queue K cells at most; 0: serial), from predictions
saved in <results stem>_predictions/ until the cell is recorded. After every cell the results JSON
(default: WORK_DIR/robustness_<protocol>.json) is rewritten atomically, and rerunning the same
command resumes, from the saved predictions where a run was killed during a metric; one run
at a time writes a results file (a second one stops, or queues with --wait). At the end the
P_clean / mPC / rPC table is printed and <results stem>_report/ next to the results gets the CSV
files and plots; tools/robustness_report.py compares several models.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.errors import UsageError, run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp

from mmengine.config import Config

from mmrobust.apis import (
    add_launch_args,
    apply_common_args,
    apply_test_args,
    build_runner,
    parse_launch_args,
)
from mmrobust.corruptions import Protocol, resolve_protocol
from mmrobust.datasets.shift_sets import (
    SHIFT_BUNDLES,
    SHIFT_FAMILIES,
    SHIFT_SETS,
    parse_shifts,
)
from mmrobust.engine.hooks.strict_load import strict_load_outcome
from mmrobust.evaluation import RobustnessOptions, evaluate_robustness, results_lock
from mmrobust.evaluation.attack_families import attack_families
from mmrobust.evaluation.attacks import attack_names, attack_plan
from mmrobust.evaluation.coco_metric import COCO_BACKENDS, DEFAULT_ROBUSTNESS_BACKEND
from mmrobust.evaluation.loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH
from mmrobust.evaluation.report import write_report
from mmrobust.evaluation.results import report_dir
from mmrobust.evaluation.robustness import DEFAULT_METRIC_QUEUE
from mmrobust.evaluation.shards import parse_shard
from mmrobust.utils import explain_registry_errors


def parse_args() -> argparse.Namespace:
    """The command line."""
    families = attack_families()  # the registered rows, a user's own among them
    seg_only = ' / '.join(f.name for f in families if f.segmentation_only)
    starts = ', '.join(f'{"on" if f.random_start else "off"} for {f.name}' for f in families)
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--protocol', default=None,
                        help='benchmark (default), cityscapes_c, fan_coco_c or all')
    parser.add_argument('--corruptions', nargs='+', default=None,
                        help='corruptions or categories (restricts --protocol if given)')
    parser.add_argument('--severities', nargs='+', type=int, default=None)
    parser.add_argument('--seed', type=int, default=None,
                        help="seed of the corrupted set (default 0; a stored set's manifest "
                             'gives its own) and of the attacks')
    parser.add_argument('--corrupted-root', default=None,
                        help='read cells from OUT/<corruption>/<severity>/ of make_corrupted.py')
    parser.add_argument('--bgr-compat', action='store_true', default=None,
                        help="corrupt mmcv's BGR arrays as if they were RGB (mmdet's historical "
                             'COCO-C; for comparison with published tables)')
    parser.add_argument('--results', default=None,
                        help='results JSON (resumed if it exists; one run at a time writes it)')
    parser.add_argument('--wait', action='store_true',
                        help='if another run writes the same results file, wait for it to finish '
                             'instead of stopping (then resume what it left)')
    parser.add_argument('--save-predictions', default=None, metavar='DIR',
                        help='also keep the predictions, one DIR/<corruption>_<severity>.pkl '
                             'per cell: boxes, scores, labels and RLE masks, or uint8 label maps '
                             '(no logits, no ground truth)')
    parser.add_argument('--coco-backend', default=None, choices=sorted(COCO_BACKENDS),
                        help='COCO evaluation library of the COCO metrics (default: the '
                             f"metric's own `backend`, else {DEFAULT_ROBUSTNESS_BACKEND}; all "
                             'give the same numbers)')
    parser.add_argument('--metric-queue', type=int, default=DEFAULT_METRIC_QUEUE, metavar='K',
                        help="compute a cell's metric in a worker process while the next cells "
                             'infer, at most K cells in flight (their predictions are saved '
                             'next to the results file until recorded, so a killed run resumes '
                             f'without inference); 0: serial (default: {DEFAULT_METRIC_QUEUE})')
    parser.add_argument('--post-process-queue', type=int, default=DEFAULT_POST_PROCESS_QUEUE,
                        metavar='B',
                        help="post-process a batch (outputs to the host, mask encoding, the "
                             "metric's per-batch work) in a thread while the next batches run "
                             'the model, at most B batches waiting; 0: in the loop (default: '
                             f'{DEFAULT_POST_PROCESS_QUEUE})')
    parser.add_argument('--prefetch', type=int, default=DEFAULT_PREFETCH, metavar='B',
                        help='receive and preprocess (to the device, normalise, pad) up to B '
                             'batches ahead in a thread while the model runs; 0: in the loop '
                             f'(default: {DEFAULT_PREFETCH})')
    parser.add_argument('--shard', default=None, metavar='I/N',
                        help='evaluate the I-th (from 0) of N disjoint shards of the cells (the '
                             'clean set in shard 0), into its own results file (default '
                             'robustness_<protocol>_shard<I>of<N>.json); join the shards with '
                             '`tools/robustness_report.py merge`')
    parser.add_argument('--no-per-image-stats', action='store_true',
                        help='do not keep per-image statistics in <results stem>_per_image/ '
                             '(the report then gives no bootstrap intervals; saves the COCO '
                             "metric's second per-image matching under faster-coco-eval)")
    parser.add_argument('--per-cell-loaders', action='store_true',
                        help='build the test dataset and its dataloader anew for every cell (the '
                             'loop before the one-pass loader; the same inputs, slower)')
    parser.add_argument('--shifts', nargs='+', default=None, metavar='SHIFT',
                        help='real-world shift cells (the config\'s pipeline and metric on '
                             'another set, not in mPC): sets '
                             f'({", ".join(SHIFT_SETS)}), SET:LEVEL, foggy_<beta>, or bundles '
                             f'({", ".join(SHIFT_BUNDLES)}); without --protocol / --corruptions '
                             'only these and the clean set run')
    parser.add_argument('--shift-root', nargs='+', default=[], metavar='FAMILY=PATH',
                        help='where a shift family lives (default data/<family>): '
                             f'{", ".join(SHIFT_FAMILIES)}')
    parser.add_argument('--attacks', nargs='+', default=None, metavar='ATTACK',
                        help='white-box attack cells, each at every --epsilons: '
                             f'{", ".join(attack_names())} ({seg_only}: '
                             'segmentors); '
                             'without --protocol / --corruptions only these cells run')
    parser.add_argument('--epsilons', nargs='+', default=None, metavar='EPS',
                        help='attack budgets in [0, 1] RGB pixel units, e.g. 1/255 8/255 '
                             '(L-inf: per pixel value; L2: the norm over the image)')
    parser.add_argument('--attack-steps', type=int, default=10, help='PGD iterations (10)')
    parser.add_argument('--attack-step-size', type=float, default=None,
                        help='default: 2.5 * epsilon / steps (FGSM: epsilon)')
    parser.add_argument('--attack-random-start', nargs='?', const='on', default=None,
                        choices=('on', 'off'),
                        help='start from a uniform point of the epsilon-ball (default: each '
                             f"attack's paper: {starts})")
    parser.add_argument('--attack-restarts', type=int, default=1,
                        help='random restarts (needs the random start); the strongest kept, '
                             'per image')
    parser.add_argument('--work-dir', help='logs and the default results file go here')
    add_launch_args(parser)
    return parse_launch_args(parser)


def _shift_roots(items) -> dict:
    """``{family: root}`` of ``--shift-root FAMILY=PATH`` items."""
    roots = {}
    for item in items:
        family, _, path = item.partition('=')
        if family not in SHIFT_FAMILIES or not path:
            raise UsageError(f'--shift-root takes FAMILY=PATH with FAMILY one of '
                             f'{", ".join(SHIFT_FAMILIES)}; got {item!r}')
        roots[family] = path
    return roots


def main() -> None:
    """Evaluate the robustness cells and write the results file."""
    args = parse_args()
    shard = parse_shard(args.shard) if args.shard else None
    attacks = attack_plan(args.attacks or (), args.epsilons, args.attack_steps,
                          args.attack_step_size,
                          None if args.attack_random_start is None
                          else args.attack_random_start == 'on', args.attack_restarts,
                          0 if args.seed is None else args.seed)
    if args.epsilons and not attacks:
        raise UsageError('--epsilons needs --attacks (e.g. --attacks pgd_linf)')
    shifts = parse_shifts(args.shifts) if args.shifts else None
    if (attacks or shifts) and args.protocol is None and args.corruptions is None:
        protocol = Protocol('attacks' if attacks else 'shifts',
                            'adversarial cells only' if attacks and not shifts else
                            'the cells asked for only', {})
    else:
        protocol = resolve_protocol(args.protocol, args.corruptions, args.severities)
    options = RobustnessOptions(
        seed=args.seed, bgr_compat=args.bgr_compat, corrupted_root=args.corrupted_root,
        checkpoint=args.checkpoint, save_predictions=args.save_predictions,
        coco_backend=args.coco_backend, metric_queue=args.metric_queue,
        one_pass=not args.per_cell_loaders, shard=shard,
        post_process_queue=args.post_process_queue, prefetch=args.prefetch, attacks=attacks,
        per_image=not args.no_per_image_stats, shifts=shifts,
        shift_roots=_shift_roots(args.shift_root))
    # NOTE: once, before any build: a bad queue depth, a half-written or mismatching stored
    # set, a missing or mis-laid shift set; evaluate_robustness reuses the result
    options.validated(protocol)
    cfg = Config.fromfile(args.config)
    cfg = apply_common_args(cfg, args.config, args.launcher, args.work_dir, args.cfg_options)
    cfg = apply_test_args(cfg, args.checkpoint)
    stem = f'robustness_{protocol.name.replace(":", "_")}'
    if shard:
        stem += f'_shard{shard[0]}of{shard[1]}'
    results_path = args.results or osp.join(cfg.work_dir, f'{stem}.json')
    runner = build_runner(cfg, ('test_dataloader',), args.allow_partial_load)
    with explain_registry_errors(), results_lock(results_path, args.wait):
        runner.call_hook('before_run')
        runner.load_or_resume()  # the checkpoint, once for all cells
        options.checkpoint_load = strict_load_outcome(runner)  # NOTE: recorded, not checked
        results = evaluate_robustness(runner, cfg, protocol, results_path, options)
        runner.call_hook('after_run')
        if runner.rank == 0:
            label = osp.splitext(osp.basename(args.config))[0]
            markdown, files = write_report({label: results}, report_dir(results_path))
            print(markdown)
            print(f'\nresults: {results_path}\nreport: {", ".join(files)}\nconfidence '
                  f'intervals, and models compared: python tools/robustness_report.py '
                  f'{results_path} [OTHER.json ...] --out-dir DIR')
            if shard:
                every = results_path.replace(f'shard{shard[0]}of', 'shard*of')
                print(f'shard {shard[0]}/{shard[1]}: once every shard is done, python '
                      f'tools/robustness_report.py merge {every} --out MERGED.json')

if __name__ == '__main__':
    run_tool(main)
