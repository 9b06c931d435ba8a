r"""How much of a robustness evaluation goes to loading + corrupting the images.

    python tools/analysis_tools/benchmark_robustness_loading.py \\
        configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py CKPT --size 512 \\
        --corruptions glass_blur zoom_blur fog --severity 5

For each cell it reports (1) the cost of the test pipeline alone, loading + Corrupt + the
config's transforms, in the main process without a model, and (2) the evaluation of the same
cell as tools/test_robustness.py runs it (workers from the config), with the time the test loop
waited for data. Both are given as a share of the evaluation's wall time.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import tempfile
import time

from mmengine.config import Config, DictAction

from mmrobust.apis import (
    add_partial_load_arg,
    apply_common_args,
    apply_test_args,
    build_runner,
)
from mmrobust.corruptions import resolve_protocol
from mmrobust.evaluation import RobustnessOptions, cell_dataloader, evaluate_robustness


def main() -> None:
    """Time loading on the fly against a stored set; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--corruptions', nargs='+', default=['glass_blur', 'zoom_blur', 'fog'])
    parser.add_argument('--severity', type=int, default=5)
    parser.add_argument('--size', type=int, default=None,
                        help='test scale (sets the first Resize of the test pipeline)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    add_partial_load_arg(parser)
    args = parser.parse_args()

    cfg = Config.fromfile(args.config)
    if args.size:
        for step in cfg.test_dataloader.dataset.pipeline:
            if step['type'].split('.')[-1] == 'Resize':
                step['scale'] = (args.size, args.size)
                break
    work_dir = tempfile.mkdtemp(prefix='robust-loading-')
    cfg = apply_common_args(cfg, args.config, 'none', work_dir, args.cfg_options)
    cfg = apply_test_args(cfg, args.checkpoint)
    runner = build_runner(cfg, ('test_dataloader',), args.allow_partial_load)
    runner.call_hook('before_run')
    runner.load_or_resume()
    protocol = resolve_protocol(None, args.corruptions, [args.severity])

    print('| cell | pipeline alone s | evaluation s | pipeline share | loop waited for data |')
    print('|---|---|---|---|---|')
    for corruption, severity in protocol.cells():
        loader_cfg = cell_dataloader(cfg, corruption, severity, 0, False, None)
        loader_cfg.update(num_workers=0, persistent_workers=False)
        loader = runner.build_dataloader(loader_cfg)
        start = time.perf_counter()
        for _ in loader:
            pass
        pipeline_s = time.perf_counter() - start

        single = resolve_protocol(None, [corruption], [severity])
        results = evaluate_robustness(runner, cfg, single, f'{work_dir}/{corruption}.json',
                                      RobustnessOptions(progress=False))
        timing = results['timing'][corruption][str(severity)]
        wall = timing['wall_s']
        print(f"| {corruption} {severity} | {pipeline_s:.2f} | {wall:.2f} | "
              f"{100 * pipeline_s / wall:.1f}% | {100 * timing['data_wait_s'] / wall:.1f}% |")


if __name__ == '__main__':
    run_tool(main)
