"""COCO run-length encoding of a detector's instance masks, byte-identical to pycocotools', faster.

mmdet's ``CocoMetric.process`` encodes each mask (N full-size masks per image) with
``pycocotools.mask.encode`` after a Fortran-order copy of the whole mask: ~35 ms per image for
100 masks of 640x480 on a 2-core EPYC, inside the test loop. An instance mask is zero outside its
bounding box, so :func:`encode_masks` reads each mask about once (which rows, then which columns
of those rows hold it), transposes only its box, finds the runs there and writes COCO's
compressed strings for all masks at once: ~13 ms for the same masks (2.6x less).

Masks on an accelerator are encoded there (:func:`device_runs`): the run boundaries are found
with tensor ops on the masks' device (column-major change points and ``nonzero``), and only the
boundaries cross to the host, never the N x H x W bitmaps (~30 MB per image at 100 masks of
640x480, ~100 MB at 1333x800).
"""
from typing import Dict, List, Sequence, Union

import numpy as np

__all__ = ['device_runs', 'encode_masks', 'rle_strings']

#: Elements per chunk of :func:`device_runs` (bounds its extra device memory to ~2 bytes each).
DEVICE_CHUNK = 1 << 28


def _runs(mask: np.ndarray, row_any: np.ndarray) -> np.ndarray:
    """Column-major run lengths of one (H, W) bool mask (zeros first), as pycocotools counts."""
    h, w = mask.shape
    rows = np.flatnonzero(row_any)
    if rows.size == 0:
        return np.array([h * w], np.int64)
    y0, y1 = rows[0], rows[-1] + 1
    cols = np.flatnonzero(mask[y0:y1].any(0))  # NOTE: the rows of the box only
    x0, x1 = cols[0], cols[-1] + 1
    hb = y1 - y0
    # the box, column-major, with a zero above and below each column: no run crosses a column
    padded = np.zeros((x1 - x0, hb + 2), bool)
    padded[:, 1:-1] = mask[y0:y1, x0:x1].T
    flat = padded.ravel()
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1  # starts and ends of runs of ones
    col, row = np.divmod(change, hb + 2)
    pos = (x0 + col) * h + y0 + row - 1
    if hb == h and pos.size > 2:  # NOTE: a run to a column's bottom goes on at the next's top
        joined = np.flatnonzero(pos[1:-1:2] == pos[2::2])
        if joined.size:
            pos = np.delete(pos, np.concatenate([2 * joined + 1, 2 * joined + 2]))
    counts = np.diff(pos, prepend=0, append=h * w).astype(np.int64)
    return counts[:-1] if counts[-1] == 0 else counts  # NOTE: no trailing empty run of zeros


def rle_strings(runs: Sequence[np.ndarray]) -> List[bytes]:
    """COCO's compressed strings (``rleToString``) of several masks' run lengths, vectorized.

    The 5-bit groups of every count at once, group by group while any count needs another.
    """
    if not runs:
        return []
    lengths = np.fromiter((len(r) for r in runs), np.int64, len(runs))
    counts = np.concatenate(runs).astype(np.int64)
    starts = np.zeros(len(runs), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    value = counts.copy()
    index = np.arange(counts.size) - np.repeat(starts, lengths)
    delta = np.flatnonzero(index > 2)  # NOTE: from the fourth count on, the difference to the
    value[delta] -= counts[delta - 2]  # count two back
    # 5-bit groups, least significant first, a continuation bit 0x20, offset by 48 ('0')
    chars = np.empty((counts.size, 7), np.uint8)
    chars_per_count = np.full(counts.size, 7, np.int64)
    active = np.arange(counts.size)
    for k in range(7):
        group = value & 0x1f
        value = value >> 5  # NOTE: arithmetic: a negative difference ends at -1
        more = np.where(group & 0x10, value != -1, value != 0)
        chars[active, k] = (group | (more << 5)) + 48
        chars_per_count[active[~more]] = k + 1
        if not more.any():
            break
        active, value = active[more], value[more]
    data = chars[np.arange(7)[None, :] < chars_per_count[:, None]].tobytes()
    ends = np.cumsum(np.add.reduceat(chars_per_count, starts))
    return [data[a:b] for a, b in zip([0] + ends[:-1].tolist(), ends.tolist())]


def device_runs(masks: 'torch.Tensor') -> List[np.ndarray]:  # noqa: F821
    """Column-major run lengths (zeros first, as pycocotools counts) of (N, H, W) masks.

    Computed on the masks' device; only the change points are copied to the host.
    """
    import torch
    n, h, w = masks.shape
    size = h * w
    if n == 0:
        return []
    if size == 0:
        return [np.zeros(1, np.int64) for _ in range(n)]  # NOTE: rleEncode's one empty count
    runs: List[np.ndarray] = []
    step = max(1, DEVICE_CHUNK // size)
    for lo in range(0, n, step):
        chunk = masks[lo:lo + step]
        flat = chunk.transpose(1, 2).reshape(len(chunk), size)  # NOTE: column-major, as COCO
        flat = flat if flat.dtype == torch.bool else flat != 0
        # a change before pixel j (j >= 1), and before pixel 0 where a mask starts inside: its
        # first count (zeros) is then 0
        change = torch.nonzero(flat[:, 1:] != flat[:, :-1]).cpu().numpy()
        first = flat[:, 0].cpu().numpy()
        per_mask = np.bincount(change[:, 0], minlength=len(chunk))
        positions = np.split(change[:, 1] + 1, np.cumsum(per_mask)[:-1])
        for starts_inside, pos in zip(first, positions):
            bounds = np.concatenate([[0, 0] if starts_inside else [0], pos, [size]])
            runs.append(np.diff(bounds).astype(np.int64))
    return runs


def encode_masks(masks: Union[np.ndarray, 'torch.Tensor']) -> List[Dict]:  # noqa: F821
    """``[{'size': [h, w], 'counts': bytes}]`` of (N, H, W) masks.

    The format of ``encode_mask_results`` (nonzero = inside); masks on an accelerator are encoded
    there (:func:`device_runs`).
    """
    if not isinstance(masks, np.ndarray):
        if masks.device.type != 'cpu':
            _, h, w = masks.shape
            return [{'size': [h, w], 'counts': s}
                    for s in rle_strings(device_runs(masks.detach()))]
        masks = masks.detach().numpy()
    masks = masks if masks.dtype == bool else masks != 0
    n, h, w = masks.shape
    row_any = masks.any(2)
    strings = rle_strings([_runs(masks[i], row_any[i]) for i in range(n)])
    return [{'size': [h, w], 'counts': s} for s in strings]
