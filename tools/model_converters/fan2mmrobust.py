"""Convert an upstream FAN checkpoint (NVlabs release) into an mmrobust backbone checkpoint.

    python tools/model_converters/fan2mmrobust.py fan_hybrid_small.pth.tar \
        checkpoints/fan_hybrid_small_det.pth --arch small --out-type det

The same as ``convert_backbone.py --family fan-hybrid`` (the default here; ``--family swin`` for
FAN-Swin): the backbone's own ``checkpoint_filter_fn``, a strict load into the target model (a
checkpoint of another architecture or variant fails with the keys listed), and a list of what
was dropped and why and of the layers the source lacks (the detection ``learnable_downsample``,
FAN-Swin's per-output norms), which keep their fresh initialisation.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert_backbone import main  # noqa: E402

from mmrobust.utils.errors import run_tool  # noqa: E402

if __name__ == '__main__':
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--family', choices=('hybrid', 'swin'), default='hybrid')
    known, rest = parser.parse_known_args()
    run_tool(lambda: main(rest, family=f'fan-{known.family}'))
