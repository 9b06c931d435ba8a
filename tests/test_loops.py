"""The overlapped loops as OpenMMLab loops: named from any config, mmengine's numbers and contract.

``OverlappedTestLoop`` / ``OverlappedValLoop`` (mmrobust/engine/runner/loops.py) are built by
mmengine's runner from ``test_cfg`` / ``val_cfg``; mmdet's and mmseg's own ``tools/test.py`` and
``tools/train.py`` (from the installed packages) run them and report mmengine's loops' numbers.
"""
import pickle
import re
import sys
from pathlib import Path

import mmdet
import mmseg
import pytest
import torch
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.model import BaseModel

from mmrobust.engine.runner import OverlappedTestLoop, OverlappedValLoop

from helpers import init_checkpoint, run_cmd

MMDET_TOOLS = Path(mmdet.__file__).parent / '.mim' / 'tools'
MMSEG_TOOLS = Path(mmseg.__file__).parent / '.mim' / 'tools'
DET = 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'
SEG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_a_config_names_the_loops_with_or_without_the_scope(scope):
    import importlib

    from mmengine.registry import LOOPS, DefaultScope
    scoped = importlib.import_module(f'{scope}.registry').LOOPS
    with DefaultScope.overwrite_default_scope(scope):
        for name, cls in (('OverlappedTestLoop', OverlappedTestLoop),
                          ('OverlappedValLoop', OverlappedValLoop)):
            # NOTE: the scoped name needs no custom_imports: mmengine imports mmrobust.registry
            assert scoped.get(f'mmrobust.{name}') is cls
            assert LOOPS.get(f'mmrobust.{name}') is cls
            assert scoped.get(name) is cls  # NOTE: registered in mmdet's and mmseg's too


def test_a_scoped_name_needs_no_custom_imports():
    """mmengine imports ``mmrobust.registry`` for a ``mmrobust.`` name: mmrobust registers it."""
    code = ('import sys\nfrom mmengine.registry import DefaultScope\nimport mmdet.registry as r\n'
            "with DefaultScope.overwrite_default_scope('mmdet'):\n"
            "    loop = r.LOOPS.get('mmrobust.OverlappedTestLoop')\n"
            "print(loop.__module__, 'mmrobust' in sys.modules)")
    assert run_cmd([sys.executable, '-c', code]).stdout.split() == [
        'mmrobust.engine.runner.loops', 'True']
    from mmengine.config import Config

    from mmrobust.utils import MissingCustomImportsError, check_custom_imports
    check_custom_imports(Config(dict(test_cfg=dict(type='mmrobust.OverlappedTestLoop'))))
    with pytest.raises(MissingCustomImportsError, match='OverlappedTestLoop'):
        check_custom_imports(Config(dict(test_cfg=dict(type='OverlappedTestLoop'))))


class _Doubler(BaseModel):
    """A model whose ``test_step`` / ``val_step`` are ``BaseModel``'s: preprocessor, predict."""

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return [x * 2 for x in inputs]


class _Runner:
    def __init__(self, model) -> None:
        self.model, self.hooks = model, []

    def call_hook(self, name, **kwargs):
        self.hooks.append((name, kwargs.get('batch_idx')))


class _Sum(BaseMetric):
    """The sum of every output, and the outputs in the order processed."""

    def process(self, data_batch, data_samples):
        self.results += [float(x.sum()) for x in data_samples]

    def compute_metrics(self, results):
        return {'sum': sum(results), 'order': list(results)}


@pytest.mark.parametrize('loop_cls,stage', [(OverlappedTestLoop, 'test'),
                                            (OverlappedValLoop, 'val')])
def test_run_iter_keeps_mmengines_contract(loop_cls, stage):
    batches = [{'inputs': [torch.full((2, 2), float(i))]} for i in range(5)]
    runner = _Runner(_Doubler())
    evaluator = Evaluator([_Sum()])
    loop = loop_cls(runner, torch.utils.data.DataLoader(batches, batch_size=None), evaluator,
                    post_process_queue=2, prefetch=2)
    metrics = loop.run()
    # every batch preprocessed ahead, predicted, post-processed in order before the metric
    assert metrics == {'sum': sum(8.0 * i for i in range(5)),
                       'order': [8.0 * i for i in range(5)]}
    assert runner.hooks[:2] == [(f'before_{stage}', None), (f'before_{stage}_epoch', None)]
    assert [h for h in runner.hooks if h[0] == f'after_{stage}_iter'] == [
        (f'after_{stage}_iter', i) for i in range(5)]
    assert runner.hooks[-1] == (f'after_{stage}', None)
    # run_iter(idx, data_batch) with a batch the loop did not prefetch: the model's own step,
    # as mmengine's loop would run it
    loop.run_iter(0, {'inputs': [torch.ones(2, 2)]})
    loop.finish_batches()
    loop.close()
    assert evaluator.metrics[0].results == [8.0]


def _metrics(stdout: str, prefix: str) -> dict:
    """The last ``<prefix>/...: value`` numbers an mmengine log printed."""
    found = {}
    for key, value in re.findall(rf'({prefix}/\w+): (-?[0-9.]+)', stdout):
        found[key] = float(value)
    return found


@pytest.mark.slow
def test_mmdets_own_test_tool_gives_testloops_numbers_and_predictions(toy_data, tmp_path):
    ckpt = init_checkpoint(DET, tmp_path / 'det.pth')
    # NOTE: every box of the untrained model kept, so that the predictions compared are many
    extra = ['model.test_cfg.rcnn.score_thr=0.0', 'test_dataloader.dataset.indices=4']
    runs = {}
    for loop in ('TestLoop', 'mmrobust.OverlappedTestLoop'):
        out = tmp_path / f'{loop}.pkl'
        log = run_cmd([sys.executable, MMDET_TOOLS / 'test.py', DET, ckpt, '--work-dir',
                       tmp_path / loop, '--out', out, '--cfg-options', f'test_cfg.type={loop}',
                       'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False',
                       *extra])
        log = log.stdout + log.stderr
        with open(out, 'rb') as f:
            runs[loop] = (_metrics(log, 'coco'), pickle.load(f))
        # the runner built the loop the config names, and it overlapped
        assert ('OverlappedTestLoop: batches received and preprocessed 2 ahead on a thread; '
                'post-processed on a thread behind the model, at most 2 waiting' in log) == (
                    loop != 'TestLoop')
    (plain, plain_preds), (overlapped, overlapped_preds) = runs.values()
    assert set(plain) >= {'coco/bbox_mAP', 'coco/segm_mAP'} and plain == overlapped
    assert len(plain_preds) == 4 and sum(len(p['pred_instances']['scores'])
                                         for p in plain_preds) > 0
    for a, b in zip(plain_preds, overlapped_preds):
        assert a['img_id'] == b['img_id']
        for key in ('bboxes', 'scores', 'labels'):
            assert torch.equal(torch.as_tensor(a['pred_instances'][key]),
                               torch.as_tensor(b['pred_instances'][key]))
        assert a['pred_instances']['masks'] == b['pred_instances']['masks']


@pytest.mark.slow
def test_mmsegs_own_tools_validate_and_test_with_the_overlapped_loops(toy_data, tmp_path):
    ckpt = init_checkpoint(SEG, tmp_path / 'seg.pth')
    work = tmp_path / 'train'
    loaders = [f'{split}_dataloader.{key}' for split in ('train', 'val')
               for key in ('num_workers=0', 'persistent_workers=False')]
    # a training run validating with the overlapped loop: two iterations, then validation
    train = run_cmd([sys.executable, MMSEG_TOOLS / 'train.py', SEG, '--work-dir', work,
                     '--cfg-options', 'val_cfg.type=mmrobust.OverlappedValLoop',
                     f'load_from={ckpt}', 'train_cfg.max_iters=2', 'train_cfg.val_interval=2',
                     'default_hooks.checkpoint.interval=2', 'train_dataloader.batch_size=2',
                     *loaders])
    train_log = train.stdout + train.stderr
    assert 'OverlappedValLoop: batches received and preprocessed 2 ahead' in train_log
    validated = _seg_metrics(train_log)
    numbers = {}
    for loop in ('TestLoop', 'mmrobust.OverlappedTestLoop'):
        proc = run_cmd([sys.executable, MMSEG_TOOLS / 'test.py', SEG, work / 'iter_2.pth',
                        '--work-dir', tmp_path / loop, '--cfg-options', f'test_cfg.type={loop}',
                        'test_dataloader.num_workers=0',
                        'test_dataloader.persistent_workers=False'])
        log = proc.stdout + proc.stderr
        assert ('OverlappedTestLoop: batches received' in log) == (loop != 'TestLoop')
        numbers[loop] = _seg_metrics(log)
    plain, overlapped = numbers.values()
    assert set(plain) == {'aAcc', 'mIoU', 'mAcc'} and float(plain['aAcc']) > 0
    # the same numbers from mmengine's TestLoop, the overlapped one, and the validation during
    # training (the same model on the same set)
    assert plain == overlapped == validated


def _seg_metrics(log: str) -> dict:
    """The last aAcc / mIoU / mAcc an mmseg log printed (as printed)."""
    return dict(re.findall(r'\b(aAcc|mIoU|mAcc): (-?[0-9.]+)', log))
