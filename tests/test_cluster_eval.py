"""The robustness loop on several ranks (2-process gloo groups): a rank without a batch in a
cell, rank 0 waiting on its metric worker, the worker's imports and the fork of the loader's
workers."""
import os
from pathlib import Path

from conftest import REPO, run_ranks

SEG_CFG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def _evaluate(rank: int, world: int, config: str, ckpt: str, work: str, options: dict,
              corruptions: list, kwargs: dict) -> dict:
    """One rank of a robustness run of ``config`` (the cells of ``corruptions`` at severity 1);
    rank 0 returns the results' cells."""
    os.chdir(REPO)
    from mmengine.config import Config

    from mmrobust.apis import apply_common_args, apply_test_args, build_runner
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import evaluate_robustness
    cfg = Config.fromfile(str(REPO / config))
    cfg = apply_common_args(cfg, str(REPO / config), 'none', work, options)
    cfg = apply_test_args(cfg, ckpt, None, False, None, 0, False)
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    runner.load_or_resume()
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, corruptions, [1]),
                               str(Path(work) / 'results.json'), progress=False, **kwargs)
    return data.get('cells', {})


ONE_IMAGE = {'test_dataloader.num_workers': 0, 'test_dataloader.persistent_workers': False,
             'test_dataloader.dataset.indices': 1, 'test_dataloader.sampler.round_up': False}


def test_a_rank_without_a_batch_in_a_cell_takes_part_and_the_numbers_equal_one_ranks(
        toy_data, tmp_path, monkeypatch):
    """One image on 2 ranks with round_up=False: rank 1 has no batch in any cell. It gathers
    every cell with rank 0 (before, rank 0 waited in the gather until the group's timeout),
    and the cells equal a 1-rank run's."""
    from test_robustness import _init_checkpoint
    ckpt = str(_init_checkpoint(SEG_CFG, tmp_path / 'seg.pth'))
    args = (ONE_IMAGE, ['gaussian_noise', 'fog'], {'metric_queue': 0, 'per_image': False})
    two = run_ranks(_evaluate, SEG_CFG, ckpt, str(tmp_path / 'w2'), *args, limit=120,
                    group_timeout_s=20)[0]
    monkeypatch.chdir(REPO)
    one = _evaluate(0, 1, SEG_CFG, ckpt, str(tmp_path / 'w1'), *args)  # NOTE: in this process
    assert sorted(two) == ['clean', 'fog', 'gaussian_noise']
    assert two == one
