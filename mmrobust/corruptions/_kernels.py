"""Compiled per-pixel kernels of the corruption engine (numba, cached on disk).

Each kernel performs exactly the floating-point operations of the reference (imagecorruptions on
NumPy / scikit-image) in the same order, so results are bit-identical; numba's default
(non-fastmath) mode neither reorders nor fuses them.
"""
import math
from typing import Tuple

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def glass_shuffle(img: np.ndarray, offsets: np.ndarray, max_delta: int, iterations: int) -> None:
    """The reference's local pixel shuffle of glass blur, in place on a uint8 HxWxC image.

    NOTE: the reference writes ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` on NumPy views, which
    copies ``x[h', w']`` into ``x[h, w]`` and leaves ``x[h', w']`` unchanged (not a swap). The
    scan order (rows and columns descending) makes each copy depend on the earlier ones, so this
    stays a sequential loop; ``offsets`` holds the (dx, dy) pairs in the order they were drawn.
    """
    height, width, channels = img.shape
    k = 0
    for _ in range(iterations):
        for h in range(height - max_delta, max_delta, -1):
            for w in range(width - max_delta, max_delta, -1):
                src_h = h + offsets[k, 1]
                src_w = w + offsets[k, 0]
                k += 1
                for c in range(channels):
                    img[h, w, c] = img[src_h, src_w, c]


@_jit
def hsv_adjust(img: np.ndarray, v_shift: float, s_scale: float, s_shift: float) -> np.ndarray:
    """RGB→HSV, ``v += v_shift`` / ``s = s * s_scale + s_shift`` (clipped to [0, 1]), HSV→RGB.

    Reproduces ``skimage.color.rgb2hsv`` / ``hsv2rgb`` on a float64 HxWx3 image in [0, 1],
    including its tie rules (blue beats green beats red as the hue reference) and its zeroing of
    undefined hue and saturation, at a fraction of their cost (no temporaries, one pass).
    """
    height, width, _ = img.shape
    out = np.empty_like(img)
    for i in range(height):
        for j in range(width):
            r = img[i, j, 0]
            g = img[i, j, 1]
            b = img[i, j, 2]
            v = max(r, g, b)
            delta = v - min(r, g, b)
            if delta == 0.0:
                h = 0.0
                s = 0.0
            else:
                s = delta / v
                h = 0.0
                if r == v:
                    h = (g - b) / delta
                if g == v:
                    h = 2.0 + (b - r) / delta
                if b == v:
                    h = 4.0 + (r - g) / delta
                h = (h / 6.0) % 1.0
            s = min(max(s * s_scale + s_shift, 0.0), 1.0)
            v = min(max(v + v_shift, 0.0), 1.0)
            hi = np.floor(h * 6)
            f = h * 6 - hi
            p = v * (1 - s)
            q = v * (1 - f * s)
            t = v * (1 - (1 - f) * s)
            sector = int(hi) % 6
            if sector == 0:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = v, t, p
            elif sector == 1:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = q, v, p
            elif sector == 2:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = p, v, t
            elif sector == 3:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = p, q, v
            elif sector == 4:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = t, p, v
            else:
                out[i, j, 0], out[i, j, 1], out[i, j, 2] = v, p, q
    return out


@_jit
def motion_blur(img: np.ndarray, weights: np.ndarray, dys: np.ndarray, dxs: np.ndarray
                ) -> np.ndarray:
    """Weighted sum of edge-clamped shifted copies of a float64 HxWxC image.

    Accumulates ``weights[i] * img[clamp(y - dys[i]), clamp(x - dxs[i])]`` for i = 0, 1, ... in
    that order starting from 0.0, exactly as the reference's loop over ``np.roll`` copies does,
    but in one pass without materialising the shifted images.
    """
    height, width, channels = img.shape
    out = np.zeros((height, width * channels), dtype=np.float64)
    src = img.reshape(height, width * channels)
    # NOTE: shift-major order with the interior split from the clamped borders keeps the inner
    # loop contiguous (vectorised); each pixel still receives its terms in increasing i, so the
    # sum is rounded exactly as the reference's.
    for i in range(weights.shape[0]):
        weight = weights[i]
        dx = dxs[i]
        lo = min(max(dx, 0), width)  # x < lo reads column 0
        hi = max(min(width + dx, width), lo)  # x >= hi reads column width - 1
        for y in range(height):
            sy = min(max(y - dys[i], 0), height - 1)
            row_out = out[y]
            row_in = src[sy]
            for x in range(lo):
                for c in range(channels):
                    row_out[x * channels + c] += weight * row_in[c]
            # NOTE: zero-based loops over views: no negative-index handling, so LLVM vectorises
            seg_out = row_out[lo * channels:hi * channels]
            seg_in = row_in[(lo - dx) * channels:(hi - dx) * channels]
            for k in range(seg_out.shape[0]):
                seg_out[k] += weight * seg_in[k]
            last = (width - 1) * channels
            for x in range(hi, width):
                for c in range(channels):
                    row_out[x * channels + c] += weight * row_in[last + c]
    return out.reshape(height, width, channels)


# -- NumPy's legacy RandomState streams (MT19937) -------------------------------------------------
# For the distributions whose C loops dominate the noise corruptions. Each draws exactly the
# numbers RandomState.poisson / .normal would draw from the same state and leaves the state where
# RandomState would; `legacy.py` wraps them.

_MT_N = 624
_MT_M = 397


@_jit
def _mt_block(key: np.ndarray, buf: np.ndarray, twist: bool) -> None:
    """Advance the MT19937 key by one block (if ``twist``) and temper it into ``buf[1:]``."""
    if twist:
        upper = np.uint32(0x80000000)
        lower = np.uint32(0x7fffffff)
        matrix = np.uint32(0x9908b0df)
        one = np.uint32(1)
        for i in range(_MT_N):
            y = (key[i] & upper) | (key[(i + 1) if i + 1 < _MT_N else 0] & lower)
            j = i + _MT_M
            if j >= _MT_N:
                j -= _MT_N
            value = key[j] ^ (y >> one)
            if y & one:
                value ^= matrix
            key[i] = value
    for i in range(_MT_N):
        y = key[i]
        y ^= y >> np.uint32(11)
        y ^= (y << np.uint32(7)) & np.uint32(0x9d2c5680)
        y ^= (y << np.uint32(15)) & np.uint32(0xefc60000)
        y ^= y >> np.uint32(18)
        buf[i + 1] = y


@_jit
def _mt_start(key: np.ndarray, pos: int) -> Tuple[np.ndarray, int]:
    """A stream buffer for the state (key, pos) and its read index.

    ``buf[1 + i]`` holds the tempered output i of the current block; ``buf[0]`` carries the
    last output of the previous block when a double straddles two blocks.
    """
    buf = np.empty(_MT_N + 1, dtype=np.uint32)
    _mt_block(key, buf, False)
    return buf, pos + 1


@_jit
def _mt_advance(key: np.ndarray, buf: np.ndarray, index: int) -> int:
    """Called when fewer than two outputs are left: start the next block (keeping a leftover)."""
    carry = buf[_MT_N]
    _mt_block(key, buf, True)
    if index == _MT_N:
        buf[0] = carry
        return 0
    return 1


# NOTE: each draw site below is written out (4 lines) rather than calling a helper: numba
# reference-counts array arguments on every call, which made a helper per draw 5x slower than
# NumPy's C. A draw is RandomState's 53-bit double from two outputs:
#     if index >= _MT_N: index = _mt_advance(key, buf, index)
#     u = ((buf[index] >> 5) * 67108864.0 + (buf[index + 1] >> 6)) / 9007199254740992.0
#     index += 2
# and the stream's position at the end is index - 1.


@_jit
def _loggam(x: float) -> float:
    """log Γ(x) as NumPy's random_loggam computes it (series + recurrence)."""
    coeffs = (8.333333333333333e-02, -2.777777777777778e-03, 7.936507936507937e-04,
              -5.952380952380952e-04, 8.417508417508418e-04, -1.917526917526918e-03,
              6.410256410256410e-03, -2.955065359477124e-02, 1.796443723688307e-01,
              -1.39243221690590e+00)
    if x == 1.0 or x == 2.0:
        return 0.0
    x0 = x
    n = 0
    if x <= 7.0:
        n = int(7 - x)
        x0 = x + n
    x2 = 1.0 / (x0 * x0)
    gl0 = coeffs[9]
    for k in range(8, -1, -1):
        gl0 *= x2
        gl0 += coeffs[k]
    gl = gl0 / x0 + 0.5 * math.log(2 * np.pi) + (x0 - 0.5) * math.log(x0) - x0
    if x <= 7.0:
        for _ in range(n):
            gl -= math.log(x0 - 1.0)
            x0 -= 1.0
    return gl


# NOTE: the draws below are written out in each loop instead of calling a helper: numba
# reference-counts array arguments on every call, which made a helper-based stream 5x slower
# than NumPy's C. Each block is the MT19937 53-bit double of RandomState (two 32-bit outputs).
@_jit
def legacy_poisson(key: np.ndarray, pos: np.ndarray, index: np.ndarray, table: np.ndarray
                   ) -> np.ndarray:
    """``RandomState.poisson(table[index])`` for flat integer ``index`` (state advanced in place).

    lam >= 10: transformed rejection (Hörmann 1993); 0 < lam < 10: multiplication method.
    The per-lam constants are computed once per table entry (an image has 256 values of lam),
    with the same operations as NumPy computes them per draw.
    """
    n_values = table.shape[0]
    consts = np.zeros((n_values, 6), dtype=np.float64)
    for j in range(n_values):
        lam_j = table[j]
        if lam_j >= 10:
            consts[j, 0] = math.log(lam_j)
            b = 0.931 + 2.53 * math.sqrt(lam_j)
            consts[j, 1] = b
            consts[j, 2] = -0.059 + 0.02483 * b
            consts[j, 3] = 1.1239 + 1.1328 / (b - 3.4)
            consts[j, 4] = 0.9277 - 3.6224 / (b - 2)
        elif lam_j > 0:
            consts[j, 5] = math.exp(-lam_j)
    buf, p = _mt_start(key, pos[0])
    out = np.empty(index.shape[0], dtype=np.int64)
    for i in range(index.shape[0]):
        j = index[i]
        lam_i = table[j]
        if lam_i >= 10:
            loglam = consts[j, 0]
            b = consts[j, 1]
            a = consts[j, 2]
            invalpha = consts[j, 3]
            vr = consts[j, 4]
            while True:
                if p >= _MT_N:
                    p = _mt_advance(key, buf, p)
                u = (np.int64(buf[p] >> np.uint32(5)) * 67108864.0 +
                     np.int64(buf[p + 1] >> np.uint32(6))) / 9007199254740992.0
                p += 2
                u -= 0.5
                if p >= _MT_N:
                    p = _mt_advance(key, buf, p)
                v = (np.int64(buf[p] >> np.uint32(5)) * 67108864.0 +
                     np.int64(buf[p + 1] >> np.uint32(6))) / 9007199254740992.0
                p += 2
                us = 0.5 - abs(u)
                k = math.floor((2 * a / us + b) * u + lam_i + 0.43)
                if us >= 0.07 and v <= vr:
                    break
                if k < 0 or (us < 0.013 and v > us):
                    continue
                if (math.log(v) + math.log(invalpha) - math.log(a / (us * us) + b)) <= \
                        (-lam_i + k * loglam - _loggam(k + 1)):
                    break
            out[i] = k
        elif lam_i == 0:
            out[i] = 0
        else:
            enlam = consts[j, 5]
            k = 0
            prod = 1.0
            while True:
                if p >= _MT_N:
                    p = _mt_advance(key, buf, p)
                u = (np.int64(buf[p] >> np.uint32(5)) * 67108864.0 +
                     np.int64(buf[p + 1] >> np.uint32(6))) / 9007199254740992.0
                p += 2
                prod *= u
                if prod > enlam:
                    k += 1
                else:
                    break
            out[i] = k
    pos[0] = p - 1
    return out


@_jit
def legacy_normal(key: np.ndarray, pos: np.ndarray, gauss: np.ndarray, count: int, loc: float,
                  scale: float) -> np.ndarray:
    """``RandomState.normal(loc, scale, count)``: the polar method with its cached second value.

    ``gauss`` = [has_gauss, cached value], updated in place like RandomState's state.
    """
    buf, p = _mt_start(key, pos[0])
    has_gauss = gauss[0] != 0.0
    cached = gauss[1]
    out = np.empty(count, dtype=np.float64)
    for i in range(count):
        if has_gauss:
            value = cached
            has_gauss = False
            cached = 0.0
        else:
            while True:
                if p >= _MT_N:
                    p = _mt_advance(key, buf, p)
                x1 = (np.int64(buf[p] >> np.uint32(5)) * 67108864.0 +
                      np.int64(buf[p + 1] >> np.uint32(6))) / 9007199254740992.0
                p += 2
                x1 = 2.0 * x1 - 1.0
                if p >= _MT_N:
                    p = _mt_advance(key, buf, p)
                x2 = (np.int64(buf[p] >> np.uint32(5)) * 67108864.0 +
                      np.int64(buf[p + 1] >> np.uint32(6))) / 9007199254740992.0
                p += 2
                x2 = 2.0 * x2 - 1.0
                r2 = x1 * x1 + x2 * x2
                if r2 < 1.0 and r2 != 0.0:
                    break
            f = math.sqrt(-2.0 * math.log(r2) / r2)
            has_gauss = True
            cached = f * x1
            value = f * x2
        out[i] = loc + scale * value
    pos[0] = p - 1
    gauss[0] = 1.0 if has_gauss else 0.0
    gauss[1] = cached
    return out


@_jit
def plasma_fractal(uniforms: np.ndarray, mapsize: int, wibble_decay: float) -> np.ndarray:
    """Diamond-square height map in [0, 1] from pre-drawn standard uniforms.

    ``uniforms`` are the doubles the reference's successive ``uniform(-w, w, (n, n))`` calls
    consume (squares, then the two diamond sets, per level); each becomes ``-w + 2w * u`` as
    NumPy computes it. Neighbours wrap around, as the reference's ``np.roll``.
    """
    heights = np.empty((mapsize, mapsize), dtype=np.float64)
    heights[0, 0] = 0
    step = mapsize
    wibble = 100.0
    k = 0
    while step >= 2:
        half = step // 2
        n = mapsize // step
        low = -wibble
        span = wibble - low
        # squares: centre = mean of the 4 corners + noise
        for i in range(n):
            top = heights[i * step]
            bottom = heights[(i + 1 if i + 1 < n else 0) * step]
            centre = heights[half + i * step]
            for j in range(n):
                a = j * step
                b = (j + 1 if j + 1 < n else 0) * step
                total = (top[a] + bottom[a]) + (top[b] + bottom[b])
                centre[half + a] = total / 4 + wibble * (low + span * uniforms[k])
                k += 1
        # diamonds on the horizontal edges, then on the vertical edges
        for i in range(n):
            corner = heights[i * step]
            below = heights[half + i * step]
            above = heights[half + (i - 1 if i > 0 else n - 1) * step]
            for j in range(n):
                a = j * step
                b = (j + 1 if j + 1 < n else 0) * step
                total = (below[half + a] + above[half + a]) + (corner[a] + corner[b])
                corner[half + a] = total / 4 + wibble * (low + span * uniforms[k])
                k += 1
        for i in range(n):
            centre = heights[half + i * step]
            top = heights[i * step]
            bottom = heights[(i + 1 if i + 1 < n else 0) * step]
            for j in range(n):
                a = j * step
                left = (j - 1 if j > 0 else n - 1) * step
                total = (centre[half + a] + centre[half + left]) + (top[a] + bottom[a])
                centre[a] = total / 4 + wibble * (low + span * uniforms[k])
                k += 1
        step //= 2
        wibble /= wibble_decay
    heights -= heights.min()
    return heights / heights.max()


@_jit
def clip_scale_to_uint8(values: np.ndarray, low, high, scale) -> np.ndarray:
    """``np.uint8(np.clip(values, low, high) * scale)`` in one pass (flat, contiguous input).

    ``low``, ``high`` and ``scale`` must have the dtype of ``values`` so that the multiply is
    rounded in that precision, as NumPy's is (a float32 image times 255 stays float32).
    """
    out = np.empty(values.shape[0], dtype=np.uint8)
    for i in range(values.shape[0]):
        v = values[i]
        if v < low:
            v = low
        elif v > high:
            v = high
        out[i] = np.uint8(v * scale)
    return out


@_jit
def contrast(x: np.ndarray, means: np.ndarray, factor: float) -> np.ndarray:
    """``uint8(clip((x - means) * factor + means, 0, 1) * 255)`` for an (N, C) float64 image."""
    out = np.empty(x.shape, dtype=np.uint8)
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = (x[i, c] - means[c]) * factor + means[c]
            out[i, c] = np.uint8(min(max(v, 0.0), 1.0) * 255)
    return out


@_jit
def fog(img: np.ndarray, plasma: np.ndarray, strength: float, max_val: float) -> np.ndarray:
    """The fog composite: ``uint8(clip((img/255 + strength*plasma) * max / (max + strength)))``."""
    height, width, channels = img.shape
    out = np.empty_like(img)
    denominator = max_val + strength
    for y in range(height):
        for x in range(width):
            haze = strength * plasma[y, x]
            for c in range(channels):
                v = ((img[y, x, c] / 255. + haze) * max_val) / denominator
                out[y, x, c] = np.uint8(min(max(v, 0.0), 1.0) * 255)
    return out


@_jit
def threshold_clip(values: np.ndarray, threshold: float) -> None:
    """In place: values below ``threshold`` become 0, then clip to [0, 1] (2-D float64)."""
    for y in range(values.shape[0]):
        for x in range(values.shape[1]):
            v = values[y, x]
            if v < threshold:
                v = 0.0
            values[y, x] = min(max(v, 0.0), 1.0)


@_jit
def snow_composite(img: np.ndarray, grey: np.ndarray, flakes: np.ndarray, blend: float
                   ) -> np.ndarray:
    """The snow corruption's composite, with the reference's float32/float64 mix.

    ``img`` is the float32 image in [0, 1] and ``grey`` its float32 luma; the frame is whitened
    in float32 (``blend * x + (1 - blend) * max(x, 1.5 grey + 0.5)``), then the 8-bit-quantised
    flake layer (cropped to the image) and its 180° rotation are added in float64.
    """
    height, width, channels = img.shape
    out = np.empty((height, width, channels), dtype=np.uint8)
    keep = np.float32(blend)
    whiten = np.float32(1 - blend)
    for y in range(height):
        for x in range(width):
            flake = np.uint8(np.rint(flakes[y, x] * 255)) / 255.
            flake_rot = np.uint8(np.rint(flakes[height - 1 - y, width - 1 - x] * 255)) / 255.
            bright = grey[y, x] * np.float32(1.5) + np.float32(0.5)
            for c in range(channels):
                v = img[y, x, c]
                frame = keep * v + whiten * max(v, bright)
                total = (np.float64(frame) + flake) + flake_rot
                out[y, x, c] = np.uint8(min(max(total, 0.0), 1.0) * 255)
    return out
