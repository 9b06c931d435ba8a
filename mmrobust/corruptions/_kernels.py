"""Compiled per-pixel kernels of the corruption engine (numba, cached on disk).

Each kernel performs exactly the floating-point operations of the reference (imagecorruptions on
NumPy / scikit-image) in the same order, so results are bit-identical; numba's default
(non-fastmath) mode neither reorders nor fuses them.
"""
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
    out = np.zeros_like(img)
    # NOTE: shift-major order keeps the inner loop contiguous; each pixel still receives its
    # terms in increasing i, so the sum is rounded exactly as the reference's.
    for i in range(weights.shape[0]):
        weight = weights[i]
        for y in range(height):
            sy = min(max(y - dys[i], 0), height - 1)
            for x in range(width):
                sx = min(max(x - dxs[i], 0), width - 1)
                for c in range(channels):
                    out[y, x, c] += weight * img[sy, sx, c]
    return out
