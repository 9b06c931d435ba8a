"""Real-world shift cells (mmrobust/datasets/shift_sets.py).

The sets' published layouts (toy versions from the project's generator), the checks before
inference, and shift cells beside corruption cells in one results file and one report, not in mPC,
scored as tools/test.py scores the config pointed at that set.
"""
import csv
import json
import re

import pytest

from helpers import DEMO_DET_CFG, REPO, assert_user_error, run_tool_here, run_tool_in_process

SEG_CFG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'
TOY_ROOTS = {'acdc': 'toy_acdc', 'foggy_cityscapes': 'toy_foggy_cityscapes',
             'dark_zurich': 'toy_dark_zurich', 'coco_o': 'toy_coco_o'}
# each toy set's images per level, as data/generate_toy_data.py writes them
TOY_SIZES = {**{f'acdc_{c}': 2 for c in ('fog', 'night', 'rain', 'snow')},
             'foggy_cityscapes': 4, 'dark_zurich': 3,
             **{f'coco_o_{d}': 4 for d in ('sketch', 'weather', 'cartoon', 'painting',
                                           'tattoo', 'handmake')}}


def _roots(toy_data):
    return {family: str(toy_data[name]) for family, name in TOY_ROOTS.items()}


def _root_args(toy_data):
    return ['--shift-root', *[f'{k}={v}' for k, v in _roots(toy_data).items()]]


def test_shift_names_bundles_aliases_and_levels():
    from mmrobust.datasets.shift_sets import UnknownShiftError, parse_shifts, shift_label
    assert parse_shifts(['cityscapes_real_world']) == [
        ('acdc_fog', 1), ('acdc_night', 1), ('acdc_rain', 1), ('acdc_snow', 1),
        ('foggy_cityscapes', 1), ('foggy_cityscapes', 2), ('foggy_cityscapes', 3),
        ('dark_zurich', 1)]
    assert len(parse_shifts(['coco_o'])) == 6
    assert parse_shifts(['foggy_0.02', 'foggy_cityscapes:3', 'acdc_fog']) == [
        ('foggy_cityscapes', 3), ('acdc_fog', 1)]
    assert shift_label('foggy_cityscapes', 3) == 'Foggy Cityscapes beta 0.02, val'
    with pytest.raises(UnknownShiftError, match='choose sets'):
        parse_shifts(['acdc'])
    with pytest.raises(UnknownShiftError, match=r'levels \[1, 2, 3\], not'):
        parse_shifts(['foggy_cityscapes:4'])


def test_toy_sets_are_laid_out_as_published_and_build_with_the_configs_dataset(toy_data):
    """Each toy set passes the layout check and builds with the config's class.

    Each toy set passes the layout check and the config's own dataset class reads the number of
    images it holds, with a label for each (segmentation) or its annotation file (COCO-O).
    """
    from mmengine.config import Config
    from mmengine.registry import DATASETS, init_default_scope

    from mmrobust.datasets.shift_sets import (
        SHIFT_SETS,
        check_shift_root,
        shift_ann_file,
        shift_dataset,
    )
    roots = _roots(toy_data)
    seg = Config.fromfile(str(REPO / SEG_CFG)).test_dataloader.dataset
    det = Config.fromfile(str(REPO / 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py')
                          ).test_dataloader.dataset
    for name, shift in SHIFT_SETS.items():
        for level in shift.levels:
            check_shift_root(name, level, roots)
            is_det = shift.family == 'coco_o'
            init_default_scope('mmdet' if is_det else 'mmseg')
            dataset = DATASETS.build(dict(shift_dataset(det if is_det else seg, name, level,
                                                        roots), pipeline=[]))
            assert len(dataset) == TOY_SIZES[name], (name, level)
            info = dataset.get_data_info(0)
            if is_det:
                assert info['instances'] and shift_ann_file(name, level, roots).endswith(
                    f'{name[len("coco_o_"):]}/annotations/instances_val2017.json')
            else:
                assert info['seg_map_path'].endswith('labelTrainIds.png')
                with open(info['seg_map_path'], 'rb'):
                    pass


def test_a_missing_or_mislaid_set_says_the_layout_and_where_to_get_it(toy_data, tmp_path):
    from mmrobust.datasets.shift_sets import ShiftDatasetError, check_shift_root
    from mmrobust.utils.errors import UsageError
    with pytest.raises(ShiftDatasetError, match=r'does not exist\. Expected under .*rgb_anon/'
                       r'\{fog,night,rain,snow\}/val.* Get it from https://acdc.vision.ee.ethz'
                       r'.ch.*--shift-root acdc=PATH'):
        check_shift_root('acdc_fog', 1, {'acdc': str(tmp_path / 'nowhere')})
    (tmp_path / 'acdc' / 'rgb_anon' / 'fog' / 'val' / 'GOPR0475').mkdir(parents=True)
    (tmp_path / 'acdc' / 'rgb_anon' / 'fog' / 'val' / 'GOPR0475' / 'x_rgb_anon.png').write_bytes(
        b'')
    with pytest.raises(ShiftDatasetError, match=r'has no label .*gt/fog/val/GOPR0475/'
                       r'x_gt_labelTrainIds\.png'):
        check_shift_root('acdc_fog', 1, {'acdc': str(tmp_path / 'acdc')})
    with pytest.raises(ShiftDatasetError, match=r'no \*_rgb_anon\.png image under'):
        check_shift_root('acdc_night', 1, {'acdc': str(tmp_path / 'acdc')})
    with pytest.raises(UsageError, match='a detection set .* the config is a segmentation one'):
        check_shift_root('coco_o_sketch', 1, _roots(toy_data), task='segmentation')
    # the tool stops before building anything, saying the same
    status, _, err = run_tool_in_process(
        'test_robustness.py', SEG_CFG, tmp_path / 'none.pth', '--shifts', 'dark_zurich',
        '--shift-root', f'dark_zurich={tmp_path / "dz"}', '--work-dir', tmp_path / 'w')
    assert_user_error(status, err, 1, 'dark_zurich 1', 'rgb_anon/val/night',
                      'Dark_Zurich_val_anon.zip')


def test_shift_cells_beside_corruption_cells_one_file_one_report(toy_data, tmp_path):
    """A Cityscapes-C run with real-world cells.

    One results file whose mPC is the corruption cells' alone, resumed without inference; its report
    has the shift table, CSV and plot; a shift cell's mIoU equals tools/test.py's on the config
    pointed at that set.
    """
    from test_robustness import _init_checkpoint
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    results = tmp_path / 'r.json'
    args = [SEG_CFG, ckpt, '--corruptions', 'gaussian_noise', '--severities', '2',
            '--shifts', 'acdc_fog', 'foggy_0.02', *_root_args(toy_data), '--results', results,
            '--work-dir', tmp_path / 'w', '--metric-queue', '0', '--cfg-options',
            'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']
    status, out, err = run_tool_in_process('test_robustness.py', *args)
    assert status == 0, err[-3000:]
    data = json.loads(results.read_text())
    assert set(data['cells']) == {'clean', 'gaussian_noise', 'acdc_fog', 'foggy_cityscapes'}
    assert set(data['cells']['foggy_cityscapes']) == {'3'}
    assert data['shifts']['foggy_cityscapes']['levels'] == {
        '3': 'Foggy Cityscapes beta 0.02, val'}
    assert 'shifts' in data['identity_keys']
    # mPC is the corruption cell's alone
    assert f"| {data['cells']['gaussian_noise']['2']['mIoU']:.3f} |" in out.split(
        'mIoU, mean over severities')[0]
    assert 'Real-world shift' in out and '| acdc_fog 1 | ACDC fog, val | mIoU |' in out
    report = results.parent / 'r_report'
    with open(report / 'shifts.csv') as f:
        rows = list(csv.DictReader(f))
    assert {(r['shift'], r['level']) for r in rows} == {('acdc_fog', '1'),
                                                        ('foggy_cityscapes', '3')}
    assert (report / 'shifts_mIoU.png').is_file()
    # resumed: every cell recorded, nothing inferred again (nor built: the table from the file)
    status, again, err = run_tool_in_process('test_robustness.py', *args)
    assert status == 0 and 'r_report (unchanged)' in again
    assert 'Real-world shift' in again and '| acdc_fog 1 | ACDC fog, val | mIoU |' in again
    assert json.loads(results.read_text())['cells'] == data['cells']
    # the report tool: the shift cells with intervals over their own images
    proc = run_tool_here('robustness_report.py', results, '--out-dir', tmp_path / 'rep',
                         '--bootstrap', '50')
    assert re.search(r'\| acdc_fog 1 \| ACDC fog, val \| mIoU \| [0-9.]+ \[[0-9.]+, [0-9.]+\]',
                     proc.stdout), proc.stdout
    # tools/test.py on the config pointed at ACDC fog by hand gives the same mIoU
    status, out, err = run_tool_in_process(
        'test.py', SEG_CFG, ckpt, '--work-dir', tmp_path / 'plain', '--cfg-options',
        f'test_dataloader.dataset.data_root={toy_data["toy_acdc"]}',
        'test_dataloader.dataset.data_prefix.img_path=rgb_anon/fog/val',
        'test_dataloader.dataset.data_prefix.seg_map_path=gt/fog/val',
        'test_dataloader.dataset.img_suffix=_rgb_anon.png',
        'test_dataloader.dataset.seg_map_suffix=_gt_labelTrainIds.png',
        'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False')
    assert status == 0, err[-3000:]
    plain = float(re.findall(r'mIoU: ([0-9.]+)', out + err)[-1])
    assert plain == pytest.approx(data['cells']['acdc_fog']['1']['mIoU'], abs=1e-9)


@pytest.mark.slow
def test_detector_with_coco_o_cells(toy_data, trained_toy_detector, tmp_path):
    """The trained toy detector on a COCO-C cell and COCO-O's six domains.

    One results file, the COCO metric of each domain scored against that domain's annotation file,
    one report with both tables and the shift plot.
    """
    ckpt = trained_toy_detector / 'iter_300.pth'
    results = tmp_path / 'det.json'
    proc = run_tool_here('test_robustness.py', DEMO_DET_CFG, ckpt, '--corruptions',
                         'gaussian_noise', '--severities', '1', '--shifts', 'coco_o',
                         *_root_args(toy_data), '--results', results, '--work-dir', tmp_path / 'w',
                         '--cfg-options', 'test_dataloader.num_workers=1',
                         'test_dataloader.persistent_workers=False',
                         'test_dataloader.dataset.indices=6')
    data = json.loads(results.read_text())
    domains = [f'coco_o_{d}' for d in ('sketch', 'weather', 'cartoon', 'painting', 'tattoo',
                                       'handmake')]
    assert set(data['cells']) == {'clean', 'gaussian_noise', *domains}
    assert all(0 <= data['cells'][d]['1']['coco/bbox_mAP'] <= 1 for d in domains)
    assert data['cells']['clean']['0']['coco/bbox_mAP'] > 0
    assert 'Real-world shift' in proc.stdout and '| coco_o_sketch 1 | COCO-O sketch |' in \
        proc.stdout
    headline = sum(data['cells'][d]['1']['coco/bbox_mAP'] for d in domains) / 6
    assert f'| coco_o_mean | COCO-O, mean over its 6 domains (its headline) | coco/bbox_mAP | ' \
           f'{headline:.3f}' in proc.stdout
    assert (results.parent / 'det_report' / 'shifts_coco_bbox_mAP.png').is_file()


def test_coco_os_headline_is_the_mean_over_its_domains_with_the_mean_of_their_replicates(
        monkeypatch):
    """COCO-O reports mean AP over its six domains; the report adds it (and ACDC's mean).

    Its interval averages the six sets' own replicates (each set resampled alone).
    """
    from types import SimpleNamespace

    import numpy as np

    from mmrobust.datasets.shift_sets import SHIFT_BUNDLES
    from mmrobust.evaluation import report_stats, uncertainty
    from mmrobust.evaluation.shift_report import shift_markdown, shift_rows
    metric = 'coco/bbox_mAP'
    domains = SHIFT_BUNDLES['coco_o']
    cells = {'clean': {'0': {metric: 0.5}}}
    for i, (name, level) in enumerate(domains):
        cells[name] = {str(level): {metric: 0.1 * (i + 1)}}
    results = {'cells': cells}
    mean = [r for r in shift_rows({'m': results}, [metric]) if r[1] == 'coco_o_mean']
    assert len(mean) == 1 and mean[0][3] == 'COCO-O, mean over its 6 domains (its headline)'
    assert mean[0][5] == pytest.approx(0.35) and mean[0][7] == pytest.approx(0.35 - 0.5)
    partial = {'cells': {k: v for k, v in cells.items() if k != domains[0][0]}}
    assert not [r for r in shift_rows({'m': partial}, [metric]) if r[1] == 'coco_o_mean']
    # its interval: the mean of the sets' replicates, not of their intervals
    rng = np.random.default_rng(0)
    reps = {cell: 0.1 * (i + 1) + rng.normal(0, 0.02 * (i + 1), 400)
            for i, cell in enumerate(domains)}
    monkeypatch.setattr(uncertainty, 'replicates_of', lambda path, res, boot: (
        SimpleNamespace(notes=[]), {metric: {'cells': reps}}))
    extras = report_stats.Extras(replicates=400)
    report_stats._bootstrap_intervals(extras, [('m', 'r.json', results)],
                                      uncertainty.Bootstrap(400), {'m': {'metrics': {}}})
    low, high = extras.cell_intervals['m'][metric][('coco_o_mean', 0)]
    expected = np.percentile(np.mean([reps[c] for c in domains], axis=0), [2.5, 97.5])
    assert (low, high) == pytest.approx(tuple(expected))
    table = '\n'.join(shift_markdown({'m': results}, [metric], extras))
    assert f'| m | coco_o_mean | COCO-O, mean over its 6 domains (its headline) | {metric} | ' \
           f'0.350 [{low:.3f}, {high:.3f}] | 0.500 | -0.150 |' in table


def test_shift_sets_and_families_are_registries():
    from mmrobust.datasets.shift_sets import (
        SHIFT_FAMILIES,
        SHIFT_SETS,
        ShiftFamily,
        ShiftSet,
        parse_shifts,
        register_shift_family,
        register_shift_set,
    )
    from mmrobust.evaluation.cell_kinds import kind_of
    from mmrobust.evaluation.cell_kinds.shift import SHIFT
    with pytest.raises(ValueError, match="shift family 'acdc' is registered already"):
        register_shift_family(ShiftFamily('acdc', 'segmentation', '-', '-', '-', 'data/acdc'))
    with pytest.raises(ValueError, match="family 'nowhere' is not registered"):
        register_shift_set(ShiftSet('rain_set', 'nowhere', {1: 'rain'}, {1: {}}))
    with pytest.raises(ValueError, match='task is one of'):
        ShiftFamily('rainy', 'classification', '-', '-', '-', 'data/rainy')
    with pytest.raises(ValueError, match='each of its levels needs its dataset arguments'):
        ShiftSet('rain_set', 'acdc', {1: 'light', 2: 'heavy'}, {1: {}})
    register_shift_family(ShiftFamily('rainy', 'segmentation', 'rgb/*.png and gt/*.png',
                                      'a user', 'CC0', 'data/rainy'))
    try:
        register_shift_set(ShiftSet('rainy_city', 'rainy', {1: 'rainy city, val'}, {1: dict(
            data_prefix=dict(img_path='rgb', seg_map_path='gt'), img_suffix='.png',
            seg_map_suffix='.png')}))
        assert parse_shifts(['rainy_city']) == [('rainy_city', 1)]
        assert kind_of('rainy_city') is SHIFT
        with pytest.raises(ValueError, match="shift set 'rainy_city' is registered already"):
            register_shift_set(SHIFT_SETS['rainy_city'])
    finally:
        SHIFT_SETS.pop('rainy_city', None)
        SHIFT_FAMILIES.pop('rainy')
