"""Sharding a protocol across jobs and merging their results files."""
import copy
import json

import pytest

from mmrobust.evaluation.results import (
    IDENTITY_KEYS,
    INFO_KEYS,
    LEGACY_IDENTITY_KEYS,
    RESULTS_FORMAT,
    RobustnessResults,
    identity_sha256,
    run_identity,
)
from mmrobust.evaluation.shards import ShardError, merge_results, parse_shard, shard_cells

from helpers import REPO, run_tool_here


def test_shards_are_disjoint_balanced_and_cover_the_protocol():
    from mmrobust.corruptions import get_protocol
    cells = [('clean', 0)] + get_protocol('benchmark').cells()
    for count in (1, 2, 3, 8, 76, 100):
        shards = [shard_cells(cells, i, count) for i in range(count)]
        flat = [c for shard in shards for c in shard]
        assert sorted(flat) == sorted(cells) and len(flat) == len(set(flat))
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1
        assert ('clean', 0) in shards[0]
    # each shard mixes corruptions and severities (balanced cost, not one slow corruption)
    assert len({c for c, _ in shard_cells(cells, 1, 8)}) >= 5


@pytest.mark.parametrize('text', ['3', '2/2', '-1/4', 'a/b', '1/0'])
def test_a_malformed_shard_says_what_it_takes(text):
    with pytest.raises(ShardError, match='I'):
        parse_shard(text)


PLAN = {'pgd_linf': {'epsilons': [1 / 255, 2 / 255], 'epsilon_text': ['1/255', '2/255'],
                     'settings': {'steps': 10, 'random_start': False, 'restarts': 1, 'seed': 0}}}
OTHER_PLAN = {'pgd_linf': {'epsilons': [4 / 255, 8 / 255], 'epsilon_text': ['4/255', '8/255'],
                           'settings': {'steps': 40, 'random_start': False, 'restarts': 1,
                                        'seed': 0}}}


def _writer_identity(**overrides) -> dict:
    """What the robustness writer records (run_identity), for a stored set with attacks."""
    from mmrobust.corruptions import Protocol
    from mmrobust.evaluation.cell_kinds import RunSpec
    args = dict(protocol=Protocol('custom', '', {'fog': (1, 2), 'snow': (1, )}), seed=0,
                bgr_compat=False, corrupted_root='sets/coco-c',
                stored_set={'manifest': True, 'seed': 0, 'channel_order': 'rgb',
                            'lossless': True, 'jpeg_quality': None, 'images': 24},
                attacks=PLAN, config='a.py', config_sha256='c', checkpoint='',
                scope='mmdet', shard=(0, 2),
                checkpoint_load={'matched': 3, 'missing': [], 'unexpected': [], 'errors': []})
    args.update(overrides)
    spec = RunSpec(**{k: args.pop(k) for k in ('protocol', 'seed', 'bgr_compat',
                                               'corrupted_root', 'stored_set', 'attacks')})
    return {'format': RESULTS_FORMAT, **run_identity(spec, **args)}


def _shard(index: int, cells: dict, **identity) -> dict:
    base = _writer_identity(shard=(index, 2), attacks=None, stored_set=None, corrupted_root=None)
    base.update(identity)
    return {**base, 'cells': cells,
            'timing': {c: {s: {'wall_s': 1.0} for s in sevs} for c, sevs in cells.items()}}


A = {'clean': {'0': {'mAP': 0.5}}, 'fog': {'2': {'mAP': 0.3}}}
B = {'fog': {'1': {'mAP': 0.4}}, 'snow': {'1': {'mAP': 0.2}}}


def test_merged_shards_are_one_run():
    merged = merge_results([('a.json', _shard(0, A)), ('b.json', _shard(1, B))])
    assert merged['cells'] == {'clean': {'0': {'mAP': 0.5}},
                               'fog': {'2': {'mAP': 0.3}, '1': {'mAP': 0.4}},
                               'snow': {'1': {'mAP': 0.2}}}
    assert 'shard' not in merged and 'partial' not in merged
    assert [m['shard']['index'] for m in merged['merged_from']] == [0, 1]
    assert set(merged['timing']['fog']) == {'1', '2'}


def _changed(value):
    """Another value of a recorded setting's kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + '-other'
    if isinstance(value, dict):
        return {**value, 'changed': True}
    if value is None:
        return 'other'
    raise AssertionError(f'no other value for {value!r}')


RECORDED = _writer_identity()


def test_every_recorded_setting_is_compared_or_declared_informational():
    """A key the writer records is either compared (it changes a number) or declared not to."""
    assert set(RECORDED) - {'format'} == set(IDENTITY_KEYS) | (set(INFO_KEYS) - {
        'partial_load'})  # NOTE: partial_load only after a partial load
    assert not set(IDENTITY_KEYS) & set(INFO_KEYS)


@pytest.mark.parametrize('key', [k for k in RECORDED if k in IDENTITY_KEYS and k != 'shard'])
def test_shards_of_different_evaluations_are_refused(key):
    """Every recorded setting that changes a number refuses the merge.

    Every recorded setting that changes a number (derived from what the writer records, not from
    IDENTITY_KEYS) refuses the merge and changes the fingerprint of side files.
    """
    first = {**RECORDED, 'cells': A}
    other = {**RECORDED, 'cells': B, 'shard': {'index': 1, 'count': 2},
             key: _changed(RECORDED[key])}
    with pytest.raises(ShardError, match=f'{key}: a.json has .*, b.json'):
        merge_results([('a.json', first), ('b.json', other)])
    assert identity_sha256(other) != identity_sha256(RECORDED)


@pytest.mark.parametrize('key', [k for k in RECORDED if k in INFO_KEYS and k != 'identity_keys'])
def test_informational_keys_do_not_refuse_a_merge(key):
    first = {**RECORDED, 'cells': A, 'attacks': None}
    other = {**first, 'cells': B, 'shard': {'index': 1, 'count': 2}}
    other[key] = _changed(RECORDED[key])
    assert merge_results([('a.json', first), ('b.json', other)], allow_missing=True)['cells']


def test_changed_attack_settings_are_refused_on_resume(tmp_path):
    """The issue's run: --epsilons 1/255 2/255, then 4/255 8/255 with 40 steps on one file."""
    from mmrobust.utils.io import ResultsMismatchError
    path = str(tmp_path / 'r.json')
    results = RobustnessResults(path, _writer_identity(shard=None))
    results.record('pgd_linf', 1, {'mAP': 0.3}, {})
    with pytest.raises(ResultsMismatchError, match='attacks: file has'):
        RobustnessResults(path, _writer_identity(shard=None, attacks=OTHER_PLAN))
    assert identity_sha256(_writer_identity(attacks=OTHER_PLAN)) != identity_sha256(RECORDED)
    # the same settings resume
    assert RobustnessResults(path, _writer_identity(shard=None)).done('pgd_linf', 1)


def test_a_stored_set_of_other_provenance_is_refused_on_resume(tmp_path):
    from mmrobust.utils.io import ResultsMismatchError
    path = str(tmp_path / 'r.json')
    RobustnessResults(path, _writer_identity(shard=None)).save()
    other = {**RECORDED['stored_set'], 'seed': 3}
    with pytest.raises(ResultsMismatchError, match='stored_set: file has'):
        RobustnessResults(path, _writer_identity(shard=None, stored_set=other))
    # the same set at another path (a node-local copy) is the same set
    moved = RobustnessResults(path, _writer_identity(shard=None,
                                                     corrupted_root='scratch/coco-c'))
    assert moved.data['corrupted_root'] == 'scratch/coco-c'


def test_a_results_file_of_an_earlier_mmrobust_still_resumes(tmp_path, monkeypatch):
    """A file without identity_keys.

    Its keys of the time are compared, the new ones it lacks are logged as not compared, and its
    side files keep their fingerprint.
    """
    path = tmp_path / 'old.json'
    identity = _writer_identity(shard=None, attacks=None)
    old = {k: v for k, v in identity.items()
           if k not in ('identity_keys', 'attacks', 'stored_set')}
    old['cells'] = {'clean': {'0': {'mAP': 0.5}}}
    path.write_text(json.dumps(old))
    legacy_sha = identity_sha256(old)
    logged = []
    monkeypatch.setattr('mmengine.logging.print_log', lambda msg, **kw: logged.append(msg))
    resumed = RobustnessResults(str(path), identity)
    assert resumed.done('clean', 0)
    assert len(logged) == 1 and 'did not record stored_set, attacks: not compared' in logged[0]
    assert identity_sha256(resumed.identity) == legacy_sha
    assert 'identity_keys' not in resumed.identity
    resumed.save()  # from now on the settings are recorded, and compared
    from mmrobust.utils.io import ResultsMismatchError
    with pytest.raises(ResultsMismatchError, match='stored_set'):
        RobustnessResults(str(path), {**identity, 'stored_set': {'manifest': False}})
    assert set(LEGACY_IDENTITY_KEYS) < set(IDENTITY_KEYS)


def test_shards_of_different_mmrobust_identity_keys_are_refused():
    legacy = {k: v for k, v in _shard(1, B).items() if k != 'identity_keys'}
    with pytest.raises(ShardError, match='identity_keys'):
        merge_results([('a.json', _shard(0, A)), ('b.json', legacy)])


def test_a_merge_without_its_attack_cells_is_partial():
    with_attacks = [('a.json', _shard(0, A, attacks=PLAN)), ('b.json', _shard(1, B, attacks=PLAN))]
    with pytest.raises(ShardError, match='in no shard: pgd_linf 1, pgd_linf 2'):
        merge_results(with_attacks)
    merged = merge_results(with_attacks, allow_missing=True)
    assert merged['partial'] == {'missing': ['pgd_linf 1', 'pgd_linf 2']}


def test_a_cell_with_two_different_numbers_is_refused():
    other = copy.deepcopy(B)
    other['fog']['2'] = {'mAP': 0.31}
    with pytest.raises(ShardError, match='fog 2: a.json and b.json'):
        merge_results([('a.json', _shard(0, A)), ('b.json', _shard(1, other))])
    same = copy.deepcopy(B)
    same['fog']['2'] = {'mAP': 0.3}  # evaluated twice, the same: fine
    assert merge_results([('a.json', _shard(0, A)), ('b.json', _shard(1, same))])['cells']


def test_missing_cells_are_listed_or_marked_partial():
    with pytest.raises(ShardError, match='in no shard: fog 1, snow 1'):
        merge_results([('a.json', _shard(0, A))])
    merged = merge_results([('a.json', _shard(0, A))], allow_missing=True)
    assert merged['partial'] == {'missing': ['fog 1', 'snow 1']}
    json.dumps(merged)  # a results file


@pytest.mark.slow
def test_two_shards_merged_equal_one_run(toy_data, trained_toy_detector, tmp_path):
    from test_robustness import DET_CFG, DET_EQUAL, _cells, assert_detects

    from mmrobust.evaluation import RobustnessResults
    ckpt = trained_toy_detector / 'iter_300.pth'
    cells = ['--corruptions', 'contrast', 'fog', '--severities', '1']
    whole = tmp_path / 'whole.json'
    run_tool_here('test_robustness.py', DET_CFG, ckpt, *cells, '--results', whole, '--work-dir',
                  tmp_path / 'w0', *DET_EQUAL)
    for index in (0, 1):  # the default results names, in one work dir
        proc = run_tool_here('test_robustness.py', DET_CFG, ckpt, *cells, '--shard', f'{index}/2',
                             '--work-dir', tmp_path / 'w', *DET_EQUAL)
        assert f'shard {index}/2: once every shard is done' in proc.stdout
    shards = sorted((tmp_path / 'w').glob('robustness_custom_shard*of2.json'))
    assert [p.name for p in shards] == ['robustness_custom_shard0of2.json',
                                        'robustness_custom_shard1of2.json']
    assert sorted(_cells(shards[0])) == ['clean', 'fog'] and _cells(shards[1]) == {
        'contrast': _cells(whole)['contrast']}
    assert json.loads(shards[1].read_text())['shard'] == {'index': 1, 'count': 2}

    merged = tmp_path / 'merged.json'
    proc = run_tool_here('robustness_report.py', 'merge', *shards, '--out', merged)
    assert 'merged 2 shards: 3 cells' in proc.stdout and 'P_clean' in proc.stdout
    assert _cells(merged) == _cells(whole)  # cell by cell
    assert_detects(_cells(whole))
    # it resumes like the unsharded run: same identity, every cell done
    identity = {k: v for k, v in json.loads(whole.read_text()).items()
                if k not in ('cells', 'timing', 'format', 'time')}
    resumed = RobustnessResults(str(merged), identity)
    assert all(resumed.done(c, s) for c, s in (('clean', 0), ('contrast', 1), ('fog', 1)))
    # the merge refuses a shard of another evaluation, naming the file and the key
    other = json.loads(shards[1].read_text())
    other['seed'] = 3
    (tmp_path / 'other.json').write_text(json.dumps(other))
    proc = run_tool_here('robustness_report.py', 'merge', shards[0], tmp_path / 'other.json',
                         '--out', tmp_path / 'x.json', check=False)
    assert proc.returncode == 1 and 'seed:' in proc.stderr and 'other.json 3' in proc.stderr
    assert not (tmp_path / 'x.json').exists()


@pytest.mark.slow
def test_a_killed_shard_resumes_like_an_unsharded_run(toy_data, tmp_path):
    import os
    import signal

    from test_background_metric import _start, _wait_for
    from test_robustness import NO_WORKERS, SEG_CFG, _cells, _init_checkpoint

    from mmrobust.evaluation.metric_worker import DELAY_ENV
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    cells = ['--corruptions', 'snow', 'fog', '--severities', '2']
    whole = tmp_path / 'whole.json'
    run_tool_here('test_robustness.py', SEG_CFG, ckpt, *cells, '--results', whole, '--work-dir',
                  tmp_path / 'w0', '--metric-queue', '0', *NO_WORKERS)
    shard = tmp_path / 'shard0.json'
    args = [SEG_CFG, ckpt, *cells, '--shard', '0/2', '--results', shard, '--work-dir',
            tmp_path / 'w1', *NO_WORKERS]
    proc = _start(args, {DELAY_ENV: '600'})
    saved = tmp_path / 'shard0_predictions'
    _wait_for(lambda: len(list(saved.glob('*.pkl'))) == 2, proc, 'the shard\'s 2 cells saved')
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    run_tool_here('test_robustness.py', *args)  # resumes: the metrics from the saved predictions
    data = json.loads(shard.read_text())
    assert sorted(data['cells']) == ['clean', 'fog']
    assert all(t['resumed_from_predictions'] for by in data['timing'].values()
               for t in by.values())
    assert {c: _cells(whole)[c] for c in data['cells']} == data['cells']


def test_one_layout_names_every_side_file(tmp_path):
    """The side folders and per-cell files of a results file.

    Named in one place and used by the predictions, the statistics and the report.
    """
    from mmrobust.evaluation.per_image import stats_dir, stats_path
    from mmrobust.evaluation.predictions_file import predictions_dir, predictions_path
    from mmrobust.evaluation.results import ResultsLayout, report_dir
    results = str(tmp_path / 'w' / 'robustness_benchmark.json')
    layout = ResultsLayout(results)
    stem = str(tmp_path / 'w' / 'robustness_benchmark')
    assert (layout.report, layout.predictions, layout.per_image) == (
        f'{stem}_report', f'{stem}_predictions', f'{stem}_per_image')
    assert (report_dir(results), predictions_dir(results), stats_dir(results)) == (
        layout.report, layout.predictions, layout.per_image)
    assert predictions_path(layout.predictions, 'fog', 3) == f'{stem}_predictions/fog_3.pkl'
    assert stats_path(layout.per_image, 'pgd_linf', '2') == f'{stem}_per_image/pgd_linf_2.npz'


def test_a_results_file_of_an_earlier_writer_loads_and_resumes_unchanged(toy_data, tmp_path,
                                                                         monkeypatch):
    """tests/data/legacy_results/robustness_1d1a892.json was written by the evaluation at 1d1a892.

    The toy SegFormer, initial weights, no checkpoint, gaussian_noise 1 and fog 1 on 2 images.
    Today's reader loads it, and today's evaluation resumes it without inferring anything and keeps
    its numbers.
    """
    import shutil

    from mmengine.config import Config

    from mmrobust.apis import apply_common_args, build_runner
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness, load_results
    from mmrobust.evaluation.report import summarize
    legacy = REPO / 'tests/data/legacy_results/robustness_1d1a892.json'
    path = tmp_path / 'r.json'
    shutil.copy(legacy, path)
    before = json.loads(legacy.read_text())
    loaded = load_results(str(path))  # NOTE: the reader gives severities as integers
    assert loaded['cells'] == {c: {int(k): v for k, v in by.items()}
                               for c, by in before['cells'].items()}
    assert 'identity_keys' not in loaded
    assert summarize(loaded)['metrics']['mIoU']['mPC'] == pytest.approx(
        (before['cells']['gaussian_noise']['1']['mIoU'] + before['cells']['fog']['1']['mIoU'])
        / 2)
    monkeypatch.chdir(REPO)  # NOTE: the file records the config by its path in the repository
    config = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'
    cfg = apply_common_args(Config.fromfile(config), config, 'none', str(tmp_path / 'w'), {
        'test_dataloader.num_workers': 0, 'test_dataloader.persistent_workers': False,
        'test_dataloader.dataset.indices': 2, 'randomness.seed': 0})
    runner = build_runner(cfg, ('test_dataloader',))
    runner.call_hook('before_run')

    def no_inference(*args, **kwargs):
        raise AssertionError('a recorded cell was inferred again')
    monkeypatch.setattr(runner.model, 'test_step', no_inference)
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, ['gaussian_noise', 'fog'], [1]),
                               str(path), RobustnessOptions(progress=False, metric_queue=0,
                                                            per_image=False))
    assert data['cells'] == before['cells'] and data['timing'] == before['timing']
    after = json.loads(path.read_text())
    assert after['config_sha256'] == before['config_sha256']
    # the identity the cell kinds make today is the file's own: same keys, same fingerprint
    # (its saved predictions and per-image statistics stay its own)
    assert {k: after.get(k) for k in LEGACY_IDENTITY_KEYS} == {
        k: before.get(k) for k in LEGACY_IDENTITY_KEYS}
    assert identity_sha256(after) == identity_sha256(before)
