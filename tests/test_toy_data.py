"""The toy datasets: deterministic, valid COCO / Cityscapes, loadable by mmdet and mmseg."""
import filecmp
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from mmrobust.datasets import (
    TOY_COCO_CLASSES,
    generate_toy_dataset,
    make_toy_cityscapes,
    make_toy_coco,
)


def _files(root: Path):
    return sorted(p.relative_to(root) for p in root.rglob('*') if p.is_file())


@pytest.mark.parametrize('make', [make_toy_coco, make_toy_cityscapes])
def test_same_seed_writes_identical_files(tmp_path, make):
    make(str(tmp_path / 'a'), seed=7, num_train=5, num_val=2)
    make(str(tmp_path / 'b'), seed=7, num_train=5, num_val=2)
    make(str(tmp_path / 'c'), seed=8, num_train=5, num_val=2)
    files = _files(tmp_path / 'a')
    assert files == _files(tmp_path / 'b') and len(files) >= 7
    for f in files:
        assert filecmp.cmp(tmp_path / 'a' / f, tmp_path / 'b' / f, shallow=False), f
    assert any(not filecmp.cmp(tmp_path / 'a' / f, tmp_path / 'c' / f, shallow=False)
               for f in files if (tmp_path / 'c' / f).exists())
    assert not list(tmp_path.rglob('*.tmp*')), 'temporary files left behind'


def test_images_do_not_depend_on_dataset_size(tmp_path):
    """Each image has its own generator: a bigger set starts with the same images."""
    make_toy_coco(str(tmp_path / 'small'), seed=1, num_train=3, num_val=1)
    make_toy_coco(str(tmp_path / 'big'), seed=1, num_train=6, num_val=2)
    for name in ('000000000001.jpg', '000000000003.jpg'):
        assert filecmp.cmp(tmp_path / 'small/train2017' / name, tmp_path / 'big/train2017' / name,
                           shallow=False)


@pytest.mark.slow
def test_generate_skips_complete_dataset_and_redoes_other_seed(tmp_path):
    root = tmp_path / 'toy'
    counts = generate_toy_dataset('toy_coco', str(root), seed=0)
    ann = root / 'annotations/instances_val2017.json'
    mtime = ann.stat().st_mtime_ns
    assert generate_toy_dataset('toy_coco', str(root), seed=0) == counts
    assert ann.stat().st_mtime_ns == mtime
    generate_toy_dataset('toy_coco', str(root), seed=1)
    assert json.loads((root / '.mmrobust_toy.json').read_text())['seed'] == 1
    with pytest.raises(KeyError, match='toy_coco'):
        generate_toy_dataset('toy_voc', str(root))


def test_toy_coco_is_valid_coco(toy_data):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    root = toy_data['toy_coco']
    for split in ('train', 'val'):
        coco = COCO(str(root / f'annotations/instances_{split}2017.json'))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(TOY_COCO_CLASSES)
        per_class = np.bincount([a['category_id'] for a in coco.dataset['annotations']],
                                minlength=6)[1:]
        assert (per_class > 0).all(), f'{split}: every class appears ({per_class})'
        for img_info in coco.dataset['images']:
            img = cv2.imread(str(root / f'{split}2017' / img_info['file_name']))
            h, w = img.shape[:2]
            assert (h, w) == (img_info['height'], img_info['width'])
            assert 256 <= h <= 320 and 256 <= w <= 320
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=img_info['id'])):
                x, y, bw, bh = ann['bbox']
                assert 0 <= x and 0 <= y and x + bw <= w and y + bh <= h and bw > 8 and bh > 8
                m = coco.annToMask(ann)
                assert m.shape == (h, w)
                # the polygon mask fills its box and matches the recorded area
                assert abs(int(m.sum()) - ann['area']) <= 0.1 * ann['area'] + 20
                ys, xs = np.nonzero(m)
                assert xs.min() >= np.floor(x) - 1 and xs.max() <= x + bw + 1
                rle = mask_utils.encode(np.asfortranarray(m))
                assert mask_utils.area(rle) > 16


def test_toy_coco_objects_stand_out(toy_data):
    """Objects differ from their surroundings, so the task is learnable."""
    from pycocotools.coco import COCO
    root = toy_data['toy_coco']
    coco = COCO(str(root / 'annotations/instances_val2017.json'))
    diffs = []
    for img_info in coco.dataset['images'][:10]:
        img = cv2.imread(str(root / 'val2017' / img_info['file_name'])).astype(np.float32)
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=img_info['id'])):
            m = coco.annToMask(ann).astype(bool)
            ring = cv2.dilate(m.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool) & ~m
            diffs.append(np.abs(img[m].mean(0) - img[ring].mean(0)).mean())
    assert np.median(diffs) > 25


def test_toy_cityscapes_is_valid_cityscapes(toy_data):
    root = toy_data['toy_cityscapes']
    images = sorted((root / 'leftImg8bit').rglob('*_leftImg8bit.png'))
    assert len(images) == 40
    seen = set()
    for img_path in images:
        rel = img_path.relative_to(root / 'leftImg8bit')
        stem = str(rel).replace('_leftImg8bit.png', '')
        train_ids = cv2.imread(str(root / 'gtFine' / f'{stem}_gtFine_labelTrainIds.png'),
                               cv2.IMREAD_UNCHANGED)
        ids = cv2.imread(str(root / 'gtFine' / f'{stem}_gtFine_labelIds.png'),
                         cv2.IMREAD_UNCHANGED)
        instances = cv2.imread(str(root / 'gtFine' / f'{stem}_gtFine_instanceIds.png'),
                               cv2.IMREAD_UNCHANGED)
        things = instances >= 1000  # Cityscapes: id * 1000 + k for classes with instances
        assert instances.dtype == np.uint16 and (instances[~things] == ids[~things]).all()
        assert (instances[things] // 1000 == ids[things]).all() and (ids[~things] < 24).all()
        img = cv2.imread(str(img_path))
        assert img.shape == (256, 512, 3) and train_ids.shape == (256, 512)
        values = set(np.unique(train_ids).tolist())
        assert values <= set(range(19)) | {255}
        assert (ids[train_ids == 255] == 0).all() and (ids[train_ids == 0] == 7).all()
        seen |= values
    # the common street classes are all present somewhere
    assert {0, 1, 2, 5, 8, 10, 11, 13} <= seen


def test_mmdet_and_mmseg_datasets_load_the_toy_data(toy_data, in_repo):
    from mmdet.datasets import CocoDataset
    from mmseg.datasets import CityscapesDataset
    coco = CocoDataset(data_root='data/toy_coco/', ann_file='annotations/instances_val2017.json',
                       data_prefix=dict(img='val2017/'), metainfo=dict(classes=TOY_COCO_CLASSES),
                       test_mode=True, pipeline=[])
    assert len(coco) == 24 and coco.metainfo['classes'] == TOY_COCO_CLASSES
    info = coco[0]
    assert Path(info['img_path']).is_file() and info['instances']
    city = CityscapesDataset(data_root='data/toy_cityscapes/',
                             data_prefix=dict(img_path='leftImg8bit/val',
                                              seg_map_path='gtFine/val'), pipeline=[])
    assert len(city) == 8
    assert Path(city[0]['seg_map_path']).is_file()
    # mmdet's Cityscapes instance layout: its instances, as the instanceIds maps hold them
    from mmdet.datasets import CityscapesDataset as DetCityscapes
    det = DetCityscapes(data_root='data/toy_cityscapes/', test_mode=True, pipeline=[],
                        ann_file='annotations/instancesonly_filtered_gtFine_val.json',
                        data_prefix=dict(img='leftImg8bit/val/'))
    assert len(det) == 8
    sample = det[0]
    ids = cv2.imread(sample['img_path'].replace('leftImg8bit', 'gtFine').replace(
        'gtFine.png', 'gtFine_instanceIds.png'), cv2.IMREAD_UNCHANGED)
    assert len(sample['instances']) == len(np.unique(ids[ids >= 1000])) > 0
    assert {det.metainfo['classes'][i['bbox_label']] for i in sample['instances']} <= \
        {'person', 'car', 'truck', 'bus'}
