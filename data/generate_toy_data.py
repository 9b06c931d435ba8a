"""Write mmrobust's toy datasets (COCO-format and Cityscapes-format) under ``data/``.

    python data/generate_toy_data.py                 # both, seed 0, into data/toy_coco, data/toy_cityscapes
    python data/generate_toy_data.py --seed 3 --out /tmp/toy --only toy_coco

Deterministic: the same seed writes byte-identical files. See data/README.md.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmrobust.datasets.toy_data import TOY_DATASETS, generate_toy_dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default=osp.dirname(osp.abspath(__file__)),
                        help='parent folder of the datasets (default: this data/ folder)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--only', nargs='+', choices=sorted(TOY_DATASETS), default=sorted(TOY_DATASETS))
    parser.add_argument('--force', action='store_true', help='rewrite a complete dataset')
    args = parser.parse_args()
    for name in args.only:
        root = osp.join(args.out, name)
        counts = generate_toy_dataset(name, root, seed=args.seed, force=args.force)
        print(f'{name}: {root} {counts}')


if __name__ == '__main__':
    main()
