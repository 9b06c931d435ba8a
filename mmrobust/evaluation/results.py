"""The robustness results file: its format, identity, writer and reader.

One JSON file per evaluation (``tools/test_robustness.py --results``): the identity of what was
evaluated (protocol, seed, source, config and checkpoint fingerprints, ...), the metrics of every
finished cell under ``cells`` and how each cell's time was spent under ``timing``. The evaluation
loop writes it through :class:`RobustnessResults` (atomically, after every cell); the report reads
it through :func:`load_results`, which also reads mmdet 3.3's ``*_results.pkl``.
"""
import hashlib
import io
import json
import os.path as osp
import pickle
from typing import Dict, Mapping

from ..corruptions import CORRUPTIONS
from ..utils.io import ResultsStore
from .metrics import CLEAN

__all__ = ['RESULTS_FORMAT', 'IDENTITY_KEYS', 'RobustnessResults', 'file_sha256', 'identity_sha256',
           'load_results', 'report_dir']

RESULTS_FORMAT = 'mmrobust-robustness/1'
# the keys that must match for a results file to be resumed
IDENTITY_KEYS = ('protocol', 'cells_planned', 'seed', 'bgr_compat', 'source', 'config_sha256',
                 'checkpoint_sha256')


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def identity_sha256(identity: Mapping) -> str:
    """Fingerprint of the identity keys (what must match to resume), e.g. for side files."""
    keys = {k: identity.get(k) for k in ('format', ) + IDENTITY_KEYS}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def report_dir(results_path: str) -> str:
    """Where the tables and plots of a results file go: ``<results stem>_report/`` next to it,
    so two results files in one folder keep their own."""
    stem = osp.splitext(osp.abspath(results_path))[0]
    return f'{stem}_report'


class RobustnessResults(ResultsStore):
    """The JSON results file: identity, cells and timings; atomic writes; resume checks."""

    def __init__(self, path: str, identity: Dict) -> None:
        super().__init__(path, {'format': RESULTS_FORMAT, **identity}, entries_key='cells',
                         identity_keys=('format', ) + IDENTITY_KEYS,
                         fix='delete the file to start fresh, or pass --results with another '
                         'path')
        self.data.setdefault('timing', {})

    def done(self, corruption: str, severity: int) -> bool:
        return super().done(corruption, str(severity))

    def record(self, corruption: str, severity: int, metrics: Dict, timing: Dict) -> None:
        self.data['timing'].setdefault(corruption, {})[str(severity)] = timing
        super().record(corruption, str(severity), value=metrics)


# -- reading ---------------------------------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Unpickles dicts of numbers only (mmdet's results files), never arbitrary objects."""

    ALLOWED = {('collections', 'OrderedDict'), ('numpy', 'dtype'),
               ('numpy.core.multiarray', 'scalar'), ('numpy._core.multiarray', 'scalar')}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f'{module}.{name} is not allowed in a results file (only dicts of numbers are)')
        return super().find_class(module, name)


def _from_mmdet_pkl(data: Mapping) -> Dict:
    """mmdet's ``{corruption: {severity: metrics}}`` (severity 0 = clean) as mmrobust cells."""
    cells: Dict = {}
    for corruption, by_severity in data.items():
        for severity, metrics in by_severity.items():
            scores = {k: float(v) for k, v in dict(metrics).items()
                      if isinstance(v, (int, float)) or hasattr(v, '__float__')}
            if int(severity) == 0:
                cells.setdefault(CLEAN, {0: scores})
            elif corruption in CORRUPTIONS:
                cells.setdefault(corruption, {})[int(severity)] = scores
    return {'protocol': 'mmdet-results', 'cells': cells, 'source': 'mmdet test_robustness'}


def _read_mmdet_pkl(path: str) -> Dict:
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
        if not isinstance(data, Mapping) or not all(isinstance(v, Mapping)
                                                    for v in data.values()):
            raise pickle.UnpicklingError(f'it holds a {type(data).__name__}, not '
                                         '{corruption: {severity: metrics}}')
    except pickle.UnpicklingError as err:
        stem, ext = osp.splitext(path)
        hint = (f' mmdet\'s test_robustness.py writes the predictions to --out {path} and the '
                f'metrics to {stem}_results{ext}: pass that file'
                + ('' if osp.isfile(f'{stem}_results{ext}') else ' (not found next to it)'))
        raise ValueError(f'{path} is not a robustness results file ({err}).'
                         + ('' if stem.endswith('_results') else hint)) from None
    return _from_mmdet_pkl(data)


def load_results(path: str) -> Dict:
    """A results dict from an mmrobust JSON or an mmdet ``_results.pkl``.

    Severities are integers in the returned ``cells`` (JSON stores them as strings).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a results file, or one of another format version (says which).
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'Results file {path} does not exist.')
    if path.endswith(('.pkl', '.pickle')):
        return _read_mmdet_pkl(path)
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as err:
            raise ValueError(f'{path} is not a robustness results file (not JSON: {err}).') \
                from None
    if not isinstance(data, dict) or 'cells' not in data:
        raise ValueError(f'{path} is not a robustness results file (no "cells").')
    fmt = data.get('format')
    if fmt is not None and fmt != RESULTS_FORMAT:
        raise ValueError(f'{path} is a results file of format {fmt!r}; this mmrobust reads '
                         f'{RESULTS_FORMAT!r}. Use the mmrobust version that wrote it, or rerun '
                         'the evaluation.')
    data['cells'] = {corruption: {int(s): scores for s, scores in by_severity.items()}
                     for corruption, by_severity in data['cells'].items()}
    return data
