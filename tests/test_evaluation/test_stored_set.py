"""A stored corrupted set is read for what it is.

Its manifest's provenance is recorded and checked (seed, colour order, half-written, failed
sources), and every sample's image is mapped into the cell's folder however its path was formed, or
refused before any inference.
"""
import json
import shutil
import types
from pathlib import Path

import pytest
from mmengine.config import Config

from mmrobust.corruptions.stored import (
    MANIFEST,
    StoredSetError,
    cell_folder,
    cell_image_path,
    read_stored_set,
    stored_set_identity,
    stored_settings,
)

from helpers import (
    DEMO_DET_CFG,
    REPO,
    assert_user_error,
    run_tool_here,
    run_tool_in_process,
)


def _manifest(root: Path, **changes) -> None:
    manifest = {'protocol': 'custom', 'seed': 0, 'channel_order': 'rgb', 'lossless': True,
                'jpeg_quality': 95, 'counts': {'images': 24}, 'failed': {}, 'converted': {}}
    manifest.update(changes)
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps(manifest))


def _stored_copy(toy_coco: Path, root: Path, cell=('fog', 3), **manifest) -> Path:
    """A stored set of one cell: the toy images copied into the cell's folder."""
    shutil.copytree(toy_coco / 'val2017', Path(cell_folder(str(root), *cell)) / 'val2017')
    _manifest(root, **manifest)
    return root


def test_the_layout_is_spelled_once(tmp_path):
    data, stored = tmp_path / 'coco', tmp_path / 'coco-c'
    assert cell_folder(str(stored), 'fog', 3) == str(stored / 'fog' / '3')
    assert cell_image_path(str(data / 'val2017' / 'a.jpg'), str(data), str(stored), 'fog',
                           3) == str(stored / 'fog' / '3' / 'val2017' / 'a.jpg')
    with pytest.raises(StoredSetError, match='not under the dataset.s data_root'):
        cell_image_path(str(tmp_path / 'elsewhere' / 'a.jpg'), str(data), str(stored), 'fog', 3)
    with pytest.raises(StoredSetError, match='no data_root'):
        cell_image_path('val2017/a.jpg', None, str(stored), 'fog', 3)


def test_a_half_written_or_failed_set_is_refused(tmp_path):
    _manifest(tmp_path / 'half', in_progress=True)
    with pytest.raises(StoredSetError, match='half-written.*Rerun the same make_corrupted.py'):
        read_stored_set(str(tmp_path / 'half'))
    _manifest(tmp_path / 'failed', failed={'val2017/a.jpg': 'truncated'})
    with pytest.raises(StoredSetError, match='1 source image.*truncated'):
        read_stored_set(str(tmp_path / 'failed'))
    (tmp_path / 'bare').mkdir()
    assert read_stored_set(str(tmp_path / 'bare')) is None  # e.g. a downloaded COCO-C
    assert stored_set_identity(None) == {'manifest': False}


def test_the_sets_seed_and_colour_order_are_its_own(tmp_path):
    _manifest(tmp_path, seed=3, channel_order='bgr')
    manifest = read_stored_set(str(tmp_path))
    assert stored_settings(str(tmp_path), manifest, None, None) == (3, True)
    assert stored_settings(str(tmp_path), manifest, 3, True) == (3, True)
    with pytest.raises(StoredSetError, match='--seed 0, but the stored set .* seed 3'):
        stored_settings(str(tmp_path), manifest, 0, None)
    with pytest.raises(StoredSetError, match='--bgr-compat is off.*BGR'):
        stored_settings(str(tmp_path), manifest, None, False)
    identity = stored_set_identity(manifest)
    assert identity['seed'] == 3 and identity['channel_order'] == 'bgr'
    assert 'source' not in identity  # where the set lies is not what it is


def _det_cfg(data_root: Path, img_prefix: str) -> Config:
    cfg = Config.fromfile(str(REPO / DEMO_DET_CFG))
    dataset = cfg.test_dataloader.dataset
    dataset.data_root, dataset.data_prefix = str(data_root), dict(img=img_prefix)
    return cfg


def test_a_stored_cell_reads_the_stored_image_with_an_absolute_data_prefix(toy_data, tmp_path):
    """Per-cell loaders: with an absolute data_prefix mmengine ignores data_root.

    So replacing data_root read the clean image under a 'fog 3' label; every sample is mapped now.
    """
    from mmengine.registry import DATASETS, init_default_scope

    from mmrobust.evaluation import cell_dataloader
    init_default_scope('mmdet')
    root = _stored_copy(toy_data['toy_coco'], tmp_path / 'c')
    cfg = _det_cfg(toy_data['toy_coco'], str(toy_data['toy_coco'] / 'val2017') + '/')
    loader = cell_dataloader(cfg, 'fog', 3, 0, False, str(root))
    dataset = DATASETS.build(loader['dataset'])
    sample = dataset[0]['data_samples']
    assert sample.img_path.startswith(str(root / 'fog' / '3' / 'val2017')), sample.img_path


@pytest.mark.parametrize('path', ['one-pass', 'per-cell'])
def test_an_image_outside_data_root_is_refused_before_inference(toy_data, tmp_path, path):
    from mmengine.registry import init_default_scope

    from mmrobust.evaluation.cell_kinds.one_pass import one_pass_loader
    from mmrobust.evaluation.cells import check_stored_leaves
    init_default_scope('mmdet')
    root = _stored_copy(toy_data['toy_coco'], tmp_path / 'c')
    elsewhere = tmp_path / 'elsewhere' / 'val2017'
    shutil.copytree(toy_data['toy_coco'] / 'val2017', elsewhere)
    cfg = _det_cfg(toy_data['toy_coco'], str(elsewhere) + '/')
    cells = [('clean', 0), ('fog', 3)]
    with pytest.raises(StoredSetError, match='is not under the dataset.s data_root'):
        if path == 'one-pass':  # NOTE: raised while building, before any batch (no runner use)
            one_pass_loader(types.SimpleNamespace(), cfg, cells, 0, False, str(root))
        else:
            check_stored_leaves(cfg, str(root), cells)


def test_a_cell_missing_from_the_set_is_refused_before_inference(toy_data, tmp_path):
    from mmengine.registry import init_default_scope

    from mmrobust.evaluation.cells import check_stored_leaves
    init_default_scope('mmdet')
    root = _stored_copy(toy_data['toy_coco'], tmp_path / 'c')
    (root / 'fog' / '4').mkdir()  # the folder, without its images
    cfg = _det_cfg(toy_data['toy_coco'], 'val2017/')
    with pytest.raises(FileNotFoundError, match='lacks images of cell fog 4'):
        check_stored_leaves(cfg, str(root), [('clean', 0), ('fog', 3), ('fog', 4)])


def test_the_tool_refuses_a_half_written_set(toy_data, tmp_path):
    root = _stored_copy(toy_data['toy_coco'], tmp_path / 'c', in_progress=True)
    status, _, err = run_tool_in_process(
        'test_robustness.py', DEMO_DET_CFG, tmp_path / 'none.pth', '--corruptions', 'fog',
        '--severities', '3', '--corrupted-root', root, '--work-dir', tmp_path / 'w')
    assert_user_error(status, err, 1, 'half-written')


@pytest.mark.slow
def test_the_results_record_the_sets_own_seed(toy_data, tmp_path):
    """A set written with --seed 3 is recorded as seed 3 (not the default 0), with its provenance.

    --seed 0 against it is refused.
    """
    from test_robustness import NO_WORKERS, _init_checkpoint
    ckpt = _init_checkpoint(DEMO_DET_CFG, tmp_path / 'det.pth')
    root = tmp_path / 'c'
    run_tool_here('make_corrupted.py', toy_data['toy_coco'], root, '--corruptions', 'fog',
                  '--severities', '3', '--seed', '3', '--lossless', '--no-progress')
    results = tmp_path / 'r.json'
    args = [DEMO_DET_CFG, ckpt, '--corruptions', 'fog', '--severities', '3', '--corrupted-root',
            root, '--results', results, '--work-dir', tmp_path / 'w', *NO_WORKERS,
            'test_dataloader.dataset.indices=2']
    run_tool_here('test_robustness.py', *args)
    data = json.loads(results.read_text())
    assert data['seed'] == 3 and data['stored_set']['seed'] == 3
    assert data['stored_set']['lossless'] is True and data['corrupted_root'] == str(root)
    status, _, err = run_tool_in_process('test_robustness.py', *args[:2], '--seed', '0',
                                         *args[2:])
    assert_user_error(status, err, 1, '--seed 0, but the stored set')
