"""Stock mmdet / mmseg zoo configs made to run on the suite's tiny sets.

The config is the installed package's own, with only what a tiny CPU run needs changed: random
initialisation (no pretrained download), the test set pointed at a tiny COCO-80 or Cityscapes
set (one image, no workers), a smaller test scale and, for the detectors with an RPN, as many
proposals per image as the smaller image holds. Its model, pipeline steps, metric and loops are
the zoo's.
"""
from pathlib import Path
from typing import Any, Optional, Tuple

#: the test scale every zoo config is run at: small enough for a CPU, large enough for the
#: strides of every architecture sampled (DINO selects 900 queries among the encoder positions;
#: a segmentor's stride-32 map is 8x4 at 256x128)
DET_SCALE = (320, 320)
SEG_SCALE = (256, 128)
#: the RPN's proposals per image (``nms_pre``, ``max_per_img``) scaled with the image's area:
#: COCO's configs ask for 1000 on a 1333x800 image; an untrained RPN's 1000 random boxes made
#: RoIAlign (adaptive sampling, every cascade stage) most of a two-stage model's CPU time
PROPOSAL_SCALE = DET_SCALE[0] * DET_SCALE[1] / (1333 * 800)


def _no_pretrained(obj: Any) -> Any:
    """Every ``init_cfg`` of type ``Pretrained`` and every ``pretrained`` path cleared."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key == 'pretrained' and isinstance(value, str):
                value = None
            elif key == 'init_cfg' and isinstance(value, dict) and \
                    value.get('type') == 'Pretrained':
                value = None
            out[key] = _no_pretrained(value)
        return out
    if isinstance(obj, list):
        return [_no_pretrained(v) for v in obj]
    return obj


def _fewer_proposals(model: dict) -> dict:
    """The RPN's proposal counts (testing, and training for the attacks' loss) x PROPOSAL_SCALE."""
    for section, key in (('test_cfg', 'rpn'), ('train_cfg', 'rpn_proposal')):
        rpn = (model.get(section) or {}).get(key)
        if isinstance(rpn, dict):
            for count in ('nms_pre', 'max_per_img'):
                if isinstance(rpn.get(count), int):
                    rpn[count] = max(1, round(rpn[count] * PROPOSAL_SCALE))
    return model


def _small(pipeline: list, scale: Tuple[int, int]) -> list:
    steps = []
    for step in pipeline:
        step = dict(step)
        if step.get('type') in ('Resize', 'RandomResize', 'mmdet.Resize') and 'scale' in step:
            step['scale'] = scale
        if step.get('type') == 'TestTimeAug':
            raise ValueError('a test-time-augmentation pipeline: not sampled')
        if step.get('type') == 'LoadAnnotations':
            step.pop('reduce_zero_label', None)  # NOTE: ADE20K's; the tiny set is Cityscapes'
        steps.append(step)
    return steps


def tiny_coco(root: str, n: int = 1) -> str:
    """A COCO-80 instance set of ``n`` 640x480 images (polygon masks), mmdet's class names."""
    import json
    import os

    import cv2
    import numpy as np
    from mmdet.datasets import CocoDataset

    from mmrobust.datasets.synthetic_coco import synthetic_coco_gt
    gt = synthetic_coco_gt(n, 80, size=(480, 640), seed=0)
    for cat, name in zip(gt['categories'], CocoDataset.METAINFO['classes']):
        cat['name'] = name  # NOTE: mmdet's COCO configs map classes to ids by these names
    os.makedirs(os.path.join(root, 'val2017'), exist_ok=True)
    os.makedirs(os.path.join(root, 'annotations'), exist_ok=True)
    rng = np.random.default_rng(0)
    for img in gt['images']:
        image = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        for ann in gt['annotations']:
            if ann['image_id'] == img['id']:
                poly = np.asarray(ann['segmentation'][0]).reshape(-1, 2).round().astype(np.int32)
                cv2.fillPoly(image, [poly], tuple(int(c) for c in rng.integers(0, 256, 3)))
        cv2.imwrite(os.path.join(root, 'val2017', img['file_name']), image)
    with open(os.path.join(root, 'annotations', 'instances_val2017.json'), 'w') as f:
        json.dump(gt, f)
    return root


def tiny_coco_panoptic(root: str, n: int = 1) -> str:
    """:func:`tiny_coco` with its COCO panoptic annotations (mmdet's 133 classes).

    Each image's things are its instances (the later one on top where they overlap), the rest of
    the image one stuff segment; ``annotations/panoptic_val2017/`` holds the id PNGs (RGB-encoded
    ids, as COCO's), ``annotations/panoptic_val2017.json`` their segments.
    """
    import json
    import os

    import cv2
    import numpy as np
    from mmdet.datasets import CocoPanopticDataset
    from panopticapi.utils import id2rgb

    tiny_coco(root, n)
    with open(os.path.join(root, 'annotations', 'instances_val2017.json')) as f:
        gt = json.load(f)
    meta = CocoPanopticDataset.METAINFO
    # NOTE: mmdet maps classes to ids by name; ids 1..133, things first as in mmdet's list
    categories = [{'id': i + 1, 'name': name, 'supercategory': 'x',
                   'isthing': int(name in meta['thing_classes'])}
                  for i, name in enumerate(meta['classes'])]
    thing_id = {c['name']: c['id'] for c in categories}
    names = {c['id']: c['name'] for c in gt['categories']}
    stuff = categories[len(meta['thing_classes'])]['id']
    out_dir = os.path.join(root, 'annotations', 'panoptic_val2017')
    os.makedirs(out_dir, exist_ok=True)
    annotations = []
    for img in gt['images']:
        pan = np.full((img['height'], img['width']), 1000, np.int64)  # NOTE: 1000: the stuff
        labels = {1000: stuff}
        for k, ann in enumerate(a for a in gt['annotations'] if a['image_id'] == img['id']):
            poly = np.asarray(ann['segmentation'][0]).reshape(-1, 2).round().astype(np.int32)
            mask = np.zeros_like(pan, np.uint8)
            cv2.fillPoly(mask, [poly], 1)
            pan[mask > 0] = k + 1
            labels[k + 1] = thing_id[names[ann['category_id']]]
        segments = []
        for seg_id, cat in labels.items():
            ys, xs = np.nonzero(pan == seg_id)
            if len(xs):
                x0, y0 = int(xs.min()), int(ys.min())
                segments.append({'id': seg_id, 'category_id': cat, 'iscrowd': 0,
                                 'area': int(len(xs)), 'bbox': [x0, y0, int(xs.max()) - x0 + 1,
                                                                int(ys.max()) - y0 + 1]})
        file_name = img['file_name'].rsplit('.', 1)[0] + '.png'
        cv2.imwrite(os.path.join(out_dir, file_name), id2rgb(pan)[..., ::-1])
        annotations.append({'image_id': img['id'], 'file_name': file_name,
                            'segments_info': segments})
    with open(os.path.join(root, 'annotations', 'panoptic_val2017.json'), 'w') as f:
        json.dump({'images': gt['images'], 'annotations': annotations,
                   'categories': categories}, f)
    return root


def _point_at(evaluator: Any, data_root: str, ann_file: str) -> Any:
    """The test evaluator's COCO metrics pointed at the tiny set's annotation files."""
    if isinstance(evaluator, (list, tuple)):
        return [_point_at(e, data_root, ann_file) for e in evaluator]
    evaluator = dict(evaluator)
    if evaluator.get('type') == 'CocoPanopticMetric':
        evaluator.update(ann_file=f'{data_root}/annotations/panoptic_val2017.json',
                         seg_prefix=f'{data_root}/annotations/panoptic_val2017/')
    else:
        evaluator['ann_file'] = f'{data_root}/{ann_file}'
    return evaluator


def zoo_config(name: str, out: Path, data_root: str, ann_file: Optional[str] = None) -> Path:
    """The stock config ``name`` (``mmdet::...``) for the tiny set at ``data_root``, as a file."""
    from mmengine.config import Config

    from mmrobust.utils.config_checks import resolve_config_path
    cfg = Config.fromfile(resolve_config_path(name))
    seg = cfg.get('default_scope') == 'mmseg'
    cfg.model = _no_pretrained(cfg.model.to_dict())
    if not seg:
        cfg.model = _fewer_proposals(cfg.model)
    loader = cfg.test_dataloader
    loader.update(batch_size=1, num_workers=0, persistent_workers=False)
    dataset = loader.dataset
    dataset.data_root = data_root
    dataset.indices = 1
    dataset.pipeline = _small(dataset.pipeline, SEG_SCALE if seg else DET_SCALE)
    if seg:
        dataset.update(type='CityscapesDataset',
                       data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
                       img_suffix='_leftImg8bit.png', seg_map_suffix='_gtFine_labelTrainIds.png')
    else:
        if dataset.type == 'CocoPanopticDataset':
            dataset.update(ann_file='annotations/panoptic_val2017.json',
                           data_prefix=dict(img='val2017/', seg='annotations/panoptic_val2017/'))
            ann_file = 'annotations/instances_val2017.json'  # NOTE: Mask2Former's instance metric
        else:
            dataset.update(ann_file=ann_file, data_prefix=dict(img='val2017/'))
        cfg.test_evaluator = _point_at(cfg.test_evaluator, data_root, ann_file)
    cfg.custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)
    path = out / (Path(name.split('::')[1]).stem + '.py')
    cfg.dump(str(path))
    return path
