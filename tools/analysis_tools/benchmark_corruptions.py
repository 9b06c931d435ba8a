"""Speed of mmrobust's corruption engine against the reference (imagecorruptions), same run.

    python tools/analysis_tools/benchmark_corruptions.py                 # 640x480, 15x5 suite
    python tools/analysis_tools/benchmark_corruptions.py --image my.jpg --repeat 3
    python tools/analysis_tools/benchmark_corruptions.py --skip-reference   # engine only

Both run single-threaded (one process, OpenCV and numba pinned to one thread): dataset
generation parallelises over worker processes instead. The two engines alternate cell by cell
(who goes first alternates too), and every speed-up is the median and range over the
repetitions of ratios measured seconds apart (this machine kind is noisy). The targets of the
corruption-engine issue are checked at the end: the whole 15x5 suite >= 20x faster, glass_blur
>= 100x, zoom_blur >= 5x; a 2048x1024 image through the Cityscapes-C protocol is timed too.
The reference runs through the scikit-image shim in ``tests/helpers/reference_corruptions.py``.
"""
import os

# NOTE: pin the thread pools before numpy / OpenCV / numba start theirs
for _var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'NUMBA_NUM_THREADS'):
    os.environ.setdefault(_var, '1')

import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Dict, List  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from mmrobust.corruptions import corrupt, get_protocol  # noqa: E402
from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TARGETS = {'suite': 20.0, 'glass_blur': 100.0, 'zoom_blur': 5.0}


def load_image(path: str, width: int, height: int) -> np.ndarray:
    """An RGB photo: ``path`` or scikit-image's astronaut, resized to width x height."""
    if path:
        img = cv2.imread(path, cv2.IMREAD_COLOR)
        if img is None:
            raise SystemExit(f'Cannot read image {path}')
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    else:
        import skimage.data
        img = skimage.data.astronaut()
    return np.ascontiguousarray(cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA))


def main() -> None:
    """Time the corruption engine against the reference; print the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--image', default='', help='photo to use (default: skimage astronaut)')
    parser.add_argument('--size', type=int, nargs=2, default=(640, 480), metavar=('W', 'H'))
    parser.add_argument('--protocol', default='benchmark', help='protocol timed against the '
                        'reference (default: the 15x5 suite)')
    parser.add_argument('--repeat', type=int, default=3,
                        help='interleaved repetitions of the whole protocol (median and range)')
    parser.add_argument('--skip-reference', action='store_true', help='time the engine only')
    parser.add_argument('--skip-cityscapes', action='store_true',
                        help='skip the 2048x1024 Cityscapes-C timing')
    args = parser.parse_args()
    cv2.setNumThreads(1)

    img = load_image(args.image, *args.size)
    protocol = get_protocol(args.protocol)
    cells = protocol.cells()
    for name in protocol.corruptions:  # compile the numba kernels, fill the texture caches
        corrupt(img, name, 1, seed=0)

    reference = None
    if not args.skip_reference:
        sys.path.insert(0, str(REPO / 'tests'))
        from helpers.reference_corruptions import reference_corrupt
        reference = reference_corrupt
        reference(img, protocol.corruptions[0], 1, 0)

    # NOTE: per cell, the engine and the reference run back to back (who goes first alternates),
    # so both see the same moment of a shared machine; every repetition gives a suite ratio
    engines = ['mmrobust'] + (['reference'] if reference is not None else [])
    per_rep: Dict[str, List[Dict[str, float]]] = {e: [] for e in engines}
    print(f'{protocol.name}: {len(cells)} cells on a {args.size[0]}x{args.size[1]} image, '
          f'one thread, {args.repeat} interleaved repetitions')
    for rep in range(args.repeat):
        totals: Dict[str, Dict[str, float]] = {e: {} for e in engines}
        for i, (name, severity) in enumerate(cells):
            cases = {'mmrobust': lambda: corrupt(img, name, severity, seed=i)}
            if reference is not None:
                cases['reference'] = lambda: reference(img, name, severity, i)
            for engine, (t, ) in interleave(cases, rounds=1, warmup=0, offset=rep + i).items():
                totals[engine][name] = totals[engine].get(name, 0.0) + t
        for engine in engines:
            per_rep[engine].append(totals[engine])

    def median_of(engine: str, name: str) -> float:
        return statistics.median(r[name] for r in per_rep[engine])

    def suite(engine: str) -> List[float]:
        return [sum(r.values()) for r in per_rep[engine]]

    header = f'| {"corruption":18s} | mmrobust ms |' + (' reference ms | speed-up |'
                                                        if reference else '')
    print(header)
    print('|---|---|' + ('---|---|' if reference else ''))
    for name in protocol.corruptions:
        row = f'| {name:18s} | {median_of("mmrobust", name) * 1e3:11.1f} |'
        if reference:
            speedup = ratio_summary([r[name] for r in per_rep['reference']],
                                    [r[name] for r in per_rep['mmrobust']])
            row += (f' {median_of("reference", name) * 1e3:12.1f} | '
                    f'{fmt_range(speedup, ".1f", "x")} |')
        print(row)
    row = f'| {"total":18s} | {statistics.median(suite("mmrobust")) * 1e3:11.1f} |'
    if reference:
        total = ratio_summary(suite('reference'), suite('mmrobust'))
        row += (f' {statistics.median(suite("reference")) * 1e3:12.1f} | '
                f'{fmt_range(total, ".1f", "x")} |')
    print(row)

    if reference:
        print('\nTargets (same run; median and range over the repetitions):')
        checks = {'suite': ratio_summary(suite('reference'), suite('mmrobust'))}
        for name in ('glass_blur', 'zoom_blur'):
            if name in protocol.corruptions:
                checks[name] = ratio_summary([r[name] for r in per_rep['reference']],
                                             [r[name] for r in per_rep['mmrobust']])
        for key, ratio in checks.items():
            status = 'met' if ratio['median'] >= TARGETS[key] else 'NOT met'
            print(f'  {key:10s} {fmt_range(ratio, ".1f", "x")}  (target >= {TARGETS[key]:.0f}x)  '
                  f'{status}')

    if not args.skip_cityscapes:
        big = load_image(args.image, 2048, 1024)
        cityscapes = get_protocol('cityscapes_c')
        start = time.perf_counter()
        for i, (name, severity) in enumerate(cityscapes.cells()):
            corrupt(big, name, severity, seed=i)
        elapsed = time.perf_counter() - start
        print(f'\n2048x1024 through cityscapes_c ({len(cityscapes.cells())} cells): '
              f'{elapsed:.2f} s on one thread')


if __name__ == '__main__':
    run_tool(main)
