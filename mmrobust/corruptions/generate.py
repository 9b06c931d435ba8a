"""Write corrupted copies of a dataset (COCO-C, Cityscapes-C, or any folder of images).

    python tools/make_corrupted.py data/coco data/coco-c --protocol benchmark --workers 8
    python tools/make_corrupted.py data/cityscapes data/cityscapes-c --protocol cityscapes_c
    python -m mmrobust.corruptions SRC OUT --corruptions fog snow --severities 3 5

Layout: ``OUT/<corruption>/<severity>/`` mirrors ``SRC``: the image folders are corrupted file by
file (same names, same formats) and the annotation folders are linked, so every cell is a
complete dataset (point ``data_root`` at it). Each image's corruption is seeded from (``--seed``,
file name, corruption, severity), so the result does not depend on the worker count, the order
or on which subset is (re)generated. Files are written atomically (temporary file + rename) and a
rerun skips the files that exist, so an interrupted run resumes where it stopped. Unreadable or
truncated sources and images that cannot be corrupted (under 8 px) are listed with the reason in
``manifest.json`` (``failed``) and the run goes on (exit status 1); conversions on reading
(16-bit to 8-bit, palette to RGB...) are listed under ``converted``.
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

from ..utils.errors import InputNotFoundError, MMRobustError
from ..utils.io import TMP_MARK, atomic_bytes
from .core import ImageTooSmallError, corrupt, derive_seed
from .protocols import Protocol, resolve_protocol
from .stored import MANIFEST, cell_folder

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


class CorruptionWriteError(RuntimeError):
    """Writing a corrupted file failed for a reason that is not the source image's.

    A full disk, an I/O error, memory, a bug. The run stops, naming the cell and the image.
    """


class SourceImageError(MMRobustError):
    """A source image that cannot be decoded (truncated, corrupt, unsupported mode)."""


# -- layout ----------------------------------------------------------------------------------------

def detect_layout(src: Path, subdirs: Optional[Sequence[str]] = None,
                  links: Optional[Sequence[str]] = None) -> Tuple[List[str], List[str]]:
    """(image folders to corrupt, entries to link) relative to ``src``.

    COCO (``annotations/`` present): the ``val2017`` images, ``annotations`` linked.
    Cityscapes (``leftImg8bit/``): ``leftImg8bit/val``, ``gtFine`` linked.
    Anything else: every image under ``src``, nothing linked. ``subdirs``/``links`` override.
    """
    if not src.is_dir():
        raise InputNotFoundError(f'Source dataset folder {src} does not exist.')
    if (src / 'leftImg8bit').is_dir():
        auto_dirs, auto_links = ['leftImg8bit/val'], ['gtFine']
    elif (src / 'annotations').is_dir():
        auto_dirs = ['val2017'] if (src / 'val2017').is_dir() else sorted(
            p.name for p in src.iterdir() if p.is_dir() and p.name != 'annotations')
        auto_links = ['annotations']
    else:
        auto_dirs, auto_links = ['.'], []
    dirs = list(subdirs) if subdirs else auto_dirs
    link_list = list(links) if links is not None else auto_links
    for rel in dirs:
        if not (src / rel).is_dir():
            raise InputNotFoundError(f'Image folder {src / rel} does not exist; choose the folders '
                                     'to corrupt with --subdirs.')
    link_list = [rel for rel in link_list if (src / rel).exists()]
    return dirs, link_list


def list_images(src: Path, subdirs: Iterable[str]) -> List[str]:
    """Image files under the given folders, as sorted POSIX paths relative to ``src``."""
    found = set()
    for rel in subdirs:
        for path in (src / rel).rglob('*'):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() and \
                    TMP_MARK not in path.name:
                found.add(path.relative_to(src).as_posix())
    return sorted(found)


# -- one image -------------------------------------------------------------------------------------

_CONVERTED_MODES = {'P': 'palette (P) -> RGB(A)', 'PA': 'palette with alpha (PA) -> RGBA',
                    'CMYK': 'CMYK -> RGB', 'YCbCr': 'YCbCr -> RGB',
                    'LA': 'grey with alpha (LA) -> RGBA', '1': '1-bit -> 8-bit grey'}
_SIXTEEN_BIT = '-> 8 bits (the high byte, as OpenCV and mmcv.imread read it)'


def read_image(path: Path) -> Tuple[np.ndarray, Optional[str]]:
    """Decode an image fully (truncated files raise) as HxW, HxWx3 RGB or HxWx4 RGBA uint8.

    Returns:
        The array and what was converted to get it (``None`` if nothing): palette, CMYK,
        YCbCr, 1-bit and grey-alpha images become RGB(A) / grey, and 16-bit images (grey or
        colour alike) keep their high byte, which is what a model's loader sees of them.

    Raises:
        SourceImageError: undecodable, or a mode without a faithful 8-bit reading (float, 32-bit
            integer), with what to do.
    """
    try:
        with Image.open(path) as pil:
            # NOTE: Pillow reads 16-bit RGB(A) as 8-bit silently; only the raw mode tells
            rawmode = str(pil.tile[0][3]) if pil.tile else ''
            pil.load()
            mode = pil.mode
            if mode in _CONVERTED_MODES:
                target = 'L' if mode == '1' else ('RGBA' if 'A' in mode or 'transparency'
                                                  in pil.info else 'RGB')
                return np.asarray(pil.convert(target)), _CONVERTED_MODES[mode]
            if mode in ('RGB', 'RGBA'):
                return np.asarray(pil), (f'16-bit {mode} {_SIXTEEN_BIT}' if ';16' in rawmode
                                         else None)
            if mode == 'L':
                return np.asarray(pil), None
            if mode.startswith('I'):
                grey = np.asarray(pil)
                if ';16' not in rawmode and grey.size and 0 <= grey.min() and grey.max() <= 255:
                    # NOTE: an integer image within 8 bits (e.g. a 32-bit TIFF of 0..255) is
                    # 8-bit data, not the low byte of 16-bit data
                    return grey.astype(np.uint8), f'integer grey (mode {mode}) within 0..255 ' \
                        '-> 8-bit grey, values kept'
                if grey.size and (grey.min() < 0 or grey.max() > 65535):
                    raise SourceImageError(
                        f'32-bit integer image (mode {mode!r}, values {grey.min()}..{grey.max()})'
                        ': corruptions are defined on 8-bit images; rescale it to 0..255 and save '
                        'it as an 8-bit PNG')
                return (grey >> 8).astype(np.uint8), f'16-bit grey {_SIXTEEN_BIT}'
            raise SourceImageError(
                f'unsupported image mode {mode!r}: corruptions are defined on 8-bit grey, RGB or '
                'RGBA images (16-bit is read as 8-bit); for float images save '
                '(np.clip(x, 0, 1) * 255).round().astype(np.uint8) as PNG')
    except SourceImageError:
        raise
    except Exception as err:  # NOTE: PIL raises OSError, SyntaxError, ValueError... on bad files
        raise SourceImageError(f'{type(err).__name__}: {err}') from None


def encode_image(img: np.ndarray, suffix: str, jpeg_quality: int, png_compression: int,
                 lossless: bool = False) -> bytes:
    """Encode an RGB(A)/grey array in the format of ``suffix`` (PNG data if ``lossless``)."""
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_RGB2BGR if img.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    suffix = '.png' if lossless else suffix.lower()
    params: List[int] = []
    if suffix in ('.jpg', '.jpeg'):
        params = [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality]
    elif suffix == '.png':
        params = [cv2.IMWRITE_PNG_COMPRESSION, png_compression]
    ok, buf = cv2.imencode(suffix, img, params)
    if not ok:
        raise OSError(f'OpenCV cannot encode {suffix} images')
    return buf.tobytes()


def _process(job: Tuple[str, List[Tuple[str, int]]]
             ) -> Tuple[str, int, Optional[str], Optional[str]]:
    """Worker: corrupt one source image into every missing cell.

    Returns:
        (path, files written, what failed or None, the conversion on reading or None). A cell
        that fails does not stop the others; the failures are summarised per message.
    """
    rel, cells = job
    opts = _WORKER_OPTS
    try:
        img, conversion = read_image(opts['src'] / rel)
    except SourceImageError as err:
        return rel, 0, str(err), None
    image_id = Path(rel).name
    written, errors = 0, {}
    for name, severity in cells:
        try:
            out = corrupt(img, name, severity,
                          seed=derive_seed(opts['seed'], image_id, name, severity),
                          channel_order=opts['channel_order'])
        except ImageTooSmallError as err:  # NOTE: the source's problem: recorded, the run goes on
            errors.setdefault(f'{type(err).__name__}: {err}', []).append(f'{name}/{severity}')
            continue
        except Exception as err:  # NOTE: a bug or no memory: stop, never a "failed source"
            raise CorruptionWriteError(
                f'corrupting {name} {severity} of {rel} failed: {type(err).__name__}: {err}. '
                'The files written so far are complete; fix the cause and rerun to resume.') \
                from err
        try:
            data = encode_image(out, Path(rel).suffix, opts['jpeg_quality'],
                                opts['png_compression'], opts['lossless'])
            atomic_bytes(Path(cell_folder(opts['out'], name, severity)) / rel, data)
        except Exception as err:  # NOTE: a full disk, an I/O error: stop at once, say where
            raise CorruptionWriteError(
                f'writing {name} {severity} of {rel} failed: {type(err).__name__}: {err}. The '
                'files written so far are complete; fix the cause (e.g. free disk space) and '
                'rerun to resume.') from err
        written += 1
    error = None
    if errors:
        error = '; '.join(msg if len(where) == len(cells) else f'{msg} (in {", ".join(where)})'
                          for msg, where in errors.items())
    return rel, written, error, conversion


_WORKER_OPTS: Dict = {}


def _init_worker(opts: Dict) -> None:
    _WORKER_OPTS.update(opts)
    cv2.setNumThreads(1)  # NOTE: parallelism is across processes; threads would oversubscribe


# -- the run ---------------------------------------------------------------------------------------

def _link(src: Path, dst: Path, copy: bool) -> None:
    if dst.is_symlink() or dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if copy:
        tmp = dst.with_name(dst.name + TMP_MARK + str(os.getpid()))
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp)
        os.replace(tmp, dst)
    else:
        # NOTE: relative, so that the dataset and its corrupted copy can move together
        os.symlink(os.path.relpath(src.resolve(), dst.parent.resolve()), dst,
                   target_is_directory=src.is_dir())


def _remove_stale_temporaries(out: Path) -> int:
    removed = 0
    if out.is_dir():
        for path in out.rglob(f'*{TMP_MARK}*'):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed += 1
    return removed


def _versions() -> Dict[str, str]:
    import PIL

    from ..version import __version__
    return {'mmrobust': __version__, 'numpy': np.__version__, 'opencv': cv2.__version__,
            'pillow': PIL.__version__}


def _earlier_manifest(out: Path, identity: Dict) -> Dict:
    """The manifest of an earlier run into ``out`` ({} if none); refuses other settings."""
    from ..utils.io import ResultsMismatchError
    path = out / MANIFEST
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    diff = [k for k in identity if k in earlier and earlier[k] != identity[k]]
    if diff:
        details = '; '.join(f'{k}: the folder has {earlier[k]!r}, this run {identity[k]!r}'
                            for k in diff)
        raise ResultsMismatchError(
            f'{out} holds corrupted files written with other settings ({details}). Refusing to '
            'mix them in one folder: write to another OUT, or rerun with the same settings.')
    return earlier


def _pending(out: Path, images: Sequence[str], cells: Sequence[Tuple[str, int]]
             ) -> Tuple[List[Tuple[str, List[Tuple[str, int]]]], int]:
    """``(image, its cells not written yet)`` for each image with one, and the files there."""
    jobs, done = [], 0
    for rel in images:
        missing = [(n, s) for n, s in cells
                   if not (Path(cell_folder(out, n, s)) / rel).is_file()]
        done += len(cells) - len(missing)
        if missing:
            jobs.append((rel, missing))
    return jobs, done


def _run(jobs: Sequence[Tuple[str, List[Tuple[str, int]]]], opts: Dict, workers: int,
         collect: Callable[..., None]) -> None:
    """Every job, in ``workers`` processes (or this one), each result handed to ``collect``."""
    if workers > 1 and len(jobs) > 1:
        ctx = mp.get_context('forkserver' if sys.platform != 'win32' else 'spawn')
        with ctx.Pool(workers, initializer=_init_worker, initargs=(opts, )) as pool:
            for result in pool.imap_unordered(_process, jobs, chunksize=1):
                collect(*result)
    else:
        _init_worker(opts)
        for job in jobs:
            collect(*_process(job))


def generate(src: Path, out: Path, protocol: Protocol, seed: int = 0, workers: int = 1,
             subdirs: Optional[Sequence[str]] = None, links: Optional[Sequence[str]] = None,
             copy_links: bool = False, channel_order: str = 'rgb', jpeg_quality: int = 95,
             png_compression: int = 3, lossless: bool = False, progress: bool = True,
             max_images: Optional[int] = None) -> Dict:
    """Corrupt ``src`` into ``out`` for every cell of ``protocol``; returns the manifest.

    ``channel_order='bgr'`` reproduces mmdet's historical COCO-C (corruptions applied to the BGR
    array as if it were RGB). ``lossless`` stores PNG data under the original file names (so the
    annotations stay valid; OpenCV and PIL decode by content), which makes evaluating the stored
    set identical to corrupting on the fly.
    """
    src, out = Path(src), Path(out)
    dirs, link_list = detect_layout(src, subdirs, links)
    images = list_images(src, dirs)
    if max_images is not None:
        images = images[:max_images]
    if not images:
        raise InputNotFoundError(f'No images ({", ".join(IMAGE_SUFFIXES)}) found under '
                                 f'{", ".join(str(src / d) for d in dirs)}.')
    out.mkdir(parents=True, exist_ok=True)
    identity = {'seed': seed, 'channel_order': channel_order, 'jpeg_quality': jpeg_quality,
                'lossless': lossless, 'source': str(src.resolve())}
    earlier = _earlier_manifest(out, identity)
    # NOTE: the identity goes down first, so a run killed before its end still guards the folder
    atomic_bytes(out / MANIFEST, json.dumps({**earlier, **identity, 'in_progress': True},
                                            indent=2).encode())
    _remove_stale_temporaries(out)
    cells = protocol.cells()
    for name, severity in cells:
        for rel in link_list:
            _link(src / rel, Path(cell_folder(out, name, severity)) / rel, copy_links)

    jobs, done = _pending(out, images, cells)
    todo = sum(len(m) for _, m in jobs)
    opts = dict(src=src, out=out, seed=seed, channel_order=channel_order,
                jpeg_quality=jpeg_quality, png_compression=png_compression, lossless=lossless)
    failed: Dict[str, str] = {}
    # NOTE: the conversions of files an earlier run wrote stay listed
    listed = set(images)
    converted: Dict[str, str] = {k: v for k, v in earlier.get('converted', {}).items()
                                 if k in listed}
    written = 0
    start = time.time()
    from tqdm import tqdm
    bar = tqdm(total=todo, unit='img', desc=f'{protocol.name} -> {out.name}',
               disable=not progress or todo == 0, dynamic_ncols=True)
    cells_of = dict(jobs)

    def collect(rel: str, count: int, error: Optional[str], conversion: Optional[str]) -> None:
        nonlocal written
        written += count
        if conversion:
            converted[rel] = conversion
        if error:
            failed[rel] = error
            bar.write(f'failed: {rel}: {error}')
        bar.update(len(cells_of[rel]))

    _run(jobs, opts, workers, collect)
    bar.close()

    manifest = {
        **{k: v for k, v in earlier.items() if k not in ('in_progress', )},
        'protocol': protocol.name,
        'description': protocol.description,
        'cells': {n: list(s) for n, s in protocol.severities.items()},
        'seed': seed,
        'seed_scheme': 'derive_seed(seed, file name, corruption, severity) -> RandomState',
        'channel_order': channel_order,
        'source': str(src.resolve()),
        'image_dirs': dirs,
        'linked': link_list,
        'jpeg_quality': jpeg_quality,
        'png_compression': png_compression,
        'lossless': lossless,
        'versions': _versions(),
        'counts': {'images': len(images), 'cells': len(cells),
                   'files_expected': len(images) * len(cells),
                   'files_present': done + written, 'written_this_run': written,
                   'skipped_existing': done, 'failed_sources': len(failed),
                   'converted_sources': len(converted)},
        'failed': failed,
        'converted': converted,
        'seconds_this_run': round(time.time() - start, 2),
    }
    atomic_bytes(out / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """``make_corrupted.py``'s command line."""
    parser = argparse.ArgumentParser(
        prog='make_corrupted', description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('src', help='dataset root (COCO, Cityscapes) or any folder of images')
    parser.add_argument('out', help='output root; cells go to OUT/<corruption>/<severity>/')
    parser.add_argument('--protocol', default=None,
                        help='benchmark (default), cityscapes_c, fan_coco_c or all')
    parser.add_argument('--corruptions', nargs='+', default=None,
                        help='explicit corruptions or categories (restricts --protocol if given)')
    parser.add_argument('--severities', nargs='+', type=int, default=None)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--workers', type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument('--subdirs', nargs='+', default=None,
                        help='folders (relative to SRC) whose images are corrupted '
                             '(default: val2017 / leftImg8bit/val / everything)')
    parser.add_argument('--link', nargs='*', default=None,
                        help='entries linked into every cell (default: annotations / gtFine)')
    parser.add_argument('--copy-links', action='store_true',
                        help='copy the linked entries instead of symlinking them')
    parser.add_argument('--bgr-compat', action='store_true',
                        help="corrupt the BGR array as if it were RGB, like mmdet's historical "
                             'COCO-C (for comparison with published tables)')
    parser.add_argument('--jpeg-quality', type=int, default=95)
    parser.add_argument('--png-compression', type=int, default=3)
    parser.add_argument('--lossless', action='store_true',
                        help='store PNG data under the original names (exact; JPEG sources grow '
                             'several times; decoders sniff the content)')
    parser.add_argument('--max-images', type=int, default=None, help='first N images only')
    parser.add_argument('--no-progress', action='store_true')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``make_corrupted.py``: write the stored set; the exit status."""
    args = parse_args(argv)
    protocol = resolve_protocol(args.protocol, args.corruptions, args.severities)
    manifest = generate(Path(args.src), Path(args.out), protocol, seed=args.seed,
                        workers=args.workers, subdirs=args.subdirs, links=args.link,
                        copy_links=args.copy_links,
                        channel_order='bgr' if args.bgr_compat else 'rgb',
                        jpeg_quality=args.jpeg_quality, png_compression=args.png_compression,
                        lossless=args.lossless, progress=not args.no_progress,
                        max_images=args.max_images)
    counts = manifest['counts']
    print(f"{manifest['protocol']}: {counts['files_present']}/{counts['files_expected']} files "
          f"in {args.out} ({counts['written_this_run']} written now, "
          f"{counts['skipped_existing']} already there), {manifest['seconds_this_run']} s")
    if manifest['converted']:
        print(f"{counts['converted_sources']} sources converted on reading (manifest.json "
              "'converted'): " + ', '.join(f'{k} ({v})' for k, v in
                                           list(manifest['converted'].items())[:5])
              + (' ...' if counts['converted_sources'] > 5 else ''))
    if manifest['failed']:
        print(f"{counts['failed_sources']} sources FAILED (manifest.json 'failed'; the other "
              'images were written):', file=sys.stderr)
        for rel, error in manifest['failed'].items():
            print(f'  {rel}: {error}', file=sys.stderr)
    return 1 if manifest['failed'] else 0
