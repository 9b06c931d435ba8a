"""A corrupted set stored by ``tools/make_corrupted.py``: its layout and its provenance.

The set lives under one root: cell ``(corruption, severity)`` in
``<root>/<corruption>/<severity>/``, each image at the same path relative to that folder as it
has under the clean set's ``data_root``, and ``manifest.json`` at the root records how the set
was made (seed, channel order, lossless or JPEG, ...). :func:`cell_folder` and
:func:`cell_image_path` are the one place that layout is spelled, for the writer and the
readers; :func:`read_stored_set` checks a set before an evaluation reads it, and
:func:`stored_set_identity` is what a results file records (and compares) of it.
"""
import json
import os.path as osp
from typing import Any, Dict, Iterable, Optional, Tuple

from ..utils.errors import InputNotFoundError, MMRobustError

__all__ = ['MANIFEST', 'StoredSetError', 'cell_folder', 'cell_image_path', 'read_stored_set',
           'stored_content_identity', 'stored_set_identity', 'stored_settings']

MANIFEST = 'manifest.json'


class StoredSetError(MMRobustError, ValueError):
    """A stored corrupted set that cannot be evaluated as it is.

    The message says why and how to mend it.
    """


def cell_folder(root: str, corruption: str, severity: int) -> str:
    """``<root>/<corruption>/<severity>``: where a stored set keeps one cell."""
    return osp.join(str(root), corruption, str(int(severity)))


def cell_image_path(path: str, data_root: Optional[str], root: str, corruption: str,
                    severity: int) -> str:
    """The stored cell's copy of the clean image ``path`` (which lies under ``data_root``).

    Raises:
        StoredSetError: ``path`` is not under ``data_root`` (e.g. an absolute ``data_prefix``
            elsewhere), so the set's layout cannot place it.
    """
    if not data_root:
        raise StoredSetError(
            f'the test dataset has no data_root, so {path} has no place in the stored set '
            f'{root} (its cells keep each image at its path relative to the clean set\'s '
            'data_root). Set test_dataloader.dataset.data_root to the folder make_corrupted.py '
            'read.')
    rel = osp.relpath(osp.abspath(path), osp.abspath(data_root))
    if rel == '..' or rel.startswith('..' + osp.sep) or osp.isabs(rel):
        raise StoredSetError(
            f'{path} is not under the dataset\'s data_root {data_root}, so the stored set '
            f'{root} (laid out relative to data_root) has no copy of it; an absolute '
            'data_prefix outside data_root does this. Make data_prefix relative to data_root '
            '(or set data_root to the folder that holds the images), or corrupt on the fly '
            'without --corrupted-root.')
    return osp.join(cell_folder(root, corruption, severity), rel)


def read_stored_set(root: str) -> Optional[Dict[str, Any]]:
    """The manifest of the stored set at ``root``, checked.

    None when the set has none (made by another tool, e.g. a downloaded COCO-C: its provenance is
    unknown).

    Raises:
        InputNotFoundError: ``root`` is not a folder.
        StoredSetError: the manifest is unreadable, the set is half-written (``in_progress``:
            ``make_corrupted.py`` was stopped), or sources failed to corrupt.
    """
    if not osp.isdir(root):
        raise InputNotFoundError(
            f'the stored corrupted set {root} does not exist: write it with `python '
            f'tools/make_corrupted.py SRC {root} ...`, or drop --corrupted-root to corrupt on '
            'the fly.')
    path = osp.join(root, MANIFEST)
    if not osp.isfile(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except ValueError as err:
        raise StoredSetError(f'{path} is not readable JSON ({err}): rerun make_corrupted.py '
                             'into that folder to rewrite it.') from None
    if not isinstance(manifest, dict):
        raise StoredSetError(f'{path} is not a make_corrupted.py manifest (a JSON object).')
    if manifest.get('in_progress'):
        raise StoredSetError(
            f'{root} is half-written: make_corrupted.py was stopped before its end (its '
            f'manifest says in_progress). Rerun the same make_corrupted.py command into {root}: '
            'it resumes and finishes the set.')
    failed = manifest.get('failed') or {}
    if failed:
        shown = '; '.join(f'{k}: {v}' for k, v in list(failed.items())[:3])
        raise StoredSetError(
            f'{root} lacks the cells of {len(failed)} source image(s) that failed to corrupt '
            f'({shown}{"; ..." if len(failed) > 3 else ""}; manifest.json "failed"). Mend or '
            'remove those sources and rerun make_corrupted.py.')
    return manifest


def stored_set_identity(manifest: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """What a results file records, and compares, of a stored set.

    How its pixels were made (not where it lies, so a copy on another node's disk is the same set).
    """
    if manifest is None:
        return {'manifest': False}  # NOTE: the evaluation adds the content's fingerprint
    lossless = bool(manifest.get('lossless', False))
    return {'manifest': True, 'seed': manifest.get('seed'),
            'channel_order': manifest.get('channel_order'), 'lossless': lossless,
            'jpeg_quality': None if lossless else manifest.get('jpeg_quality'),
            'images': (manifest.get('counts') or {}).get('images')}


def stored_content_identity(root: str, cells: Iterable[Tuple[str, int]]) -> Dict[str, Any]:
    """A fingerprint of a stored set without a manifest: what its cells' folders hold.

    Each file's path relative to its cell folder and its size, over ``cells`` (the clean cell has
    no folder), hashed: another set (other images, other corruptions at the same paths written
    differently) under the same or another root gives another fingerprint, and a copy of the
    same set elsewhere the same one. A stat per file, no read.
    """
    import hashlib
    import os
    digest = hashlib.sha256()
    files = 0
    for corruption, severity in sorted({(c, int(s)) for c, s in cells}):
        folder = cell_folder(root, corruption, severity)
        digest.update(f'{corruption}/{severity}\n'.encode())
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in sorted(filenames):
                path = osp.join(dirpath, name)
                rel = osp.relpath(path, folder)
                digest.update(f'{rel}\t{os.stat(path).st_size}\n'.encode())
                files += 1
    return {'manifest': False, 'content_sha256': digest.hexdigest(), 'files': files}


def stored_settings(root: str, manifest: Optional[Dict[str, Any]], seed: Optional[int],
                    bgr_compat: Optional[bool]) -> Tuple[Optional[int], Optional[bool]]:
    """The seed and colour mode of a stored set's cells.

    The manifest's (``seed`` / ``bgr_compat``, when given, must agree with it); without a manifest,
    what was given.

    Raises:
        StoredSetError: the given seed or colour mode contradicts the manifest.
    """
    if manifest is None:
        return seed, bgr_compat
    made_seed = manifest.get('seed')
    made_bgr = manifest.get('channel_order') == 'bgr'
    if seed is not None and made_seed is not None and seed != made_seed:
        raise StoredSetError(
            f'--seed {seed}, but the stored set {root} was made with seed {made_seed} (its '
            f'manifest.json). Drop --seed (the set\'s seed is recorded), or write a set with '
            f'`make_corrupted.py --seed {seed}`.')
    if bgr_compat is not None and bool(bgr_compat) != made_bgr:
        raise StoredSetError(
            f'--bgr-compat is {"on" if bgr_compat else "off"}, but the stored set {root} was '
            f'corrupted in {"BGR" if made_bgr else "RGB"} order (manifest.json channel_order). '
            'Drop --bgr-compat (the set\'s order is recorded), or write a set in the order you '
            'want.')
    return made_seed, made_bgr
