"""Attention rollout (FAN-Hybrid, Dr-ViT) and FAN's channel-attention gates, clean and corrupted.

    python tools/analysis_tools/attention_maps.py CONFIG CKPT --images a.jpg b.jpg \
        --corruptions gaussian_noise fog --severity 3 --out-dir work_dirs/attention
    python tools/analysis_tools/attention_maps.py CONFIG CKPT --num-images 4 --out-dir ...

Per image: <name>.png with the inputs (top: clean, then each corruption) above their rollout
overlays, and for FAN gates_<name>.png (mean channel gate per block and head); attention.json
holds, per image and corruption, the L1 distance of the rollout map to the clean one and the
gate statistics.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse

from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope

from mmrobust.analysis import attention_report
from mmrobust.apis import add_partial_load_arg, load_checkpoint_strict
from mmrobust.utils import config_scope


def main() -> None:
    """Parse the arguments and save the attention maps."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--images', nargs='+', help='image files (default: test images)')
    parser.add_argument('--num-images', type=int, default=4)
    parser.add_argument('--max-size', type=int, default=512)
    parser.add_argument('--corruptions', nargs='+', default=['gaussian_noise', 'defocus_blur',
                                                             'fog', 'jpeg_compression'])
    parser.add_argument('--severity', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    add_partial_load_arg(parser)
    args = parser.parse_args()

    from mmengine.registry import MODELS

    import mmrobust  # noqa: F401  (registers the backbones)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(config_scope(cfg))
    if args.images:
        paths = args.images
    else:
        from mmrobust.datasets import dataset_image_paths
        paths = dataset_image_paths(args.config, 'test_dataloader')[:args.num_images]
    model = MODELS.build(cfg.model)
    load_checkpoint_strict(model, args.checkpoint, args.allow_partial_load)
    model.eval()
    attention_report(model, paths, args.corruptions, args.severity, args.out_dir,
                     seed=args.seed, max_size=args.max_size)
    print(f'figures and attention.json in {args.out_dir}')


if __name__ == '__main__':
    run_tool(main)
