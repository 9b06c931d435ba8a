"""White-box attacks (mmrobust.evaluation.attacks) on the toy detector and segmentor.

The budget, the model left as it was, the loss ascended, the random parts seeded per image, bad
input.
"""
import copy
import dataclasses
import json
import math

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

from mmrobust.evaluation.attack_families import (
    ATTACK_FAMILIES,
    AttackFamily,
    register_attack_family,
    segpgd_weight,
)
from mmrobust.evaluation.attacks import (
    ATTACKS,
    Attack,
    AttackError,
    attack_batch,
    attack_loss,
    attack_names,
    parse_epsilon,
)
from mmrobust.models import adversarial
from mmrobust.models.data_preprocessors import PixelSpace, valid_mask

from helpers import REPO

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
        Attack.from_name('pgd_linf', 0.1, restarts=3, random_start=False)
    # the papers' starts: FGSM from the image, PGD, SegPGD and CosPGD from a random point
    assert [Attack.from_name(f'{a}_linf', 0.1).random_start for a in ATTACKS] == \
        [False, True, True, True]
    assert Attack.from_name('segpgd_l2', 0.1, random_start=False).random_start is False
    # the results identity records the start each attack took, not "the default"
    from mmrobust.evaluation.attacks import attack_plan
    plan = attack_plan(['pgd_linf', 'fgsm_linf'], ['1/255'])
    assert [plan[a]['settings']['random_start'] for a in plan] == [True, False]
    plan = attack_plan(['pgd_linf', 'fgsm_linf'], ['1/255'], random_start=False)
    assert [plan[a]['settings']['random_start'] for a in plan] == [False, False]
    assert Attack.from_name('fgsm_linf', 0.1, steps=10).steps == 1
    assert Attack.from_name('pgd_linf', 0.1, steps=10).alpha == pytest.approx(0.025)
    assert len(attack_names()) == 8
    # a zoo user's "--epsilons 2" meant 2/255: on the [0, 1] scale it would saturate every pixel
    with pytest.raises(AttackError, match=r'--epsilons 2: an L-inf budget \(pgd_linf\).*2/255'):
        attack_plan(['pgd_l2', 'pgd_linf'], ['1/255', '2'])
    assert attack_plan(['pgd_l2'], ['2'])['pgd_l2']['epsilons'] == [2.0]  # L2: the image's norm


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


@pytest.mark.parametrize('name,eps', [('fgsm_l2', 0.05), ('fgsm_linf', 1e-4)])
def test_a_small_step_moves_the_loss_as_its_first_order_prediction(name, eps, seg):
    """Beyond the ε = 0 plumbing.

    At a small ε the attacked loss rises by ⟨∇L, δ⟩ (ε‖∇L‖₂ for L2, ε‖∇L‖₁ for L-inf, less what the
    [0, 1] clamp takes), so the step goes up the gradient of the loss that is measured, by the
    amount the budget allows.
    """
    from mmrobust.evaluation.attack_losses import objective as _objective
    from mmrobust.models import adversarial
    model, data = seg
    attack = Attack.from_name(name, eps)
    space = PixelSpace(model.data_preprocessor)
    x0 = space.to_pixels(data['inputs'])
    result = attack_batch(model, data, attack)
    delta = space.to_pixels(result.data['inputs']) - x0
    rise = attack_loss(model, result.data, attack) - attack_loss(model, data, attack)
    predicted = 0.0
    with adversarial.eval_mode(model):
        for i in range(len(data['data_samples'])):  # the loss is the images' mean
            grad, _ = adversarial.input_gradient(lambda p: _objective(
                attack, model, space.from_pixels(p), data['data_samples'][i:i + 1], None),
                x0[i:i + 1])
            predicted += float((grad * delta[i:i + 1]).sum()) / len(data['data_samples'])
            norm = grad.abs().sum() if attack.norm == 'linf' else grad.norm()
            assert float((grad * delta[i:i + 1]).sum()) <= eps * float(norm) * (1 + 1e-4)
    assert predicted > 0
    assert rise == pytest.approx(predicted, rel=0.05), (rise, predicted)


def _preprocessed(model, raw: dict, order) -> dict:
    """The data preprocessor's batch of the raw images ``order`` (indices into ``raw``).

    As a loader would give it with that batch (its own padding).
    """
    raw = copy.deepcopy(raw)
    return model.data_preprocessor({k: [raw[k][i] for i in order] for k in raw}, False)


@pytest.mark.parametrize('kind,name', [('seg', 'pgd_linf'), ('det', 'pgd_linf'),
                                       ('det', 'pgd_l2')])
def test_an_image_gets_the_same_attack_alone_in_a_batch_and_in_any_order(kind, name, toy_data):
    """An image's attack does not depend on its batch.

    The attack of an image does not depend on its batch, so 1 and N processes, any batch size and a
    resume agree: alone, in a batch of 2 and with the batch's order swapped, the image's attacked
    values are identical (the toy Mask R-CNN's proposal samplers included; its batch of 2 pads the
    smaller image).
    """
    config = SEG if kind == 'seg' else DET
    model, _ = _setup(config)
    cfg = Config.fromfile(str(REPO / config))
    loader = Runner.build_dataloader(dict(cfg.test_dataloader, batch_size=2, num_workers=0,
                                          persistent_workers=False))
    raw = next(iter(loader))
    if kind == 'det':  # NOTE: image 1 smaller, so that the batch of 2 pads it more than alone
        image = raw['inputs'][1] = raw['inputs'][1][:, :-64, :-96].contiguous()
        raw['data_samples'][1].set_metainfo({'img_shape': tuple(image.shape[-2:])})
    attack = Attack.from_name(name, EPS if name.endswith('linf') else 1.0, steps=2,
                              random_start=True)

    def attacked(order, seed=0):
        data = _preprocessed(model, raw, order)
        adv = attack_batch(model, data, dataclasses.replace(attack, seed=seed),
                           gt_at_file_scale=kind == 'det').data['inputs']
        out = {}
        for row, i in enumerate(order):
            h, w = data['data_samples'][row].img_shape[:2]
            out[i] = adv[row, :, :h, :w]
        return out, data
    both, data = attacked([0, 1])
    swapped = attacked([1, 0])[0]
    padded = 0
    for i, adv in both.items():
        alone, data_alone = attacked([i])
        padded += data_alone['inputs'].shape != data['inputs'][:1].shape
        assert torch.equal(adv, alone[i])
        assert torch.equal(adv, swapped[i])
    assert padded == (kind == 'det'), 'the toy detector pads one image in the batch of 2'
    reseeded = attacked([0, 1], seed=1)[0]
    assert not torch.equal(reseeded[1], both[1])  # another start


SLIDE = {'model.test_cfg': dict(mode='slide', crop_size=(256, 256), stride=(192, 192))}


def _window_loop_ce(model, inputs: torch.Tensor, sample) -> torch.Tensor:
    """The slide predictor's mean cross-entropy, written out.

    256-pixel windows every 192 pixels (the last one flush with the edge), their class scores
    averaged where they overlap, resized to the label.
    """
    import torch.nn.functional as F
    crop, stride = 256, 192
    height, width = inputs.shape[-2:]

    def starts(size):
        last = size - crop
        return sorted({min(k * stride, last) for k in range(-(-last // stride) + 1)})
    total = count = 0
    for y in starts(height):
        for x in starts(width):
            window = inputs[:, :, y:y + crop, x:x + crop]
            scores = model.encode_decode(window, [dict(sample.metainfo, img_shape=(crop, crop))])
            total = total + F.pad(scores, (x, width - x - crop, y, height - y - crop))
            count = count + F.pad(torch.ones_like(scores[:, :1]),
                                  (x, width - x - crop, y, height - y - crop))
    label = sample.gt_sem_seg.data.long()
    scores = F.interpolate(total / count, size=label.shape[-2:], mode='bilinear',
                           align_corners=False)
    return F.cross_entropy(scores, label, ignore_index=255)


def test_segmentor_attacks_differentiate_the_slide_predictor_that_is_scored(toy_data):
    """With a slide test_cfg the attack's gradient is the slide predictor's.

    An explicit window loop. Not the whole-image forward's: FGSM-L2's step at a small budget is ε g
    / ‖g‖.
    """
    from mmrobust.models import adversarial
    model, data = _setup(SEG, batch_size=1, pipeline_options=SLIDE)
    sample = data['data_samples'][0]
    space = PixelSpace(model.data_preprocessor)
    x0 = space.to_pixels(data['inputs'])
    assert x0.shape[-1] > 256  # the windows overlap: several of them
    eps = 0.05
    adv = attack_batch(model, data, Attack.from_name('fgsm_l2', eps)).data['inputs']
    step = (space.to_pixels(adv) - x0) / eps
    inside = ((x0 > 1e-3) & (x0 < 1 - 1e-3)).expand_as(x0)  # no clamp at 0 or 1

    def cosine(grad):
        grad = grad / grad.norm()
        return float(torch.nn.functional.cosine_similarity(step[inside], grad[inside], dim=0))
    with adversarial.eval_mode(model):
        slide, _ = adversarial.input_gradient(
            lambda p: _window_loop_ce(model, space.from_pixels(p), sample), x0)
        whole, _ = adversarial.input_gradient(
            lambda p: torch.nn.functional.cross_entropy(torch.nn.functional.interpolate(
                model.encode_decode(space.from_pixels(p), [sample.metainfo]),
                size=sample.gt_sem_seg.shape, mode='bilinear'),
                sample.gt_sem_seg.data.long(), ignore_index=255), x0)
    assert cosine(slide) > 0.999
    assert cosine(whole) < 0.95  # the whole-image surrogate's is another direction


def _fit_on_windows(model, data, iterations: int) -> None:
    """Overfit ``model`` on 256-pixel crops of the batch's images.

    As Cityscapes models train on the crops their slide windows then see (in place; eval mode
    after).
    """
    from mmengine.structures import PixelData
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(iterations):
        left = int(torch.randint(0, data['inputs'].shape[-1] - 256 + 1, (1,), generator=gen))
        crops = []
        for sample in data['data_samples']:
            crop = sample.clone()
            crop.set_metainfo({'img_shape': (256, 256), 'pad_shape': (256, 256)})
            crop.gt_sem_seg = PixelData(data=sample.gt_sem_seg.data[..., left:left + 256])
            crops.append(crop)
        inputs = data['inputs'][..., left:left + 256].contiguous()
        loss, _ = model.parse_losses(model(inputs, crops, mode='loss'))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _miou(model, inputs: torch.Tensor, samples) -> float:
    """mmseg's mIoU of the scored predictor (model.predict) over the batch, in [0, 1]."""
    with torch.no_grad():
        out = model.predict(inputs, copy.deepcopy(samples))
    classes = model.decode_head.num_classes
    inter, union = torch.zeros(classes), torch.zeros(classes)
    for sample in out:
        pred, label = sample.pred_sem_seg.data[0], sample.gt_sem_seg.data[0]
        valid = label != 255
        for c in range(classes):
            inter[c] += ((pred == c) & (label == c) & valid).sum()
            union[c] += (((pred == c) | (label == c)) & valid).sum()
    seen = union > 0
    return float((inter[seen] / union[seen]).mean())


@pytest.mark.slow
def test_pgd_on_the_slide_predictor_beats_the_whole_image_surrogate(toy_data):
    """On the toy SegFormer trained on 256 crops and scored through 256 windows.

    PGD-10 at 8/255 through the slide predictor lowers the slide-scored mIoU at least as much as the
    same PGD through the whole-image training loss (the attack before), and raises the scored loss
    more.
    """
    from mmrobust.evaluation.attack_losses import task_loss as _task_loss
    from mmrobust.models import adversarial
    model, data = _setup(SEG, pipeline_options=SLIDE)
    _fit_on_windows(model, data, 60)
    samples = data['data_samples']
    attack = Attack.from_name('pgd_linf', EPS, steps=10, random_start=False)
    direct = attack_batch(model, data, attack).data
    space = PixelSpace(model.data_preprocessor)
    x0 = space.to_pixels(data['inputs'])
    mask = valid_mask(samples, tuple(x0.shape), x0.device)
    delta = torch.zeros_like(x0)
    with adversarial.eval_mode(model):
        for _ in range(attack.steps):
            grad, _ = adversarial.input_gradient(
                lambda p: _task_loss(model, space.from_pixels(p), samples), x0 + delta)
            move = adversarial.step_direction(grad, 'linf', mask)
            delta = adversarial.project(delta + attack.alpha * move, EPS, 'linf', x0, mask)
    surrogate = dict(data, inputs=space.from_pixels(x0 + delta))
    clean = _miou(model, data['inputs'], samples)
    scores = {name: _miou(model, d['inputs'], samples)
              for name, d in (('direct', direct), ('surrogate', surrogate))}
    assert scores['direct'] <= scores['surrogate'] < clean, (clean, scores)
    assert attack_loss(model, direct, attack) > attack_loss(model, surrogate, attack)


def test_test_data_without_ground_truth_says_which_step_to_add(toy_data):
    model, data = _setup(SEG, batch_size=1)
    for sample in data['data_samples']:
        del sample.gt_sem_seg
    with pytest.raises(AttackError, match=r"LoadAnnotations.*test_dataloader.dataset.pipeline"):
        attack_batch(model, data, Attack.from_name('pgd_linf', EPS))


def test_cost_benchmark_prints_the_ratio_to_a_clean_cell(toy_data, in_repo):
    from helpers import run_tool_here
    proc = run_tool_here('analysis_tools/benchmark_attacks.py', '--images', '1', '--rounds', '1',
                         '--steps', '1')
    assert '| clean |' in proc.stdout and '| pgd_linf (1 step) |' in proc.stdout
    assert 'x (' in proc.stdout and 'load average' in proc.stdout


def test_a_test_pipeline_without_annotations_stops_the_tool_before_inference():
    from mmrobust.evaluation.attacks import check_attack_pipeline
    cfg = Config.fromfile(str(REPO / SEG))
    check_attack_pipeline(cfg)  # the toy pipeline loads them
    pipeline = cfg.test_dataloader.dataset.pipeline
    cfg.test_dataloader.dataset.pipeline = [s for s in pipeline
                                            if s['type'] != 'LoadAnnotations']
    with pytest.raises(AttackError, match=r"Add dict\(type='LoadAnnotations', \.\.\.\) before"):
        check_attack_pipeline(cfg)


def test_crowd_boxes_are_rescaled_with_the_other_ground_truth():
    """mmdet's test pipelines load annotations after Resize.

    The attack brings them to the input's scale, the ignored (crowd) boxes too, which the assigners
    use to ignore proposals.
    """
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmengine.structures import InstanceData

    from mmrobust.evaluation.attack_losses import gt_at_input_scale as _gt_at_input_scale
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
    """Two pixels of class 0, the first predicted right (logits 2, 0), the second wrong (0, 1).

    SegPGD weighs the right one 1 - λ and the wrong one λ, λ = (t - 1) / 2T (Gu et al. 2022); CosPGD
    weighs each by cos(softmax, one-hot) (Agnihotri et al. 2024). Swapped λ, or 1 - cos, give other
    numbers.
    """
    import math
    from types import SimpleNamespace

    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    from mmrobust.evaluation.attack_losses import seg_loss as _seg_loss
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]]).T.reshape(1, 2, 1, 2)  # (N, C, H, W)

    class Stub(torch.nn.Module):
        decode_head = SimpleNamespace(align_corners=False, ignore_index=255)

        def inference(self, inputs, img_metas):
            return logits
    sample = SegDataSample(metainfo=dict(img_shape=(1, 2)))
    sample.gt_sem_seg = PixelData(data=torch.zeros(1, 1, 2, dtype=torch.long))
    inputs = torch.zeros(1, 3, 1, 2)
    ce_right, ce_wrong = math.log(1 + math.exp(-2)), math.log(1 + math.exp(1))
    for step, steps in ((0, 4), (1, 4), (3, 4)):  # the t-th of T iterations is step t - 1
        lam = step / (2 * steps)
        got = float(_seg_loss('segpgd', Stub(), inputs, [sample], step, steps))
        assert got == pytest.approx(((1 - lam) * ce_right + lam * ce_wrong) / 2, rel=1e-6)

    def cos(a, b, y):  # softmax of (a, b) against the one-hot of class y
        p = (math.exp(a), math.exp(b))
        p = tuple(v / sum(p) for v in p)
        return p[y] / math.hypot(*p)
    got = float(_seg_loss('cospgd', Stub(), inputs, [sample], 0, 4))
    assert got == pytest.approx((cos(2, 0, 0) * ce_right + cos(0, 1, 0) * ce_wrong) / 2,
                                rel=1e-6)


def test_dat_and_the_attacks_take_the_same_step(toy_data):
    """FGSM-L2 at ε = α and DAT's L2 step are one step module.

    One step module: FGSM-L2 at ε = α and DAT's L2 step (before its re-quantisation) are the same δ
    = α g / ‖g‖₂ of the toy detector's training loss (same seed for its samplers).
    """
    from mmrobust.engine.hooks.dat import DATHook
    from mmrobust.evaluation.attack_losses import gt_at_input_scale as _gt_at_input_scale
    from mmrobust.evaluation.attacks import (
        Attack,
        _image_key,
        _seed,
        _seeded,
        attack_batch,
    )
    from mmrobust.models import adversarial
    from mmrobust.models.data_preprocessors import valid_mask
    model, data = _setup(DET, batch_size=1)
    alpha = 0.5
    attack = Attack.from_name('fgsm_l2', alpha)
    adv = attack_batch(model, data, attack, gt_at_file_scale=True).data['inputs']

    class Identity(torch.nn.Module):
        factor = 1

        def encode(self, x):
            return x

        def decode(self, x):
            return x
    hook = DATHook(tokenizer=Identity(), alpha=alpha, eps=alpha)
    hook.attach(model)
    try:
        space, x, samples = hook.space, data['inputs'], data['data_samples']
        mask = valid_mask(samples, tuple(x.shape), x.device)
        key = _image_key(samples[0], 0)
        with adversarial.eval_mode(model), _seeded(_seed(attack, key, 0, 0), x.device):
            grad, _ = hook.input_gradient(x, _gt_at_input_scale(samples))
        delta = hook.perturbation(space.grad_to_pixels(grad), mask, None)
    finally:
        hook.detach()
    x0 = space.to_pixels(x)
    attacked = space.to_pixels(adv) - x0
    inside = ((x0 + delta > 0) & (x0 + delta < 1)).expand_as(x0) & mask
    assert float(delta.flatten(1).norm(dim=1)) == pytest.approx(alpha, rel=1e-5)
    torch.testing.assert_close(attacked[inside], delta[inside], rtol=1e-3, atol=1e-6)


def test_a_loss_that_fails_on_the_test_data_is_a_failure_not_a_usage_error():
    """A model whose training loss raises on the test data: exit status 1 with what to add.

    Before, it was an AttackError, a usage error (status 2), though the command line was right.
    """
    from mmrobust.evaluation import attack_losses
    from mmrobust.utils.errors import MMRobustError

    class NoGroundTruth(torch.nn.Module):
        def forward(self, inputs, samples, mode):
            raise KeyError('gt_instances')

    with pytest.raises(MMRobustError) as err:
        attack_losses.task_loss(NoGroundTruth(), torch.zeros(1, 3, 8, 8), [])
    assert err.value.exit_code == 1
    assert 'NoGroundTruth' in str(err.value) and 'LoadAnnotations' in str(err.value)


# -- a family added at run time --------------------------------------------------------------------

def _momentum_ascent(grad, norm, mask, state):
    """MI-FGSM's rule (Dong et al., CVPR 2018): g <- g + grad / ‖grad‖₁, then sign(g)."""
    state.setdefault('calls', []).append('g' in state)
    unit = grad * mask / (grad * mask).abs().sum().clamp_min(1e-12)
    state['g'] = state.get('g', 0) + unit
    return adversarial.step_direction(state['g'], norm, mask)


@pytest.fixture
def mifgsm():
    """MI-FGSM registered as a user would, removed again after the test."""
    calls = []

    def rule(grad, norm, mask, state):
        out = _momentum_ascent(grad, norm, mask, state)
        calls.append(state['calls'][-1])
        return out
    family = register_attack_family(AttackFamily(
        'mifgsm', random_start=False, paper='Dong et al., CVPR 2018', update=rule,
        norms=('linf',)))
    yield family, calls
    ATTACK_FAMILIES.pop('mifgsm')


def test_a_family_registered_at_run_time_runs_end_to_end(mifgsm, toy_data, tmp_path):
    """One row and its rule, nothing else: the tool plans, runs, records and reports its cells."""
    from test_robustness import _init_checkpoint

    from helpers import run_tool_in_process
    _, calls = mifgsm
    assert 'mifgsm_linf' in attack_names() and 'mifgsm_l2' not in attack_names()
    with pytest.raises(AttackError, match="unknown attack 'mifgsm_l2'.*mifgsm_linf"):
        Attack.from_name('mifgsm_l2', EPS)
    attack = Attack.from_name('mifgsm_linf', EPS, steps=3)
    assert attack.random_start is False and attack.alpha == pytest.approx(2.5 * EPS / 3)
    ckpt = _init_checkpoint(SEG, tmp_path / 'seg.pth')
    results = tmp_path / 'r.json'
    status, out, err = run_tool_in_process(
        'test_robustness.py', SEG, ckpt, '--attacks', 'mifgsm_linf', '--epsilons', '2/255',
        '--attack-steps', '2', '--results', results, '--work-dir', tmp_path / 'w',
        '--metric-queue', '0', '--cfg-options', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False')
    assert status == 0, err[-3000:]
    data = json.loads(results.read_text())
    assert set(data['cells']) == {'clean', 'mifgsm_linf'}
    assert data['attacks']['mifgsm_linf']['settings']['random_start'] is False
    # each image's two steps: the first without momentum, the second with the first's
    assert calls and calls[0::2] == [False] * (len(calls) // 2) and all(calls[1::2])
    assert 'mifgsm_linf' in out


def test_a_family_row_is_checked_when_registered():
    # a segmentation family is PGD with a pixel weighting: without one it would be PGD renamed
    with pytest.raises(ValueError, match='segmentation-only family needs its pixel_weight'):
        AttackFamily('segx', random_start=True, paper='-', segmentation_only=True)
    with pytest.raises(ValueError, match='set segmentation_only=True'):
        AttackFamily('detx', random_start=True, paper='-', pixel_weight=segpgd_weight)
    with pytest.raises(ValueError, match='<name>_<norm>'):
        AttackFamily('my_pgd', random_start=True, paper='-')
    with pytest.raises(ValueError, match='norms'):
        AttackFamily('pgdx', random_start=True, paper='-', norms=('l1',))
    with pytest.raises(ValueError, match="'pgd' is registered already"):
        register_attack_family(AttackFamily('pgd', random_start=True, paper='-'))
    assert ATTACKS == ('fgsm', 'pgd', 'segpgd', 'cospgd')


@pytest.mark.slow
@pytest.mark.parametrize('config', ['dino/dino-4scale_r50_8xb2-12e_coco.py',
                                    'deformable_detr/deformable-detr_r50_16xb2-50e_coco.py'])
def test_query_based_detectors_give_the_attack_their_training_loss(config):
    """DINO and Deformable DETR build their loss's inputs only where ``training`` is set.

    On 0b79246 their loss in eval mode failed (``DINOHead.loss() missing ... 'enc_outputs_class',
    'enc_outputs_coord', and 'dn_meta'``). The stock configs from the installed mmdet.
    """
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from mmrobust.evaluation.attack_losses import task_loss
    from mmrobust.models import adversarial
    from mmrobust.utils.config_checks import resolve_config_path
    cfg = Config.fromfile(resolve_config_path(f'mmdet::{config}'))
    cfg.model.backbone.init_cfg = None  # NOTE: random init, no download
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()  # NOTE: DINO's level embeddings are uninitialised memory until then
    # NOTE: DINO selects its 900 queries among the encoder's positions: enough of them
    data = model.data_preprocessor(demo_mm_inputs(1, [[3, 256, 320]], num_items=[3]), False)
    with adversarial.eval_mode(model):
        x = data['inputs'].float().requires_grad_(True)
        loss = task_loss(model, x, data['data_samples'])
        grad, = torch.autograd.grad(loss, x)
        # the branches were on for the loss only: eval mode again, the norms never left it
        assert not any(m.training for m in model.modules())
    assert torch.isfinite(loss) and loss > 0 and grad.abs().sum() > 0
