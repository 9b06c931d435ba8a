"""Tables, CSV and plots of corruption-robustness results, several models side by side.

    python tools/robustness_report.py work_dirs/a/robustness_benchmark.json \\
        work_dirs/b/robustness_benchmark.json --labels baseline DAT --out-dir report/
    python tools/robustness_report.py old_mmdet_results.pkl          # mmdet's test_robustness

    python tools/robustness_report.py merge w/robustness_benchmark_shard*of8.json \
        --out w/robustness_benchmark.json                                # join shards

Prints P_clean / mPC / rPC per model and metric and the per-corruption means (Markdown), and
writes OUT_DIR/summary.csv, cells.csv, per_corruption_<metric>.png and per_severity_<metric>.png.
Accepts mmrobust results JSON and mmdet 3.3 `*_results.pkl` files.

`merge` joins the results files of `test_robustness.py --shard I/N` runs into one that resumes
and reports like an unsharded run's; it refuses shards of different evaluations and cells with
two different numbers, and cells no shard holds unless --allow-missing (marked partial).
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp
from typing import List

from mmrobust.evaluation.report import plot, summary_markdown, write_csv
from mmrobust.evaluation.results import load_results, report_dir


def merge(argv: List[str]) -> int:
    """``merge SHARD... --out MERGED``: one results file from the shards' files."""
    from mmrobust.evaluation.results import ShardError, merge_results
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
    try:
        merged = merge_results([(p, load_results(p)) for p in args.shards], args.allow_missing)
    except (ShardError, ValueError, FileNotFoundError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    with exclusive_lock(args.out):  # NOTE: not over a results file a run is writing
        atomic_json(args.out, merged)
    cells = sum(len(v) for v in merged['cells'].values())
    print(f'merged {len(args.shards)} shards: {cells} cells into {args.out}'
          + (f'; PARTIAL, missing: {", ".join(merged["partial"]["missing"])}'
             if 'partial' in merged else ''))
    print(summary_markdown({osp.splitext(osp.basename(args.out))[0]: load_results(args.out)}))
    return 0


def main() -> int:
    if sys.argv[1:2] == ['merge']:
        return merge(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('results', nargs='+', help='results JSON / mmdet _results.pkl files')
    parser.add_argument('--labels', nargs='+', default=None, help='one name per results file')
    parser.add_argument('--metrics', nargs='+', default=None,
                        help='metrics to show (default: box/mask AP or mIoU)')
    parser.add_argument('--out-dir', default=None,
                        help='where CSV and plots go (default: <stem>_report/ next to the first '
                        'results file, <stem1>_vs_<stem2>_report/ for several)')
    args = parser.parse_args()
    if args.labels and len(args.labels) != len(args.results):
        parser.error(f'{len(args.labels)} labels for {len(args.results)} results files')
    labels = args.labels or [osp.splitext(osp.basename(p))[0] if len(
        {osp.basename(q) for q in args.results}) == len(args.results) else p
        for p in args.results]
    results = {label: load_results(path) for label, path in zip(labels, args.results)}
    # NOTE: one folder per results file (or per set compared), never a shared report/
    stems = [osp.splitext(osp.basename(p))[0] for p in args.results]
    out_dir = args.out_dir or report_dir(
        osp.join(osp.dirname(osp.abspath(args.results[0])), '_vs_'.join(stems)))
    print(summary_markdown(results, args.metrics))
    paths = list(write_csv(results, out_dir)) + plot(results, out_dir, args.metrics)
    print('\nwrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    sys.exit(main())
