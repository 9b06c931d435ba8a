"""tools/make_corrupted.py on the toy datasets, and the Corrupt transform in real pipelines."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import mmcv
import numpy as np
import pytest
from PIL import Image

from mmrobust.corruptions import corrupt, derive_seed
from mmrobust.corruptions.generate import MANIFEST, read_image
from mmrobust.utils.errors import ConfigError

from helpers import REPO, assert_user_error, run_tool_here, run_tool_in_process

CELLS = ['--corruptions', 'gaussian_noise', 'glass_blur', 'zoom_blur', '--severities', '2', '5']


def tree(root: Path) -> dict:
    """Relative path -> bytes of every regular file under root (links followed for files)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob('*')) if p.is_file() and p.name != MANIFEST}


@pytest.mark.slow
def test_toy_coco_c_is_deterministic_complete_and_loadable(toy_data, tmp_path):
    one, two = tmp_path / 'w1', tmp_path / 'w2'
    run_tool_here('make_corrupted.py', toy_data['toy_coco'], one, *CELLS, '--workers', '1')
    run_tool_here('make_corrupted.py', toy_data['toy_coco'], two, *CELLS, '--workers', '2',
                  '--no-progress')
    assert tree(one) == tree(two), 'the result depends on the worker count'

    manifest = json.loads((one / MANIFEST).read_text())
    val = sorted(p.name for p in (toy_data['toy_coco'] / 'val2017').iterdir())
    assert manifest['counts']['files_expected'] == len(val) * 6 == \
        manifest['counts']['files_present']
    assert manifest['seed'] == 0 and manifest['channel_order'] == 'rgb'
    for name in ('gaussian_noise', 'glass_blur', 'zoom_blur'):
        for severity in (2, 5):
            cell = one / name / str(severity)
            assert sorted(p.name for p in (cell / 'val2017').iterdir()) == val
            assert (cell / 'annotations' / 'instances_val2017.json').is_file()
            # relative links: the dataset and its corrupted copy can move together
            assert not os.path.isabs(os.readlink(cell / 'annotations'))
    # each file is the engine's output for its per-image seed (JPEG-encoded at quality 95)
    src = read_image(toy_data['toy_coco'] / 'val2017' / val[0])[0]
    expected = corrupt(src, 'zoom_blur', 5, seed=derive_seed(0, val[0], 'zoom_blur', 5))
    stored = read_image(one / 'zoom_blur' / '5' / 'val2017' / val[0])[0]
    assert np.abs(stored.astype(int) - expected).mean() < 2.0

    # every cell is a dataset mmdet loads
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    cell = one / 'glass_blur' / '5'
    dataset = DATASETS.build(dict(
        type='CocoDataset', data_root=str(cell), ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'), test_mode=True,
        pipeline=[dict(type='LoadImageFromFile'), dict(type='PackDetInputs')]))
    assert len(dataset) == len(val)
    assert dataset[0]['inputs'].shape[0] == 3


@pytest.mark.slow
def test_toy_cityscapes_c_keeps_png_and_labels(toy_data, tmp_path):
    out = tmp_path / 'cs'
    run_tool_here('make_corrupted.py', toy_data['toy_cityscapes'], out, '--protocol',
                  'cityscapes_c', '--corruptions', 'fog', 'speckle_noise', '--workers', '2',
                  '--no-progress')
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, 'fog', 'speckle_noise'])
    assert sorted(p.name for p in (out / 'speckle_noise').iterdir()) == ['1', '2', '3']
    src_imgs = sorted((toy_data['toy_cityscapes'] / 'leftImg8bit' / 'val').rglob('*.png'))
    cell = out / 'fog' / '4'
    for path in src_imgs:
        rel = path.relative_to(toy_data['toy_cityscapes'])
        stored, original = read_image(cell / rel)[0], read_image(path)[0]
        assert stored.shape == original.shape  # PNG stays PNG, lossless
        expected = corrupt(original, 'fog', 4, seed=derive_seed(0, path.name, 'fog', 4))
        assert np.array_equal(stored, expected)
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS
    init_default_scope('mmseg')
    dataset = DATASETS.build(dict(
        type='CityscapesDataset', data_root=str(cell),
        data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
        pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
                  dict(type='PackSegInputs')]))
    assert len(dataset) == len(src_imgs)
    sample = dataset[0]
    assert sample['data_samples'].gt_sem_seg.data.shape[-2:] == sample['inputs'].shape[-2:]


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_result(toy_data, tmp_path):
    args = [sys.executable, REPO / 'tools' / 'make_corrupted.py', toy_data['toy_coco'],
            tmp_path / 'run', '--corruptions', 'glass_blur', 'fog', 'snow', '--severities',
            '4', '5', '--workers', '1', '--no-progress']
    env = {**os.environ, 'PYTHONPATH': str(REPO)}
    proc = subprocess.Popen([str(a) for a in args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(list((tmp_path / 'run').rglob('*.jpg'))) >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = [p for p in (tmp_path / 'run').rglob('*.jpg')]
    assert 10 <= len(partial) < 24 * 6, 'the run was not interrupted part-way'
    for path in partial:  # every visible image is complete (atomic rename)
        with Image.open(path) as img:
            img.load()
    # the settings went down first, so the folder is guarded; the run is marked unfinished
    assert json.loads((tmp_path / 'run' / MANIFEST).read_text())['in_progress'] is True

    rerun = run_tool_here(*[str(a) for a in args[1:]])
    assert 'already there' in rerun.stdout
    manifest = json.loads((tmp_path / 'run' / MANIFEST).read_text())
    assert manifest['counts']['skipped_existing'] >= len(partial) - 1
    assert manifest['counts']['files_present'] == manifest['counts']['files_expected'] == 24 * 6
    assert 'in_progress' not in manifest
    assert not [p for p in (tmp_path / 'run').rglob('*') if '.mmrobust-tmp-' in p.name]

    fresh = tmp_path / 'fresh'
    run_tool_here(*[str(a) for a in args[1:3]], fresh, *[str(a) for a in args[4:]])
    assert tree(tmp_path / 'run') == tree(fresh)


@pytest.mark.slow
def test_every_bad_source_is_listed_and_every_good_one_corrupted(toy_data, tmp_path):
    src = tmp_path / 'folder' / 'imgs'
    shutil.copytree(toy_data['toy_coco'] / 'val2017', src)
    good = sorted(p.name for p in src.iterdir())
    rng = np.random.default_rng(0)
    data = (src / good[0]).read_bytes()
    (src / 'truncated.jpg').write_bytes(data[:len(data) // 2])
    (src / 'empty.jpg').write_bytes(b'')
    (src / 'text.png').write_bytes(b'not a png at all')
    for size in (1, 5):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), np.uint8)).save(src / f'{size}px.png')
    rgb16 = rng.integers(0, 65535, (24, 32, 3)).astype(np.uint16)
    grey16 = rng.integers(0, 65535, (24, 32)).astype(np.uint16)
    cv2.imwrite(str(src / 'rgb16.png'), rgb16[..., ::-1])
    cv2.imwrite(str(src / 'grey16.png'), grey16)
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), np.uint8)).convert('P').save(
        src / 'palette.png')

    proc = run_tool_here('make_corrupted.py', src.parent, tmp_path / 'out', '--corruptions',
                         'contrast', 'gaussian_noise', '--severities', '1', '3', '--workers', '2',
                         '--no-progress', check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / 'out' / MANIFEST).read_text())
    failed = {Path(k).name: v for k, v in manifest['failed'].items()}
    assert sorted(failed) == ['1px.png', '5px.png', 'empty.jpg', 'text.png', 'truncated.jpg']
    assert 'at least 8 px' in failed['1px.png'] and 'at least 8 px' in failed['5px.png']
    for name in failed:  # the reason and the file reach the user, not only the manifest
        assert name in proc.stderr
    converted = {Path(k).name: v for k, v in manifest['converted'].items()}
    assert sorted(converted) == ['grey16.png', 'palette.png', 'rgb16.png']
    assert '16-bit' in converted['rgb16.png'] and '16-bit' in converted['grey16.png']
    assert manifest['counts']['files_present'] == (len(good) + 3) * 4  # 2 corruptions x 2
    for name, severity in [(n, s) for n in ('contrast', 'gaussian_noise') for s in (1, 3)]:
        written = sorted(p.name for p in (tmp_path / 'out' / name / str(severity) / 'imgs')
                         .iterdir())
        assert written == sorted(good + list(converted))
    # 16-bit grey and colour are read alike: their high byte, as mmcv.imread sees them
    for name, high in (('rgb16.png', (rgb16 >> 8).astype(np.uint8)),
                       ('grey16.png', (grey16 >> 8).astype(np.uint8))):
        assert np.array_equal(read_image(src / name)[0], high)
        stored = read_image(tmp_path / 'out' / 'contrast' / '1' / 'imgs' / name)[0]
        expected = corrupt(high, 'contrast', 1, seed=derive_seed(0, name, 'contrast', 1))
        assert np.array_equal(stored, expected)


@pytest.mark.slow
def test_missing_source_is_explained(tmp_path):
    proc = run_tool_here('make_corrupted.py', tmp_path / 'nope', tmp_path / 'out', check=False)
    assert_user_error(proc.returncode, proc.stderr, 1, 'nope does not exist')
    proc = run_tool_here('make_corrupted.py', tmp_path, tmp_path / 'out', '--protocol', 'coco',
                         check=False)
    assert_user_error(proc.returncode, proc.stderr, 2, 'Valid protocols: benchmark')


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_corrupt_transform_in_test_pipelines(toy_data, in_repo, scope):
    """The transform inside the toy configs' real test pipelines, right after loading."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    config = {'mmdet': 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py',
              'mmseg': 'configs/toy/segformer_mit-b0_toy-cityscapes.py'}[scope]
    cfg = Config.fromfile(config)
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['DATASETS'])
    dataset_cfg = cfg.test_dataloader.dataset
    pipeline = list(dataset_cfg.pipeline)
    load = next(i for i, t in enumerate(pipeline) if t['type'] == 'LoadImageFromFile')
    pipeline.insert(load + 1, dict(type='Corrupt', corruption='snow', severity=3, seed=4))
    clean = registry.DATASETS.build(dataset_cfg)
    dataset_cfg.pipeline = pipeline
    corrupted = registry.DATASETS.build(dataset_cfg)
    assert 'Corrupt' in repr(corrupted.pipeline)

    a, b = clean[0], corrupted[0]
    meta = b['data_samples'].metainfo
    assert a['inputs'].shape == b['inputs'].shape
    assert not np.array_equal(a['inputs'].numpy(), b['inputs'].numpy())
    # what the transform did equals the engine on the loaded (BGR) image with its seed
    raw = mmcv.imread(meta['img_path'])
    expected = corrupt(raw, 'snow', 3, seed=derive_seed(4, Path(meta['img_path']).name, 'snow', 3),
                       channel_order='bgr')
    probe = registry.TRANSFORMS.build(dict(type='Corrupt', corruption='snow', severity=3, seed=4))
    got = probe(dict(img=raw.copy(), img_path=meta['img_path']))['img']
    assert np.array_equal(got, expected)
    # bgr_compat corrupts the BGR array as if it were RGB (mmdet's historical behaviour)
    compat = registry.TRANSFORMS.build(dict(type='Corrupt', corruption='snow', severity=3, seed=4,
                                            bgr_compat=True))
    got = compat(dict(img=raw.copy(), img_path=meta['img_path']))['img']
    assert np.array_equal(got, corrupt(raw, 'snow', 3, seed=derive_seed(
        4, Path(meta['img_path']).name, 'snow', 3), channel_order='rgb'))


def test_a_float_loading_steps_image_is_corrupted_as_its_file_bytes(toy_data, in_repo):
    """A float-loading step's image is its file's uint8 corrupted, then converted as it was.

    ``LoadImageFromFile(to_float32=True)``: mmdet's Mask2Former, CornerNet, CenterNet configs.
    """
    from mmdet.registry import TRANSFORMS
    path = next((REPO / 'data/toy_coco/val2017').glob('*.jpg'))
    steps = [TRANSFORMS.build(dict(type='LoadImageFromFile', to_float32=True)),
             TRANSFORMS.build(dict(type='Corrupt', corruption='snow', severity=3, seed=4,
                                   bgr_compat=False))]
    results = dict(img_path=str(path))
    for step in steps:
        results = step(results)
    expected = corrupt(mmcv.imread(str(path)), 'snow', 3, channel_order='bgr',
                       seed=derive_seed(4, path.name, 'snow', 3)).astype(np.float32)
    assert results['img'].dtype == np.float32 and np.array_equal(results['img'], expected)
    # what is not a loaded 8-bit file is refused with what to do, never corrupted as something else
    with pytest.raises(ConfigError, match='not whole values in \\[0, 255\\].*before any normal'):
        steps[1](dict(img=expected / 255 - 0.5, img_path=str(path)))
    with pytest.raises(ConfigError, match="uint16 image.*color_type='color'"):
        steps[1](dict(img=np.zeros((40, 40, 3), np.uint16), img_path=str(path)))


def test_corrupt_built_by_mmdets_name_says_once_that_its_colour_handling_is_not_mmdets(
        monkeypatch):
    import mmengine.logging
    from mmdet.registry import TRANSFORMS

    from mmrobust.datasets import transforms
    logged = []
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, **kw: logged.append(msg)
                        if kw.get('level', 20) >= 30 else None)  # NOTE: not the registry's
    monkeypatch.setattr(transforms, '_TOLD', [])
    TRANSFORMS.build(dict(type='Corrupt', corruption='fog', severity=1, bgr_compat=False))
    assert logged == []  # chosen explicitly: nothing to say
    for _ in range(2):  # as mmdet's own test_robustness.py builds it: said once
        assert TRANSFORMS.build(dict(type='Corrupt', corruption='fog', severity=1)).bgr_compat \
            is False
    assert len(logged) == 1 and 'bgr_compat=True' in logged[0] and "mmdet's own" in logged[0]


def test_corrupt_transform_errors():
    from mmdet.registry import TRANSFORMS
    with pytest.raises(KeyError, match='Valid corruptions'):
        TRANSFORMS.build(dict(type='Corrupt', corruption='blurry', severity=1))
    with pytest.raises(ValueError, match='1..5'):
        TRANSFORMS.build(dict(type='Corrupt', corruption='fog', severity=7))
    t = TRANSFORMS.build(dict(type='Corrupt', corruption='fog', severity=1))
    with pytest.raises(ConfigError, match='LoadImageFromFile'):
        t(dict(img_path='x.jpg'))
    assert cv2 is not None


def test_corruption_grid_shows_what_make_corrupted_writes(toy_data, tmp_path):
    """tools/analysis_tools/corruption_grid.py (in-process).

    The clean tile, then one per cell, each seeded as make_corrupted.py seeds that file, labelled,
    in --columns columns.
    """
    src = sorted((toy_data['toy_coco'] / 'val2017').iterdir())[0]
    out = tmp_path / 'grid.png'
    args = [src, '--out', out, '--corruptions', 'fog', 'snow', '--severities', '1', '5',
            '--width', '64']
    status, _, err = run_tool_in_process('analysis_tools/corruption_grid.py', *args,
                                         '--columns', '0')
    assert_user_error(status, err, 2, 'must be >= 1')
    status, _, _ = run_tool_in_process('analysis_tools/corruption_grid.py', *args,
                                       '--columns', '2')
    assert status == 0
    grid = cv2.cvtColor(cv2.imread(str(out)), cv2.COLOR_BGR2RGB)
    img = read_image(src)[0]
    th = round(img.shape[0] * 64 / img.shape[1])
    strip = 14
    assert grid.shape == (3 * (th + strip), 2 * 64, 3)  # clean + 4 cells in 2 columns
    for i, (name, sev) in enumerate([('fog', 1), ('fog', 5), ('snow', 1), ('snow', 5)], 1):
        r, c = divmod(i, 2)
        expected = cv2.resize(corrupt(img, name, sev, seed=derive_seed(0, src.name, name, sev)),
                              (64, th), interpolation=cv2.INTER_AREA)
        y = r * (th + strip) + strip
        assert np.array_equal(grid[y:y + th, c * 64:(c + 1) * 64], expected), (name, sev)
    assert np.any(grid[r * (th + strip):r * (th + strip) + strip] < 128)  # a label is drawn
