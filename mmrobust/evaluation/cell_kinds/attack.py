"""The attack cells: the clean images attacked in the model's data preprocessor.

A cell ``(<family>_<norm>, k)`` is the k-th budget of an attack of the run's plan
(:func:`~..attacks.attack_plan`); ``(worst, k)`` the per-image worst case over them
(:mod:`..worst_case`), computed from the others' per-image statistics, never inferred. The
families are rows of :mod:`..attack_families`.
"""
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping

from typing_extensions import override

from ...models.utils import unwrap_model
from ..attack_families import ATTACK_FAMILIES
from ..attacks import Attack, attack_batch, attack_cells, attack_of_cell, check_attack_pipeline
from ..cells import cell_dataloader, gt_at_file_scale
from . import WORST, Cell, CellRun, RunSpec, register_cell_kind
from . import corruption as _corruption  # noqa: F401  (registered before: run order)
from .per_cell import PerCellKind

__all__ = ['ATTACK', 'AttackKind', 'attacking']


def _is_attack(name: str) -> bool:
    family, _, norm = name.rpartition('_')
    return name == WORST or (family in ATTACK_FAMILIES and norm in ATTACK_FAMILIES[family].norms)


class AttackKind(PerCellKind):
    """Adversarial cells: each budget of each attack of the plan."""

    @override
    def planned(self, identity: Mapping) -> List[Cell]:
        return attack_cells(identity.get('attacks') or {})

    @override
    def identity(self, spec: RunSpec) -> Dict[str, Any]:
        return {'attacks': dict(spec.attacks) if spec.attacks else None}

    def check_run(self, runner: Any, cfg: Any, spec: RunSpec) -> None:
        """The pipeline loads the ground truth, and every attack can attack the model."""
        if not spec.attacks:
            return
        check_attack_pipeline(cfg)
        model = unwrap_model(runner.model)
        for name in spec.attacks:
            attack_of_cell(spec.attacks, name, 1).check_model(model)

    @override
    def dataloader(self, run: CellRun, cell: Cell) -> Any:
        return cell_dataloader(self.config(run), None, 0, run.spec.seed, run.spec.bgr_compat,
                               None)

    @override
    def prefetch(self, run: CellRun) -> int:
        return 0  # NOTE: the preprocessor attacks with the model: in the loop

    @override
    def model_context(self, run: CellRun, cell: Cell):
        assert run.spec.attacks
        return attacking(run.runner, run.cfg, attack_of_cell(run.spec.attacks, *cell))


@contextmanager
def attacking(runner, cfg: Any, attack: Attack) -> Iterator[None]:
    """The model's data preprocessor attacks every test batch within the block."""
    from ...models.data_preprocessors import PixelSpace
    from ...models.data_preprocessors.pixel_space import patched_forward
    model = unwrap_model(runner.model)
    late_gt = gt_at_file_scale(cfg)
    space = None

    def transform(data: dict, training: bool) -> dict:
        nonlocal space
        if training:
            return data
        if space is None:
            space = PixelSpace(model.data_preprocessor).to(data['inputs'].device)
        return attack_batch(model, data, attack, space, gt_at_file_scale=late_gt).data

    with patched_forward(model.data_preprocessor, transform):
        yield


# NOTE: an attack's loss needs the ground truth the config's own pipeline loads
ATTACK = register_cell_kind(AttackKind('attack', _is_attack, config_ground_truth=True,
                                       category='adversarial'))
