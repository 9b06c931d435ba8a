"""Convert an upstream FAN checkpoint (NVlabs release) into an mmrobust backbone checkpoint.

    python tools/model_converters/fan2mmrobust.py fan_hybrid_small.pth.tar \
        checkpoints/fan_hybrid_small_det.pth --arch small --out-type det

The conversion is the backbone's own `checkpoint_filter_fn` (what `init_cfg=dict(type=
'Pretrained')` uses too), and the result is loaded strictly into the target model before it is
written, so a checkpoint of another architecture or variant fails here with the keys listed.
Layers the source lacks (the detection `learnable_downsample`, FAN-Swin's per-output norms) keep
their fresh initialisation and are reported.
"""
import argparse
import os

import torch

from mmrobust.models.backbones import FANHybrid, FANSwin, fan, fan_swin
from mmrobust.models.utils import load_state_dict_strict
from mmrobust.utils import safe_load

FAMILIES = {'hybrid': (FANHybrid, fan.checkpoint_filter_fn),
            'swin': (FANSwin, fan_swin.checkpoint_filter_fn)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='upstream checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--family', choices=sorted(FAMILIES), default='hybrid')
    parser.add_argument('--arch', default='small', help='tiny / small / base / large')
    parser.add_argument('--out-type', default=None,
                        help="hybrid: det (default) / seg / cls; swin: dense (default) / cls")
    args = parser.parse_args()
    cls, filter_fn = FAMILIES[args.family]
    out_type = args.out_type or ('det' if args.family == 'hybrid' else 'dense')
    model = cls(arch=args.arch, out_type=out_type)
    model.init_weights()
    state = filter_fn(safe_load(args.src, map_location='cpu'), model)
    # the only layers a classification checkpoint cannot provide
    allowed = {'det': ('learnable_downsample.',),
               'dense': tuple(f'norm{i}.' for i in range(4))}.get(out_type, ())
    load_state_dict_strict(model, state, allowed, source=f'checkpoint {args.src}')
    new = sorted(set(model.state_dict()) - set(state))
    tmp = f'{args.dst}.tmp{os.getpid()}'
    torch.save(dict(state_dict=model.state_dict(),
                    meta=dict(source=os.path.basename(args.src), family=args.family,
                              arch=args.arch, out_type=out_type)), tmp)
    os.replace(tmp, args.dst)
    print(f'wrote {args.dst}: {len(state)} tensors converted'
          + (f', newly initialised: {", ".join(new)}' if new else ''))


if __name__ == '__main__':
    main()
