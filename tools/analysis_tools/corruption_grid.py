"""One image under corruptions, as a labelled grid: what a protocol does before you run it.

    python tools/analysis_tools/corruption_grid.py IMAGE --out grid.jpg    # benchmark, sev. 3
    python tools/analysis_tools/corruption_grid.py IMAGE --out grid.png --corruptions fog snow \
        --severities 1 3 5 --columns 4 --width 240

The first tile is the clean image, then one tile per corruption and severity, each seeded as
tools/make_corrupted.py and the Corrupt transform seed it (the same --seed and file name give
the same pixels), scaled to --width pixels and labelled. The grid is written atomically.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp
from typing import List, Sequence, Tuple

import cv2
import numpy as np

from mmrobust.corruptions import corrupt, derive_seed, resolve_protocol
from mmrobust.corruptions.generate import read_image
from mmrobust.utils.errors import InputNotFoundError, UsageError
from mmrobust.utils.io import atomic_image


def tiles(img: np.ndarray, name: str, cells: Sequence[Tuple[str, int]], seed: int
          ) -> List[Tuple[str, np.ndarray]]:
    """(label, RGB image) for the clean image and each (corruption, severity) cell."""
    return [('clean', img)] + [
        (f'{c} {s}', corrupt(img, c, s, seed=derive_seed(seed, name, c, s))) for c, s in cells]


def montage(labelled: Sequence[Tuple[str, np.ndarray]], columns: int, width: int) -> np.ndarray:
    """The tiles, scaled to ``width`` pixels, row-major in ``columns`` columns.

    Each with its label on a strip above it (RGB, white background).
    """
    h, w = labelled[0][1].shape[:2]
    th = max(1, round(h * width / w))
    strip = max(14, width // 12)
    rows = -(-len(labelled) // columns)
    grid = np.full((rows * (th + strip), columns * width, 3), 255, np.uint8)
    corners = [(r * (th + strip), c * width)
               for r, c in (divmod(i, columns) for i in range(len(labelled)))]
    for (label, _), (y, x) in zip(labelled, corners):
        cv2.putText(grid, label, (x + 3, y + strip - 4), cv2.FONT_HERSHEY_SIMPLEX,
                    strip / 30, (0, 0, 0), 1, cv2.LINE_AA)
    # NOTE: the tiles after every label: a label's anti-aliased edge never marks a tile
    for (_, img), (y, x) in zip(labelled, corners):
        grid[y + strip:y + strip + th, x:x + width] = cv2.resize(
            img[..., :3] if img.ndim == 3 else np.stack([img] * 3, -1), (width, th),
            interpolation=cv2.INTER_AREA)
    return grid


def main() -> int:
    """Write the corruption grid; the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help='the image file')
    parser.add_argument('--out', required=True, help='the grid image (.jpg, .png, ...)')
    parser.add_argument('--protocol', default=None,
                        help='a named protocol (default: benchmark, the 15 COCO-C corruptions)')
    parser.add_argument('--corruptions', nargs='+', default=None,
                        help='corruption or category names (restrict --protocol)')
    parser.add_argument('--severities', nargs='+', type=int, default=[3],
                        help='severities 1-5 (default: 3)')
    parser.add_argument('--columns', type=int, default=4, help='tiles per row (default: 4)')
    parser.add_argument('--width', type=int, default=200, help='tile width in px (default: 200)')
    parser.add_argument('--seed', type=int, default=0,
                        help="make_corrupted.py's --seed (default: 0)")
    args = parser.parse_args()
    if args.columns < 1 or args.width < 16:
        raise UsageError(f'--columns must be >= 1 and --width >= 16, got {args.columns} and '
                         f'{args.width}')
    if not osp.isfile(args.image):
        raise InputNotFoundError(f'image {args.image} does not exist')
    protocol = resolve_protocol(args.protocol, args.corruptions, args.severities)
    img, _ = read_image(Path(args.image))
    cells = [(c, s) for c, sevs in protocol.severities.items() for s in sevs]
    grid = montage(tiles(img, osp.basename(args.image), cells, args.seed), args.columns,
                   args.width)
    atomic_image(args.out, cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    print(f'{args.out}: the clean image and {len(cells)} corrupted ({protocol.description})')
    return 0


if __name__ == '__main__':
    run_tool(main)
