"""Convert upstream weights into an mmrobust checkpoint, strictly, saying what was dropped.

    python tools/model_converters/convert_backbone.py tf_efficientnet_lite0.pth \
        checkpoints/efficientnet-lite0_in1k.pth --family efficientnet-lite
    python tools/model_converters/convert_backbone.py fan_hybrid_small.pth.tar \
        checkpoints/fan_hybrid_small_det.pth --family fan-hybrid --arch small --out-type det

Families (sources): fan-hybrid (NVlabs FAN fan_hybrid_*.pth.tar), fan-swin (a FAN-Swin
classification checkpoint), drvit (a timm / DeiT ViT), vqgan (a taming / latent-diffusion
.ckpt), efficientnet-lite (timm's tf_efficientnet_lite0 .pth, or the TensorFlow / TF-Keras
variables as .npz: see configs/efficientdet/README.md). The conversion is the family's own
``checkpoint_filter_fn``, the one ``init_cfg=dict(type='Pretrained')`` uses, and the result is
loaded strictly into the target model before it is written: a checkpoint of another
architecture or variant fails here with the keys listed. The output holds the converted
tensors only (layers the source lacks are initialised afresh whenever it is loaded, and are
listed); every key left out is printed with the reason.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os
from typing import List, Optional

import torch

from mmrobust.apis.convert import FAMILIES, convert_checkpoint, read_checkpoint
from mmrobust.models.checkpoint import dropped_summary
from mmrobust.utils import atomic_write


def main(argv: Optional[List[str]] = None, family: Optional[str] = None) -> int:
    """Convert a checkpoint of ``family`` and write it; the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='upstream checkpoint (.pth / .pth.tar / .ckpt / .npz)')
    parser.add_argument('dst', help='output file')
    if family is None:
        parser.add_argument('--family', required=True, choices=sorted(FAMILIES))
    parser.add_argument('--arch', default=None, help='variant (default: the family\'s usual one)')
    parser.add_argument('--out-type', default=None,
                        help='; '.join(f'{k}: {"/".join(v.out_types)}'
                                       for k, v in FAMILIES.items()) + ' (default: the first)')
    args = parser.parse_args(argv)
    family = family or args.family
    conv = convert_checkpoint(family, read_checkpoint(args.src), args.arch, args.out_type,
                              source=f'checkpoint {args.src}')
    model = conv.model
    with atomic_write(args.dst, 'wb') as f:
        torch.save(dict(state_dict=conv.state,
                        meta=dict(source=os.path.basename(args.src), family=family,
                                  arch=getattr(model, 'arch_name', args.arch),
                                  out_type=args.out_type or FAMILIES[family].out_types[0],
                                  dropped=conv.dropped)), f)
    print(f'wrote {args.dst}: {len(conv.state)} tensors converted into '
          f'{type(model).__name__}({getattr(model, "arch_name", "")}), loaded strictly')
    if conv.dropped:
        print(dropped_summary(conv.dropped, limit=1000))
    if conv.new:
        print(f'not in the source, initialised afresh on every load ({len(conv.new)}): '
              f'{", ".join(conv.new)}')
    return 0


if __name__ == '__main__':
    run_tool(main)
