"""The one-pass loop's data is byte-identical to a per-cell rebuild.

The one-pass loop's data: every cell's model inputs byte-identical to a per-cell rebuild, with 0, 1
and 2 workers, batch sizes 1 and 3, on the fly and from a stored set.
"""
import hashlib
from typing import Dict, List, Tuple

import pytest
from mmengine.config import Config

from helpers import DEMO_DET_CFG, REPO, robustness_runner, run_tool

CELLS = [('clean', 0), ('gaussian_noise', 2), ('contrast', 5), ('jpeg_compression', 1)]


def _runner(cfg: Config, tmp_path):
    from mmrobust.apis import apply_common_args, build_runner
    cfg = apply_common_args(cfg, cfg.filename, 'none', str(tmp_path / 'work'), None)
    return build_runner(cfg, ('test_dataloader', ))


def _digests(batches) -> Dict[str, str]:
    """img_path's file name -> sha256 of the model input (the packed image tensor)."""
    out = {}
    for batch in batches:
        for image, sample in zip(batch['inputs'], batch['data_samples']):
            digest = hashlib.sha256(image.contiguous().numpy().tobytes())
            digest.update(str(tuple(image.shape)).encode())
            out[sample.img_path.rsplit('/', 1)[-1]] = digest.hexdigest()
    return out


def _per_cell(runner, cfg, cells, corrupted_root) -> List[Dict[str, str]]:
    from mmrobust.evaluation import cell_dataloader
    return [_digests(runner.build_dataloader(cell_dataloader(
        cfg, None if c == 'clean' else c, s, 0, False, corrupted_root))) for c, s in cells]


def _one_pass(runner, cfg, cells, corrupted_root) -> Tuple[List[Dict[str, str]], int]:
    from mmrobust.evaluation.cell_kinds.one_pass import one_pass_loader
    loader, per_cell = one_pass_loader(runner, cfg, cells, 0, False, corrupted_root)
    out: List[Dict[str, str]] = [{} for _ in cells]
    for index, batch in enumerate(loader):
        out[index // per_cell].update(_digests([batch]))
    return out, per_cell


@pytest.mark.parametrize('stored', [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=['on-the-fly', 'stored'])
def test_one_pass_inputs_equal_per_cell_rebuild(toy_data, tmp_path, stored):
    root = None
    if stored:
        root = tmp_path / 'coco-c'
        run_tool('make_corrupted.py', toy_data['toy_coco'], root, '--corruptions',
                 *[c for c, _ in CELLS[1:]], '--severities', '1', '2', '5', '--lossless',
                 '--workers', '2', '--no-progress')
        root = str(root)
    cfg = Config.fromfile(str(REPO / DEMO_DET_CFG))
    cfg.test_dataloader.num_workers, cfg.test_dataloader.persistent_workers = 0, False
    runner = _runner(cfg, tmp_path)
    reference = _per_cell(runner, cfg, CELLS, root)
    assert all(len(r) == 24 for r in reference)
    assert reference[0] != reference[1]  # the cells differ
    for workers, batch_size in ((0, 1), (1, 3), (2, 3)):
        cfg.test_dataloader.num_workers, cfg.test_dataloader.batch_size = workers, batch_size
        # the cells in another order give each cell the same inputs
        order = CELLS if workers != 1 else CELLS[::-1]
        got, per_cell = _one_pass(runner, cfg, order, root)
        assert per_cell == -(-24 // batch_size)
        for cell, digests in zip(order, got):
            assert digests == reference[CELLS.index(cell)], (cell, workers, batch_size)


@pytest.mark.slow
def test_one_pass_parses_annotations_once_and_says_where_the_time_went(toy_data, tmp_path,
                                                                       monkeypatch, capsys):
    """Three cells: the COCO annotations are parsed once by the dataset and once by the metric.

    Not once per cell. One progress line counts images; the time summary is in the log and in the
    results file.
    """
    from mmdet.datasets import CocoDataset
    from test_robustness import _init_checkpoint

    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustCocoMetric, RobustnessOptions, evaluate_robustness
    counts = {'dataset': 0, 'metric': 0}
    load, init = CocoDataset.load_data_list, RobustCocoMetric.__init__

    def counting_load(self):
        counts['dataset'] += 1
        return load(self)

    def counting_init(self, *args, **kwargs):
        counts['metric'] += 1
        init(self, *args, **kwargs)
    monkeypatch.setattr(CocoDataset, 'load_data_list', counting_load)
    monkeypatch.setattr(RobustCocoMetric, '__init__', counting_init)
    monkeypatch.setenv('MMROBUST_PROGRESS_INTERVAL_S', '1000')

    ckpt = _init_checkpoint(DEMO_DET_CFG, tmp_path / 'det.pth')
    runner, cfg = robustness_runner(DEMO_DET_CFG, str(tmp_path / 'work'), str(ckpt), {
        'test_dataloader.num_workers': 1, 'test_dataloader.persistent_workers': False,
        'test_dataloader.dataset.indices': 4})
    capsys.readouterr()
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, ['gaussian_noise', 'fog'],
                                                             [1]),
                               str(tmp_path / 'r.json'),
                               RobustnessOptions(checkpoint=str(ckpt), metric_queue=0))
    assert counts == {'dataset': 1, 'metric': 1}
    assert data['loader'] == 'one-pass' and len(data['cells']) == 3
    err = capsys.readouterr().err
    assert 'custom: 12/12 images (100%)' in err and 'ETA' in err
    summary = data['time']
    parts = ('inference_s', 'data_wait_s', 'metric_wait_s', 'save_s', 'setup_other_s')
    assert set(summary['shares']) == set(parts)
    assert sum(summary[k] for k in parts) == pytest.approx(summary['wall_s'], abs=0.01)
    assert summary['metric_wait_s'] > 0 and summary['inference_s'] > 0
    with open(runner.log_dir + f'/{runner.timestamp}.log') as f:
        assert 'where the time went: inference' in f.read()
