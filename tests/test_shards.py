"""Sharding a protocol across jobs and merging their results files."""
import copy
import json

import pytest

from mmrobust.evaluation.results import (
    IDENTITY_KEYS,
    RESULTS_FORMAT,
    ShardError,
    merge_results,
    parse_shard,
    shard_cells,
)

from conftest import run_tool


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


def _shard(index: int, cells: dict, **identity) -> dict:
    base = {'format': RESULTS_FORMAT, 'protocol': 'custom',
            'cells_planned': {'fog': [1, 2], 'snow': [1]}, 'seed': 0, 'bgr_compat': False,
            'source': 'on-the-fly', 'config_sha256': 'c', 'checkpoint_sha256': 'k',
            'shard': {'index': index, 'count': 2}}
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


@pytest.mark.parametrize('key, value', [
    ('config_sha256', 'other'), ('checkpoint_sha256', 'other'), ('protocol', 'benchmark'),
    ('seed', 1), ('source', 'stored'), ('bgr_compat', True)])
def test_shards_of_different_evaluations_are_refused(key, value):
    assert key in IDENTITY_KEYS
    with pytest.raises(ShardError, match=f'{key}: a.json has .*, b.json {value!r}'):
        merge_results([('a.json', _shard(0, A)), ('b.json', _shard(1, B, **{key: value}))])


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
    from test_robustness import DET_CFG, DET_OPTIONS, _cells

    from mmrobust.evaluation import RobustnessResults
    ckpt = trained_toy_detector / 'iter_300.pth'
    cells = ['--corruptions', 'contrast', 'fog', '--severities', '5']
    whole = tmp_path / 'whole.json'
    run_tool('test_robustness.py', DET_CFG, ckpt, *cells, '--results', whole, '--work-dir',
             tmp_path / 'w0', *DET_OPTIONS)
    for index in (0, 1):  # the default results names, in one work dir
        proc = run_tool('test_robustness.py', DET_CFG, ckpt, *cells, '--shard', f'{index}/2',
                        '--work-dir', tmp_path / 'w', *DET_OPTIONS)
        assert f'shard {index}/2: once every shard is done' in proc.stdout
    shards = sorted((tmp_path / 'w').glob('robustness_custom_shard*of2.json'))
    assert [p.name for p in shards] == ['robustness_custom_shard0of2.json',
                                        'robustness_custom_shard1of2.json']
    assert sorted(_cells(shards[0])) == ['clean', 'fog'] and _cells(shards[1]) == {
        'contrast': _cells(whole)['contrast']}
    assert json.loads(shards[1].read_text())['shard'] == {'index': 1, 'count': 2}

    merged = tmp_path / 'merged.json'
    proc = run_tool('robustness_report.py', 'merge', *shards, '--out', merged)
    assert 'merged 2 shards: 3 cells' in proc.stdout and 'P_clean' in proc.stdout
    assert _cells(merged) == _cells(whole)  # cell by cell
    # it resumes like the unsharded run: same identity, every cell done
    identity = {k: v for k, v in json.loads(whole.read_text()).items()
                if k not in ('cells', 'timing', 'format', 'time')}
    resumed = RobustnessResults(str(merged), identity)
    assert all(resumed.done(c, s) for c, s in (('clean', 0), ('contrast', 5), ('fog', 5)))
    # the merge refuses a shard of another evaluation, naming the file and the key
    other = json.loads(shards[1].read_text())
    other['seed'] = 3
    (tmp_path / 'other.json').write_text(json.dumps(other))
    proc = run_tool('robustness_report.py', 'merge', shards[0], tmp_path / 'other.json',
                    '--out', tmp_path / 'x.json', check=False)
    assert proc.returncode == 1 and 'seed:' in proc.stderr and 'other.json 3' in proc.stderr
    assert not (tmp_path / 'x.json').exists()


@pytest.mark.slow
def test_a_killed_shard_resumes_like_an_unsharded_run(toy_data, tmp_path):
    import os
    import signal

    from test_background_metric import _start, _wait_for
    from test_robustness import NO_WORKERS, SEG_CFG, _cells, _init_checkpoint

    from mmrobust.evaluation.background import DELAY_ENV
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    cells = ['--corruptions', 'snow', 'fog', '--severities', '2']
    whole = tmp_path / 'whole.json'
    run_tool('test_robustness.py', SEG_CFG, ckpt, *cells, '--results', whole, '--work-dir',
             tmp_path / 'w0', '--metric-queue', '0', *NO_WORKERS)
    shard = tmp_path / 'shard0.json'
    args = [SEG_CFG, ckpt, *cells, '--shard', '0/2', '--results', shard, '--work-dir',
            tmp_path / 'w1', *NO_WORKERS]
    proc = _start(args, {DELAY_ENV: '600'})
    saved = tmp_path / 'shard0_predictions'
    _wait_for(lambda: len(list(saved.glob('*.pkl'))) == 2, proc, 'the shard\'s 2 cells saved')
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    run_tool('test_robustness.py', *args)  # resumes: the metrics from the saved predictions
    data = json.loads(shard.read_text())
    assert sorted(data['cells']) == ['clean', 'fog']
    assert all(t['resumed_from_predictions'] for by in data['timing'].values()
               for t in by.values())
    assert {c: _cells(whole)[c] for c in data['cells']} == data['cells']
