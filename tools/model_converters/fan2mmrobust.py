"""Convert an upstream FAN checkpoint (NVlabs release) into an mmrobust backbone checkpoint.

    python tools/model_converters/fan2mmrobust.py fan_hybrid_small.pth.tar \
        checkpoints/fan_hybrid_small_det.pth --arch small --out-type det

The conversion is the backbone's own `checkpoint_filter_fn` (what `init_cfg=dict(type=
'Pretrained')` uses too), and the result is loaded strictly into the target model before it is
written, so a checkpoint of another architecture or variant fails here with the keys listed.
Layers the source lacks (the detection `learnable_downsample`, FAN-Swin's per-output norms) keep
their fresh initialisation and are reported.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os

import torch

from mmrobust.models.backbones import FANHybrid, FANSwin
from mmrobust.models.utils import load_state_dict_strict
from mmrobust.utils import atomic_write, safe_load

FAMILIES = {'hybrid': FANHybrid, 'swin': FANSwin}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='upstream checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--family', choices=sorted(FAMILIES), default='hybrid')
    parser.add_argument('--arch', default='small', help='tiny / small / base / large')
    parser.add_argument('--out-type', default=None,
                        help="hybrid: det (default) / seg / cls; swin: dense (default) / cls")
    args = parser.parse_args()
    out_type = args.out_type or ('det' if args.family == 'hybrid' else 'dense')
    model = FAMILIES[args.family](arch=args.arch, out_type=out_type)
    model.init_weights()
    state = model.convert_checkpoint(safe_load(args.src, map_location='cpu'))
    # NOTE: the model names the only layers a classification checkpoint cannot provide
    load_state_dict_strict(model, state, model.newly_added(), source=f'checkpoint {args.src}')
    new = sorted(set(model.state_dict()) - set(state))
    with atomic_write(args.dst, 'wb') as f:
        torch.save(dict(state_dict=model.state_dict(),
                        meta=dict(source=os.path.basename(args.src), family=args.family,
                                  arch=args.arch, out_type=out_type)), f)
    print(f'wrote {args.dst}: {len(state)} tensors converted'
          + (f', newly initialised: {", ".join(new)}' if new else ''))


if __name__ == '__main__':
    main()
