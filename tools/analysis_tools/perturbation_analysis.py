"""Fourier sensitivity heatmap or patch-masking curve of a trained detector or segmentor.

    python tools/analysis_tools/perturbation_analysis.py fourier CONFIG CKPT --grid 15 --eps 8 \
        --num-images 16 --out-dir work_dirs/fourier_r18
    python tools/analysis_tools/perturbation_analysis.py masking CONFIG CKPT --patch 16 \
        --ratios 0 0.1 0.2 0.4 0.6 0.8 --out-dir work_dirs/masking_r18 --compare OTHER.json

The score is the config's own test metric (box AP, mIoU; --metric picks one) on the first
--num-images test images. Fourier: each image gets eps · r_c · U_(u,v) (a unit-norm real Fourier
basis image, random sign per channel) in [0, 1] pixels; half of the centred grid is evaluated
(the other half is the same image) and the heatmap shows the drop from the clean score.
Masking: exactly round(ratio · n) of each image's patches are filled with the dataset mean.
Results go to <out-dir>/<analysis>.json after every setting (a rerun resumes), the figure next
to it (and for Fourier the heatmap matrix as fourier_heatmap.npy); --compare adds other runs'
JSON files to the figure.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import json
import os.path as osp

import numpy as np
from mmengine.config import DictAction

from mmrobust.analysis import heatmap_matrix, open_study, plot_heatmaps, plot_masking
from mmrobust.apis import add_partial_load_arg
from mmrobust.utils import exclusive_lock, explain_registry_errors


def main() -> None:
    """Run the Fourier or masking study and write its results and plots."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('analysis', choices=['fourier', 'masking'])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--num-images', type=int, default=16, help='0: the whole test set')
    parser.add_argument('--grid', type=int, default=15, help='odd size of the frequency grid')
    parser.add_argument('--eps', type=float, default=8.0,
                        help='L2 norm of the Fourier perturbation per channel ([0, 1] pixels)')
    parser.add_argument('--patch', type=int, default=16, help='patch size (pixels)')
    parser.add_argument('--ratios', type=float, nargs='+',
                        default=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--metric', help='metric to plot (default: box AP / mIoU)')
    parser.add_argument('--label', help='name of this model in the figure (default: config)')
    parser.add_argument('--compare', nargs='+', default=[], help='other runs (their JSON files)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    add_partial_load_arg(parser)
    args = parser.parse_args()

    if args.analysis == 'fourier':
        identity = dict(analysis='fourier', grid=args.grid, eps=args.eps)
    else:
        identity = dict(analysis='masking', patch=args.patch)
    path = osp.join(args.out_dir, f'{args.analysis}.json')
    # NOTE: one run per results file (a second one would compute the same settings again)
    with explain_registry_errors(), exclusive_lock(path):
        study = open_study(args.config, args.checkpoint, path, identity, args.num_images,
                           args.seed, args.cfg_options, work_dir=args.out_dir,
                           allow_partial_load=args.allow_partial_load)
        study.evaluate('clean', None)
        if args.analysis == 'fourier':
            study.fourier(args.grid, args.eps)
        else:
            study.masking(args.ratios, args.patch)
    results = {args.label or osp.splitext(osp.basename(args.config))[0]: study.data}
    for other in args.compare:
        with open(other) as f:
            data = json.load(f)
        if data['identity']['analysis'] != args.analysis:
            raise SystemExit(f'{other} holds a {data["identity"]["analysis"]} study, not '
                             f'{args.analysis}')
        results[osp.basename(osp.dirname(osp.abspath(other)))] = data
    plot = plot_heatmaps if args.analysis == 'fourier' else plot_masking
    figure = plot(results, osp.join(args.out_dir, f'{args.analysis}.png'), args.metric)
    print(f'results: {path}\nfigure: {figure}')
    if args.analysis == 'fourier':
        # The heatmap as a plain matrix too, for users who plot or compare it themselves.
        matrix = osp.join(args.out_dir, 'fourier_heatmap.npy')
        np.save(matrix, heatmap_matrix(study.data, args.metric))
        print(f'heatmap matrix (metric drop, row u + {args.grid // 2}, column v + '
              f'{args.grid // 2}): {matrix}')


if __name__ == '__main__':
    run_tool(main)
