"""Test (evaluate) a checkpoint of a detector or segmentor; the config's scope decides.

python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE_OR_DIR] [--show]
[--show-dir DIR] [--tta] [--cfg-options k=v ...] [--launcher ...]
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse

from mmengine.config import Config

from mmrobust.apis import (
    add_launch_args,
    apply_common_args,
    apply_test_args,
    build_runner,
    parse_launch_args,
)
from mmrobust.utils import config_scope, explain_registry_errors


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description='Test a detector or segmentor')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where the evaluation metrics are saved')
    parser.add_argument('--out', help='detection: dump raw predictions to this .pkl; '
                        'segmentation: save predicted label maps into this folder')
    parser.add_argument('--show', action='store_true', help='show predictions in a window')
    parser.add_argument('--show-dir', help='save images with drawn predictions here '
                        '(relative to the work dir for detection)')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds between --show images')
    parser.add_argument('--tta', action='store_true', help='test-time augmentation')
    add_launch_args(parser)
    return parse_launch_args(parser)


def main() -> None:
    """Test the config's model with the checkpoint."""
    args = parse_args()
    cfg = Config.fromfile(args.config)
    cfg = apply_common_args(cfg, args.config, args.launcher, args.work_dir, args.cfg_options)
    cfg = apply_test_args(cfg, args.checkpoint, out=args.out, show=args.show,
                          show_dir=args.show_dir, wait_time=args.wait_time, tta=args.tta)
    runner = build_runner(cfg, ('test_dataloader',), args.allow_partial_load)
    if args.out is not None and config_scope(cfg) == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    with explain_registry_errors():
        runner.test()


if __name__ == '__main__':
    run_tool(main)
