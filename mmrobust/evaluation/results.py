"""The robustness results file: its format, identity, writer and reader.

One JSON file per evaluation (``tools/test_robustness.py --results``): the identity of what was
evaluated (protocol, seed, source, config and checkpoint fingerprints, ...), the metrics of every
finished cell under ``cells`` and how each cell's time was spent under ``timing``. The evaluation
loop writes it through :class:`RobustnessResults` (atomically, after every cell); the report reads
it through :func:`load_results`, which also reads mmdet 3.3's ``*_results.pkl``.
"""
import hashlib
import importlib
import io
import json
import os.path as osp
import pickle
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mmengine.logging import print_log
from typing_extensions import override

from ..corruptions import CORRUPTIONS
from ..utils.errors import InputNotFoundError, MMRobustError
from ..utils.io import ResultsStore
from .cell_kinds import CELL_KINDS, CLEAN, RunSpec, UnknownCellError, counts_in_mpc, kind_of

__all__ = ['RESULTS_FORMAT', 'IDENTITY_KEYS', 'LEGACY_IDENTITY_KEYS', 'INFO_KEYS', 'SHIFTS_KEY',
           'RobustnessResults', 'NotAResultsFileError', 'file_sha256', 'evaluation_sha256',
           'identity_keys', 'identity_sha256', 'load_results', 'ResultsLayout',
           'corruption_cells', 'planned_cells', 'report_dir', 'run_identity',
           'CUSTOM_IMPORTS_KEY', 'custom_import_names', 'import_recorded_modules']

RESULTS_FORMAT = 'mmrobust-robustness/1'
#: What must match for a results file to be resumed, or for shards to be merged: every recorded
#: setting that changes a number (``stored_set``: the provenance of a stored corrupted set, from
#: its manifest; ``attacks``: the attacks, their budgets and settings).
IDENTITY_KEYS = ('protocol', 'cells_planned', 'seed', 'bgr_compat', 'source', 'stored_set',
                 'attacks', 'config_sha256', 'checkpoint_sha256', 'shard')
#: The real-world shift cells (:mod:`~mmrobust.datasets.shift_sets`): an identity key of the
#: files that have them (so that a file without them keeps its fingerprint), compared always.
SHIFTS_KEY = 'shifts'
#: The identity keys of results files written before a file recorded its ``identity_keys``.
LEGACY_IDENTITY_KEYS = ('protocol', 'cells_planned', 'seed', 'bgr_compat', 'source',
                        'config_sha256', 'checkpoint_sha256', 'shard')
#: What the identity records for the reader that does not change a number (paths, versions,
#: what the checkpoint load found): not compared.
INFO_KEYS = ('config', 'checkpoint', 'corrupted_root', 'scope', 'mmrobust', 'checkpoint_load',
             'partial_load', 'identity_keys')


#: the config's ``custom_imports`` (what registered its cells), recorded outside the identity
CUSTOM_IMPORTS_KEY = 'custom_imports'


def custom_import_names(cfg: Mapping) -> List[str]:
    """The modules a config's ``custom_imports`` names."""
    imports = (cfg.get('custom_imports') or {}).get('imports') or []
    return [imports] if isinstance(imports, str) else list(imports)


def import_recorded_modules(data: Mapping, path: str) -> None:
    """Import the modules a results file records, so that its cells have their kinds.

    A user's attack family, cell kind or shift set is registered by the module the run's config
    named in ``custom_imports``: the readers (report, merge) import it too.

    Raises:
        UnknownCellError: a module cannot be imported and some cell has no kind without it.
    """
    failed = {}
    for module in data.get(CUSTOM_IMPORTS_KEY) or ():
        try:
            importlib.import_module(module)
        except ImportError as err:
            failed[module] = f'{type(err).__name__}: {err}'
    if not failed:
        return
    why = '; '.join(f'{m} ({e})' for m, e in failed.items())
    unknown = []
    for name in data.get('cells', {}):
        try:
            kind_of(name)
        except UnknownCellError:
            unknown.append(name)
    if unknown:
        raise UnknownCellError(
            f'{path}: cell(s) {", ".join(unknown)} are no registered kind\'s, and the modules '
            f'the run that wrote it imported (its config\'s custom_imports) cannot be imported '
            f'here: {why}. Put them on the Python path (PYTHONPATH=<your project>) and rerun.')
    print_log(f'{path}: its config imported modules that cannot be imported here ({why}); every '
              'cell has its kind without them', logger='current', level=30)


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def identity_keys(identity: Mapping) -> Tuple[str, ...]:
    """The identity keys a results file is defined by (those of its own version)."""
    keys = identity.get('identity_keys')
    return tuple(keys) if keys else LEGACY_IDENTITY_KEYS


def identity_sha256(identity: Mapping) -> str:
    """Fingerprint of the identity keys (what must match to resume), e.g. for side files.

    A results file written before ``identity_keys`` was recorded keeps its fingerprint over the
    keys of its time, so its saved predictions and per-image statistics stay its own.
    """
    keys = {k: identity.get(k) for k in ('format', ) + identity_keys(identity)}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def evaluation_sha256(identity: Mapping) -> str:
    """Fingerprint of what was evaluated.

    The same for a run and its shards' merge (the identity keys without ``shard``): names the
    results a per-image statistics file belongs to.
    """
    return identity_sha256({k: v for k, v in identity.items() if k != 'shard'})


@dataclass(frozen=True)
class ResultsLayout:
    """The files a results file owns, next to it.

    Two results files in one folder keep their own; every name of one (with or without
    ``.json``, through symlinks) has one stem, one lock (:attr:`owner`), one set of these:

    - ``<stem>_report/``: the report's tables and plots;
    - ``<stem>_predictions/``: the saved predictions of cells whose metric is not recorded yet
      (``<cell>_<index>.pkl``);
    - ``<stem>_per_image/``: each cell's per-image statistics (``<cell>_<index>.npz``).
    """
    results_path: str

    @property
    def stem(self) -> str:
        """The results file's real path (symlinks resolved) without its extension."""
        return osp.splitext(osp.realpath(self.results_path))[0]

    @property
    def owner(self) -> str:
        """What the one job writing this location locks (``<stem>.json``, whatever the name)."""
        return f'{self.stem}.json'

    @property
    def report(self) -> str:
        """The report folder."""
        return f'{self.stem}_report'

    @property
    def predictions(self) -> str:
        """The folder of the predictions files."""
        return f'{self.stem}_predictions'

    @property
    def per_image(self) -> str:
        """The folder of the per-image statistics."""
        return f'{self.stem}_per_image'

    @staticmethod
    def cell_file(folder: str, name: str, index: int, extension: str) -> str:
        """A cell's file in one of the side folders: ``<folder>/<name>_<index>.<extension>``."""
        return osp.join(folder, f'{name}_{int(index)}.{extension}')


def report_dir(results_path: str) -> str:
    """Where the tables and plots of a results file go (:class:`ResultsLayout`)."""
    return ResultsLayout(results_path).report


def run_identity(spec: RunSpec, config: Optional[str] = None,
                 config_sha256: Optional[str] = None, checkpoint: str = '',
                 scope: Optional[str] = None, shard: Optional[Tuple[int, int]] = None,
                 checkpoint_load: Optional[Mapping] = None) -> Dict[str, Any]:
    """What a robustness results file records of its evaluation.

    :data:`IDENTITY_KEYS` (compared on resume and merge) and :data:`INFO_KEYS` (for the reader).
    What it records of its cells is their kinds' (:meth:`~.cell_kinds.CellKind.identity` of
    ``spec``, in run order); a kind's field that is neither joins the identity keys (the shift
    cells', only where there are some, so that a file without them keeps its fingerprint).
    """
    from ..version import __version__
    cells: Dict[str, Any] = {}
    for kind in CELL_KINDS.values():
        cells.update(kind.identity(spec))
    identity: Dict[str, Any] = {
        **cells,
        'config': config, 'config_sha256': config_sha256,
        'checkpoint': checkpoint,
        'checkpoint_sha256': file_sha256(checkpoint) if checkpoint else None,
        'scope': scope, 'mmrobust': __version__,
        'shard': {'index': shard[0], 'count': shard[1]} if shard else None,
        'identity_keys': list(IDENTITY_KEYS) + [
            k for k in cells if k not in IDENTITY_KEYS and k not in INFO_KEYS],
    }
    if checkpoint_load is not None:
        identity['checkpoint_load'] = dict(checkpoint_load)
        if any(checkpoint_load.get(k) for k in ('missing', 'unexpected', 'errors')):
            identity['partial_load'] = {k: checkpoint_load[k] for k in (
                'missing', 'unexpected', 'errors') if checkpoint_load.get(k)}
    return identity


class RobustnessResults(ResultsStore):
    """The JSON results file: identity, cells and timings; atomic writes; resume checks.

    Resuming compares :data:`IDENTITY_KEYS`. A file written before the file recorded its
    ``identity_keys`` (an earlier mmrobust) still resumes: its keys of that time are compared,
    and of the keys added since those it records (``attacks`` where it had attacks); the log
    says which were not compared. It keeps its identity keys, hence the fingerprint of its
    saved predictions and per-image statistics.
    """

    def __init__(self, path: str, identity: Dict) -> None:
        identity = {'format': RESULTS_FORMAT, **identity}
        identity.setdefault('identity_keys', list(IDENTITY_KEYS))
        # NOTE: the shift cells' key always (a file without them differs from a run with them),
        # and any other a kind adds
        keys: Tuple[str, ...] = ('format', ) + IDENTITY_KEYS + tuple(dict.fromkeys(
            [SHIFTS_KEY] + [k for k in identity['identity_keys'] if k not in IDENTITY_KEYS]))
        old = _peek_json(path)
        if old is not None and not old.get('identity_keys'):
            added = [k for k in IDENTITY_KEYS if k not in LEGACY_IDENTITY_KEYS]
            unknown = [k for k in added if k not in old]
            keys = ('format', ) + LEGACY_IDENTITY_KEYS + tuple(k for k in added if k in old)
            identity.pop('identity_keys')  # NOTE: keeps the legacy fingerprint (side files)
            if unknown:
                from mmengine.logging import print_log
                print_log(f'{path} was written by an earlier mmrobust, which did not record '
                          f'{", ".join(unknown)}: not compared on this resume (recorded from '
                          'now on, and compared on the next). Start a new results file to have '
                          'every cell checked against them.', logger='current', level=30)
        super().__init__(path, identity, entries_key='cells', identity_keys=keys,
                         fix='delete the file to start fresh, or pass --results with another '
                         'path')
        self.data.setdefault('timing', {})
        if old is not None:
            _say_moved_paths(path, old, identity)

    @override
    def done(self, corruption: str, severity: int) -> bool:
        return super().done(corruption, str(severity))

    @override
    def record(self, corruption: str, severity: int, metrics: Dict, timing: Dict) -> None:
        self.data['timing'].setdefault(corruption, {})[str(severity)] = timing
        super().record(corruption, str(severity), value=metrics)


#: Paths an identity records for the reader (not compared): a resume that changes one says so.
RECORDED_PATHS = ('corrupted_root', 'config', 'checkpoint')


def _say_moved_paths(path: str, old: Mapping, identity: Mapping) -> None:
    """Log each recorded path a resume replaces (same evaluation, files found elsewhere)."""
    from mmengine.logging import print_log
    for key in RECORDED_PATHS:
        if key in old and old.get(key) != identity.get(key):
            print_log(f'{path} recorded {key} {old.get(key)!r}; this run reads '
                      f'{identity.get(key)!r}, which the identity check found to be the same '
                      f'(its cells are kept): the file now records the new {key}',
                      logger='current', level=30)


def _peek_json(path: str) -> Optional[Dict]:
    """An existing results file's content (None: no file, or not a JSON object)."""
    if not osp.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except ValueError:
        return None  # NOTE: ResultsStore says what is wrong with it
    return data if isinstance(data, dict) else None


def planned_cells(identity: Mapping) -> List[Tuple[str, int]]:
    """Every cell an evaluation plans, in the order it runs them.

    Each kind's (:meth:`~.cell_kinds.CellKind.planned`), in run order: the clean set, the
    protocol's (corruption, severity) cells, each attack's budgets, the real-world shifts' (set,
    level) cells.
    """
    return [cell for kind in CELL_KINDS.values() for cell in kind.planned(identity)]


def corruption_cells(results: Mapping) -> List[Tuple[str, int]]:
    """The corruption cells mPC averages over.

    The planned ones (:func:`planned_cells` without the clean set, the attacks and the shifts),
    else, for results without a plan, every recorded one.
    """
    if results.get('cells_planned'):
        return [c for c in planned_cells(results) if counts_in_mpc(c[0])]
    return [(c, int(s)) for c, sevs in results.get('cells', {}).items()
            if counts_in_mpc(c) for s in sevs]


# -- reading ---------------------------------------------------------------------------------------

class NotAResultsFileError(MMRobustError, ValueError):
    """A file that is not a robustness results file of this mmrobust's format."""


def _latin1_encode(text: str, encoding: str = 'latin1') -> bytes:
    """``_codecs.encode`` as numpy's protocol-2 pickles use it (a scalar's bytes), only that."""
    if encoding not in ('latin1', 'latin-1') or not isinstance(text, str):
        raise pickle.UnpicklingError(f'_codecs.encode({encoding!r}) is not how numpy pickles '
                                     'data')
    return text.encode('latin1')


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles dicts of numbers only (mmdet's results files, the COCO-C leaderboard's).

    Never arbitrary objects: exactly what numpy's scalars need besides containers.
    """

    ALLOWED = {('collections', 'OrderedDict'), ('numpy', 'dtype'),
               ('numpy.core.multiarray', 'scalar'), ('numpy._core.multiarray', 'scalar')}

    def find_class(self, module: str, name: str):
        if (module, name) == ('_codecs', 'encode'):
            return _latin1_encode
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f'{module}.{name} is not allowed in a results file (only dicts of numbers are)')
        return super().find_class(module, name)


#: mmdet 1.x / 2.x ``test_robustness.py`` (the COCO-C leaderboard's pickles) names COCOeval's
#: stats per task; as mmdet 3.x's CocoMetric names them, so such a file is a ``--reference``.
_LEGACY_COCO_NAMES = {'AP': 'mAP', 'AP50': 'mAP_50', 'AP75': 'mAP_75', 'APs': 'mAP_s',
                      'APm': 'mAP_m', 'APl': 'mAP_l'}


def _scores(metrics: Mapping, where: str) -> Dict[str, float]:
    """A cell's numbers: mmdet 3.x's flat ``{name: value}``.

    Also mmdet 1.x / 2.x's nested ``{task: {'AP': ...}}`` as ``coco/<task>_mAP...`` (mmdet 3.x's
    names).
    """
    scores: Dict[str, float] = {}
    for key, value in dict(metrics).items():
        if isinstance(value, Mapping):
            for name, number in value.items():
                if isinstance(number, (int, float)) or hasattr(number, '__float__'):
                    scores[f'coco/{key}_{_LEGACY_COCO_NAMES.get(name, name)}'] = float(number)
        elif isinstance(value, (int, float)) or hasattr(value, '__float__'):
            scores[str(key)] = float(value)
    if not scores:
        raise NotAResultsFileError(f'{where} holds no numbers ({dict(metrics)!r:.200}): not a '
                                   'robustness results file of mmdet\'s test_robustness.py')
    return scores


#: A VOC-style cell's metrics, as mmdet 3.x's ``VOCMetric`` names AP at IoU 0.5.
VOC_METRICS = ('pascal_voc/mAP', 'pascal_voc/AP50')


def _is_voc_cell(metrics: Any) -> bool:
    """mmdet 1.x's VOC-style cell (the COCO-C leaderboard's Pascal VOC pickles).

    ``eval_map``'s per-class list, ``[{'ap': ...}, ...]``.
    """
    return isinstance(metrics, (list, tuple)) and bool(metrics) and all(
        isinstance(c, Mapping) and 'ap' in c for c in metrics)


def _voc_scores(aps: Sequence[float]) -> Dict[str, float]:
    """A VOC-style cell's AP50: the mean of its classes' APs (as ``robustness_eval.py``)."""
    mean = float(np.mean(np.asarray(aps, dtype=np.float32)))
    return {name: mean for name in VOC_METRICS}


def _voc_note(per_class: Mapping[Tuple[str, int], Sequence[float]],
              averaged: Sequence[str]) -> str:
    """Which rPC is printed, and mmdet's own (the mean of the per-class ratios)."""
    clean = next((aps for (c, s), aps in per_class.items() if s == 0), None)
    cells = [aps for (c, s), aps in per_class.items() if s > 0 and c in averaged]
    mmdet = ''
    if clean is not None and cells:  # NOTE: robustness_eval.py's float32 arithmetic
        p = np.asarray(clean, dtype=np.float32)
        mpc = np.mean(np.asarray(cells, dtype=np.float32), axis=0)
        with np.errstate(divide='ignore', invalid='ignore'):
            mmdet = f' = {float(np.mean(mpc / p)) * 100:.1f} %'
    return ('VOC-style cells (mmdet 1.x, per-class AP): AP50 is the mean of the classes\' AP; '
            'rPC here is mPC / P_clean (a ratio of means), mmdet\'s robustness_eval.py prints '
            f'the mean of the per-class ratios{mmdet}')


def _from_mmdet_pkl(data: Mapping, path: str = 'the file',
                    aggregate: str = 'benchmark') -> Dict:
    """mmdet's ``{corruption: {severity: metrics}}`` (severity 0 = clean) as mmrobust cells.

    mPC averages ``aggregate``'s corruptions: ``benchmark`` (default), the 15 of ImageNet-C as
    mmdet's ``robustness_eval.py`` and the COCO-C paper do, or ``all`` present; the results
    record which under ``aggregate``.
    """
    from ..corruptions import BENCHMARK_CORRUPTIONS
    if aggregate not in ('benchmark', 'all'):
        raise ValueError(f"aggregate is 'benchmark' or 'all', got {aggregate!r}")
    cells: Dict = {}
    per_class: Dict = {}  # NOTE: VOC-style cells: (corruption, severity) -> the classes' APs
    for corruption, by_severity in data.items():
        for severity, metrics in by_severity.items():
            if _is_voc_cell(metrics):
                per_class[corruption, int(severity)] = [float(c['ap']) for c in metrics]
                scores = _voc_scores(per_class[corruption, int(severity)])
            elif not isinstance(metrics, Mapping):
                raise NotAResultsFileError(
                    f'{path}: {corruption} {severity} holds a {type(metrics).__name__}, not a '
                    'dict of metrics (mmdet 3.x, COCO-style) nor a list of per-class dicts with '
                    "'ap' (mmdet 1.x, VOC-style): not a robustness results file")
            else:
                scores = _scores(metrics, f'{path}: {corruption} {severity}')
            if int(severity) == 0:
                cells.setdefault(CLEAN, {0: scores})
            elif corruption in CORRUPTIONS:
                cells.setdefault(corruption, {})[int(severity)] = scores
    present = [c for c in cells if counts_in_mpc(c)]
    averaged = [c for c in present if c in BENCHMARK_CORRUPTIONS] \
        if aggregate == 'benchmark' else present
    if not averaged:  # NOTE: only held-out corruptions: those are what there is
        averaged = present
    left = [c for c in present if c not in averaged]
    note = (f'mPC over {len(averaged)} corruption(s) '
            + ('of the 15 benchmark ones (ImageNet-C, COCO-C)' if aggregate == 'benchmark'
               else 'present')
            + (f'; not averaged: {", ".join(left)}' if left else ''))
    if per_class:
        note += '; ' + _voc_note(per_class, averaged)
    return {'protocol': 'mmdet-results', 'cells': cells, 'source': 'mmdet test_robustness',
            'cells_planned': {c: sorted(cells[c]) for c in averaged}, 'aggregate': note}


def _read_mmdet_pkl(path: str, aggregate: str = 'benchmark') -> Dict:
    with open(path, 'rb') as f:
        raw = f.read()
    stem, ext = osp.splitext(path)
    # NOTE: said only of what holds arrays or a list, as mmdet's predictions file (--out) does
    hint = ('' if stem.endswith('_results') else
            f' mmdet\'s test_robustness.py writes the predictions to --out {path} and the '
            f'metrics to {stem}_results{ext}: pass that file'
            + ('' if osp.isfile(f'{stem}_results{ext}') else ' (not found next to it)'))
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as err:
        arrays = '_reconstruct' in str(err) or 'ndarray' in str(err)
        raise NotAResultsFileError(f'{path} is not a robustness results file ({err}).'
                                   + (hint if arrays else '')) from None
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for v in data.values()):
        raise NotAResultsFileError(
            f'{path} is not a robustness results file (it holds a {type(data).__name__}, not '
            '{corruption: {severity: metrics}}).' + ('' if isinstance(data, Mapping) else hint))
    return _from_mmdet_pkl(data, path, aggregate)


def load_results(path: str, aggregate: str = 'benchmark') -> Dict:
    """A results dict from an mmrobust JSON or an mmdet ``_results.pkl``.

    mmdet 3.x's, or mmdet 1.x / 2.x's as the COCO-C leaderboard publishes them, whose mPC averages
    ``aggregate``'s corruptions: see :func:`_from_mmdet_pkl`.

    Severities are integers in the returned ``cells`` (JSON stores them as strings).

    Raises:
        InputNotFoundError: no such file.
        NotAResultsFileError: not a results file, or one of another format version (says
            which).
    """
    if not osp.isfile(path):
        raise InputNotFoundError(f'Results file {path} does not exist.')
    if path.endswith(('.pkl', '.pickle')):
        return _read_mmdet_pkl(path, aggregate)
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as err:
            raise NotAResultsFileError(f'{path} is not a robustness results file (not JSON: '
                                       f'{err}).') from None
    if not isinstance(data, dict) or 'cells' not in data:
        raise NotAResultsFileError(f'{path} is not a robustness results file (no "cells").')
    fmt = data.get('format')
    if fmt is not None and fmt != RESULTS_FORMAT:
        raise NotAResultsFileError(
            f'{path} is a results file of format {fmt!r}; this mmrobust reads '
            f'{RESULTS_FORMAT!r}. Use the mmrobust version that wrote it, or rerun the '
            'evaluation.')
    import_recorded_modules(data, path)
    data['cells'] = {corruption: {int(s): scores for s, scores in by_severity.items()}
                     for corruption, by_severity in data['cells'].items()}
    return data
