"""The per-image worst case over a run's attacks (mmrobust.evaluation.worst_case).

Each image under the attack that lowers its own mIoU most, scored as mmseg scores a cell.
"""
import numpy as np
import pytest
import torch

from mmrobust.evaluation.per_image import iou_block, load_cell_stats, save_cell_stats, stats_dir
from mmrobust.evaluation.per_image import stats_path as cell_stats_path
from mmrobust.evaluation.results import evaluation_sha256
from mmrobust.evaluation.worst_case import WORST, add_worst_case, image_miou, worst_case_block

# three images, two classes: per image the (intersect, union, pred, label) areas per class
PGD = [([8, 2], [10, 4], [9, 3], [9, 3]),     # image a: mIoU (0.8 + 0.5) / 2 = 0.65
       ([5, 0], [10, 5], [10, 0], [5, 5]),    # image b: (0.5 + 0) / 2 = 0.25
       ([0, 0], [0, 0], [0, 0], [0, 0])]      # image c: nothing counted (NaN)
SEGPGD = [([6, 1], [10, 5], [8, 3], [8, 3]),  # a: (0.6 + 0.2) / 2 = 0.4: the worst of a
          ([6, 1], [9, 6], [7, 4], [8, 3]),   # b: (2/3 + 1/6) / 2 = 0.4167
          ([0, 0], [0, 0], [0, 0], [0, 0])]


def _block(areas, images=('a.png', 'b.png', 'c.png')):
    return iou_block([[np.array(v, dtype=np.float64) for v in row] for row in areas],
                     list(images), '')


def test_each_image_takes_its_own_worst_attack():
    # the second attack lists its images in another order (gathered from other ranks)
    segpgd = _block([SEGPGD[2], SEGPGD[0], SEGPGD[1]], images=('c.png', 'a.png', 'b.png'))
    np.testing.assert_allclose(image_miou(_block(PGD)), [0.65, 0.25, np.nan])
    block = worst_case_block([_block(PGD), segpgd])
    assert list(block['images']) == ['a.png', 'b.png', 'c.png']
    np.testing.assert_array_equal(block['intersect'], [[6, 1], [5, 0], [0, 0]])
    np.testing.assert_array_equal(block['union'], [[10, 5], [10, 5], [0, 0]])
    assert block['chosen'].tolist() == [2, 1]  # c (nothing counted) goes to the first
    assert worst_case_block([_block(PGD), _block(SEGPGD, images=('a', 'b', 'x'))]) is None


def test_the_worst_cell_is_scored_as_mmseg_scores_a_cell():
    """The cell's numbers are mmseg IoUMetric's on the chosen areas (2 decimals).

    And with identical attacks (ε = 0: the clean images) they are those attacks' numbers.
    """
    from mmseg.evaluation import IoUMetric

    from mmrobust.evaluation.worst_case import _scores
    block = worst_case_block([_block(PGD), _block(SEGPGD)])
    metric = IoUMetric(iou_metrics=['mIoU', 'mDice'])
    metric.dataset_meta = dict(classes=('road', 'car'))
    rows = [tuple(torch.tensor(block[k][i]) for k in ('intersect', 'union', 'pred', 'label'))
            for i in range(3)]
    expected = metric.compute_metrics(rows)
    assert _scores(block, list(expected)) == pytest.approx(expected, abs=1e-9)
    same = worst_case_block([_block(PGD), _block(PGD)])
    pgd_rows = [tuple(torch.tensor(v, dtype=torch.float64) for v in r) for r in PGD]
    assert _scores(same, list(expected)) == pytest.approx(metric.compute_metrics(pgd_rows))


def _results(attacks, budgets=2):
    plan = {a: {'epsilons': [0.0, 8 / 255][:budgets], 'epsilon_text': ['0', '8/255'][:budgets],
                'settings': {'steps': 10, 'random_start': True, 'restarts': 1, 'seed': 0}}
            for a in attacks}
    data = {'format': 'mmrobust-robustness/1', 'protocol': 'attacks', 'attacks': plan,
            'cells_planned': {}, 'cells': {'clean': {'0': {'mIoU': 50.0}}}}
    return data


def _record(data, tmp_path, attack, k, areas):
    data['cells'].setdefault(attack, {})[str(k)] = {'aAcc': 1.0, 'mIoU': 1.0, 'mAcc': 1.0}
    path = cell_stats_path(stats_dir(str(tmp_path / 'r.json')), attack, k)
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_cell_stats(path, (attack, k), evaluation_sha256(data), [_block(areas)])


def test_worst_cells_are_added_where_every_attack_allows_and_say_why_not(tmp_path):
    results = str(tmp_path / 'r.json')
    one = _results(['pgd_linf'])
    _record(one, tmp_path, 'pgd_linf', 1, PGD)
    assert add_worst_case(results, one) == {} and WORST not in one['cells']

    data = _results(['pgd_linf', 'segpgd_linf'])
    for attack, areas in (('pgd_linf', PGD), ('segpgd_linf', SEGPGD)):
        _record(data, tmp_path, attack, 1, areas)
    data['cells']['pgd_linf']['2'] = {'mIoU': 1.0}  # recorded, but without statistics
    data['cells']['segpgd_linf']['2'] = {'mIoU': 1.0}
    skipped = add_worst_case(results, data)
    assert list(skipped) == [2] and 'per-image IoU statistics' in skipped[2]
    assert set(data['cells'][WORST]) == {'1'}
    assert set(data['cells'][WORST]['1']) == {'aAcc', 'mIoU', 'mAcc'}
    assert data['worst_case']['1'] == {'pgd_linf': 2, 'segpgd_linf': 1}
    saved = load_cell_stats(cell_stats_path(stats_dir(results), WORST, 1))
    assert saved['meta']['fingerprint'] == evaluation_sha256(data)
    np.testing.assert_array_equal(saved['blocks'][0]['intersect'], [[6, 1], [5, 0], [0, 0]])
    before = dict(data['cells'][WORST])
    assert add_worst_case(results, data) == {2: skipped[2]}  # recorded cells are kept
    assert data['cells'][WORST] == before


def test_the_report_shows_the_worst_case_next_to_the_attacks(tmp_path):
    from mmrobust.evaluation.report import summary_markdown
    data = _results(['pgd_linf', 'segpgd_linf'])
    data['cells'].update({'pgd_linf': {'1': {'mIoU': 50.0}, '2': {'mIoU': 30.0}},
                          'segpgd_linf': {'1': {'mIoU': 50.0}, '2': {'mIoU': 25.0}},
                          WORST: {'1': {'mIoU': 50.0}, '2': {'mIoU': 20.0}}})
    table = summary_markdown({'m': data}, ['mIoU'])
    assert '| m | worst | 0.031373 | 8 | 20.000 | per image, worst of pgd_linf, segpgd_linf |' \
        in table, table
