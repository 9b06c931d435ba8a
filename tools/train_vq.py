"""Train a VQ tokenizer (Dr-ViT's stage 1, DAT's discretizer) on a dataset's images.

    python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py [--work-dir DIR]
                             [--resume] [--cfg-options train.iters=2000 ...]

Writes DIR/tokenizer.pth (a plain state dict for VQGAN(checkpoint=...)), DIR/latest_state.pth
(for --resume), reconstruction previews in DIR/previews/, codebook usage in DIR/log.jsonl and
the final PSNR / perplexity / used codes next to two trivial baselines in DIR/eval.json.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import json
import os.path as osp

from mmengine.config import Config, DictAction

from mmrobust.apis.train_vq import train_vq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('--work-dir', default=None)
    parser.add_argument('--resume', action='store_true', help='continue from latest_state.pth')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    import mmrobust  # noqa: F401  (registers VQGAN)
    work_dir = args.work_dir or osp.join('work_dirs', osp.splitext(osp.basename(args.config))[0])
    result = train_vq(cfg, work_dir, resume=args.resume)
    print(json.dumps(result, indent=1))
    print(f'tokenizer: {osp.join(work_dir, "tokenizer.pth")}')


if __name__ == '__main__':
    main()
