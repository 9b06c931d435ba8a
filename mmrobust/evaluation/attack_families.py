"""The attack families of a robustness evaluation: one row each, with its update rule.

A row (:class:`AttackFamily`) says everything that differs between families: the norms it comes
in (its cells are ``<family>_<norm>``), whether it starts from a uniform point of the ε-ball as
its paper does, whether it is for segmentors only, its steps and default step size, how it
weights a segmentor's per-pixel cross-entropy, and how a step moves (its update rule).
:mod:`.attacks` runs every family with the same loop, projection, seeding and model protection,
reading only the row. A new family is one :func:`register_attack_family` call; the tool, the
results identities and the report take it from here.

The rules work on one image alone (a batch of one), in RGB [0, 1] pixels, on its valid area
``mask``; a rule's ``state`` is a dict kept across the steps of one restart.
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..models import adversarial
from ..utils.tables import RowTable

__all__ = ['ATTACK_FAMILIES', 'NORMS', 'AttackFamily', 'PixelWeight', 'UpdateRule',
           'attack_families', 'cospgd_weight', 'madry_step_size', 'one_step_size',
           'register_attack_family', 'segpgd_weight', 'steepest_ascent']

NORMS = ('linf', 'l2')

#: ``(logits N x C x H x W, labels N x H x W with -1 where ignored, step from 0, steps)`` -> the
#: per-pixel weights of the cross-entropy at that step (N x H x W; computed without gradient)
PixelWeight = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]
#: ``(input gradient, norm, valid-area mask, state)`` -> the step's direction, of unit ``norm``
#: (the step size multiplies it; the result is projected into the ε-ball)
UpdateRule = Callable[[torch.Tensor, str, torch.Tensor, dict], torch.Tensor]


def steepest_ascent(grad: torch.Tensor, norm: str, mask: torch.Tensor, state: dict
                    ) -> torch.Tensor:
    """FGSM's and PGD's rule: ``sign(g)`` (L-inf) or ``g / ‖g‖₂`` (L2); no state."""
    return adversarial.step_direction(grad, norm, mask)


def madry_step_size(eps: float, steps: int) -> float:
    """2.5 ε / steps (Madry et al. 2018): the ball's boundary reachable from anywhere inside."""
    return 2.5 * eps / steps


def one_step_size(eps: float, steps: int) -> float:
    """ε: one step to the boundary (FGSM)."""
    return eps


def segpgd_weight(logits: torch.Tensor, labels: torch.Tensor, step: int, steps: int
                  ) -> torch.Tensor:
    """SegPGD (Gu et al., ECCV 2022): correct pixels 1 - λ, wrong ones λ, λ from 0 to ½."""
    lam = step / (2 * steps)
    correct = logits.argmax(1) == labels
    return torch.where(correct, 1 - lam, lam)


def cospgd_weight(logits: torch.Tensor, labels: torch.Tensor, step: int, steps: int
                  ) -> torch.Tensor:
    """CosPGD (Agnihotri et al., ICML 2024, softmax version): cos(softmax, one-hot) = p_y / ‖p‖."""
    prob = logits.softmax(1)
    p_true = prob.gather(1, labels.clamp_min(0)[:, None])[:, 0]
    return p_true / prob.norm(dim=1).clamp_min(1e-12)


@dataclass(frozen=True)
class AttackFamily:
    """One attack family.

    Args:
        name: lower-case letters and digits (cells are ``<name>_<norm>``).
        random_start: its paper's start: a uniform point of the ε-ball (True) or the image.
        paper: where it comes from, for the guide and the tool's help.
        segmentation_only: defined on per-pixel class scores: segmentors only.
        pixel_weight: the per-pixel weights of the segmentor's cross-entropy at each step; None
            for the plain mean. A segmentation-only family must give one.
        steps: a fixed number of steps (FGSM: 1) whatever ``--attack-steps`` says; None: as set.
        step_size: the default step from ``(eps, steps)``.
        update: the update rule.
        norms: the norms it comes in.
    """

    name: str
    random_start: bool
    paper: str
    segmentation_only: bool = False
    pixel_weight: Optional[PixelWeight] = None
    steps: Optional[int] = None
    step_size: Callable[[float, int], float] = madry_step_size
    update: UpdateRule = steepest_ascent
    norms: Tuple[str, ...] = field(default=NORMS)

    def __post_init__(self) -> None:
        if not re.fullmatch(r'[a-z][a-z0-9]*', self.name):
            raise ValueError(f'attack family name {self.name!r}: lower-case letters and digits '
                             '(its cells are <name>_<norm>)')
        if self.segmentation_only and self.pixel_weight is None:
            # NOTE: the segmentation families differ from PGD only in their pixel weighting
            raise ValueError(f'{self.name}: a segmentation-only family needs its pixel_weight '
                             '(segpgd_weight, cospgd_weight or its own rule); without one it '
                             'would be PGD under another name')
        if self.pixel_weight is not None and not self.segmentation_only:
            raise ValueError(f'{self.name}: pixel_weight weights a segmentor\'s per-pixel loss; '
                             'set segmentation_only=True')
        unknown = [n for n in self.norms if n not in NORMS]
        if unknown or not self.norms:
            raise ValueError(f'{self.name}: norms are among {NORMS}, got {self.norms}')
        if self.steps is not None and self.steps < 1:
            raise ValueError(f'{self.name}: steps must be >= 1 or None, got {self.steps}')

    def cell_names(self) -> List[str]:
        """Its cells' names, ``<name>_<norm>``."""
        return [f'{self.name}_{n}' for n in self.norms]


#: the families by name, in registration order (the tool's and the report's order)
ATTACK_FAMILIES: Dict[str, AttackFamily] = RowTable('attack family')


def register_attack_family(family: AttackFamily, force: bool = False) -> AttackFamily:
    """Add ``family`` to :data:`ATTACK_FAMILIES` (``force``: replace one of its name)."""
    return ATTACK_FAMILIES.add(family, force)


def attack_families() -> List[AttackFamily]:
    """The registered families, in registration order."""
    return list(ATTACK_FAMILIES.values())


for _row in (
        AttackFamily('fgsm', random_start=False, steps=1, step_size=one_step_size,
                     paper='Goodfellow et al. 2015'),
        AttackFamily('pgd', random_start=True, paper='Madry et al. 2018'),
        AttackFamily('segpgd', random_start=True, segmentation_only=True,
                     pixel_weight=segpgd_weight, paper='Gu et al., ECCV 2022'),
        AttackFamily('cospgd', random_start=True, segmentation_only=True,
                     pixel_weight=cospgd_weight, paper='Agnihotri et al., ICML 2024'),
):
    register_attack_family(_row)
