"""White-box adversarial attacks on detectors and segmentors, in the model's own pixel space.

FGSM and PGD (L-inf and L2; random start, restarts) ascend the model's own training loss on the
test set's ground truth (every mmdet detector and mmseg segmentor loss). For segmentors, SegPGD
(Gu et al., ECCV 2022: per-pixel cross-entropy, the correctly and the wrongly classified pixels
reweighted over the iterations) and CosPGD (Agnihotri et al., ICML 2024: per-pixel
cross-entropy weighted by the cosine similarity of the softmax prediction and the one-hot
target) attack the per-pixel losses instead.

Perturbations live in RGB [0, 1] pixels (:class:`~mmrobust.models.data_preprocessors.PixelSpace`,
the preprocessor's own mean, std and channel order) on each image's own area: the padding keeps
its values, and the L2 budget is the norm over that area. The model is not changed: it runs in
eval mode, the gradient is taken w.r.t. the input only (no parameter's ``.grad`` is touched) and
every buffer is restored. The random parts (the random start, and the proposal samplers of
two-stage detectors inside the loss) are drawn from the attack's seed and each image's path, so
an image gets the same attack in any batch, on any rank and after a resume.
"""
import copy
import math
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import is_model_wrapper

from ..engine.hooks.dat import preserved_buffers
from ..models.data_preprocessors import PixelSpace, valid_mask
from ..utils.errors import UsageError

__all__ = ['ATTACKS', 'NORMS', 'Attack', 'AttackError', 'AttackResult', 'annotations_after_resize',
           'attack_batch', 'attack_cells', 'attack_loss', 'attack_names', 'attack_of_cell',
           'attack_plan', 'gt_at_file_scale', 'is_attack_cell', 'parse_epsilon', 'transform_names']

#: attack families; each comes in every norm of :data:`NORMS` (``pgd_linf``, ``fgsm_l2``, ...)
ATTACKS = ('fgsm', 'pgd', 'segpgd', 'cospgd')
#: the attacks defined on per-pixel class scores: segmentors only
SEGMENTATION_ONLY = ('segpgd', 'cospgd')
NORMS = ('linf', 'l2')


class AttackError(UsageError):
    """An attack that cannot run as asked: its name, budget, or the model and test data."""


def attack_names() -> List[str]:
    return [f'{a}_{n}' for a in ATTACKS for n in NORMS]


def parse_epsilon(value: Union[str, float, int]) -> float:
    """A budget as written on the command line: ``8/255``, ``0.03`` or a number (>= 0)."""
    try:
        eps = float(Fraction(value.strip())) if isinstance(value, str) else float(value)
    except (ValueError, ZeroDivisionError):
        raise AttackError(f'epsilon {value!r} is not a number: write it as 8/255 or 0.031 '
                          '(RGB pixel values in [0, 1])') from None
    if not math.isfinite(eps) or eps < 0:
        raise AttackError(f'epsilon must be a finite number >= 0 (0: the clean images), '
                          f'got {value!r}')
    return eps


@dataclass(frozen=True)
class Attack:
    """One attack setting.

    Args:
        name: ``fgsm``, ``pgd``, ``segpgd`` or ``cospgd``.
        norm: ``linf`` (``eps`` and the step per pixel value) or ``l2`` (norms over the image's
            own area, all three channels).
        eps: the budget in RGB [0, 1] pixel units; 0 gives the clean images back unchanged.
        steps: iterations (FGSM: 1).
        step_size: the step; default ``eps`` for FGSM, else ``2.5 * eps / steps`` (Madry et
            al.: the budget's boundary reachable from anywhere inside it).
        random_start: start from a uniform point of the ε-ball (PGD's usual start).
        restarts: runs from new random starts; the one with the highest final loss is kept
            (per batch: mmdet's losses are batch means).
        seed: seeds the random starts and the detectors' proposal samplers.
    """

    name: str
    norm: str
    eps: float
    steps: int = 10
    step_size: Optional[float] = None
    random_start: bool = False
    restarts: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in ATTACKS or self.norm not in NORMS:
            raise AttackError(f'unknown attack {self.label!r}; choose from '
                              f'{", ".join(attack_names())}')
        parse_epsilon(self.eps)
        if self.name == 'fgsm' and self.steps != 1:
            object.__setattr__(self, 'steps', 1)
        if self.steps < 1 or self.restarts < 1:
            raise AttackError(f'{self.label}: steps and restarts must be >= 1, got '
                              f'{self.steps} and {self.restarts}')
        if self.step_size is not None and (not math.isfinite(self.step_size)
                                           or self.step_size <= 0):
            raise AttackError(f'{self.label}: step_size must be > 0, got {self.step_size}')
        if self.restarts > 1 and not self.random_start:
            raise AttackError(f'{self.label}: restarts without random_start repeat the same '
                              'attack; add random_start')

    @classmethod
    def from_name(cls, name: str, eps: Union[str, float], **kwargs) -> 'Attack':
        """``Attack.from_name('pgd_linf', '8/255', steps=10)``."""
        family, _, norm = name.rpartition('_')
        return cls(family or name, norm, parse_epsilon(eps), **kwargs)

    @property
    def label(self) -> str:
        return f'{self.name}_{self.norm}'

    @property
    def alpha(self) -> float:
        if self.step_size is not None:
            return float(self.step_size)
        return self.eps if self.name == 'fgsm' else 2.5 * self.eps / self.steps

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`AttackError` if this attack is not defined for ``model``."""
        if self.name in SEGMENTATION_ONLY and not _is_segmentor(model):
            raise AttackError(f'{self.label} attacks per-pixel class scores: it is for '
                              f'segmentors (mmseg), and {type(model).__name__} is not one; use '
                              f'pgd_{self.norm} for detectors')

    def settings(self) -> Dict:
        """Everything that decides the attack (for results identities)."""
        return {**asdict(self), 'alpha': self.alpha}


@dataclass
class AttackResult:
    """The attacked batch and what the attack saw: the loss it ascended at each step and the
    final loss (plain cross-entropy for SegPGD / CosPGD) of the kept restart."""
    data: dict
    step_losses: List[float] = field(default_factory=list)
    final_loss: Optional[float] = None


# -- losses ----------------------------------------------------------------------------------------

def _is_segmentor(model: nn.Module) -> bool:
    return hasattr(model, 'decode_head')


def _check_ground_truth(model: nn.Module, samples: Optional[Sequence]) -> None:
    seg = _is_segmentor(model)
    key, fix = (('gt_sem_seg', "dict(type='LoadAnnotations') before PackSegInputs") if seg else
                ('gt_instances', "dict(type='LoadAnnotations', with_bbox=True) (with_mask=True "
                 'for instance segmentation) before PackDetInputs'))
    if not samples or any(key not in s for s in samples):
        raise AttackError(
            f'the attack ascends the model\'s training loss, which needs the ground truth '
            f'({key}) in the test data, and the test batches have none: add {fix} to '
            'test_dataloader.dataset.pipeline')


def _gt_at_input_scale(samples: Sequence) -> List:
    """Copies of detection samples whose ground truth, loaded at the file's scale (mmdet's test
    pipelines load annotations after Resize), is brought to the network input's scale."""
    out = []
    for sample in samples:
        sample = copy.deepcopy(sample)  # NOTE: clone() shares the boxes, rescaled in place
        w_scale, h_scale = sample.metainfo.get('scale_factor', (1.0, 1.0))
        if (w_scale, h_scale) != (1.0, 1.0):
            # NOTE: the crowd boxes too: the losses' assigners ignore proposals by them
            for key in ('gt_instances', 'ignored_instances'):
                if key not in sample:
                    continue
                gt = sample.get(key)
                if 'bboxes' in gt:
                    boxes = gt.bboxes
                    if torch.is_tensor(boxes):
                        gt.bboxes = boxes * boxes.new_tensor([w_scale, h_scale] * 2)
                    else:  # NOTE: mmdet's box types
                        boxes.rescale_((w_scale, h_scale))
                if 'masks' in gt:
                    gt.masks = gt.masks.resize(tuple(sample.metainfo['img_shape'][:2]))
        out.append(sample)
    return out


def _per_pixel_ce(model: nn.Module, inputs: torch.Tensor, samples: Sequence
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-pixel cross-entropy, logits, labels) at the labels' resolution; ignored pixels
    have label -1 and loss 0. Logits are cropped to each image's area before resizing."""
    head = model.decode_head
    logits = model(inputs, samples, mode='tensor')
    logits = F.interpolate(logits, size=inputs.shape[-2:], mode='bilinear',
                           align_corners=head.align_corners)
    ignore = getattr(head, 'ignore_index', 255)
    losses, kept_logits, labels = [], [], []
    for i, sample in enumerate(samples):
        label = sample.gt_sem_seg.data.to(inputs.device).long()[0]
        h, w = sample.metainfo.get('img_shape', inputs.shape[-2:])[:2]
        part = F.interpolate(logits[i:i + 1, :, :h, :w], size=label.shape, mode='bilinear',
                             align_corners=head.align_corners)
        label = torch.where(label == ignore, torch.full_like(label, -1), label)
        losses.append(F.cross_entropy(part, label[None], ignore_index=-1, reduction='none')[0])
        kept_logits.append(part[0])
        labels.append(label)
    return torch.stack(losses), torch.stack(kept_logits), torch.stack(labels)


def _seg_weighted_loss(name: str, model: nn.Module, inputs: torch.Tensor, samples: Sequence,
                       step: int, steps: int) -> torch.Tensor:
    ce, logits, labels = _per_pixel_ce(model, inputs, samples)
    valid = labels >= 0
    count = valid.sum().clamp_min(1)
    with torch.no_grad():
        if name == 'segpgd':  # NOTE: λ grows from 0 to ½ over the iterations (the paper's)
            lam = step / (2 * steps)
            correct = logits.argmax(1) == labels
            weight = torch.where(correct, 1 - lam, lam)
        else:  # cospgd: cos(softmax, one-hot) = p_y / ‖p‖
            prob = logits.softmax(1)
            p_true = prob.gather(1, labels.clamp_min(0)[:, None])[:, 0]
            weight = p_true / prob.norm(dim=1).clamp_min(1e-12)
    return (ce * weight * valid).sum() / count


def _task_loss(model: nn.Module, inputs: torch.Tensor, samples: Sequence) -> torch.Tensor:
    try:
        losses = model(inputs, samples, mode='loss')
    except Exception as err:
        raise AttackError(
            f'the training loss of {type(model).__name__} could not be computed from the test '
            f'data ({type(err).__name__}: {err}). The attack needs the ground truth in the test '
            'pipeline (LoadAnnotations before the Pack step) and the model\'s train_cfg') from err
    loss, _ = model.parse_losses(losses)
    return loss


def _final_loss(attack: 'Attack', model: nn.Module, inputs: torch.Tensor,
                samples: Sequence) -> torch.Tensor:
    """What restarts are compared by: the training loss, or for SegPGD / CosPGD the plain
    per-pixel cross-entropy."""
    if attack.name in SEGMENTATION_ONLY:
        ce, _, labels = _per_pixel_ce(model, inputs, samples)
        return ce.sum() / (labels >= 0).sum().clamp_min(1)
    return _task_loss(model, inputs, samples)


def _loss_samples(model: nn.Module, samples: Sequence, gt_at_file_scale: bool) -> Sequence:
    """The samples the loss sees: checked for ground truth, detection boxes and masks at the
    input's scale (on a copy)."""
    _check_ground_truth(model, samples)
    if gt_at_file_scale and not _is_segmentor(model):
        return _gt_at_input_scale(samples)
    return samples


# -- the attack ------------------------------------------------------------------------------------

def _image_key(sample, index: int) -> str:
    meta = getattr(sample, 'metainfo', {}) if sample is not None else {}
    return str(meta.get('img_path', meta.get('img_id', index)))


def _seed(attack: Attack, samples: Sequence, *parts: int) -> int:
    keys = '|'.join(_image_key(s, i) for i, s in enumerate(samples))
    return zlib.crc32(f'{attack.seed}|{keys}|{"|".join(map(str, parts))}'.encode())


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Torch's random state seeded within the block, restored after (the proposal samplers of
    two-stage detectors draw from it inside the loss)."""
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _norms(delta: torch.Tensor) -> torch.Tensor:
    return delta.flatten(1).norm(dim=1).view(-1, 1, 1, 1)


def _project(attack: Attack, delta: torch.Tensor, x0: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
    """δ inside the ε-ball, x0 + δ inside [0, 1], zero on the padding."""
    if attack.norm == 'linf':
        delta = delta.clamp(-attack.eps, attack.eps)
    else:
        delta = delta * (attack.eps / _norms(delta).clamp_min(1e-12)).clamp(max=1.0)
    return ((x0 + delta).clamp(0, 1) - x0) * mask


def _random_start(attack: Attack, samples: Sequence, shape: torch.Size, mask: torch.Tensor,
                  restart: int) -> torch.Tensor:
    """A uniform point of the ε-ball, drawn per image from (seed, image path, restart)."""
    parts = []
    for sample in samples:
        # NOTE: keyed by the image, not its place in the batch
        gen = torch.Generator().manual_seed(_seed(attack, [sample], restart))
        if attack.norm == 'linf':
            part = (torch.rand(shape[1:], generator=gen) * 2 - 1) * attack.eps
        else:
            part = torch.randn(shape[1:], generator=gen)
            radius = float(torch.rand((), generator=gen)) * attack.eps
            part = part / part.norm().clamp_min(1e-12) * radius
        parts.append(part)
    return torch.stack(parts).to(mask.device) * mask


def attack_batch(model: nn.Module, data: dict, attack: Attack,
                 space: Optional[PixelSpace] = None, gt_at_file_scale: bool = False,
                 pixel_max: float = 255.) -> AttackResult:
    """The preprocessed batch ``data`` (``inputs``, ``data_samples``) with its images attacked.

    Args:
        model: the detector or segmentor (a DDP wrapper is unwrapped); eval mode is used and
            the model is left as it was.
        attack: the setting; ``eps == 0`` returns ``data`` itself (the clean images, exactly).
        space: the model's pixel space (default: from its data preprocessor).
        gt_at_file_scale: detection ground truth was loaded at the file's scale (after
            ``Resize``, as mmdet's test pipelines do) and is rescaled to the input's for the
            loss; the batch returned keeps the samples as they were.

    Raises:
        AttackError: a segmentation-only attack on a detector, or test data without ground
            truth, or a model whose training loss fails on it.
    """
    module = model.module if is_model_wrapper(model) else model
    attack.check_model(module)
    if attack.eps == 0:
        return AttackResult(data)
    x, samples = data['inputs'], data.get('data_samples')
    loss_samples = _loss_samples(module, samples, gt_at_file_scale)
    space = space or PixelSpace(module.data_preprocessor, pixel_max=pixel_max).to(x.device)
    mask = valid_mask(samples, tuple(x.shape), x.device)
    x0 = space.to_pixels(x).detach()

    def objective(pixels: torch.Tensor, step: Optional[int]) -> torch.Tensor:
        # NOTE: the padding keeps the preprocessor's values; step None: the final loss
        inputs = torch.where(mask, space.from_pixels(pixels).to(x.dtype), x)
        if step is None or attack.name not in SEGMENTATION_ONLY:
            return _final_loss(attack, module, inputs, loss_samples)
        return _seg_weighted_loss(attack.name, module, inputs, loss_samples, step, attack.steps)

    def gradient(pixels: torch.Tensor, step: int, restart: int) -> Tuple[torch.Tensor, float]:
        pixels = pixels.detach().requires_grad_(True)
        with torch.enable_grad(), _seeded(_seed(attack, samples, restart, step), x.device):
            loss = objective(pixels, step)
            grad, = torch.autograd.grad(loss, pixels)
        return grad * mask, float(loss.detach())

    best: Optional[Tuple[float, torch.Tensor, List[float]]] = None
    training = module.training
    module.eval()
    try:
        with preserved_buffers(module):
            for restart in range(attack.restarts):
                delta = torch.zeros_like(x0)
                if attack.random_start:
                    delta = _project(attack, _random_start(attack, samples, x0.shape, mask,
                                                           restart), x0, mask)
                losses = []
                for step in range(attack.steps):
                    grad, loss = gradient(x0 + delta, step, restart)
                    losses.append(loss)
                    if attack.norm == 'linf':
                        move = grad.sign()
                    else:
                        move = grad / _norms(grad).clamp_min(1e-12)
                    delta = _project(attack, delta + attack.alpha * move, x0, mask)
                with torch.no_grad(), _seeded(_seed(attack, samples, restart, attack.steps),
                                              x.device):
                    final = float(objective(x0 + delta, None))
                if best is None or final > best[0]:
                    best = (final, delta, losses)
    finally:
        module.train(training)
    assert best is not None
    final, delta, losses = best
    adv = torch.where(mask, space.from_pixels(x0 + delta).to(x.dtype), x)
    return AttackResult(dict(data, inputs=adv.detach()), losses, final)


def attack_loss(model: nn.Module, data: dict, attack: Attack, gt_at_file_scale: bool = False
                ) -> float:
    """The loss ``attack`` ascends (its final form: the training loss, or plain per-pixel
    cross-entropy for SegPGD / CosPGD) at ``data``'s images, seeded as the attack seeds it."""
    module = model.module if is_model_wrapper(model) else model
    samples = data['data_samples']
    attack.check_model(module)
    loss_samples = _loss_samples(module, samples, gt_at_file_scale)
    training = module.training
    module.eval()
    try:
        with torch.no_grad(), preserved_buffers(module), \
                _seeded(_seed(attack, samples, 0, attack.steps), data['inputs'].device):
            return float(_final_loss(attack, module, data['inputs'], loss_samples))
    finally:
        module.train(training)



# -- attack cells of a robustness evaluation -------------------------------------------------------

def is_attack_cell(name: str) -> bool:
    """Whether a results cell is an attack's (``pgd_linf``, ...), not a corruption's."""
    return name in attack_names()


def attack_plan(names: Sequence[str], epsilons: Sequence[Union[str, float]], steps: int = 10,
                step_size: Optional[float] = None, random_start: bool = False,
                restarts: int = 1, seed: int = 0) -> Dict[str, Dict]:
    """The attack cells of an evaluation, as recorded in its results identity: ``{attack:
    {'epsilons': [...], 'settings': {...}}}``; cell ``(attack, k)`` is the k-th epsilon (from 1).
    Every attack is built here once, so a bad name or setting stops before any inference."""
    if not names:
        return {}
    values = [parse_epsilon(e) for e in epsilons or ()]
    if not values:
        raise AttackError('attacks need their budgets: --epsilons 1/255 2/255 4/255 8/255')
    if len(set(values)) != len(values):
        raise AttackError(f'--epsilons lists a budget twice: {list(epsilons)}')
    plan = {}
    for name in dict.fromkeys(names):
        attack = Attack.from_name(name, values[-1], steps=steps, step_size=step_size,
                                  random_start=random_start, restarts=restarts, seed=seed)
        settings = {k: v for k, v in attack.settings().items()
                    if k not in ('name', 'norm', 'eps', 'alpha')}
        plan[attack.label] = {'epsilons': values, 'epsilon_text': [str(e) for e in epsilons],
                              'settings': settings}
    return plan


def attack_cells(plan: Mapping[str, Dict]) -> List[Tuple[str, int]]:
    return [(name, k) for name, entry in plan.items()
            for k in range(1, len(entry['epsilons']) + 1)]


def attack_of_cell(plan: Mapping[str, Dict], name: str, index: int) -> Attack:
    entry = plan[name]
    return Attack.from_name(name, entry['epsilons'][index - 1], **entry['settings'])


def transform_names(pipeline: Sequence) -> List[str]:
    """The type names of a pipeline's transforms (configs, classes or instances), without
    their scope (``mmdet.Resize`` → ``Resize``)."""
    def kind(step) -> str:
        name = step.get('type', '') if isinstance(step, Mapping) else type(step).__name__
        return (name if isinstance(name, str) else getattr(name, '__name__', '')).split('.')[-1]
    return [kind(s) for s in pipeline]


def annotations_after_resize(pipeline: Sequence) -> bool:
    """Whether a test pipeline loads its annotations after resizing (mmdet's default: the
    ground truth stays at the file's scale for evaluation), by the transforms' type names."""
    kinds = transform_names(pipeline)
    loads = [i for i, k in enumerate(kinds) if k.startswith('LoadAnnotations')]
    resizes = [i for i, k in enumerate(kinds) if 'Resize' in k]
    return bool(loads and resizes and loads[0] > resizes[0])


def gt_at_file_scale(cfg) -> bool:
    """Whether a config's test pipelines load the ground truth after resizing (pass it as
    :func:`attack_batch`'s ``gt_at_file_scale``)."""
    from ..utils.config_checks import leaf_datasets
    return any(annotations_after_resize(list(d.get('pipeline', [])))
               for d in leaf_datasets(cfg.test_dataloader['dataset']))
