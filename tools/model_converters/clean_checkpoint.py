"""Rewrite a checkpoint you trust into plain tensors and containers.

mmrobust loads checkpoints with ``weights_only=True`` and an allow-list of types, and refuses files
holding other pickled objects. For such a file from a source you trust, this tool unpickles it
once (explicitly, with --trust-source) and writes a copy that holds only tensors, numbers,
strings and containers: numpy arrays become tensors, objects with a ``__dict__`` (e.g.
``argparse.Namespace``) become dicts, anything else is dropped and listed.

    python tools/model_converters/clean_checkpoint.py IN.pth OUT.pth --trust-source
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
from collections import OrderedDict
from typing import Any, List

import numpy as np
import torch

from mmrobust.utils import atomic_write

_PLAIN = (torch.Tensor, int, float, bool, str, bytes, type(None))


def clean(obj: Any, path: str, dropped: List[str]) -> Any:
    """A copy of ``obj`` with only weights_only-loadable content.

    The paths of what is dropped are appended to ``dropped``.
    """
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                dropped.append(f'{path}[{key!r}] (key of type {type(key).__name__})')
                continue
            out[key] = clean(value, f'{path}.{key}' if path else str(key), dropped)
        return out
    if isinstance(obj, (list, tuple)):
        items = [clean(v, f'{path}[{i}]', dropped) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if hasattr(obj, '__dict__') and not callable(obj):
        return clean(dict(vars(obj)), path, dropped)
    dropped.append(f'{path} ({type(obj).__module__}.{type(obj).__qualname__})')
    return None


def main() -> None:
    """Write the weights_only-loadable copy and say what was dropped."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='checkpoint to rewrite')
    parser.add_argument('dst', help='where to write the clean copy')
    parser.add_argument('--trust-source', action='store_true',
                        help='required: confirms that unpickling SRC cannot harm you')
    args = parser.parse_args()
    if not args.trust_source:
        parser.error('unpickling runs code stored in the file; pass --trust-source only for a '
                     'checkpoint whose origin you trust')
    # NOTE: deliberate full unpickling, gated on --trust-source above
    ckpt = torch.load(args.src, map_location='cpu', weights_only=False)
    dropped: List[str] = []
    cleaned = clean(ckpt, '', dropped)
    with atomic_write(args.dst, 'wb') as f:
        torch.save(cleaned, f)
    print(f'wrote {args.dst}')
    for item in dropped:
        print(f'dropped {item}')


if __name__ == '__main__':
    run_tool(main)
