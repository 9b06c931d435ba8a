"""Test (evaluate) a checkpoint of a detector or segmentor; the config's scope decides.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE_OR_DIR] [--show]
                         [--show-dir DIR] [--tta] [--cfg-options k=v ...] [--launcher ...]
"""
import argparse
import os

from mmengine.config import Config, DictAction

from mmrobust.apis import apply_common_args, apply_test_args, build_runner
from mmrobust.utils import config_scope, explain_registry_errors


def parse_args() -> argparse.Namespace:
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
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main() -> None:
    args = parse_args()
    cfg = Config.fromfile(args.config)
    cfg = apply_common_args(cfg, args.config, args.launcher, args.work_dir, args.cfg_options)
    cfg = apply_test_args(cfg, args.checkpoint, args.out, args.show, args.show_dir,
                          args.wait_time, args.tta)
    runner = build_runner(cfg, ('test_dataloader',))
    if args.out is not None and config_scope(cfg) == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    with explain_registry_errors():
        runner.test()


if __name__ == '__main__':
    main()
