"""End-to-end: tools/train.py, tools/test.py, the torchrun and Slurm launchers, on the toy data."""
import json
import os
import pickle
import stat
import sys
from pathlib import Path

import pytest

from mmrobust.utils import safe_load

from helpers import REPO, assert_user_error, free_port, run_cmd, run_tool, run_tool_here

DET_CFG = 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'
SEG_CFG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def _short(iters: int, ckpt_interval: int = 0, validate: bool = True) -> list:
    """--cfg-options for a run of ``iters`` iterations in the test process budget."""
    val = f'train_cfg.val_interval={iters}' if validate else 'train_cfg.val_begin=1000'
    return ['--cfg-options', f'train_cfg.max_iters={iters}', val,
            f'default_hooks.checkpoint.interval={ckpt_interval or iters}',
            'default_hooks.logger.interval=1', 'train_dataloader.batch_size=2',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
            'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']


def _scalars(work_dir: Path) -> list:
    logs = sorted(work_dir.glob('*/vis_data/scalars.json'))
    assert logs, f'no scalars.json under {work_dir}'
    return [json.loads(line) for log in logs for line in log.read_text().splitlines()]


@pytest.mark.slow
def test_detection_train_test_and_resume(toy_data, tmp_path):
    work = tmp_path / 'det'
    run_tool_here('train.py', DET_CFG, '--work-dir', work, *_short(4, ckpt_interval=2))
    assert (work / 'iter_4.pth').is_file() and (work / 'last_checkpoint').is_file()
    records = _scalars(work)
    assert any('coco/bbox_mAP' in r for r in records) and any('coco/segm_mAP' in r for r in records)

    # resume (auto: latest checkpoint of the work dir) continues the iteration count
    # (no validation this time: the first run validated)
    proc = run_tool_here('train.py', DET_CFG, '--work-dir', work, '--resume',
                         *_short(6, 2, validate=False))
    ckpt = safe_load(str(work / 'iter_6.pth'))
    assert ckpt['meta']['iter'] == 6
    iters = [r['iter'] for r in _scalars(work) if 'loss' in r]
    assert iters[-2:] == [5, 6] and 'resumed' in (proc.stdout + proc.stderr).lower()

    preds = tmp_path / 'preds.pkl'
    proc = run_tool_here('test.py', DET_CFG, work / 'iter_6.pth', '--work-dir', tmp_path / 'test',
                         '--out', preds, '--cfg-options', 'test_dataloader.num_workers=0',
                         'test_dataloader.persistent_workers=False')
    assert 'coco/bbox_mAP' in proc.stdout + proc.stderr
    with open(preds, 'rb') as f:
        results = pickle.load(f)
    assert len(results) == 24 and 'pred_instances' in results[0]


@pytest.mark.slow
@pytest.mark.parametrize('config', ['configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py',
                                    'configs/toy/segformer_fan-t-hybrid_toy-cityscapes.py'])
def test_fan_toy_configs_train(config, toy_data, tmp_path):
    work = tmp_path / 'fan'
    proc = run_tool_here('train.py', config, '--work-dir', work, *_short(2))
    # the frozen class-token path: one summary line, not one warning per parameter
    assert 'is skipped since its requires_grad=False' not in proc.stdout + proc.stderr
    assert '27 frozen parameters are left out of the optimizer: backbone.cls_token' in \
        proc.stdout + proc.stderr
    ckpt = safe_load(str(work / 'iter_2.pth'))
    assert ckpt['meta']['iter'] == 2
    assert any(k.startswith('backbone.blocks.') for k in ckpt['state_dict'])


@pytest.mark.slow
def test_segmentation_train_and_test(toy_data, tmp_path):
    work = tmp_path / 'seg'
    run_tool_here('train.py', SEG_CFG, '--work-dir', work, *_short(4))
    assert any('mIoU' in r for r in _scalars(work))
    out_dir = tmp_path / 'pred_maps'
    proc = run_tool_here('test.py', SEG_CFG, work / 'iter_4.pth', '--work-dir', tmp_path / 'test',
                         '--out', out_dir, '--cfg-options', 'test_dataloader.num_workers=0',
                         'test_dataloader.persistent_workers=False')
    assert 'mIoU' in proc.stdout + proc.stderr
    assert len(list(out_dir.rglob('*.png'))) == 8


@pytest.mark.slow
def test_amp_on_cpu_trains_in_bfloat16(toy_data, tmp_path):
    work = tmp_path / 'amp'
    proc = run_tool_here('train.py', SEG_CFG, '--work-dir', work, '--amp', *_short(2))
    assert "type='CPUAmpOptimWrapper'" in proc.stdout + proc.stderr
    assert safe_load(str(work / 'iter_2.pth'))['meta']['iter'] == 2


@pytest.mark.slow
def test_dist_train_two_cpu_processes_and_resume(toy_data, tmp_path):
    work = tmp_path / 'dist'
    env = {'PORT': str(free_port())}
    proc = run_cmd(['bash', REPO / 'tools/dist_train.sh', DET_CFG, '2', '--work-dir', work,
                    *_short(3, validate=False)], env=env)
    log = proc.stdout + proc.stderr
    assert 'Distributed launcher: pytorch' in log and 'Distributed training: True' in log
    assert 'GPU number: 2' in log  # mmengine's name for the world size
    assert safe_load(str(work / 'iter_3.pth'))['meta']['iter'] == 3
    env = {'PORT': str(free_port())}
    run_cmd(['bash', REPO / 'tools/dist_train.sh', DET_CFG, '2', '--work-dir', work,
             '--resume', str(work / 'iter_3.pth'), *_short(5, validate=False)], env=env)
    assert safe_load(str(work / 'iter_5.pth'))['meta']['iter'] == 5
    # and the 2-process test launcher evaluates all 24 val images of that checkpoint
    proc = run_cmd(['bash', REPO / 'tools/dist_test.sh', DET_CFG, work / 'iter_5.pth', '2',
                    '--work-dir', tmp_path / 'dist_test', '--cfg-options',
                    'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False'],
                   env={'PORT': str(free_port())})
    log = proc.stdout + proc.stderr
    assert 'GPU number: 2' in log and 'Iter(test) [12/12]' in log and 'coco/bbox_mAP' in log


def test_slurm_scripts_call_srun_with_the_tools(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    srun = bin_dir / 'srun'
    srun.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$SRUN_LOG"\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    env = {'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'GPUS': '16',
           'SRUN_LOG': str(tmp_path / 'log')}
    run_cmd(['bash', REPO / 'tools/slurm_train.sh', 'part', 'job', DET_CFG, 'wd', '--amp'], env=env)
    args = (tmp_path / 'log').read_text().split('\n')
    assert args[:2] == ['-p', 'part'] and '--ntasks=16' in args and '--launcher=slurm' in args
    assert str(REPO / 'tools/train.py') in args and '--work-dir=wd' in args and '--amp' in args
    run_cmd(['bash', REPO / 'tools/slurm_test.sh', 'part', 'job', SEG_CFG, 'x.pth'], env=env)
    args = (tmp_path / 'log').read_text().split('\n')
    assert str(REPO / 'tools/test.py') in args and 'x.pth' in args and '--launcher=slurm' in args


@pytest.mark.parametrize('root,hint', [('data/toy_nowhere/', 'generate_toy_data.py'),
                                       ('data/coco_nowhere/', 'data/README.md')])
@pytest.mark.slow
def test_missing_dataset_names_path_and_fix(root, hint, tmp_path):
    proc = run_tool_here('train.py', DET_CFG, '--work-dir', tmp_path,
                         '--cfg-options', f'train_dataloader.dataset.data_root={root}', check=False)
    assert_user_error(proc.returncode, proc.stderr, 1, root, hint)


@pytest.mark.slow
def test_test_tool_rejects_missing_checkpoint(tmp_path):
    proc = run_tool_here('test.py', DET_CFG, tmp_path / 'nope.pth', check=False)
    assert_user_error(proc.returncode, proc.stderr, 1, 'nope.pth', 'does not exist')


@pytest.mark.slow
def test_demo_detector_learns(trained_toy_detector):
    """The README demo's FAN-T-Hybrid Mask R-CNN reaches a clearly non-trivial AP in its CPU budget.

    From scratch.

    After 30 iterations it scores ~0.01, and so did the whole run while mmcv's RoIAlign read the
    backbone's channels-last maps as NCHW (0.003); the seeded 300-iteration run scores about 0.23
    box and 0.31 mask AP (0.48 / 0.49 AP50).
    """
    final = [r for r in _scalars(trained_toy_detector) if 'coco/bbox_mAP' in r][-1]
    assert final['coco/bbox_mAP'] > 0.12 and final['coco/segm_mAP'] > 0.12
    assert final['coco/bbox_mAP_50'] > 0.3


def test_a_command_past_its_safety_limit_fails_as_a_timeout():
    with pytest.raises(pytest.fail.Exception, match=r'TIMEOUT \(not a wrong result\): sleep 5'):
        run_cmd(['sleep', '5'], timeout=0.5)


def test_tools_run_the_checkout_they_belong_to(tmp_path):
    """A second clone's tools import the second clone's mmrobust.

    Even with the first one on PYTHONPATH (as an editable install puts it), and say which one at
    start-up.
    """
    import shutil
    clone = tmp_path / 'clone'
    for part in ('mmrobust', 'tools'):
        shutil.copytree(REPO / part, clone / part, ignore=shutil.ignore_patterns('__pycache__'))
    # (a tool in a subfolder: its repository root is two levels up)
    proc = run_cmd([sys.executable, clone / 'tools' / 'model_converters' / 'clean_checkpoint.py',
                    '--help'], env={'PYTHONPATH': str(REPO)})
    assert f'from {clone / "mmrobust"}\n' in proc.stderr, proc.stderr[-2000:]
    proc = run_tool('robustness_report.py', '--help')
    assert f'from {REPO / "mmrobust"}\n' in proc.stderr


def test_flop_counter_counts_fused_cpu_attention():
    """The counter of the backbone benchmark and the model zoo's metafiles."""
    import torch
    import torch.nn.functional as F

    from mmrobust.utils.flops import count_flops
    b, h, n, m, d = 2, 3, 40, 24, 8
    q, k, v = torch.randn(b, h, n, d), torch.randn(b, h, m, d), torch.randn(b, h, m, d)
    flops = count_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert flops == 2 * (2 * b * h * n * m * d)  # q @ k^T and attn @ v


@pytest.mark.slow
def test_backbone_benchmark_prints_ratios_to_the_baselines():
    proc = run_tool_here('analysis_tools/benchmark_backbones.py', '--models', 'fan_hybrid_tiny',
                         '--size', '64', '--iters', '1', '--warmup', '0')
    rows = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith('| ') and '---' not in line}
    assert set(rows) == {'model', 'swin_t', 'resnet50', 'fan_hybrid_tiny'}
    header = rows.pop('model')
    # median (range) of the per-round ratios; a baseline against itself is exactly 1
    assert rows['swin_t'][header.index('x Swin-T')] == '1.00 (1.00-1.00)'
    assert rows['resnet50'][header.index('x ResNet-50')] == '1.00 (1.00-1.00)'
    for name, cells in rows.items():
        assert float(cells[header.index('GFLOPs')]) > 0 and float(cells[header.index('ms')]) > 0


@pytest.mark.parametrize('torch_info,nvcc,arch_list,expect_rc,expect', [
    ('none 0 none', None, '', 0, 'CPU ops'),
    ('12.4 1 9.0', None, '', 1, 'needs nvcc, and there is none'),
    ('12.4 1 9.0', '12.4', '', 0, 'arch=9.0 force=1'),
    ('12.4 1 9.0', '12.4', '8.0;9.0', 0, 'arch=8.0;9.0 force=1'),
    ('12.4 1 8.6', '11.8', '', 1, 'nvcc is CUDA 11.8 but torch was built with CUDA 12.4'),
], ids=['cpu', 'gpu-no-nvcc', 'gpu', 'gpu-arch-set', 'gpu-nvcc-mismatch'])
def test_setup_env_cuda_branch(tmp_path, torch_info, nvcc, arch_list, expect_rc, expect):
    """tools/cuda_env.sh (sourced by setup_env.sh before mmcv's build) with a faked torch and nvcc.

    CPU machines are untouched; with a GPU it targets the GPU's architecture, or stops before
    building with what to install.
    """
    fake_python = tmp_path / 'python'
    fake_python.write_text(f'#!/bin/sh\necho "{torch_info}"\n')
    fake_python.chmod(0o755)
    cuda_home = tmp_path / 'cuda'
    (cuda_home / 'bin').mkdir(parents=True)
    if nvcc:
        tool = cuda_home / 'bin' / 'nvcc'
        tool.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {nvcc}, V{nvcc}.1"\n')
        tool.chmod(0o755)
    env = {'CUDA_HOME': str(cuda_home), 'TORCH_CUDA_ARCH_LIST': arch_list, 'FORCE_CUDA': '0'}
    script = ('[ -n "$TORCH_CUDA_ARCH_LIST" ] || unset TORCH_CUDA_ARCH_LIST; '
              'source tools/cuda_env.sh; mmrobust_cuda_env "$1"; rc=$?; '
              'echo "rc=$rc arch=${TORCH_CUDA_ARCH_LIST:-} force=${FORCE_CUDA:-}"')
    proc = run_cmd(['bash', '-c', script, 'bash', fake_python], env=env)
    out = proc.stdout + proc.stderr
    assert f'rc={expect_rc}' in out and expect in out, out
    setup = (REPO / 'tools' / 'setup_env.sh').read_text()
    assert setup.index('mmrobust_cuda_env') < setup.index('mmcv==2.1.0')


def test_gpu_check_script_commands_exist():
    """tools/gpu_check.sh (run by a person on a GPU).

    Every tool and config it calls exists and the DAT step loads the tokenizer the first step
    trains.
    """
    proc = run_cmd(['bash', REPO / 'tools' / 'gpu_check.sh', 'work_dirs/x'],
                   env={'DRY_RUN': '1', 'ITERS': '3'})
    commands = [line[2:].split() for line in proc.stdout.splitlines() if line.startswith('+ ')]
    assert len(commands) == 7
    from mmengine.config import Config
    for words in commands:
        for word in words[1:]:
            if word.endswith('.py') and '=' not in word:
                assert (REPO / word).is_file(), word
        if '--cfg-options' in words:  # every option names a setting the config has
            config = next(w for w in words if w.startswith('configs/'))
            cfg = Config.fromfile(str(REPO / config)).to_dict()
            for option in words[words.index('--cfg-options') + 1:]:
                node = cfg
                for part in option.split('=')[0].split('.'):
                    node = node[int(part)] if isinstance(node, list) else node[part]
    assert all('--amp' in commands[i] for i in (1, 2, 3))
    assert 'custom_hooks.0.tokenizer.init_cfg.checkpoint=work_dirs/x/tokenizer/tokenizer.pth' \
        in commands[3]
    assert 'work_dirs/x/fan-t/iter_3.pth' in commands[4]
    # the 2-process steps: torchrun's launchers
    assert 'tools/dist_train.sh' in commands[5] and 'TOOL=test_robustness.py' in commands[6]
    # a rerun in the same work dir (a retrained checkpoint) writes a results file of its own
    again = run_cmd(['bash', REPO / 'tools' / 'gpu_check.sh', 'work_dirs/x'],
                    env={'DRY_RUN': '1', 'ITERS': '3'})
    results = [[w for w in line.split() if w.endswith('.json')]
               for out in (proc.stdout, again.stdout) for line in out.splitlines()
               if line.startswith('+ ') and 'tools/test_robustness.py' in line]
    assert results[0] and results[1] and results[0] != results[1]
