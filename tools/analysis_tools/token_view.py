"""What a VQ tokenizer keeps.

Images decoded from their codes, clean and corrupted, and how many codes each corruption changes.

    python tools/analysis_tools/token_view.py configs/tokenizers/vq-small-f16_toy-coco.py \
        --data configs/toy/mask-rcnn_r18_fpn_toy-coco.py --num-images 8 --out-dir work_dirs/tokens
    python tools/analysis_tools/token_view.py f16_1024 \
        --checkpoint checkpoints/vqgan_imagenet_f16_1024.ckpt \
        --images a.jpg b.jpg --corruptions gaussian_noise fog --out-dir work_dirs/tokens

Writes one side-by-side PNG per image (top: inputs; bottom: reconstructions from codes; clean,
then each corruption at --show-severity), token_view.json (codes changed and reconstruction
PSNR per corruption and severity) and codes_changed.png.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp

from mmrobust.analysis import load_tokenizer, plot_code_changes, read_rgb, token_view
from mmrobust.corruptions import PROTOCOLS


def main() -> None:
    """Write the token views and their numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('tokenizer', help='a tokenizer config (tools/train_vq.py) or a VQGAN arch')
    parser.add_argument('--checkpoint', help="the tokenizer's weights (default: the config's "
                        'init_cfg checkpoint)')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--data', help='an mmdet/mmseg config: its images are used')
    source.add_argument('--images', nargs='+', help='image files')
    parser.add_argument('--loader', default='test_dataloader', help='dataloader of --data')
    parser.add_argument('--num-images', type=int, default=8)
    parser.add_argument('--max-size', type=int, default=512,
                        help='resize the longer side to this (0: full size)')
    parser.add_argument('--corruptions', nargs='+',
                        default=list(PROTOCOLS['benchmark'].corruptions))
    parser.add_argument('--severities', nargs='+', type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument('--show-severity', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out-dir', required=True)
    args = parser.parse_args()

    if args.show_severity not in args.severities:
        parser.error(f'--show-severity {args.show_severity} is not in --severities')
    if args.data:
        from mmrobust.datasets import dataset_image_paths
        paths = dataset_image_paths(args.data, args.loader)[:args.num_images]
    else:
        paths = args.images
    tokenizer = load_tokenizer(args.tokenizer, args.checkpoint)
    images = {p: read_rgb(p, args.max_size) for p in paths}
    result = token_view(tokenizer, images, args.out_dir, args.corruptions, args.severities,
                        args.show_severity, args.seed)
    plot = plot_code_changes(result, osp.join(args.out_dir, 'codes_changed.png'))
    print(f"{len(images)} images, reconstruction PSNR {result['recon_psnr_clean']:.2f} dB (clean); "
          f"re-encoding the reconstruction changes {100 * result['codes_changed_reencoding']:.1f}% "
          'of the codes')
    for c, per_sev in result['codes_changed'].items():
        print(f'{c:22s} codes changed: ' + ', '.join(f'{s}: {100 * v:.1f}%'
                                                     for s, v in per_sev.items()))
    print(f'figures and token_view.json in {args.out_dir} ({osp.basename(plot)})')


if __name__ == '__main__':
    run_tool(main)
