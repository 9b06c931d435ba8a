r"""Tables, CSV and plots of corruption-robustness results, several models side by side.

    python tools/robustness_report.py work_dirs/a/robustness_benchmark.json \\
        work_dirs/b/robustness_benchmark.json --labels baseline DAT --out-dir report/
    python tools/robustness_report.py old_mmdet_results.pkl          # mmdet's test_robustness

    python tools/robustness_report.py merge w/robustness_benchmark_shard*of8.json \
        --out w/robustness_benchmark.json                                # join shards

    python tools/robustness_report.py dat_s0.json dat_s1.json plain_s0.json plain_s1.json \
        --labels DAT DAT plain plain --reference plain_s0.json     # seeds, paired, CE

Prints P_clean / mPC / rPC per model and metric, with 95 % bootstrap intervals over the test
images (--bootstrap R replicates, from the per-image statistics test_robustness.py keeps in
<results stem>_per_image/), and the per-corruption means (Markdown); then the paired
differences of each recipe against the first one (the same resampled images for both; refused,
with the difference named, for results of different image sets), mean and standard deviation
across the seeds of a recipe (files with the same --labels name), and with --reference the
Corruption Error (CE_c = sum_s (S - P_c,s) / sum_s (S - P^ref_c,s), S = 1 for AP and 100 for
mIoU; mCE and relative mCE as ImageNet-C). Writes OUT_DIR/summary.csv and cells.csv (with the
intervals), paired.csv, seeds.csv, corruption_error.csv, per_corruption_<metric>.png,
per_severity_<metric>.png and intervals_<metric>.png. Accepts mmrobust results JSON and mmdet
3.3 ``*_results.pkl`` files (no intervals: they keep no per-image statistics).

``merge`` joins the results files of ``test_robustness.py --shard I/N`` runs into one that resumes
and reports like an unsharded run's; it refuses shards of different evaluations and cells with
two different numbers, and cells no shard holds unless --allow-missing (marked partial).
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp
from typing import Dict, List

from mmrobust.evaluation.comparisons import ER_AXES
from mmrobust.evaluation.report import build_extras, summary_markdown, write_report
from mmrobust.evaluation.results import load_results, report_dir
from mmrobust.evaluation.uncertainty import DEFAULT_REPLICATES, Bootstrap


def merge(argv: List[str]) -> int:
    """``merge SHARD... --out MERGED``: one results file from the shards' files."""
    from mmrobust.evaluation.cell_kinds import CELL_KINDS
    from mmrobust.evaluation.per_image import stats_folders
    from mmrobust.evaluation.shards import merge_results
    from mmrobust.utils.io import atomic_json, exclusive_lock
    parser = argparse.ArgumentParser(
        prog='robustness_report.py merge',
        description='Join the results files of test_robustness.py --shard I/N runs.')
    parser.add_argument('shards', nargs='+', help='the shards\' results JSON files')
    parser.add_argument('--out', required=True, help='the merged results JSON')
    parser.add_argument('--allow-missing', action='store_true',
                        help='write the merged file even if cells of the protocol are in no '
                             'shard (it is marked partial, with the missing cells)')
    args = parser.parse_args(argv)
    if osp.abspath(args.out) in {osp.abspath(p) for p in args.shards}:
        parser.error(f'--out {args.out} is one of the shards: write the merge elsewhere')
    merged = merge_results([(p, load_results(p)) for p in args.shards], args.allow_missing)
    # NOTE: what a kind computes from the recorded cells (the worst case over attacks) needs
    # every cell: the shards may split them
    folders = stats_folders(args.out, merged)
    for kind in CELL_KINDS.values():
        for what, why in kind.finish(args.out, merged, folders).items():
            print(f'no {what}: {why}')
    with exclusive_lock(args.out):  # NOTE: not over a results file a run is writing
        atomic_json(args.out, merged)
    cells = sum(len(v) for v in merged['cells'].values())
    print(f'merged {len(args.shards)} shards: {cells} cells into {args.out}'
          + (f'; PARTIAL, missing: {", ".join(merged["partial"]["missing"])}'
             if 'partial' in merged else ''))
    print(summary_markdown({osp.splitext(osp.basename(args.out))[0]: load_results(args.out)}))
    return 0


def main() -> int:
    """Merge shards, or write the report of results files; the exit status."""
    if sys.argv[1:2] == ['merge']:
        return merge(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('results', nargs='+', help='results JSON / mmdet _results.pkl files')
    parser.add_argument('--labels', nargs='+', default=None,
                        help='one name per results file; files with the same name are seeds of '
                        'one recipe (mean and std across them); the first name is the baseline '
                        'of the paired differences')
    parser.add_argument('--metrics', nargs='+', default=None,
                        help='metrics to show (default: box/mask AP or mIoU)')
    parser.add_argument('--bootstrap', type=int, default=DEFAULT_REPLICATES, metavar='R',
                        help='bootstrap replicates over the test images for the intervals and '
                        f'paired differences (default {DEFAULT_REPLICATES}: the Monte-Carlo '
                        'error of a 2.5%% endpoint is ~0.1 sigma; 0: none)')
    parser.add_argument('--baselines', nargs='+', default=(), metavar='NAME',
                        help='models (names as --labels gives them) whose trend of mPC against '
                        'P_clean the effective robustness of every model is measured from '
                        '(at least 2)')
    parser.add_argument('--er-axis', choices=ER_AXES, default='logit',
                        help='axes of that trend: logit (Taori et al. 2020, default) or linear')
    parser.add_argument('--seed-bootstrap', action='store_true',
                        help='the seeds vary in the paired intervals and the per-corruption '
                        'tests (between-seed variance with the bootstrap over images; needs '
                        'two or more files a label): statements about the recipes, not these '
                        'checkpoints')
    parser.add_argument('--alpha', type=float, default=0.05,
                        help='family-wise error rate of the per-corruption differences (Holm; '
                        'default 0.05); a verdict within 3 Monte-Carlo errors of its threshold '
                        'is drawn again, or printed undecided')
    parser.add_argument('--confidence', type=float, default=0.95,
                        help='confidence level of the intervals (default 0.95)')
    parser.add_argument('--bootstrap-seed', type=int, default=0,
                        help='seed of the image draws (the same draws for every model)')
    parser.add_argument('--reference', default=None, metavar='RESULTS',
                        help='results file of the reference model of the Corruption Error '
                        '(CE, mCE, relative mCE; e.g. the plain baseline)')
    parser.add_argument('--aggregate', choices=('benchmark', 'all'), default='benchmark',
                        help="mmdet _results.pkl files: mPC over the 15 benchmark corruptions "
                             "(default, as mmdet's robustness_eval.py and the COCO-C paper) or "
                             'all present')
    parser.add_argument('--out-dir', default=None,
                        help='where CSV and plots go (default: <stem>_report/ next to the first '
                        'results file, <stem1>_vs_<stem2>_report/ for several)')
    args = parser.parse_args()
    if args.labels and len(args.labels) != len(args.results):
        parser.error(f'{len(args.labels)} labels for {len(args.results)} results files')
    if args.bootstrap < 0:
        parser.error(f'--bootstrap takes 0 (no intervals) or more replicates, got '
                     f'{args.bootstrap}')
    if args.bootstrap and args.bootstrap < 100:
        print(f'note: {args.bootstrap} replicates give rough {args.confidence:.0%} intervals '
              '(their tails rest on a few replicates); 200 or more are usual', file=sys.stderr)
    if not 0 < args.confidence < 1:
        parser.error(f'--confidence is a level in (0, 1), e.g. 0.95; got {args.confidence}')
    names = args.labels or [osp.splitext(osp.basename(p))[0] if len(
        {osp.basename(q) for q in args.results}) == len(args.results) else p
        for p in args.results]
    counts = {n: names.count(n) for n in names}
    seen: Dict[str, int] = {}
    labels, groups = [], {}
    for name in names:  # NOTE: seeds of one recipe share a name; each file keeps its own row
        seen[name] = seen.get(name, 0) + 1
        label = f'{name} #{seen[name]}' if counts[name] > 1 else name
        labels.append(label)
        groups.setdefault(name, []).append(label)
    results = {label: load_results(path, args.aggregate)
               for label, path in zip(labels, args.results)}
    reference = None
    if args.reference:
        ref_label = osp.splitext(osp.basename(args.reference))[0]
        reference = (ref_label, load_results(args.reference, args.aggregate))
    boot = Bootstrap(args.bootstrap, args.confidence, args.bootstrap_seed)
    extras = build_extras([(label, path, results[label])
                           for label, path in zip(labels, args.results)],
                          groups, boot if args.bootstrap else None, reference, args.metrics,
                          baselines=args.baselines, er_axis=args.er_axis,
                          seed_bootstrap=args.seed_bootstrap, alpha=args.alpha)
    # NOTE: one folder per results file (or per set compared), never a shared report/
    stems = [osp.splitext(osp.basename(p))[0] for p in args.results]
    out_dir = args.out_dir or report_dir(
        osp.join(osp.dirname(osp.abspath(args.results[0])), '_vs_'.join(stems)))
    markdown, paths = write_report(results, out_dir, args.metrics, extras)
    print(markdown)
    print('\nwrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    run_tool(main)
