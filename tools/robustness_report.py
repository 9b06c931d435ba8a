"""Tables, CSV and plots of corruption-robustness results, several models side by side.

    python tools/robustness_report.py work_dirs/a/robustness_benchmark.json \\
        work_dirs/b/robustness_benchmark.json --labels baseline DAT --out-dir report/
    python tools/robustness_report.py old_mmdet_results.pkl          # mmdet's test_robustness

Prints P_clean / mPC / rPC per model and metric and the per-corruption means (Markdown), and
writes OUT_DIR/summary.csv, cells.csv, per_corruption_<metric>.png and per_severity_<metric>.png.
Accepts mmrobust results JSON and mmdet 3.3 `*_results.pkl` files.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp

from mmrobust.evaluation.report import plot, summary_markdown, write_csv
from mmrobust.evaluation.results import load_results, report_dir


def main() -> int:
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
