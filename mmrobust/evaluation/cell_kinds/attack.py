"""The attack cells: the clean images attacked in the model's data preprocessor.

A cell ``(<family>_<norm>, k)`` is the k-th budget of an attack of the run's plan
(:func:`~..attacks.attack_plan`); ``(worst, k)`` the per-image worst case over them
(:mod:`..worst_case`), computed from the others' per-image statistics, never inferred. The
families are rows of :mod:`..attack_families`.
"""
import argparse
import copy
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from mmengine.logging import print_log
from typing_extensions import override

from ...models.utils import unwrap_model
from ...utils.config_checks import leaf_datasets
from ...utils.errors import UsageError
from ..attack_families import ATTACK_FAMILIES, attack_families
from ..attack_losses import is_segmentor
from ..attack_report import attack_markdown, plot_attacks, write_attack_csv
from ..attacks import (
    Attack,
    attack_batch,
    attack_cells,
    attack_names,
    attack_of_cell,
    attack_plan,
    check_attack_pipeline,
)
from ..cells import cell_dataloader, gt_at_file_scale
from ..worst_case import add_worst_case
from . import WORST, Cell, CellRun, RunSpec
from .per_cell import PerCellKind

__all__ = ['ATTACK', 'AttackKind', 'attacking']


def _loss_reads_masks(model: Any) -> bool:
    """Whether a detector's training loss reads instance masks (a mask head or mask loss)."""
    return bool(getattr(model, 'with_mask', False)) or any(
        hasattr(m, 'loss_mask') for m in model.modules())


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
    def config(self, run: CellRun) -> Any:
        """The config's own, with the instance masks loaded where the model's loss reads them.

        A zoo test pipeline loads what its metric needs: RTMDet-Ins's loads boxes only, while
        its training loss reads the masks.
        """
        model = unwrap_model(run.runner.model)
        # NOTE: a segmentor's loss reads its label maps (mmseg's Mask2Former has a loss_mask)
        if is_segmentor(model) or not _loss_reads_masks(model):
            return run.cfg
        cfg = copy.deepcopy(run.cfg)
        added = False
        for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
            for step in dataset.get('pipeline', []):
                if isinstance(step, dict) and str(step.get('type', '')).endswith(
                        'LoadAnnotations') and not step.get('with_mask', False):
                    step['with_mask'] = added = True
        if added and 'attack_gt' not in run.loading:  # NOTE: said once, and recorded
            run.loading['attack_gt'] = (f'instance masks loaded too (with_mask=True): the '
                                        f'training loss of {type(model).__name__} reads them')
            print_log(f'attack cells: {run.loading["attack_gt"]}', logger='current')
        return cfg

    @override
    def prefetch(self, run: CellRun) -> int:
        return 0  # NOTE: the preprocessor attacks with the model: in the loop

    @override
    def model_context(self, run: CellRun, cell: Cell):
        assert run.spec.attacks
        return attacking(run.runner, run.cfg, attack_of_cell(run.spec.attacks, *cell))

    @override
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        families = attack_families()  # NOTE: the registered rows, a user's own among them
        seg_only = ' / '.join(f.name for f in families if f.segmentation_only)
        starts = ', '.join(f'{"on" if f.random_start else "off"} for {f.name}'
                           for f in families)
        group = parser.add_argument_group('attack cells (white-box, in the preprocessor)')
        group.add_argument('--attacks', nargs='+', default=None, metavar='ATTACK',
                           help='white-box attack cells, each at every --epsilons: '
                                f'{", ".join(attack_names())} ({seg_only}: segmentors); '
                                'without --protocol / --corruptions only the cells asked for '
                                'run')
        group.add_argument('--epsilons', nargs='+', default=None, metavar='EPS',
                           help='attack budgets in [0, 1] RGB pixel units, e.g. 1/255 8/255 '
                                '(L-inf: per pixel value, at most 1; L2: the norm over the '
                                "image's pixels and channels, in the same units)")
        group.add_argument('--attack-steps', type=int, default=10,
                           help='PGD iterations (10)')
        group.add_argument('--attack-step-size', type=float, default=None,
                           help='default: 2.5 * epsilon / steps (FGSM: epsilon)')
        group.add_argument('--attack-random-start', nargs='?', const='on', default=None,
                           choices=('on', 'off'),
                           help='start from a uniform point of the epsilon-ball (default: '
                                f"each attack's paper: {starts})")
        group.add_argument('--attack-restarts', type=int, default=1,
                           help='random restarts (needs the random start); the strongest '
                                'kept, per image')

    @override
    def apply_args(self, args: argparse.Namespace, options: Any) -> bool:
        """``options.attacks``: the plan of ``--attacks`` (every attack built once, checked)."""
        start = args.attack_random_start
        options.attacks = attack_plan(
            args.attacks or (), args.epsilons, args.attack_steps, args.attack_step_size,
            None if start is None else start == 'on', args.attack_restarts,
            0 if args.seed is None else args.seed) or None
        if args.epsilons and not options.attacks:
            raise UsageError('--epsilons needs --attacks (e.g. --attacks pgd_linf)')
        return bool(options.attacks)

    @override
    def finish(self, path: str, data: Dict, stats_folders: Optional[Sequence[str]] = None
               ) -> Dict[str, str]:
        """The per-image worst case over the attacks (:mod:`..worst_case`), logged."""
        attacks = list(data.get('attacks') or {})
        before = set(data.get('cells', {}).get(WORST, {}))
        skipped = add_worst_case(path, data, stats_folders)
        added = sorted(set(data.get('cells', {}).get(WORST, {})) - before, key=int)
        if added:
            print_log(f'worst case over {", ".join(attacks)} per image: cell(s) {WORST} '
                      f'{", ".join(added)} recorded', logger='current')
        return {f'worst-case cell at budget {k}': why for k, why in skipped.items()}

    @override
    def report_markdown(self, results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
                        extras: Any) -> List[str]:
        return attack_markdown(results_by_label, metrics, extras)

    @override
    def report_files(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        return write_attack_csv(results_by_label, out_dir, metrics, extras)

    @override
    def report_plots(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        return plot_attacks(results_by_label, out_dir, metrics, extras)


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
ATTACK = AttackKind('attack', _is_attack, config_ground_truth=True, category='adversarial',
                    alone='attacks')
