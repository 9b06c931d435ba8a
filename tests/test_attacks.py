"""White-box attacks (mmrobust.evaluation.attacks) on the toy detector and segmentor: the budget,
the model left as it was, the loss ascended, the random parts seeded per image, bad input."""
import copy
import math

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

from mmrobust.evaluation.attacks import (
    Attack,
    AttackError,
    attack_batch,
    attack_loss,
    attack_names,
    parse_epsilon,
)
from mmrobust.models.data_preprocessors import PixelSpace, valid_mask

from conftest import REPO

SEG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'
DET = 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'
EPS = 8 / 255


def _setup(config: str, batch_size: int = 2, pipeline_options: dict = None):
    """(untrained model in eval mode, one preprocessed test batch) of a toy config."""
    cfg = Config.fromfile(str(REPO / config))
    if pipeline_options:
        cfg.merge_from_dict(pipeline_options)
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    loader = Runner.build_dataloader(dict(cfg.test_dataloader, batch_size=batch_size,
                                          num_workers=0, persistent_workers=False))
    return model, model.data_preprocessor(next(iter(loader)), False)


@pytest.fixture(scope='module')
def seg(toy_data):
    return _setup(SEG)


@pytest.fixture(scope='module')
def det(toy_data):
    return _setup(DET)


@pytest.fixture(params=['seg', 'det'])
def model_and_batch(request, toy_data):
    model, data = request.getfixturevalue(request.param)
    return request.param, model, data


def test_epsilon_and_attack_names_are_checked():
    assert parse_epsilon('8/255') == pytest.approx(8 / 255)
    assert parse_epsilon('0.5') == 0.5 and parse_epsilon(0) == 0.0
    for bad in ('-1/255', 'eight', '1/0', 'nan', float('inf')):
        with pytest.raises(AttackError, match='epsilon'):
            parse_epsilon(bad)
    with pytest.raises(AttackError, match='unknown attack .pgd_l3.*pgd_linf.*cospgd_l2'):
        Attack.from_name('pgd_l3', '8/255')
    with pytest.raises(AttackError, match='random_start'):
        Attack.from_name('pgd_linf', 0.1, restarts=3)
    assert Attack.from_name('fgsm_linf', 0.1, steps=10).steps == 1
    assert Attack.from_name('pgd_linf', 0.1, steps=10).alpha == pytest.approx(0.025)
    assert len(attack_names()) == 8


def test_epsilon_zero_gives_the_clean_batch_back(model_and_batch):
    _, model, data = model_and_batch
    result = attack_batch(model, data, Attack.from_name('pgd_linf', 0))
    assert result.data is data and result.final_loss is None


@pytest.mark.parametrize('name,eps', [('pgd_linf', EPS), ('pgd_l2', 1.0), ('fgsm_linf', EPS)])
def test_budget_padding_and_the_model_are_kept(name, eps, model_and_batch):
    kind, model, data = model_and_batch
    before = copy.deepcopy(model.state_dict())
    attack = Attack.from_name(name, eps, steps=2, random_start=name.startswith('pgd'))
    result = attack_batch(model, data, attack, gt_at_file_scale=kind == 'det')
    # the model: eval mode kept, no parameter gradient, every tensor (BN statistics) as it was
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # the images: within the budget in [0, 1] RGB, in range, the padding untouched
    space = PixelSpace(model.data_preprocessor)
    x, adv = data['inputs'], result.data['inputs']
    mask = valid_mask(data['data_samples'], tuple(x.shape), x.device)
    delta = space.to_pixels(adv) - space.to_pixels(x)
    if attack.norm == 'linf':
        assert float(delta.abs().max()) <= eps + 1e-5
    else:
        assert float(delta.flatten(1).norm(dim=1).max()) <= eps * (1 + 1e-4)
    assert float(delta.abs().max()) > 0.5 * (eps if attack.norm == 'linf' else 1e-3)
    pixels = space.to_pixels(adv)
    assert float(pixels.min()) >= -1e-5 and float(pixels.max()) <= 1 + 1e-5
    assert torch.equal(torch.where(mask, 0, adv), torch.where(mask, 0, x))
    if kind == 'det':
        assert not mask.all()  # the toy detector's batch is padded: the check above bites
    # the batch's samples are those given (the loss's rescaled ground truth was a copy)
    assert result.data['data_samples'] is data['data_samples']


@pytest.mark.parametrize('name', ['pgd_linf', 'pgd_l2', 'segpgd_linf', 'cospgd_linf'])
def test_attacks_raise_the_loss_and_more_steps_do_not_lower_it(name, model_and_batch):
    kind, model, data = model_and_batch
    if kind == 'det' and name.startswith(('segpgd', 'cospgd')):
        with pytest.raises(AttackError, match='for segmentors'):
            attack_batch(model, data, Attack.from_name(name, EPS))
        return
    eps = EPS if name.endswith('linf') else 2.0
    finals = []
    for steps in (1, 4):
        attack = Attack.from_name(name, eps, steps=steps)
        result = attack_batch(model, data, attack, gt_at_file_scale=kind == 'det')
        clean = attack_loss(model, data, attack, gt_at_file_scale=kind == 'det')
        again = attack_loss(model, result.data, attack, gt_at_file_scale=kind == 'det')
        assert math.isclose(again, result.final_loss, rel_tol=1e-4)  # what the result says
        assert result.final_loss > clean, (steps, clean, result.final_loss)
        finals.append(result.final_loss)
    assert finals[1] >= finals[0] - 1e-3 * abs(finals[0]), finals


def test_an_image_gets_the_same_attack_in_any_batch(seg):
    """The attack of an image does not depend on its batch (so 1 and N processes, any batch
    size and a resume agree): per-image random start, and the L-inf step is the sign of a
    gradient that a batch mean only scales; up to float rounding. (Restarts are chosen per
    batch: mmdet's losses are batch means.)"""
    model, data = seg
    attack = Attack.from_name('pgd_linf', EPS, steps=2, random_start=True)
    both = attack_batch(model, data, attack).data['inputs']
    alone = attack_batch(model, dict(data, inputs=data['inputs'][1:],
                                     data_samples=data['data_samples'][1:]), attack).data
    # NOTE: float rounding differs between the batch and the single image, and flips the sign
    # where the gradient is about 0: 0.3% of the values after 2 steps on the toy segmentor
    same = (alone['inputs'][0] - both[1]).abs() <= 1e-5
    assert float(same.float().mean()) > 0.99
    reseeded = attack_batch(model, data, Attack.from_name(
        'pgd_linf', EPS, steps=2, random_start=True, seed=1)).data['inputs']
    assert float(((reseeded - both).abs() <= 1e-5).float().mean()) < 0.9  # another start


def test_test_data_without_ground_truth_says_which_step_to_add(toy_data):
    model, data = _setup(SEG, batch_size=1)
    for sample in data['data_samples']:
        del sample.gt_sem_seg
    with pytest.raises(AttackError, match=r"LoadAnnotations.*test_dataloader.dataset.pipeline"):
        attack_batch(model, data, Attack.from_name('pgd_linf', EPS))


def test_cost_benchmark_prints_the_ratio_to_a_clean_cell(toy_data, in_repo):
    from conftest import run_tool
    proc = run_tool('analysis_tools/benchmark_attacks.py', '--images', '1', '--rounds', '1',
                    '--steps', '1')
    assert '| clean |' in proc.stdout and '| pgd_linf (1 step) |' in proc.stdout
    assert 'x (' in proc.stdout and 'load average' in proc.stdout


def test_a_test_pipeline_without_annotations_stops_the_tool_before_inference():
    from mmrobust.evaluation.robustness import check_attack_pipeline
    cfg = Config.fromfile(str(REPO / SEG))
    check_attack_pipeline(cfg)  # the toy pipeline loads them
    pipeline = cfg.test_dataloader.dataset.pipeline
    cfg.test_dataloader.dataset.pipeline = [s for s in pipeline
                                            if s['type'] != 'LoadAnnotations']
    with pytest.raises(AttackError, match=r"Add dict\(type='LoadAnnotations', \.\.\.\) before"):
        check_attack_pipeline(cfg)


def test_crowd_boxes_are_rescaled_with_the_other_ground_truth():
    """mmdet's test pipelines load annotations after Resize: the attack brings them to the
    input's scale, the ignored (crowd) boxes too, which the assigners use to ignore proposals."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmengine.structures import InstanceData

    from mmrobust.evaluation.attacks import _gt_at_input_scale
    sample = DetDataSample(metainfo=dict(scale_factor=(2.0, 0.5), img_shape=(50, 200)))
    sample.gt_instances = InstanceData(
        bboxes=HorizontalBoxes(torch.tensor([[10., 20., 30., 40.]])), labels=torch.tensor([1]))
    sample.ignored_instances = InstanceData(bboxes=torch.tensor([[0., 0., 50., 100.]]),
                                            labels=torch.tensor([0]))
    scaled = _gt_at_input_scale([sample])[0]
    assert scaled.gt_instances.bboxes.tensor.tolist() == [[20., 10., 60., 20.]]
    assert scaled.ignored_instances.bboxes.tolist() == [[0., 0., 100., 50.]]
    assert sample.ignored_instances.bboxes.tolist() == [[0., 0., 50., 100.]]  # a copy


def test_segpgd_and_cospgd_weightings_on_a_hand_computed_example():
    """Two pixels of class 0, the first predicted right (logits 2, 0), the second wrong (0, 1):
    SegPGD weighs the right one 1 - λ and the wrong one λ, λ = (t - 1) / 2T (Gu et al. 2022);
    CosPGD weighs each by cos(softmax, one-hot) (Agnihotri et al. 2024). Swapped λ, or 1 - cos,
    give other numbers."""
    import math
    from types import SimpleNamespace

    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    from mmrobust.evaluation.attacks import _seg_weighted_loss
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]]).T.reshape(1, 2, 1, 2)  # (N, C, H, W)

    class Stub(torch.nn.Module):
        decode_head = SimpleNamespace(align_corners=False, ignore_index=255)

        def forward(self, inputs, samples, mode):
            return logits
    sample = SegDataSample(metainfo=dict(img_shape=(1, 2)))
    sample.gt_sem_seg = PixelData(data=torch.zeros(1, 1, 2, dtype=torch.long))
    inputs = torch.zeros(1, 3, 1, 2)
    ce_right, ce_wrong = math.log(1 + math.exp(-2)), math.log(1 + math.exp(1))
    for step, steps in ((0, 4), (1, 4), (3, 4)):  # the t-th of T iterations is step t - 1
        lam = step / (2 * steps)
        got = float(_seg_weighted_loss('segpgd', Stub(), inputs, [sample], step, steps))
        assert got == pytest.approx(((1 - lam) * ce_right + lam * ce_wrong) / 2, rel=1e-6)

    def cos(a, b, y):  # softmax of (a, b) against the one-hot of class y
        p = (math.exp(a), math.exp(b))
        p = tuple(v / sum(p) for v in p)
        return p[y] / math.hypot(*p)
    got = float(_seg_weighted_loss('cospgd', Stub(), inputs, [sample], 0, 4))
    assert got == pytest.approx((cos(2, 0, 0) * ce_right + cos(0, 1, 0) * ce_wrong) / 2,
                                rel=1e-6)
