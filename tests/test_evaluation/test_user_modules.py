"""A user's own module, named only in the config's ``custom_imports``, reaches every tool.

Its attack family and its cell kind (with its own command-line option and pre-flight check) are
planned, run, recorded, merged and reported by ``tools/test_robustness.py`` and
``tools/robustness_report.py`` in processes of their own, as a user runs them: nothing registers
them in the test's process.
"""
import csv
import json
import textwrap

import pytest

from helpers import REPO, assert_user_error, init_checkpoint, run_tool

SEG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'

USER_MODULE = '''
"""A user's robustness extensions: MI-FGSM and occlusion patches."""
import copy

from mmrobust.evaluation.attack_families import AttackFamily, register_attack_family
from mmrobust.evaluation.cell_kinds import register_cell_kind
from mmrobust.evaluation.cell_kinds.per_cell import PerCellKind
from mmrobust.evaluation.evaluator_cfg import find_loading_step
from mmrobust.models import adversarial
from mmrobust.utils.config_checks import leaf_datasets
from mmrobust.utils.errors import UsageError


def momentum_ascent(grad, norm, mask, state):
    state['g'] = state.get('g', 0) + grad * mask / (grad * mask).abs().sum().clamp_min(1e-12)
    return adversarial.step_direction(state['g'], norm, mask)


register_attack_family(AttackFamily('mifgsm', random_start=False, update=momentum_ascent,
                                    norms=('linf',), paper='Dong et al., CVPR 2018'))


class Occlude:
    """A grey square over the image's top-left corner."""

    def __init__(self, size):
        self.size = size

    def __call__(self, results):
        results['img'] = results['img'].copy()
        results['img'][:self.size, :self.size] = 128
        return results


class OcclusionKind(PerCellKind):
    def add_arguments(self, parser):
        parser.add_argument('--occlusion-sizes', nargs='+', type=int, default=None)

    def options_from_args(self, args):
        return args.occlusion_sizes

    def check(self, spec):
        sizes = spec.kind_options.get(self.name) or []
        if any(s <= 0 for s in sizes):
            raise UsageError(f'occlusion sizes are pixels > 0, got {sizes}')
        return spec

    def planned(self, identity):
        return [('occlusion', int(k)) for k in (identity.get('occlusion') or {})]

    def identity(self, spec):
        sizes = spec.kind_options.get('occlusion')
        return {'occlusion': {str(k): s for k, s in enumerate(sizes, 1)}} if sizes else {}

    def dataloader(self, run, cell):
        loader = copy.deepcopy(self.config(run).test_dataloader)
        for dataset in leaf_datasets(loader['dataset']):
            pipeline = list(dataset['pipeline'])
            pipeline.insert(find_loading_step(pipeline) + 1,
                            Occlude(run.spec.kind_options['occlusion'][cell[1] - 1]))
            dataset['pipeline'] = pipeline
        return loader


register_cell_kind(OcclusionKind('occlusion', lambda name: name == 'occlusion',
                                 category='occlusion'))
'''


@pytest.fixture
def user_project(tmp_path, toy_data):
    """A user's module and a config that names it in ``custom_imports`` (and nowhere else)."""
    (tmp_path / 'my_robustness.py').write_text(USER_MODULE)
    config = tmp_path / 'segformer_user.py'
    config.write_text(textwrap.dedent(f'''\
        _base_ = ['{REPO / SEG}']
        custom_imports = dict(imports=['mmrobust', 'my_robustness'], allow_failed_imports=False)
        test_dataloader = dict(num_workers=0, persistent_workers=False,
                               dataset=dict(indices=2))
        '''))
    ckpt = init_checkpoint(SEG, tmp_path / 'seg.pth')
    return config, ckpt, {'PYTHONPATH': f'{REPO}:{tmp_path}'}


@pytest.mark.slow
def test_a_users_family_and_kind_from_custom_imports_reach_every_tool(user_project, tmp_path):
    config, ckpt, env = user_project
    common = [config, ckpt, '--metric-queue', '0', '--work-dir', tmp_path / 'w']
    # the kind's own option reaches its own pre-flight check, before any model is built
    bad = run_tool('test_robustness.py', *common, '--occlusion-sizes', '0', env=env, check=False)
    assert_user_error(bad.returncode, bad.stderr, 2, 'occlusion sizes are pixels > 0')
    shard = tmp_path / 'r_shard0of1.json'
    run_tool('test_robustness.py', *common, '--attacks', 'mifgsm_linf', '--epsilons', '2/255',
             '--attack-steps', '2', '--occlusion-sizes', '8', '24', '--shard', '0/1',
             '--results', shard, env=env)
    data = json.loads(shard.read_text())
    assert set(data['cells']) == {'clean', 'mifgsm_linf', 'occlusion'}
    assert set(data['cells']['occlusion']) == {'1', '2'} and data['occlusion'] == {'1': 8, '2': 24}
    assert data['attacks']['mifgsm_linf']['settings']['random_start'] is False
    assert data['custom_imports'] == ['mmrobust', 'my_robustness']
    # the merge and the report import what the results record, in processes of their own
    merged = tmp_path / 'merged.json'
    out = run_tool('robustness_report.py', 'merge', shard, '--out', merged, env=env).stdout
    assert 'mifgsm_linf' in out and set(json.loads(merged.read_text())['cells']) == set(
        data['cells'])
    report = tmp_path / 'report'
    out = run_tool('robustness_report.py', merged, '--out-dir', report, '--bootstrap', '0',
                   env=env).stdout
    assert 'mifgsm_linf' in out
    with open(report / 'cells.csv') as f:
        categories = {row['corruption']: row['category'] for row in csv.DictReader(f)}
    assert categories == {'clean': '', 'mifgsm_linf': 'adversarial', 'occlusion': 'occlusion'}
    # a reader without the module on its path says which module it needs
    gone = run_tool('robustness_report.py', merged, '--out-dir', report, '--bootstrap', '0',
                    env={'PYTHONPATH': str(REPO)}, check=False)
    assert_user_error(gone.returncode, gone.stderr, 1, 'occlusion', 'my_robustness',
                      'PYTHONPATH')
    # the kind asked for alone, from the config: it replaces the default corruption protocol
    alone = run_tool('test_robustness.py', *common, '--cfg-options',
                     'robustness_kind_options.occlusion=[16]', env=env)
    data = json.loads((tmp_path / 'w' / 'robustness_occlusion.json').read_text())
    assert set(data['cells']) == {'clean', 'occlusion'} and data['occlusion'] == {'1': 16}
    assert 'occlusion' in alone.stdout


def test_a_zoo_users_inputs(tmp_path):
    """Package configs as mmengine names them; a missing one; a budget meant over 255."""
    from helpers import run_tool_in_process
    stock = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
    # the stock config is found in the installed mmdet (its name reaches the epsilon check)
    status, _, err = run_tool_in_process('test_robustness.py', stock, tmp_path / 'none.pth',
                                         '--attacks', 'pgd_linf', '--epsilons', '2')
    assert_user_error(status, err, 2, '--epsilons 2: an L-inf budget (pgd_linf)', '2/255')
    status, _, err = run_tool_in_process('test_robustness.py', 'mmdet::faster_rcnn/nope.py',
                                         tmp_path / 'none.pth')
    assert_user_error(status, err, 1, 'mmdet has no config faster_rcnn/nope.py')
    status, _, err = run_tool_in_process('test_robustness.py', tmp_path / 'missing.py',
                                         tmp_path / 'none.pth')
    assert_user_error(status, err, 1, 'missing.py does not exist', 'mmdet::')


@pytest.mark.slow
def test_mmdets_mask2former_instance_config_runs_a_corruption_cell_unchanged(tmp_path):
    """The stock config loads float32 images and inherits a panoptic ``seg`` prefix.

    On 0b79246 the pre-flight check refused the set (no panoptic folder, which ``CocoDataset``
    never opens), then ``Corrupt`` refused the float32 image.
    """
    from helpers.zoo import tiny_coco
    root = tiny_coco(str(tmp_path / 'coco'), 1)  # NOTE: COCO-80, instances only
    config = tmp_path / 'mask2former_instance.py'
    config.write_text(textwrap.dedent(f'''\
        _base_ = ['mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py']
        custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)
        model = dict(backbone=dict(init_cfg=None))  # random init, no download
        test_dataloader = dict(num_workers=0, persistent_workers=False,
                               dataset=dict(data_root='{root}/'))
        test_evaluator = dict(ann_file='{root}/annotations/instances_val2017.json')
        '''))
    ckpt = init_checkpoint(str(config), tmp_path / 'm2f.pth')
    results = tmp_path / 'r.json'
    proc = run_tool('test_robustness.py', config, ckpt, '--corruptions', 'fog', '--severities',
                    '1', '--metric-queue', '0', '--results', results, '--work-dir', tmp_path / 'w')
    data = json.loads(results.read_text())
    assert set(data['cells']) == {'clean', 'fog'}
    assert {'coco/bbox_mAP', 'coco/segm_mAP'} <= set(data['cells']['fog']['1'])
    assert 'panoptic_val2017' in proc.stdout + proc.stderr  # NOTE: said, not refused
