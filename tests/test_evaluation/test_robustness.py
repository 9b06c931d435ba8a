"""Robustness evaluation: the mPC/rPC maths, tools/test_robustness.py and the report."""
import copy
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import Config

from mmrobust.corruptions import (
    CORRUPTIONS,
    UnknownCorruptionError,
    get_protocol,
    resolve_protocol,
)
from mmrobust.evaluation import (
    COCO_BACKENDS,
    PipelineError,
    ResultsMismatchError,
    RobustnessResults,
    cell_dataloader,
    coco_backend,
    find_loading_step,
    robustness_summary,
)
from mmrobust.evaluation.report import load_results, summarize, summary_markdown

from helpers import (
    DEMO_DET_CFG,
    REPO,
    assert_user_error,
    init_checkpoint,
    run_cmd,
    run_tool_here,
    run_tool_in_process,
)

DET_CFG = DEMO_DET_CFG  # the configuration of `trained_toy_detector`'s checkpoint
SEG_CFG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'
# a small protocol: 2 corruptions x 2 severities + clean
CELLS = ['--corruptions', 'gaussian_noise', 'fog', '--severities', '1', '4']
NO_WORKERS = ['--cfg-options', 'test_dataloader.num_workers=1',
              'test_dataloader.persistent_workers=False']
# the trained detector's runs: 12 of the 24 toy images keep its many cells quick
DET_OPTIONS = [*NO_WORKERS, 'test_dataloader.dataset.indices=12']
# the trained detector's runs whose numbers must equal another run's (shards, ranks): 6 images
# (3 per rank) and severity-1 cells, where it still detects (box and mask AP 0.01-0.06; at
# severity 5 contrast leaves it nothing to compare: 0 everywhere)
DET_EQUAL = [*NO_WORKERS, 'test_dataloader.dataset.indices=6']


def assert_detects(cells: dict) -> None:
    """Every cell's box and mask AP above 0: numbers that a lost or changed image would move."""
    for corruption, by_severity in cells.items():
        for severity, scores in by_severity.items():
            assert scores['coco/bbox_mAP'] > 0 and scores['coco/segm_mAP'] > 0, (
                corruption, severity, scores)
# Faster R-CNN R50-FPN 1x on COCO-C (Michaelis et al. 2019): box AP per corruption, mean of 1-5
FASTER_RCNN = dict(zip(get_protocol('benchmark').corruptions,
                       [17.1, 17.0, 13.9, 17.4, 11.0, 15.8, 7.6, 17.5, 21.9, 30.4, 32.2, 22.6, 20.8,
                        13.5, 14.6]))


def test_mpc_rpc_by_hand():
    cells = {'clean': {0: {'mIoU': 0.8, 'aAcc': 0.9}},
             'gaussian_noise': {1: {'mIoU': 0.6}, 2: {'mIoU': 0.4}},
             'fog': {'1': {'mIoU': 0.7, 'aAcc': 0.8}, '3': {'mIoU': 0.5, 'aAcc': 0.6}}}
    protocol = resolve_protocol(None, ['gaussian_noise', 'fog', 'snow'], [1, 2, 3])
    summary = robustness_summary(cells, protocol)
    miou = summary['metrics']['mIoU']
    assert miou['P_clean'] == 0.8
    assert miou['mPC'] == pytest.approx((0.6 + 0.4 + 0.7 + 0.5) / 4)
    assert miou['rPC'] == pytest.approx(0.55 / 0.8)
    assert miou['per_corruption'] == pytest.approx({'gaussian_noise': 0.5, 'fog': 0.6})
    assert miou['per_category'] == pytest.approx({'noise': 0.5, 'weather': 0.6})
    assert miou['per_severity'] == pytest.approx({1: 0.65, 2: 0.4, 3: 0.5})
    assert summary['metrics']['aAcc']['mPC'] == pytest.approx(0.7)
    assert summary['cells'] == 4
    assert sorted(summary['missing']) == [('fog', 2), ('gaussian_noise', 3), ('snow', 1),
                                          ('snow', 2), ('snow', 3)]


def _cityscapes_c_cells(noise: float = 40.0, rest: float = 70.0) -> dict:
    cells = {'clean': {0: {'mIoU': 80.0}}}
    for corruption, sevs in get_protocol('cityscapes_c').severities.items():
        value = noise if corruption.endswith('noise') else rest
        cells[corruption] = {s: {'mIoU': value} for s in sevs}
    return cells


def test_cityscapes_c_mpc_weighs_every_corruption_alike():
    """4 noise corruptions at severities 1-3 and 12 others at 1-5.

    The mean of the 16 per-corruption means (SegFormer's and FAN's estimator) is 62.5; the flat mean
    over the 72 cells read 65.0, overstating robustness where noise is hardest. The bootstrap's
    replicates use the same estimator.
    """
    import numpy as np

    from mmrobust.evaluation.uncertainty import replicate_summary
    protocol = get_protocol('cityscapes_c')
    assert len(protocol.cells()) == 72
    m = robustness_summary(_cityscapes_c_cells(), protocol)['metrics']['mIoU']
    assert m['mPC'] == pytest.approx(62.5) and m['rPC'] == pytest.approx(62.5 / 80)
    cells = {(c, s): {'mIoU': np.full(3, v[s]['mIoU'])}
             for c, by in _cityscapes_c_cells().items() for s in by for v in [by]}

    class Stats:
        pass
    stats = Stats()
    stats.cells = list(cells)
    stats.scores = lambda cell, weights: cells[cell]
    replicates = replicate_summary(stats, np.ones((3, 1)), protocol.cells())['mIoU']
    assert np.allclose(replicates['mPC'], 62.5)


def test_categories_follow_the_protocols_source():
    """Brightness is weather in ImageNet-C's grouping (COCO-C).

    Digital in SegFormer's Cityscapes-C table (with contrast, saturate and JPEG).
    """
    cells = _cityscapes_c_cells()
    cells['brightness'] = {s: {'mIoU': 10.0} for s in range(1, 6)}
    city = robustness_summary(cells, get_protocol('cityscapes_c'))['metrics']['mIoU']
    assert city['per_category']['digital'] == pytest.approx((10 + 70 * 3) / 4)
    assert city['per_category']['weather'] == pytest.approx(70)
    every = robustness_summary(cells, get_protocol('all'))['metrics']['mIoU']
    assert every['per_category']['weather'] == pytest.approx((10 + 70 * 4) / 5)
    sub = resolve_protocol('cityscapes_c', ['brightness', 'fog'], None)
    assert sub.category('brightness') == 'digital'
    from mmrobust.evaluation.report import summary_markdown
    table = summary_markdown({'m': {'protocol': 'cityscapes_c', 'cells': cells,
                                    'cells_planned': {c: list(s) for c, s in get_protocol(
                                        'cityscapes_c').severities.items()}}})
    assert f'| *digital* | {(10 + 70 * 3) / 4:.3f} |' in table


def test_published_faster_rcnn_table():
    """The 15 published per-corruption means average to mPC 18.2 = 50.2% of P_clean 36.3.

    The paper's 50.1% comes from its unrounded cells.
    """
    protocol = get_protocol('benchmark')
    cells = {'clean': {0: {'bbox_mAP': 36.3}}}
    for corruption, mean in FASTER_RCNN.items():
        # severities spread around the published mean, so only the mean over 1..5 is fixed
        cells[corruption] = {s: {'bbox_mAP': mean + (3 - s) * 1.5} for s in range(1, 6)}
    m = robustness_summary(cells, protocol)['metrics']['bbox_mAP']
    assert m['mPC'] == pytest.approx(18.22)
    assert round(m['mPC'], 1) == 18.2 and round(100 * m['rPC'], 1) == 50.2
    assert m['per_corruption'] == pytest.approx(FASTER_RCNN)
    assert m['per_category']['noise'] == pytest.approx((17.1 + 17.0 + 13.9) / 3)


def test_corrupt_step_goes_after_loading_found_by_type():
    cfg = Config.fromfile(str(REPO / DET_CFG))
    pipeline = [dict(type='mmdet.LoadAnnotations'), dict(type='mmdet.LoadImageFromFile'),
                dict(type='Resize', scale=(8, 8))]
    cfg.test_dataloader.dataset.pipeline = pipeline
    assert find_loading_step(pipeline) == 1
    loader = cell_dataloader(cfg, 'fog', 3, seed=5, bgr_compat=True, corrupted_root=None)
    assert [t['type'] for t in loader.dataset.pipeline] == [
        'mmdet.LoadAnnotations', 'mmdet.LoadImageFromFile', 'Corrupt', 'Resize']
    assert loader.dataset.pipeline[2] == dict(type='Corrupt', corruption='fog', severity=3,
                                              seed=5, bgr_compat=True)
    assert cfg.test_dataloader.dataset.pipeline == pipeline  # the config is left alone
    assert cell_dataloader(cfg, None, 0, 0, False, None) == cfg.test_dataloader
    with pytest.raises(PipelineError, match='no image-loading step'):
        find_loading_step([dict(type='Resize'), dict(type='PackDetInputs')])
    with pytest.raises(FileNotFoundError, match='make_corrupted.py'):
        cell_dataloader(cfg, 'fog', 3, 0, False, '/nonexistent-root')


def test_results_file_refuses_another_evaluation(tmp_path):
    identity = {'protocol': 'benchmark', 'cells_planned': {'fog': [1]}, 'seed': 0,
                'bgr_compat': False, 'source': 'on-the-fly', 'config_sha256': 'a',
                'checkpoint_sha256': 'b'}
    results = RobustnessResults(str(tmp_path / 'r.json'), identity)
    results.record('fog', 1, {'mIoU': 0.5}, {})
    assert RobustnessResults(str(tmp_path / 'r.json'), identity).done('fog', 1)
    for key, value in (('seed', 1), ('checkpoint_sha256', 'c'), ('protocol', 'all')):
        with pytest.raises(ResultsMismatchError, match=f'{key}.*delete the file'):
            RobustnessResults(str(tmp_path / 'r.json'), {**identity, key: value})
    assert not list(tmp_path.glob('*.tmp-*'))


def _init_checkpoint(config: str, path: Path) -> Path:
    """A checkpoint of the config's freshly initialised model (no training needed)."""
    return init_checkpoint(config, path)


def _cells(path: Path) -> dict:
    return json.loads(path.read_text())['cells']


def _same_predictions(a: Path, b: Path) -> bool:
    """Two DumpResults files hold the same predictions (paths to the images differ)."""
    with open(a, 'rb') as fa, open(b, 'rb') as fb:
        left, right = pickle.load(fa), pickle.load(fb)  # NOTE: files this test just wrote
    assert len(left) == len(right) > 0
    for x, y in zip(left, right):
        assert Path(x['img_path']).name == Path(y['img_path']).name
        for key in ('pred_instances', 'pred_sem_seg'):
            if key in x:
                for field, value in x[key].items():
                    assert np.array_equal(np.asarray(value), np.asarray(y[key][field])), field
    return True


def test_detector_on_the_fly_stored_resume_and_report(toy_data, trained_toy_detector, tmp_path):
    ckpt = trained_toy_detector / 'iter_300.pth'
    fly = tmp_path / 'fly.json'
    proc = run_tool_here('test_robustness.py', DET_CFG, ckpt, *CELLS, '--results', fly,
                         '--work-dir', tmp_path / 'w1', '--save-predictions', tmp_path / 'pred_fly',
                         *DET_OPTIONS)
    assert 'P_clean' in proc.stdout and 'coco/segm_mAP' in proc.stdout
    # one command gives the results, the table and the plots
    # (in the results file's own folder: two results files in one folder keep their plots)
    assert (tmp_path / 'fly_report' / 'per_corruption_coco_bbox_mAP.png').is_file()
    assert (tmp_path / 'fly_report' / 'summary.csv').is_file()
    data = json.loads(fly.read_text())
    assert data['protocol'] == 'custom' and data['source'] == 'on-the-fly'
    # what the strict load found, not which flag was passed
    assert data['checkpoint_load']['matched'] > 100 and 'partial_load' not in data
    assert not any(data['checkpoint_load'][k] for k in ('missing', 'unexpected', 'errors'))
    assert sorted(data['cells']) == ['clean', 'fog', 'gaussian_noise']
    for corruption in ('fog', 'gaussian_noise'):
        assert sorted(data['cells'][corruption]) == ['1', '4']
    clean = data['cells']['clean']['0']
    assert clean['coco/bbox_mAP'] > 0.08 and clean['coco/segm_mAP'] > 0.08
    assert data['cells']['fog']['4']['coco/bbox_mAP'] < clean['coco/bbox_mAP']
    assert data['timing']['fog']['4']['data_wait_s'] >= 0
    for by_severity in data['timing'].values():  # what each cell's metric hid, or not
        for timing in by_severity.values():
            assert timing['inference_s'] > 0 and timing['metric_s'] > 0
            assert timing['wait_s'] >= 0
    assert not (tmp_path / 'fly_predictions').exists()  # removed once recorded
    # the COCO library of robustness runs, recorded per cell and for the run
    faster = coco_backend('faster-coco-eval').label
    assert data['coco_backend'] == data['timing']['fog']['4']['metric_backend'] == faster
    assert sorted(p.name for p in (tmp_path / 'pred_fly').iterdir()) == [
        'clean_0.pkl', 'fog_1.pkl', 'fog_4.pkl', 'gaussian_noise_1.pkl', 'gaussian_noise_4.pkl']

    # stored: the same cells written by make_corrupted.py (lossless) give the same numbers
    run_tool_here('make_corrupted.py', toy_data['toy_coco'], tmp_path / 'coco-c', *CELLS,
                  '--lossless', '--workers', '2', '--no-progress')
    stored = tmp_path / 'stored.json'
    run_tool_here('test_robustness.py', DET_CFG, ckpt, *CELLS, '--results', stored, '--work-dir',
                  tmp_path / 'w2', '--corrupted-root', tmp_path / 'coco-c', '--save-predictions',
                  tmp_path / 'pred_stored', *DET_OPTIONS)
    assert _cells(stored) == _cells(fly)
    assert _same_predictions(tmp_path / 'pred_fly' / 'fog_4.pkl',
                             tmp_path / 'pred_stored' / 'fog_4.pkl')

    # resume: drop two finished cells as if the run had been interrupted; only they are redone
    interrupted = json.loads(fly.read_text())
    del interrupted['cells']['fog']['4'], interrupted['cells']['gaussian_noise']
    kept_timing = copy.deepcopy(interrupted['timing'])
    del kept_timing['fog']['4'], kept_timing['gaussian_noise']
    fly.write_text(json.dumps(interrupted))
    proc = run_tool_here('test_robustness.py', DET_CFG, ckpt, *CELLS, '--results', fly,
                         '--work-dir', tmp_path / 'w3', *DET_OPTIONS)
    # one progress line (not a terminal) counted the 3 missing cells' 12 images only
    assert 'custom: 36/36 images (100%)' in proc.stderr
    resumed = json.loads(fly.read_text())
    assert resumed['cells'] == data['cells']
    for corruption, by_severity in kept_timing.items():
        for severity, timing in by_severity.items():
            assert resumed['timing'][corruption][severity] == timing  # not recomputed

    # another seed is another corrupted set: refused, not mixed in
    proc = run_tool_here('test_robustness.py', DET_CFG, ckpt, *CELLS, '--results', fly, '--seed',
                         '1', '--work-dir', tmp_path / 'w4', *DET_OPTIONS, check=False)
    assert proc.returncode != 0 and 'delete the file to start fresh' in proc.stderr

    # report: table, CSV and plots, two "models" side by side
    out = tmp_path / 'report'
    proc = run_tool_here('robustness_report.py', fly, stored, '--labels', 'on-the-fly', 'stored',
                         '--out-dir', out)
    assert '| on-the-fly | coco/bbox_mAP |' in proc.stdout and 'rPC %' in proc.stdout
    assert {p.name for p in out.iterdir()} == {
        'cells.csv', 'summary.csv', 'paired.csv', 'per_corruption_coco_bbox_mAP.png',
        'per_severity_coco_bbox_mAP.png', 'per_corruption_coco_segm_mAP.png',
        'per_severity_coco_segm_mAP.png', 'intervals_coco_bbox_mAP.png',
        'intervals_coco_segm_mAP.png', 'per_corruption_tests.csv'}
    rows = (out / 'cells.csv').read_text().splitlines()
    assert len(rows) == 1 + 2 * 5 * 12  # models x cells x the 12 COCO box/mask metrics
    # the per-image statistics of both runs: the same predictions, so a paired difference of
    # exactly 0; the bootstrap's point is the recorded (rounded) AP
    assert sorted(p.name for p in (tmp_path / 'fly_per_image').iterdir()) == [
        'clean_0.npz', 'fog_1.npz', 'fog_4.npz', 'gaussian_noise_1.npz', 'gaussian_noise_4.npz']
    paired = (out / 'paired.csv').read_text().splitlines()[1:]
    assert paired and all(row.split(',')[4:7] == ['0.0'] * 3 for row in paired)
    from mmrobust.evaluation.uncertainty import cell_stats
    stats = cell_stats(str(fly), load_results(str(fly)))
    # NOTE: mmdet's CocoMetric scores every image of the annotation file (12 with predictions)
    assert not stats.missing and len(stats.images) == 24
    for cell, scores in ((c, stats.scores(c, np.ones((1, 24)))) for c in stats.cells):
        for name in ('coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50'):
            assert abs(scores[name][0] - data['cells'][cell[0]][str(cell[1])][name]) <= 6e-4


@pytest.mark.slow
def test_segmentor_on_the_fly_equals_stored(toy_data, tmp_path):
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    cells = ['--corruptions', 'speckle_noise', 'snow', '--severities', '2']
    fly, stored = tmp_path / 'fly.json', tmp_path / 'stored.json'
    run_tool_here('test_robustness.py', SEG_CFG, ckpt, *cells, '--results', fly, '--work-dir',
                  tmp_path / 'w1', '--save-predictions', tmp_path / 'p1', *NO_WORKERS)
    run_tool_here('make_corrupted.py', toy_data['toy_cityscapes'], tmp_path / 'cs-c', *cells,
                  '--workers', '2', '--no-progress')
    run_tool_here('test_robustness.py', SEG_CFG, ckpt, *cells, '--results', stored, '--work-dir',
                  tmp_path / 'w2', '--corrupted-root', tmp_path / 'cs-c', '--save-predictions',
                  tmp_path / 'p2', '--metric-queue', '0', '--per-cell-loaders', *NO_WORKERS)
    # on the fly, one dataloader, background metrics = stored, a dataloader per cell, serial
    assert _cells(fly) == _cells(stored)
    assert set(_cells(fly)['snow']['2']) >= {'mIoU', 'mAcc', 'aAcc'}
    assert _same_predictions(tmp_path / 'p1' / 'snow_2.pkl', tmp_path / 'p2' / 'snow_2.pkl')
    assert 'mIoU' in summary_markdown({'seg': load_results(str(fly))})
    # per-image statistics: the images are named alike in the stored set's cell folders and on
    # the fly, so the two runs pair; the same predictions differ by exactly 0
    from mmrobust.evaluation.uncertainty import cell_stats
    for path in (fly, stored):
        stats = cell_stats(str(path), load_results(str(path)))
        assert not stats.missing and len(stats.cells) == 3 and len(stats.images) == 8
        assert all(i.startswith('leftImg8bit/val/') for i in stats.images), stats.images[:2]
        clean = stats.scores(('clean', 0), np.ones((1, 8)))['mIoU'][0]
        assert abs(clean - _cells(path)['clean']['0']['mIoU']) <= 0.005 + 1e-9
    proc = run_tool_here('robustness_report.py', fly, stored, '--labels', 'fly', 'stored',
                         '--out-dir', tmp_path / 'rep')
    assert '| stored | fly | mIoU | mPC | 0.000 | [0.000, 0.000] |' in proc.stdout


def test_two_processes_match_one(toy_data, trained_toy_detector, tmp_path):
    """--launcher pytorch gives the numbers of a single process.

    --launcher pytorch (2 CPU processes, one dataloader, background metrics) gives the numbers of a
    single process (a dataloader per cell, serial metrics).
    """
    ckpt = trained_toy_detector / 'iter_300.pth'
    cells = ['--corruptions', 'fog', 'contrast', '--severities', '1']
    single = tmp_path / 'one.json'  # the loop before the one-pass loader and the background
    run_tool_here('test_robustness.py', DET_CFG, ckpt, *cells, '--results', single, '--work-dir',
                  tmp_path / 'w1', '--metric-queue', '0', '--per-cell-loaders', *DET_EQUAL)
    double = tmp_path / 'two.json'
    run_cmd(['bash', REPO / 'tools/dist_test.sh', DET_CFG, ckpt, '2', *cells, '--results',
             double, '--work-dir', tmp_path / 'w2', *DET_EQUAL],
            env={'TOOL': 'test_robustness.py', 'PORT': str(29500 + np.random.randint(1000))})
    assert _cells(double) == _cells(single)
    assert_detects(_cells(single))


@pytest.mark.slow
def test_mmdet_results_pickle_is_read_safely(tmp_path):
    """mmdet 3.3's own ``*_results.pkl`` ({corruption: {severity: metrics}}, 0 = clean)."""
    data = {'gaussian_noise': {0: {'coco/bbox_mAP': np.float64(0.4)},
                               1: {'coco/bbox_mAP': np.float64(0.3)}},
            'fog': {0: {'coco/bbox_mAP': np.float64(0.4)}, 1: {'coco/bbox_mAP': 0.35}}}
    path = tmp_path / 'old_results.pkl'
    path.write_bytes(pickle.dumps(data))
    results = load_results(str(path))
    assert results['cells']['clean'] == {0: {'coco/bbox_mAP': 0.4}}  # severities as integers
    m = robustness_summary(results['cells'])['metrics']['coco/bbox_mAP']
    assert m['mPC'] == pytest.approx(0.325) and m['rPC'] == pytest.approx(0.8125)
    proc = run_tool_here('robustness_report.py', path, '--out-dir', tmp_path / 'rep')
    assert '| old_results | coco/bbox_mAP | 0.400 | 0.325 | 81.250 |' in proc.stdout

    class Payload:
        def __reduce__(self):
            return (print, ('pwned', ))
    evil = tmp_path / 'evil_results.pkl'
    evil.write_bytes(pickle.dumps({'fog': {0: Payload()}}))
    with pytest.raises(ValueError, match='builtins.print is not allowed'):
        load_results(str(evil))


def _leaderboard_pickle(path: Path, clean: float = 0.363) -> None:
    """A COCO-C leaderboard results file as mmdet 1.x / 2.x's test_robustness.py writes it.

    {corruption: {severity: {'bbox': {'AP': ..., ...}}}}, numpy scalars, pickle protocol 2, the 15
    benchmark corruptions at Faster R-CNN's published means and the 4 held-out at 0.30.
    """
    data = {}
    for corruption in CORRUPTIONS:
        mean = FASTER_RCNN.get(corruption, 30.0) / 100
        data[corruption] = {0: {'bbox': {'AP': np.float64(clean), 'AP50': np.float64(0.58)}}}
        for s in range(1, 6):
            data[corruption][s] = {'bbox': {'AP': np.float64(mean + (3 - s) * 0.015),
                                            'AP50': np.float64(0.5)}}
    path.write_bytes(pickle.dumps(data, protocol=2))


def test_leaderboard_results_pickle_averages_the_15_benchmark_corruptions(tmp_path):
    """Its numpy scalars need _codecs.encode (refused before).

    Its nested metrics are mapped (dropped before, leaving empty cells), and mPC is over the 15
    benchmark corruptions as mmdet's robustness_eval.py and the paper average (18.2 = 50.2 % of
    36.3), with the aggregate said; --aggregate all gives the mean of all 19.
    """
    path = tmp_path / 'faster_rcnn_r50_fpn_1x_results.pkl'
    _leaderboard_pickle(path)
    assert b'_codecs' in path.read_bytes()
    results = load_results(str(path))
    m = summarize(results)['metrics']['coco/bbox_mAP']
    assert m['mPC'] == pytest.approx(0.1822) and round(100 * m['rPC'], 1) == 50.2
    assert 'not averaged: speckle_noise, gaussian_blur, spatter, saturate' in results['aggregate']
    assert summarize(results)['metrics']['coco/bbox_mAP_50']['P_clean'] == pytest.approx(0.58)
    every = summarize(load_results(str(path), aggregate='all'))['metrics']['coco/bbox_mAP']
    assert every['mPC'] == pytest.approx((0.1822 * 15 + 0.30 * 4) / 19)
    table = summary_markdown({'frcnn': results})
    assert 'frcnn: mPC over 15 corruption(s) of the 15 benchmark ones' in table
    # such a file is a reference for CE, over the 15 benchmark corruptions, the set named
    from mmrobust.evaluation.report import build_extras
    _leaderboard_pickle(tmp_path / 'better_results.pkl', clean=0.40)
    better = load_results(str(tmp_path / 'better_results.pkl'))
    extras = build_extras([('better', str(tmp_path / 'better_results.pkl'), better)],
                          {'better': ['better']}, None, ('frcnn', results), ['coco/bbox_mAP'])
    ce = extras.errors['better']['coco/bbox_mAP']
    assert ce['corruptions'] == 'the 15 benchmark corruptions'
    assert sorted(ce['per_corruption']) == sorted(FASTER_RCNN)
    assert ce['mCE'] == pytest.approx(1.0)


def test_voc_leaderboard_pickles_give_mmdets_p_and_mpc_and_say_which_rpc(tmp_path):
    """The COCO-C leaderboard's Pascal VOC pickles (mmdet 1.x: per-class ``[{'ap': ...}] x 20``).

    AP50 is the mean of the classes' AP; P and mPC equal robustness_eval.py's
    ``get_voc_style_results`` (computed here as it does); the rPC printed is mPC / P, and the
    note gives mmdet's mean of per-class ratios as well.
    """
    rng = np.random.default_rng(0)
    names = list(CORRUPTIONS)
    table = np.zeros((len(names), 6, 20), np.float32)  # robustness_eval.py's array
    data = {}
    clean = rng.uniform(0.5, 0.9, 20).astype(np.float32)
    for i, corruption in enumerate(names):
        data[corruption] = {}
        for s in range(0 if i == 0 else 1, 6):  # NOTE: the clean set once, as mmdet 1.x ran it
            aps = clean if s == 0 else (clean * rng.uniform(0.3, 0.9, 20)).astype(np.float32)
            data[corruption][s] = [{'ap': np.float32(a)} for a in aps]
            table[i, s] = aps
    path = tmp_path / 'faster_rcnn_r50_fpn_1x_voc_results.pkl'
    path.write_bytes(pickle.dumps(data, protocol=2))
    results = load_results(str(path))
    m = summarize(results)['metrics']['pascal_voc/AP50']
    p_clean = table[0, 0]
    mpc = np.mean(table[:15, 1:, :], axis=(0, 1))  # get_voc_style_results, 'benchmark'
    assert m['P_clean'] == pytest.approx(float(np.mean(p_clean)), abs=1e-6)
    assert m['mPC'] == pytest.approx(float(np.mean(mpc)), abs=1e-6)
    assert m['rPC'] == pytest.approx(float(np.mean(mpc)) / float(np.mean(p_clean)), abs=1e-6)
    assert f'{float(np.mean(mpc / p_clean)) * 100:.1f} %' in results['aggregate']
    assert 'rPC here is mPC / P_clean' in results['aggregate']
    table_md = summary_markdown({'voc': results})
    assert 'mean of the per-class ratios' in table_md
    # a list of something else is still refused, saying what each format holds
    path.write_bytes(pickle.dumps({'fog': {1: [1, 2]}}, protocol=2))
    from mmrobust.evaluation.results import NotAResultsFileError
    with pytest.raises(NotAResultsFileError, match="per-class dicts with 'ap'"):
        load_results(str(path))


def test_a_reference_without_a_drop_is_warned_of():
    from mmrobust.evaluation.uncertainty import corruption_errors
    ref = {'clean': {0: {'mIoU': 0.5}}, 'fog': {1: {'mIoU': 0.5}, 2: {'mIoU': 0.4999}}}
    run = {'clean': {0: {'mIoU': 0.6}}, 'fog': {1: {'mIoU': 0.5}, 2: {'mIoU': 0.4}}}
    out = corruption_errors(run, ref, 'mIoU', ['fog'])
    assert len(out['warnings']) == 1 and 'fog' in out['warnings'][0]
    assert 'explodes or flips sign' in out['warnings'][0]


def test_a_predictions_dump_points_at_the_metrics_file(tmp_path):
    """mmdet's test_robustness writes predictions to --out x.pkl, the metrics to x_results.pkl.

    Given the first, the report says to pass the second.
    """
    dump = tmp_path / 'x.pkl'
    dump.write_bytes(pickle.dumps([{'img_id': 1, 'pred_instances': {
        'scores': np.zeros(3, np.float32)}}]))
    with pytest.raises(ValueError, match=r'x_results\.pkl: pass that file \(not found'):
        load_results(str(dump))
    proc = run_tool_here('robustness_report.py', dump, check=False)
    assert proc.returncode != 0 and 'x_results.pkl' in proc.stderr


def test_undefined_rpc_reads_as_a_dash_in_plots(tmp_path, monkeypatch):
    from mmrobust.evaluation import report
    legends = []

    def keep_legend(fig, path, dpi=120):
        legends.extend(t.get_text() for t in fig.axes[0].get_legend().get_texts())
        return str(path)
    monkeypatch.setattr(report, 'save_figure', keep_legend)
    results = {'cells': {'clean': {'0': {'mIoU': 0.0}}, 'fog': {'1': {'mIoU': 0.0}}}}
    report.plot({'untrained': results}, str(tmp_path))
    assert legends and 'rPC —' in legends[0] and 'nan' not in ' '.join(legends)


def test_one_writer_per_results_file(tmp_path):
    import threading
    import time

    from mmrobust.utils import FileLockedError, exclusive_lock
    target = tmp_path / 'r.json'
    with exclusive_lock(target):
        with pytest.raises(FileLockedError, match=rf'pid {os.getpid()} on .*--wait'):
            with exclusive_lock(target):
                pass
    assert not (tmp_path / 'r.json.lock').exists()

    # --wait queues behind the holder, and says whom it waits for
    held, order, messages = threading.Event(), [], []

    def holder():
        with exclusive_lock(target):
            held.set()
            time.sleep(0.5)
            order.append('first done')
    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    with exclusive_lock(target, wait=True, waiting=messages.append):
        order.append('second in')
    thread.join()
    assert order == ['first done', 'second in'] and 'waiting for pid' in messages[0]


@pytest.mark.parametrize('first,second', [('r.json', 'r.json'), ('r', 'r.json'),
                                          ('r.json', 'alias/r'), ('alias/r.json', 'r')])
def test_second_robustness_run_on_one_results_location_is_refused(toy_data, tmp_path, first,
                                                                   second):
    """A second run on the results another run writes stops at once, naming that run.

    Whatever the names: with or without ``.json``, through a symlinked folder, they are one
    location with one lock (two locks let two jobs write one set of side folders). It stops
    before loading or computing anything.
    """
    from mmrobust.evaluation import results_lock
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    (tmp_path / 'alias').symlink_to(tmp_path, target_is_directory=True)
    with results_lock(str(tmp_path / first)):
        proc = run_tool_here('test_robustness.py', SEG_CFG, ckpt, '--corruptions', 'fog',
                             '--severities', '1', '--results', tmp_path / second, '--work-dir',
                             tmp_path / 'w', *NO_WORKERS, check=False)
    assert_user_error(proc.returncode, proc.stderr, 1, f'is being written by pid {os.getpid()}',
                      str(tmp_path / second))
    assert not any(p.name.startswith('r') for p in tmp_path.iterdir()), list(tmp_path.iterdir())


def test_a_finished_run_reruns_read_only_and_prints_its_table(toy_data, tmp_path):
    """A rerun with every cell recorded writes nothing: a read-only disk still gives the table.

    Nothing built, locked or written (every write under the results folder fails, as on a
    read-only disk, and none is tried); ``--report DIR`` writes the report there.
    """
    from helpers.fs_faults import failing_writes
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    out = tmp_path / 'out'
    args = [SEG_CFG, ckpt, '--corruptions', 'fog', '--severities', '1', '--results',
            out / 'r.json', '--work-dir', out / 'w', *NO_WORKERS]
    first = run_tool_here('test_robustness.py', *args)
    before = {p: p.read_bytes() for p in out.rglob('*') if p.is_file() and 'w' not in p.parts}
    with failing_writes(out) as tried:
        again = run_tool_here('test_robustness.py', *args)
    assert not tried, tried
    assert 'nothing to run, nothing written' in again.stdout + again.stderr
    table = [line for line in first.stdout.splitlines() if line.startswith('| ')]
    assert table and table == [line for line in again.stdout.splitlines()
                               if line.startswith('| ')]
    assert {p: p.read_bytes() for p in out.rglob('*')
            if p.is_file() and 'w' not in p.parts} == before
    # asked for, the report goes where it is writable
    run_tool_here('test_robustness.py', *args, '--report', tmp_path / 'rep')
    assert (tmp_path / 'rep' / 'summary.csv').is_file()
    assert (tmp_path / 'rep' / 'summary.csv').read_bytes() == before[out / 'r_report' /
                                                                       'summary.csv']


def test_a_results_folder_that_cannot_be_written_stops_before_the_model(toy_data, tmp_path):
    """``--results`` a folder, or in a read-only folder: one ``error:`` line, nothing built."""
    from helpers.fs_faults import failing_writes
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')

    def run(results):
        return run_tool_here('test_robustness.py', SEG_CFG, ckpt, '--corruptions', 'fog',
                             '--severities', '1', '--results', results, '--work-dir',
                             tmp_path / 'w', *NO_WORKERS, check=False)
    (tmp_path / 'folder').mkdir()
    proc = run(tmp_path / 'folder')
    assert_user_error(proc.returncode, proc.stderr, 2, 'is a folder', 'folder/results.json')
    out = tmp_path / 'out'
    with failing_writes(out) as tried:
        proc = run(out / 'r.json')
    assert tried and not out.exists()
    assert_user_error(proc.returncode, proc.stderr, 1, str(out), 'Read-only file system (EROFS)',
                      'Rerun the same command to resume')
    assert 'Loads checkpoint' not in proc.stdout + proc.stderr  # before the model


# what a full disk strikes, in the run's process: (the path's mark, its first write to fail,
# the run's options); the per-image statistics with the metric in this process
FULL_DISK = {'results file': ('r.json' + '.mmrobust-tmp-', 2, ()),
             'predictions': ('r_predictions', 1, ()),
             'per-image statistics': ('r_per_image', 1, ('--metric-queue', '0')),
             'report': ('r_report', 1, ())}


@pytest.fixture(scope='module')
def fault_free_cells(toy_data, tmp_path_factory):
    """The cells of the full-disk runs, run without a fault."""
    tmp = tmp_path_factory.mktemp('fault_free')
    ckpt = _init_checkpoint(SEG_CFG, tmp / 'seg.pth')
    run_tool_here('test_robustness.py', SEG_CFG, ckpt, '--corruptions', 'fog', 'snow',
                  '--severities', '1', '--results', tmp / 'r.json', '--work-dir', tmp / 'w',
                  *NO_WORKERS)
    return _cells(tmp / 'r.json')


@pytest.mark.slow
@pytest.mark.parametrize('writer', list(FULL_DISK))
def test_a_full_disk_at_each_writer_ends_in_one_error_line_and_the_rerun_resumes(
        writer, fault_free_cells, toy_data, tmp_path):
    """One ``error:`` line at the write it strikes: the path, ENOSPC, "rerun to resume".

    No traceback; the results file as it was when the fault struck; the lock released and no
    worker left (the resubmit takes the lock; the harness checks the processes); the resubmitted
    command resumes to the numbers of a run without faults, the report written.
    """
    import errno

    from helpers.fs_faults import failing_writes
    mark, nth, options = FULL_DISK[writer]
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    out = tmp_path / 'out'
    args = [SEG_CFG, ckpt, '--corruptions', 'fog', 'snow', '--severities', '1', '--results',
            out / 'r.json', '--work-dir', tmp_path / 'w', *options, *NO_WORKERS]
    seen, kept = [], {}

    def strike(path: str, operation: str) -> bool:
        if operation != 'open' or mark not in path:
            return False
        seen.append(path)
        if len(seen) == nth:
            results = out / 'r.json'
            kept['results'] = results.read_bytes() if results.exists() else None
        return len(seen) == nth
    with failing_writes(out, errno.ENOSPC, when=strike):
        proc = run_tool_here('test_robustness.py', *args, check=False)
    message = assert_user_error(proc.returncode, proc.stderr, 1, 'No space left on device '
                                '(ENOSPC)', 'Rerun the same command to resume')
    assert str(out) in message and 'results' in kept, message
    if kept['results'] is None:  # struck before the first record
        assert not (out / 'r.json').exists()
    else:
        assert (out / 'r.json').read_bytes() == kept['results']
    assert not list(out.rglob('*.mmrobust-tmp-*'))
    run_tool_here('test_robustness.py', *args)
    assert _cells(out / 'r.json') == fault_free_cells
    assert (out / 'r_report' / 'summary.csv').is_file()


def test_missing_per_image_statistics_are_recomputed_by_the_command_the_report_names(
        toy_data, tmp_path):
    """Per-image files lost or another evaluation's: the report names what recomputes them.

    And that command does: those cells only, to the same numbers.
    """
    from mmrobust.evaluation.per_image import load_cell_stats, save_cell_stats, stats_path
    from mmrobust.evaluation.uncertainty import cell_stats
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    results = tmp_path / 'r.json'
    args = [SEG_CFG, ckpt, '--corruptions', 'fog', 'snow', '--severities', '1', '--results',
            results, '--work-dir', tmp_path / 'w', *NO_WORKERS]
    run_tool_here('test_robustness.py', *args)
    recorded = _cells(results)
    folder = str(tmp_path / 'r_per_image')
    kept = Path(stats_path(folder, 'clean', 0)).read_bytes()
    os.remove(stats_path(folder, 'fog', 1))
    other = load_cell_stats(stats_path(folder, 'snow', 1))
    save_cell_stats(stats_path(folder, 'snow', 1), ('snow', 1), 'another evaluation',
                    other['blocks'])
    notes = cell_stats(str(results), load_results(str(results))).notes
    assert notes and all('--refresh-per-image' in n for n in notes), notes
    proc = run_tool_here('test_robustness.py', *args, '--refresh-per-image')
    assert 'custom: 16/16 images' in proc.stderr  # fog 1 and snow 1, not the clean cell
    assert _cells(results) == recorded
    stats = cell_stats(str(results), load_results(str(results)))
    assert not stats.missing and not stats.notes and len(stats.cells) == 3
    assert Path(stats_path(folder, 'clean', 0)).read_bytes() == kept


@pytest.mark.slow
def test_errors_name_the_valid_choices(tmp_path):
    proc = run_tool_here('test_robustness.py', DET_CFG, tmp_path / 'x.pth', '--corruptions',
                         'blurry', check=False)
    assert_user_error(proc.returncode, proc.stderr, 2, 'Valid corruptions: gaussian_noise')
    proc = run_tool_here('test_robustness.py', DET_CFG, tmp_path / 'x.pth', '--coco-backend',
                         'fast', check=False)
    assert proc.returncode == 2 and "invalid choice: 'fast'" in proc.stderr
    assert all(name in proc.stderr for name in COCO_BACKENDS)
    # the same functions stop the tool (in-process: no need for two more start-ups)
    with pytest.raises(UnknownCorruptionError, match='Valid protocols: benchmark'):
        resolve_protocol('coco-c', None, None)
    from mmrobust.apis import apply_test_args
    with pytest.raises(FileNotFoundError, match='does not exist'):
        apply_test_args(Config.fromfile(str(REPO / DET_CFG)), str(tmp_path / 'x.pth'))


# -- adversarial cells -----------------------------------------------------------------------------

ATTACK_CELLS = ['--corruptions', 'gaussian_noise', '--severities', '1', '--attacks', 'pgd_linf',
                'segpgd_linf', '--epsilons', '0', '8/255', '--attack-steps', '2']
SEG_FEW = [*NO_WORKERS, 'test_dataloader.dataset.indices=3']


@pytest.mark.slow
def test_attack_cells_beside_corruptions_report_and_two_processes(toy_data, tmp_path):
    """Attack cells in the results file next to a corruption cell.

    Epsilon 0 is the clean score exactly, the score falls under attack, the report has the table,
    CSV and curve, and 2 processes give the numbers of 1 (per-image seeding).
    """
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    results = tmp_path / 'r.json'
    proc = run_tool_here('test_robustness.py', SEG_CFG, ckpt, *ATTACK_CELLS, '--results', results,
                         '--work-dir', tmp_path / 'w', *SEG_FEW)
    data = json.loads(results.read_text())
    assert data['attacks']['pgd_linf']['epsilons'] == [0.0, 8 / 255]
    assert data['attacks']['pgd_linf']['settings']['steps'] == 2
    cells = data['cells']
    for attack in ('pgd_linf', 'segpgd_linf'):
        assert cells[attack]['1'] == cells['clean']['0']  # epsilon 0: the clean images
        assert cells[attack]['1']['mIoU'] > cells[attack]['2']['mIoU'], cells[attack]
    assert 'mIoU under attack' in proc.stdout and '| pgd_linf | 0.031373 | 8 |' in proc.stdout
    # the per-image worst case over the two attacks: at epsilon 0 the clean images' numbers
    assert cells['worst']['1'] == cells['clean']['0']
    assert cells['worst']['2']['mIoU'] <= max(cells[a]['2']['mIoU']
                                              for a in ('pgd_linf', 'segpgd_linf'))
    assert sum(data['worst_case']['2'].values()) == 3  # images
    assert '| worst | 0.031373 | 8 |' in proc.stdout
    report = tmp_path / 'r_report'
    assert (report / 'adversarial_mIoU.png').is_file() and (report / 'attacks.csv').is_file()
    summary = robustness_summary(cells)  # the attack cells are not corruptions
    assert summary['cells'] == 1 and summary['metrics']['mIoU']['mPC'] == \
        cells['gaussian_noise']['1']['mIoU']

    double = tmp_path / 'two.json'
    run_cmd(['bash', REPO / 'tools/dist_test.sh', SEG_CFG, ckpt, '2', '--attacks', 'pgd_linf',
             *ATTACK_CELLS[7:], '--results', double, '--work-dir', tmp_path / 'w2', *SEG_FEW],
            env={'TOOL': 'test_robustness.py', 'PORT': str(29500 + np.random.randint(1000))})
    two = _cells(double)
    assert set(two) == {'clean', 'pgd_linf'}
    for k in ('1', '2'):  # each image attacked alone: the same attacked images on 1 or 2 ranks
        for metric, value in cells['pgd_linf'][k].items():
            assert two['pgd_linf'][k][metric] == pytest.approx(value, abs=1e-9), k


def test_every_attack_figure_comes_with_its_steps(tmp_path):
    """A 10-step number overstates robustness (Halmosi et al. 2023, Croce et al. 2024).

    The report's table, CSV and plot legend print each attack's steps, start and restarts.
    """
    import csv

    from mmrobust.evaluation.attacks import attack_plan
    from mmrobust.evaluation.report import write_csv
    plan = {**attack_plan(['pgd_linf'], ['4/255'], steps=100, restarts=3),
            **attack_plan(['fgsm_linf'], ['4/255'])}
    results = {'cells': {'clean': {'0': {'mIoU': 60.0}}, 'pgd_linf': {'1': {'mIoU': 20.0}},
                         'fgsm_linf': {'1': {'mIoU': 40.0}}}, 'attacks': plan}
    table = summary_markdown({'m': results}, ['mIoU'])
    assert '| m | pgd_linf | 0.015686 | 4 | 20.000 | 100 steps, random start, 3 restarts |' \
        in table, table
    assert '| m | fgsm_linf | 0.015686 | 4 | 40.000 | 1 step |' in table
    write_csv({'m': results}, str(tmp_path))
    with open(tmp_path / 'attacks.csv') as f:
        rows = list(csv.DictReader(f))
    assert {r['setting'] for r in rows if r['attack'] == 'pgd_linf'} == \
        {'100 steps, random start, 3 restarts'}


@pytest.mark.parametrize('args,message', [
    (['--attacks', 'pgd_l3', '--epsilons', '1/255'], "unknown attack 'pgd_l3'; choose from"),
    (['--attacks', 'pgd_linf', '--epsilons=-1/255'], 'epsilon must be a finite number >= 0'),
    (['--attacks', 'pgd_linf', '--epsilons', 'x'], 'is not a number'),
    (['--attacks', 'pgd_linf'], 'attacks need their budgets'),
    (['--epsilons', '1/255'], '--epsilons needs --attacks'),
])
def test_bad_attack_arguments_stop_before_anything_is_built(args, message, tmp_path):
    # NOTE: in this process: no interpreter start-up
    status, _, err = run_tool_in_process('test_robustness.py', SEG_CFG, tmp_path / 'none.pth',
                                         *args)
    assert_user_error(status, err, 2, message)


@pytest.mark.slow
def test_detector_attack_cells_run_and_resume(toy_data, tmp_path):
    """PGD cells on the toy Mask R-CNN (ground truth loaded after Resize, rescaled for the loss).

    Recorded with the report's table and curve, epsilon 0 equal to clean, a rerun adds nothing.
    (SegPGD on a detector: tests/test_evaluation/test_attacks.py.)
    """
    ckpt = _init_checkpoint(DET_CFG, tmp_path / 'det.pth')
    results = tmp_path / 'det.json'
    args = [DET_CFG, ckpt, '--attacks', 'pgd_linf', '--epsilons', '0', '4/255',
            '--attack-steps', '1', '--results', results, '--work-dir', tmp_path / 'w',
            *NO_WORKERS, 'test_dataloader.dataset.indices=2']
    proc = run_tool_here('test_robustness.py', *args)
    cells = _cells(results)
    assert set(cells) == {'clean', 'pgd_linf'} and set(cells['pgd_linf']) == {'1', '2'}
    assert cells['pgd_linf']['1'] == cells['clean']['0']
    assert 'coco/bbox_mAP under attack' in proc.stdout
    assert (tmp_path / 'det_report' / 'adversarial_coco_bbox_mAP.png').is_file()
    before = results.read_text()
    run_tool_here('test_robustness.py', *args)
    assert json.loads(results.read_text())['timing'] == json.loads(before)['timing']
    # other budgets or steps on the same file: refused (before, the file was relabelled with
    # the new settings and kept the old numbers)
    before = results.read_text()
    for changed in (['--epsilons', '0', '8/255'], ['--attack-steps', '2']):
        at = args.index(changed[0])
        rerun = args[:at] + changed + args[at + len(changed):]
        status, _, err = run_tool_in_process('test_robustness.py', *rerun)
        assert_user_error(status, err, 1, 'holds results of a different evaluation (attacks:')
    assert results.read_text() == before
