"""Train a detector (mmdet config) or segmentor (mmseg config); the config's scope decides.

python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--auto-scale-lr]
[--cfg-options k=v ...] [--launcher none|pytorch|slurm|mpi]
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os

from mmengine.config import Config

from mmrobust.apis import (
    add_launch_args,
    apply_common_args,
    apply_train_args,
    build_runner,
    parse_launch_args,
)
from mmrobust.utils import explain_registry_errors


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description='Train a detector or segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='where logs and checkpoints go '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (fp16 on GPU, bf16 on CPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the LR by the actual total batch size over the config's "
                        'auto_scale_lr.base_batch_size')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or without a path from the latest '
                        'checkpoint in the work dir')
    add_launch_args(parser)
    return parse_launch_args(parser)


def main() -> None:
    """Train the config's model."""
    args = parse_args()
    cfg = Config.fromfile(args.config)
    cfg = apply_common_args(cfg, args.config, args.launcher, args.work_dir, args.cfg_options)
    cfg = apply_train_args(cfg, args.resume, args.amp, args.auto_scale_lr)
    loaders = ('train_dataloader', ) + (('val_dataloader', ) if cfg.get('val_cfg') else ())
    runner = build_runner(cfg, loaders, args.allow_partial_load)
    with explain_registry_errors():
        runner.train()
    runner.logger.info(f'checkpoints and logs are in {os.path.abspath(cfg.work_dir)}')


if __name__ == '__main__':
    run_tool(main)
