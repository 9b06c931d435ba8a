"""White-box adversarial attacks on detectors and segmentors, in the model's own pixel space.

FGSM and PGD (L-inf and L2; random start, restarts) ascend, for detectors, the model's own
training loss on the test set's ground truth (every mmdet detector's loss) and, for segmentors,
the per-pixel cross-entropy of the predictor the config scores. SegPGD (Gu et al., ECCV 2022:
the correctly and the wrongly classified pixels reweighted over the iterations) and CosPGD
(Agnihotri et al., ICML 2024, the softmax version: each pixel weighted by the cosine of the
softmax prediction and the one-hot target) reweight that cross-entropy; they are for segmentors.

The losses, and the scored predictor behind a segmentor's, are :mod:`.attack_losses`'.

Perturbations live in RGB [0, 1] pixels (:class:`~mmrobust.models.data_preprocessors.PixelSpace`,
the preprocessor's own mean, std and channel order) on each image's own area: the padding keeps
its values, and the L2 budget is the norm over that area. The step, projection, random start
and the model's protection (eval mode, input gradient only, buffers restored, fp16 scaling, no
step on a non-finite gradient) are DAT's (:mod:`mmrobust.models.adversarial`). Each image is
attacked alone, on the input the data preprocessor gives it alone, and its random parts (the
random start, and the proposal samplers of two-stage detectors inside the loss) are drawn from
the attack's seed and the image's path: an image gets the same attack in any batch, in any
order, on any rank and after a resume.
"""
import logging
import math
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log

from ..models import adversarial
from ..models.data_preprocessors import PixelSpace, valid_mask
from ..models.utils import unwrap_model
from ..utils.config_checks import leaf_datasets
from .attack_families import ATTACK_FAMILIES, AttackFamily
from .attack_losses import (
    AttackError,
    AttackLossError,
    is_segmentor,
    objective,
    samples_for_loss,
)
from .cells import (
    ATTACKS,
    NORMS,
    annotations_after_resize,
    attack_names,
    gt_at_file_scale,
)
from .evaluator_cfg import annotation_steps, transform_names

__all__ = ['ATTACKS', 'NORMS', 'Attack', 'AttackError', 'AttackLossError', 'AttackResult',
           'annotations_after_resize',
           'attack_batch', 'attack_cells', 'attack_loss', 'attack_names', 'attack_of_cell',
           'attack_plan', 'check_attack_pipeline', 'gt_at_file_scale',
           'parse_epsilon', 'transform_names']

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
        name: a registered family (:data:`~.attack_families.ATTACK_FAMILIES`): ``fgsm``,
            ``pgd``, ``segpgd``, ``cospgd``, ...
        norm: ``linf`` (``eps`` and the step per pixel value) or ``l2`` (norms over the image's
            own area, all three channels).
        eps: the budget in RGB [0, 1] pixel units; 0 gives the clean images back unchanged.
        steps: iterations (a family with fixed steps, FGSM's 1, keeps its own).
        step_size: the step; default the family's (``eps`` for FGSM, else ``2.5 * eps /
            steps``, Madry et al.: the budget's boundary reachable from anywhere inside it).
        random_start: start from a uniform point of the ε-ball; None: the family's default
            (its paper's).
        restarts: runs from new random starts; the one with the highest final loss is kept,
            per image.
        seed: seeds the random starts and the detectors' proposal samplers.
    """

    name: str
    norm: str
    eps: float
    steps: int = 10
    step_size: Optional[float] = None
    random_start: Optional[bool] = None
    restarts: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        family = ATTACK_FAMILIES.get(self.name)
        if family is None or self.norm not in family.norms:
            raise AttackError(f'unknown attack {self.label!r}; choose from '
                              f'{", ".join(attack_names())}')
        parse_epsilon(self.eps)
        if self.random_start is None:
            object.__setattr__(self, 'random_start', family.random_start)
        if family.steps is not None and self.steps != family.steps:
            object.__setattr__(self, 'steps', family.steps)
        if self.steps < 1 or self.restarts < 1:
            raise AttackError(f'{self.label}: steps and restarts must be >= 1, got '
                              f'{self.steps} and {self.restarts}')
        if self.step_size is not None and (not math.isfinite(self.step_size)
                                           or self.step_size <= 0):
            raise AttackError(f'{self.label}: step_size must be > 0, got {self.step_size}')
        if self.restarts > 1 and not self.random_start:
            default = 'on' if family.random_start else 'off'
            raise AttackError(f'{self.label}: restarts without random_start repeat the same '
                              'attack; add random_start (--attack-random-start on; '
                              f'{self.name}\'s default is {default})')

    @classmethod
    def from_name(cls, name: str, eps: Union[str, float], **kwargs) -> 'Attack':
        """``Attack.from_name('pgd_linf', '8/255', steps=10)``."""
        family, _, norm = name.rpartition('_')
        return cls(family or name, norm, parse_epsilon(eps), **kwargs)

    @property
    def label(self) -> str:
        """The attack's cell name, ``<attack>_<norm>``."""
        return f'{self.name}_{self.norm}'

    @property
    def family(self) -> AttackFamily:
        """Its family's row."""
        return ATTACK_FAMILIES[self.name]

    @property
    def alpha(self) -> float:
        """The step size: as set, else the family's (eps for FGSM, 2.5 eps / steps for PGD)."""
        if self.step_size is not None:
            return float(self.step_size)
        return float(self.family.step_size(self.eps, self.steps))

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`AttackError` if this attack is not defined for ``model``."""
        if self.family.segmentation_only and not is_segmentor(model):
            raise AttackError(f'{self.label} attacks per-pixel class scores: it is for '
                              f'segmentors (mmseg), and {type(model).__name__} is not one; use '
                              f'pgd_{self.norm} for detectors')

    def settings(self) -> Dict:
        """Everything that decides the attack (for results identities)."""
        return {**asdict(self), 'alpha': self.alpha}


@dataclass
class AttackResult:
    """The attacked batch and what the attack saw, averaged over its images.

    The loss it ascended at each step and the final loss (for segmentors the plain cross-entropy) of
    each image's kept restart.
    """
    data: dict
    step_losses: List[float] = field(default_factory=list)
    final_loss: Optional[float] = None
    #: steps (over images and restarts) whose input gradient was not finite: no move
    nonfinite_steps: int = 0


# -- the attack ------------------------------------------------------------------------------------

def _image_key(sample, index: int) -> str:
    meta = getattr(sample, 'metainfo', {}) if sample is not None else {}
    return str(meta.get('img_path', meta.get('img_id', index)))


def _seed(attack: Attack, key: str, *parts: int) -> int:
    return zlib.crc32(f'{attack.seed}|{key}|{"|".join(map(str, parts))}'.encode())


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """torch's random state seeded within the block.

    Restored after (the proposal samplers of two-stage detectors draw from it inside the loss).
    """
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@dataclass
class _Image:
    """One image of a batch as it would be alone.

    Each image's input is cropped to the shape the data preprocessor gives it alone (mmdet's
    per-image ``pad_shape``), and its samples (the metric's and the loss's) saying so.
    """
    index: int
    key: str
    inputs: torch.Tensor
    sample: object
    loss_sample: object

    @property
    def height_width(self) -> Tuple[int, int]:
        return tuple(self.inputs.shape[-2:])


def _images(x: torch.Tensor, samples: Sequence, loss_samples: Sequence) -> List[_Image]:
    out = []
    for i, (sample, loss_sample) in enumerate(zip(samples, loss_samples)):
        shape = sample.metainfo.get('pad_shape') or x.shape[-2:]
        h, w = min(int(shape[0]), x.shape[-2]), min(int(shape[1]), x.shape[-1])
        if 'batch_input_shape' in sample.metainfo:
            # NOTE: the loss reads the batch's shape (anchors' valid flags, RPN): alone, its own
            sample, loss_sample = sample.clone(), loss_sample.clone()
            for s in (sample, loss_sample):
                s.set_metainfo({'batch_input_shape': (h, w)})
        # NOTE: contiguous: mmcv 2.1's RoIAlign ignores strides
        out.append(_Image(i, _image_key(sample, i), x[i:i + 1, :, :h, :w].contiguous(), sample,
                          loss_sample))
    return out


def _attack_image(module: nn.Module, image: _Image, attack: Attack, space: PixelSpace
                  ) -> Tuple[torch.Tensor, List[float], float, int]:
    """The attack on one image alone, the best of its restarts.

    (attacked input, step losses, final loss, steps without a finite gradient) of one image alone,
    the best of its restarts.
    """
    x = image.inputs
    mask = valid_mask([image.sample], tuple(x.shape), x.device)
    x0 = space.to_pixels(x).detach()

    def loss_at(pixels: torch.Tensor, step: Optional[int]) -> torch.Tensor:
        # NOTE: the padding keeps the preprocessor's values
        inputs = torch.where(mask, space.from_pixels(pixels).to(x.dtype), x)
        return objective(attack, module, inputs, [image.loss_sample], step)

    best: Optional[Tuple[float, torch.Tensor, List[float]]] = None
    nonfinite = 0
    for restart in range(attack.restarts):
        delta = torch.zeros_like(x0)
        if attack.random_start:
            # NOTE: keyed by the image, not its place in the batch
            gen = torch.Generator().manual_seed(_seed(attack, image.key, restart))
            start = adversarial.random_start(attack.norm, attack.eps, mask[0], gen)
            delta = adversarial.project(start[None], attack.eps, attack.norm, x0, mask)
        losses, state = [], {}  # state: the update rule's, across this restart's steps
        for step in range(attack.steps):
            with _seeded(_seed(attack, image.key, restart, step), x.device):
                grad, loss = adversarial.input_gradient(
                    lambda pixels: loss_at(pixels, step), x0 + delta)
            losses.append(loss)
            nonfinite += int(not bool(adversarial.finite_images(grad).all()))
            move = attack.family.update(grad, attack.norm, mask, state)
            delta = adversarial.project(delta + attack.alpha * move, attack.eps, attack.norm, x0,
                                        mask)
        with torch.no_grad(), _seeded(_seed(attack, image.key, restart, attack.steps), x.device):
            final = float(loss_at(x0 + delta, None))
        if best is None or final > best[0]:
            best = (final, delta, losses)
    assert best is not None
    final, delta, losses = best
    return torch.where(mask, space.from_pixels(x0 + delta).to(x.dtype), x), losses, final, \
        nonfinite


def attack_batch(model: nn.Module, data: dict, attack: Attack,
                 space: Optional[PixelSpace] = None, gt_at_file_scale: bool = False,
                 pixel_max: float = 255.) -> AttackResult:
    """The preprocessed batch ``data`` (``inputs``, ``data_samples``) with its images attacked.

    Each image is attacked alone, on the input the data preprocessor gives it alone (its own
    padded shape), with its own seed: the same attack in any batch, in any order, on any rank.

    Args:
        model: the detector or segmentor (a DDP wrapper is unwrapped); eval mode is used and
            the model is left as it was.
        data: the preprocessed batch (``inputs``, ``data_samples``).
        attack: the setting; ``eps == 0`` returns ``data`` itself (the clean images, exactly).
        space: the model's pixel space (default: from its data preprocessor).
        gt_at_file_scale: detection ground truth was loaded at the file's scale (after
            ``Resize``, as mmdet's test pipelines do) and is rescaled to the input's for the
            loss; the batch returned keeps the samples as they were.
        pixel_max: the largest pixel value of the images (255 for 8-bit).

    Raises:
        AttackError: a segmentation-only attack on a detector, or test data without ground
            truth, or a model whose training loss fails on it.
    """
    module = unwrap_model(model)
    attack.check_model(module)
    if attack.eps == 0:
        return AttackResult(data)
    x, samples = data['inputs'], data.get('data_samples')
    loss_samples = samples_for_loss(module, samples, gt_at_file_scale)
    space = space or PixelSpace(module.data_preprocessor, pixel_max=pixel_max).to(x.device)
    adv = x.detach().clone()
    step_losses, finals, nonfinite = [], [], 0
    with adversarial.eval_mode(module):
        for image in _images(x, samples, loss_samples):
            h, w = image.height_width
            out, losses, final, skipped = _attack_image(module, image, attack, space)
            adv[image.index, :, :h, :w] = out[0]
            step_losses.append(losses)
            finals.append(final)
            nonfinite += skipped
    if nonfinite:
        print_log(f'{attack.label}: {nonfinite} attack step(s) had a non-finite input gradient '
                  '(fp16 overflow?) and did not move their image', logger='current',
                  level=logging.WARNING)
    return AttackResult(dict(data, inputs=adv), [sum(v) / len(v) for v in zip(*step_losses)],
                        sum(finals) / len(finals), nonfinite)


def attack_loss(model: nn.Module, data: dict, attack: Attack, gt_at_file_scale: bool = False
                ) -> float:
    """The final loss ``attack`` ascends at ``data``'s images, averaged.

    The loss ``attack`` ascends (its final form: the training loss, or the scored predictor's plain
    per-pixel cross-entropy for segmentors) at ``data``'s images, each alone and seeded as the
    attack seeds it, averaged over the images (as :attr:`AttackResult.final_loss`).
    """
    module = unwrap_model(model)
    x, samples = data['inputs'], data['data_samples']
    attack.check_model(module)
    loss_samples = samples_for_loss(module, samples, gt_at_file_scale)
    losses = []
    with torch.no_grad(), adversarial.eval_mode(module):
        for image in _images(x, samples, loss_samples):
            with _seeded(_seed(attack, image.key, 0, attack.steps), x.device):
                losses.append(float(objective(attack, module, image.inputs,
                                              [image.loss_sample], None)))
    return sum(losses) / len(losses)


# -- attack cells of a robustness evaluation -------------------------------------------------------

def attack_plan(names: Sequence[str], epsilons: Sequence[Union[str, float]], steps: int = 10,
                step_size: Optional[float] = None, random_start: Optional[bool] = None,
                restarts: int = 1, seed: int = 0) -> Dict[str, Dict]:
    """The attack cells of an evaluation, as recorded in its results identity.

    ``{attack: {'epsilons': [...], 'settings': {...}}}``; cell ``(attack, k)`` is the k-th epsilon
    (from 1). Every attack is built here once, so a bad name or setting stops before any inference;
    the settings recorded are resolved (``random_start`` None becomes each family's default).
    """
    if not names:
        return {}
    values = [parse_epsilon(e) for e in epsilons or ()]
    if not values:
        raise AttackError('attacks need their budgets: --epsilons 1/255 2/255 4/255 8/255')
    if len(set(values)) != len(values):
        raise AttackError(f'--epsilons lists a budget twice: {list(epsilons)}')
    linf = [n for n in dict.fromkeys(names) if n.rpartition('_')[2] == 'linf']
    big = [str(e) for e, v in zip(epsilons, values) if v > 1]
    if linf and big:
        # NOTE: a budget above 1 lets every pixel reach 0 or 255: a 2 meant as 2/255
        raise AttackError(f'--epsilons {" ".join(big)}: an L-inf budget ({", ".join(linf)}) is '
                          'in [0, 1] RGB pixel units, where more than 1 lets every pixel go to 0 '
                          f'or 255; write it over 255, e.g. {big[0]}/255')
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
    """Every attack cell ``(name, k)`` of an attack plan, k from 1."""
    return [(name, k) for name, entry in plan.items()
            for k in range(1, len(entry['epsilons']) + 1)]


def attack_of_cell(plan: Mapping[str, Dict], name: str, index: int) -> Attack:
    """The :class:`Attack` of the plan's cell ``(name, index)``."""
    entry = plan[name]
    return Attack.from_name(name, entry['epsilons'][index - 1], **entry['settings'])


def check_attack_pipeline(cfg: Config) -> None:
    """Attacks ascend the training loss: the test pipeline must load the ground truth."""
    for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
        kinds = transform_names(dataset.get('pipeline', []))
        if not annotation_steps(dataset.get('pipeline', [])):
            raise AttackError(
                'the attacks ascend the model\'s training loss, which needs the ground truth, '
                f'and the test pipeline does not load it: {kinds}. Add '
                "dict(type='LoadAnnotations', ...) before the Pack step of "
                'test_dataloader.dataset.pipeline')
