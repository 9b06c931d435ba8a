"""Panoptic segmentation through the robustness tool: mmdet's ``CocoPanopticMetric`` per cell.

PQ per cell in the results, the per-cell log lines, the end-of-run table and the report (P_clean,
mPC and rPC of PQ), on the tiny COCO panoptic set with a model whose PQ depends on the pixels it
is fed (``helpers.panoptic_oracle``). The stock panoptic configs run in the zoo matrix.
"""
import csv
import json
import math

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.config import Config
from mmengine.structures import InstanceData, PixelData

from mmrobust.evaluation.attack_losses import gt_at_input_scale
from mmrobust.evaluation.evaluator_cfg import annotation_steps

from helpers import init_checkpoint, run_tool_in_process
from helpers.zoo import tiny_coco_panoptic, zoo_config

PANOPTIC_FPN = 'mmdet::panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py'


def test_panoptic_ground_truth_counts_as_ground_truth():
    # the attack's pipeline check and the rescaling of late-loaded ground truth find it
    pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(8, 8)),
                dict(type='mmdet.LoadPanopticAnnotations'), dict(type='PackDetInputs')]
    assert annotation_steps(pipeline) == [2]


def test_a_panoptic_label_map_is_brought_to_the_inputs_scale():
    labels = torch.arange(6, dtype=torch.uint8).repeat_interleave(2).reshape(1, 3, 4)
    sample = DetDataSample(metainfo=dict(scale_factor=(2.0, 2.0), img_shape=(6, 8)))
    sample.gt_sem_seg = PixelData(sem_seg=labels)
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[0., 0., 2., 2.]]), labels=torch.tensor([0]),
        masks=BitmapMasks(torch.ones(1, 3, 4, dtype=torch.uint8).numpy(), 3, 4))
    out = gt_at_input_scale([sample])[0]
    seg = out.gt_sem_seg.sem_seg
    assert seg.shape == (1, 6, 8) and seg.dtype == torch.uint8
    # nearest: every label kept, each pixel doubled both ways
    assert torch.equal(seg, labels.repeat_interleave(2, 1).repeat_interleave(2, 2))
    assert out.gt_instances.masks.to_ndarray().shape == (1, 6, 8)
    assert sample.gt_sem_seg.sem_seg.shape == (1, 3, 4)  # the batch's own sample is untouched


@pytest.fixture(scope='module')
def oracle_run(tmp_path_factory):
    """A panoptic run of the oracle on three images: clean, gaussian noise 1 and 5, fog 1."""
    tmp = tmp_path_factory.mktemp('panoptic')
    root = tiny_coco_panoptic(str(tmp / 'set'), 3)
    cfg = Config.fromfile(str(zoo_config(PANOPTIC_FPN, tmp, root)))
    cfg.model = dict(type='PanopticOracle', data_preprocessor=dict(
        type='DetDataPreprocessor', mean=[0., 0., 0.], std=[1., 1., 1.], bgr_to_rgb=False))
    cfg.test_dataloader.dataset.indices = 3
    cfg.custom_imports = dict(imports=['mmrobust', 'helpers.panoptic_oracle'],
                              allow_failed_imports=False)
    config = tmp / 'oracle.py'
    cfg.dump(str(config))
    ckpt = init_checkpoint(str(config), tmp / 'oracle.pth')
    results = tmp / 'r.json'
    status, out, err = run_tool_in_process(
        'test_robustness.py', config, ckpt, '--corruptions', 'gaussian_noise', 'fog',
        '--severities', '1', '5', '--results', results,
        '--work-dir', tmp / 'w')
    assert status == 0, err[-3000:]
    log = '\n'.join(p.read_text() for p in (tmp / 'w').rglob('*.log'))
    return json.loads(results.read_text()), out, log, tmp / 'r_report'


def test_a_panoptic_run_records_pq_per_cell(oracle_run):
    results, _, log, _ = oracle_run
    pq = {(c, int(s)): v['coco_panoptic/PQ'] for c, by in results['cells'].items()
          for s, v in by.items()}
    assert pq[('clean', 0)] == pytest.approx(100.0)  # the oracle sees every thing flat
    # heavy noise hides the things (they go to the stuff around them); the clean set's PQ is not
    # what a corrupted cell records
    assert pq[('gaussian_noise', 5)] < pq[('gaussian_noise', 1)] <= 100.0
    assert pq[('gaussian_noise', 5)] < 90.0
    for cell, value in pq.items():  # the per-cell log line names PQ with its value
        assert f'{cell[0]} {cell[1]}: coco_panoptic/PQ: {value:.4f}' in log


def test_a_panoptic_runs_table_and_report_give_pq_mpc_and_rpc(oracle_run):
    results, out, _, report = oracle_run
    pq = {(c, int(s)): v['coco_panoptic/PQ'] for c, by in results['cells'].items()
          for s, v in by.items()}
    clean = pq.pop(('clean', 0))
    by_corruption = {}
    for (corruption, _), value in pq.items():
        by_corruption.setdefault(corruption, []).append(value)
    mpc = sum(sum(v) / len(v) for v in by_corruption.values()) / len(by_corruption)
    with open(report / 'summary.csv') as f:
        rows = {row['metric']: row for row in csv.DictReader(f)}
    row = rows['coco_panoptic/PQ']
    assert float(row['P_clean']) == pytest.approx(clean)
    assert float(row['mPC']) == pytest.approx(mpc)
    assert float(row['rPC']) == pytest.approx(mpc / clean)
    assert math.isfinite(float(row['rPC'])) and float(row['rPC']) < 1
    # the end-of-run table leads with PQ (the headline of a panoptic model), not SQ / RQ
    table = [line for line in out.splitlines() if '| coco_panoptic/' in line]
    assert table and all('| coco_panoptic/PQ |' in line for line in table), table
    assert f'| {clean:.3f} | {mpc:.3f} | {100 * mpc / clean:.3f} |' in table[0], table
    assert (report / 'per_corruption_coco_panoptic_PQ.png').exists()
    assert not (report / 'per_corruption_coco_panoptic_SQ.png').exists()
