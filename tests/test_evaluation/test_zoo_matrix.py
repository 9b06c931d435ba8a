"""Stock mmdet / mmseg zoo configs through ``tools/test_robustness.py``: a compatibility matrix.

Each case is the installed package's own config (random initialisation, no download; the tiny
COCO-80 or Cityscapes set, one image, a smaller test scale and the RPN's proposals scaled with it:
``helpers.zoo``) with one corruption cell and one FGSM cell in one run. The architectures the
robustness guide lists as covered. The panoptic configs score PQ with mmdet's
``CocoPanopticMetric`` (``test_panoptic.py``: its numbers). mmdet's Mask2Former instance config
runs unchanged in ``test_user_modules.py``.
"""
import json
import math

import pytest

from helpers import init_checkpoint, run_tool_in_process
from helpers.zoo import tiny_coco_panoptic, zoo_config

DET = [
    'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',  # two-stage
    'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    'cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py',
    'retinanet/retinanet_r50_fpn_1x_coco.py',  # one-stage
    'fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py',
    'yolox/yolox_s_8xb8-300e_coco.py',
    'rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
    'rtmdet/rtmdet-ins_tiny_8xb32-300e_coco.py',
    'detr/detr_r50_8xb2-150e_coco.py',  # query-based
    'deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
    'dino/dino-4scale_r50_8xb2-12e_coco.py',
    'solov2/solov2_r50_fpn_1x_coco.py',  # masks without boxes
    'condinst/condinst_r50_fpn_ms-poly-90k_coco_instance.py',
    'mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py',  # panoptic
    'panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py',
]
SEG = [
    'segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py',
    'deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py',
    'pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py',
    'swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    'segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py',
    'mask2former/mask2former_r50_8xb2-90k_cityscapes-512x1024.py',
    'pidnet/pidnet-s_2xb6-120k_1024x1024-cityscapes.py',  # real-time
    'stdc/stdc1_4xb12-80k_cityscapes-512x1024.py',
    'bisenetv2/bisenetv2_fcn_4xb4-160k_cityscapes-1024x1024.py',
]


@pytest.fixture(scope='module')
def tiny_coco(tmp_path_factory) -> str:
    """A COCO-80 instance set of one 640x480 image (polygon masks), and its panoptic annotations."""
    return tiny_coco_panoptic(str(tmp_path_factory.mktemp('tiny_coco')), 1)


@pytest.mark.slow
@pytest.mark.parametrize('name', [f'mmdet::{c}' for c in DET] + [f'mmseg::{c}' for c in SEG])
def test_a_stock_config_runs_a_corruption_and_an_attack_cell(name, toy_data, tiny_coco,
                                                             tmp_path):
    seg = name.startswith('mmseg')
    root = str(toy_data['toy_cityscapes']) if seg else tiny_coco
    config = zoo_config(name, tmp_path, root,
                        None if seg else 'annotations/instances_val2017.json')
    ckpt = init_checkpoint(str(config), tmp_path / 'init.pth')
    results = tmp_path / 'r.json'
    status, out, err = run_tool_in_process(
        'test_robustness.py', config, ckpt, '--corruptions', 'fog', '--severities', '1',
        '--attacks', 'fgsm_linf', '--epsilons', '2/255', '--metric-queue', '0', '--results',
        results, '--work-dir', tmp_path / 'w')
    assert status == 0, err[-3000:]
    cells = json.loads(results.read_text())['cells']
    assert set(cells) == {'clean', 'fog', 'fgsm_linf'}
    for by_level in cells.values():
        scores = next(iter(by_level.values()))
        # mIoU, or box / mask AP (SOLOv2 predicts masks only), or PQ
        assert any(k == 'mIoU' if seg else k in ('coco/bbox_mAP', 'coco/segm_mAP',
                                                 'coco_panoptic/PQ') for k in scores), scores
        if 'panoptic' in name:
            assert 'coco_panoptic/PQ' in scores, scores
        assert all(math.isfinite(v) for v in scores.values() if isinstance(v, float))


def test_a_two_stage_zoo_config_proposes_for_its_smaller_image(tmp_path):
    """The RPN's counts scale with the image's area (1000 on 1333x800 -> 96 on 320x320)."""
    from mmengine.config import Config

    from mmrobust.utils.config_checks import resolve_config_path

    from helpers.zoo import PROPOSAL_SCALE
    name = 'mmdet::cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py'
    path = zoo_config(name, tmp_path, str(tmp_path), 'annotations/instances_val2017.json')
    model = Config.fromfile(str(path)).model
    stock = Config.fromfile(resolve_config_path(name)).model
    assert round(1000 * PROPOSAL_SCALE) == 96 and stock.test_cfg.rpn.max_per_img == 1000
    for section, key in (('test_cfg', 'rpn'), ('train_cfg', 'rpn_proposal')):
        for count in ('nms_pre', 'max_per_img'):
            assert model[section][key][count] == round(stock[section][key][count] * PROPOSAL_SCALE)
    assert model.test_cfg.rcnn == stock.test_cfg.rcnn  # the rest as the zoo has it
