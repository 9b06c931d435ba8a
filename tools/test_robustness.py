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

from mmrobust.utils.errors import file_system_error, run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp
from typing import List, Optional, Tuple

from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.utils import import_modules_from_strings

from mmrobust.apis import (
    add_launch_args,
    apply_common_args,
    apply_test_args,
    build_runner,
    parse_launch_args,
)
from mmrobust.corruptions import Protocol, resolve_protocol
from mmrobust.engine.hooks.strict_load import strict_load_outcome
from mmrobust.evaluation import RobustnessOptions, evaluate_robustness, results_lock
from mmrobust.evaluation.cell_kinds import CELL_KINDS
from mmrobust.evaluation.coco_metric import COCO_BACKENDS, DEFAULT_ROBUSTNESS_BACKEND
from mmrobust.evaluation.loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH
from mmrobust.evaluation.report import summary_markdown, write_report
from mmrobust.evaluation.results import report_dir
from mmrobust.evaluation.robustness import DEFAULT_METRIC_QUEUE, recorded_results
from mmrobust.evaluation.shards import parse_shard
from mmrobust.utils import explain_registry_errors
from mmrobust.utils.config_checks import resolve_config_path
from mmrobust.utils.io import check_writable


def build_parser(first_pass: bool = False) -> argparse.ArgumentParser:
    """The command line: the run's options, then each registered cell kind's.

    ``first_pass``: the parser that finds the config before its ``custom_imports`` (a user's
    families and kinds) are imported: no help, positionals optional, unknown options left.
    """
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=not first_pass)
    parser.add_argument('config', nargs='?' if first_pass else None)
    parser.add_argument('checkpoint', nargs='?' if first_pass else None)
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
    parser.add_argument('--report', default=None, metavar='DIR',
                        help='write the report (CSV files, plots) into DIR, not into <results '
                             'stem>_report/; a rerun with every cell recorded writes nothing '
                             'without it (it prints the table from the results file)')
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
    parser.add_argument('--refresh-per-image', action='store_true',
                        help='infer again the recorded cells whose per-image statistics are '
                             'missing or of another evaluation (what the report asks for; '
                             'their numbers come out the same)')
    parser.add_argument('--no-per-image-stats', action='store_true',
                        help='do not keep per-image statistics in <results stem>_per_image/ '
                             '(the report then gives no bootstrap intervals; saves the COCO '
                             "metric's second per-image matching under faster-coco-eval)")
    parser.add_argument('--per-cell-loaders', action='store_true',
                        help='build the test dataset and its dataloader anew for every cell (the '
                             'loop before the one-pass loader; the same inputs, slower)')
    parser.add_argument('--work-dir', help='logs and the default results file go here')
    add_launch_args(parser)
    for kind in CELL_KINDS.values():  # NOTE: a kind's own options (a user's, once imported)
        kind.add_arguments(parser)
    return parser


def load_config(argv: Optional[List[str]] = None) -> Optional[Config]:
    """The config named on the command line, its ``custom_imports`` imported (None: none named).

    As mmdet's tools do, before anything is planned: a user's attack families, cell kinds, shift
    sets and metrics are registered by the modules it names (``--cfg-options`` included).
    """
    known, _ = build_parser(first_pass=True).parse_known_args(argv)
    if not known.config:
        return None
    cfg = Config.fromfile(resolve_config_path(known.config))  # NOTE: imports custom_imports
    if known.cfg_options:
        cfg.merge_from_dict(known.cfg_options)
    if cfg.get('custom_imports'):  # NOTE: again, for what --cfg-options added
        import_modules_from_strings(**cfg['custom_imports'])
    return cfg


def run_options(args: argparse.Namespace, cfg: Config) -> Tuple[Protocol, RobustnessOptions]:
    """The protocol and the options of the run, each kind's from its own arguments."""
    options = RobustnessOptions(
        seed=args.seed, bgr_compat=args.bgr_compat, corrupted_root=args.corrupted_root,
        checkpoint=args.checkpoint, save_predictions=args.save_predictions,
        coco_backend=args.coco_backend, metric_queue=args.metric_queue,
        one_pass=not args.per_cell_loaders,
        shard=parse_shard(args.shard) if args.shard else None,
        post_process_queue=args.post_process_queue, prefetch=args.prefetch,
        per_image=not args.no_per_image_stats, refresh_per_image=args.refresh_per_image,
        kind_options=dict(cfg.get('robustness_kind_options') or {}) or None)
    asked = [kind for kind in CELL_KINDS.values() if kind.apply_args(args, options)]
    if asked and args.protocol is None and args.corruptions is None:
        # NOTE: a kind asked for alone replaces the default corruption protocol
        first = asked[0]
        protocol = Protocol(first.alone or first.name,
                            f'{first.category or first.name} cells only' if len(asked) == 1
                            else 'the cells asked for only', {})
    else:
        protocol = resolve_protocol(args.protocol, args.corruptions, args.severities)
    return protocol, options


def main() -> None:
    """Evaluate the robustness cells and write the results file."""
    cfg = load_config()
    args = parse_launch_args(build_parser())
    protocol, options = run_options(args, cfg)
    shard = options.shard
    # NOTE: once, before any build: a bad queue depth, a half-written or mismatching stored
    # set, a missing or mis-laid shift set, a user's kind's own checks; evaluate_robustness
    # reuses the result
    options.validated(protocol)
    cfg = apply_common_args(cfg, args.config, args.launcher, args.work_dir, args.cfg_options)
    cfg = apply_test_args(cfg, args.checkpoint)
    stem = f'robustness_{protocol.name.replace(":", "_")}'
    if shard:
        stem += f'_shard{shard[0]}of{shard[1]}'
    results_path = args.results or osp.join(cfg.work_dir, f'{stem}.json')
    label = osp.splitext(osp.basename(args.config))[0]
    # NOTE: one process only: ranks that could each decide alone must not diverge
    recorded = None if args.launcher != 'none' else recorded_results(
        cfg, protocol, results_path, options)
    if recorded is not None:  # NOTE: nothing to run: nothing built, locked or written
        print_log(f'every planned cell is recorded in {results_path}: nothing to run, nothing '
                  'written (--report DIR writes the report there)', logger='current')
        markdown, files = _report(label, recorded, results_path, args.report, True)
        _print_table(markdown, results_path, files, shard)
        return
    check_writable(results_path, '--results')  # NOTE: before the model: a folder, read-only
    runner = build_runner(cfg, ('test_dataloader',), args.allow_partial_load)
    with explain_registry_errors(), results_lock(results_path, args.wait):
        runner.call_hook('before_run')
        runner.load_or_resume()  # the checkpoint, once for all cells
        options.checkpoint_load = strict_load_outcome(runner)  # NOTE: recorded, not checked
        # NOTE: rank 0 alone decides only what it alone does after the run: the report. One
        # process asked above already (each ask hashes the checkpoint)
        done = args.launcher != 'none' and runner.rank == 0 and recorded_results(
            cfg, protocol, results_path, options) is not None
        results = evaluate_robustness(runner, cfg, protocol, results_path, options)
        runner.call_hook('after_run')
        if runner.rank == 0:
            markdown, files = _report(label, results, results_path, args.report, done)
            _print_table(markdown, results_path, files, shard)


def _report(label: str, results: dict, results_path: str, out: Optional[str],
            done: bool) -> Tuple[str, List[str]]:
    """The table, and the report written where asked (``out``) or next to the results.

    Next to the results of a run that did nothing (``done``), only where it is missing (a run
    stopped while writing it, by a full disk): where that fails too, the table still prints
    (the log says why the report is not there).
    """
    if out:
        return write_report({label: results}, out)
    folder = report_dir(results_path)
    if not done:
        return write_report({label: results}, folder)
    if osp.isfile(osp.join(folder, 'summary.csv')):
        return summary_markdown({label: results}), [f'{folder} (unchanged)']
    try:
        return write_report({label: results}, folder)
    except OSError as err:
        if file_system_error(err) is None:
            raise
        print_log(f'the report is missing from {folder} and cannot be written there ({err}): '
                  '--report DIR writes it elsewhere', logger='current', level=30)
        return summary_markdown({label: results}), []


def _print_table(markdown: str, results_path: str, files: list, shard) -> None:
    """The end of a run: the table, where the results and the report are, what comes next."""
    print(markdown)
    print(f'\nresults: {results_path}\nreport: {", ".join(files) or "not written"}\n'
          f'confidence intervals, and models compared: python tools/robustness_report.py '
          f'{results_path} [OTHER.json ...] --out-dir DIR')
    if shard:
        every = results_path.replace(f'shard{shard[0]}of', 'shard*of')
        print(f'shard {shard[0]}/{shard[1]}: once every shard is done, python '
              f'tools/robustness_report.py merge {every} --out MERGED.json')


if __name__ == '__main__':
    run_tool(main, file_error_hint='Rerun the same command to resume: the cells recorded so far '
             'are kept, the results file as the last recorded cell left it.')
