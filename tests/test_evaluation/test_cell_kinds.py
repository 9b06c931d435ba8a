"""Cell kinds (mmrobust.evaluation.cell_kinds): each name one kind's, mPC over the corruptions'."""
import json

import pytest

from mmrobust.evaluation.attack_families import (
    ATTACK_FAMILIES,
    AttackFamily,
    register_attack_family,
)
from mmrobust.evaluation.cell_kinds import (
    CELL_KINDS,
    CellKind,
    UnknownCellError,
    kind_of,
    register_cell_kind,
)
from mmrobust.evaluation.cell_kinds.attack import ATTACK
from mmrobust.evaluation.cell_kinds.corruption import CLEAN_SET, CORRUPTION
from mmrobust.evaluation.cell_kinds.shift import SHIFT
from mmrobust.evaluation.metrics import robustness_summary
from mmrobust.evaluation.results import corruption_cells

from helpers import REPO

LEGACY = REPO / 'tests/data/legacy_results/robustness_1d1a892.json'


@pytest.fixture
def occlusion():
    """A kind of cell added as a user would (occlusion patches), removed after the test."""
    kind = register_cell_kind(CellKind('occlusion', lambda name: name.startswith('occlusion_')))
    yield kind
    CELL_KINDS.pop('occlusion')


def test_every_name_is_one_kinds():
    assert [k.name for k in CELL_KINDS.values()] == ['clean', 'corruption', 'attack', 'shift']
    cases = {'clean': CLEAN_SET, 'fog': CORRUPTION, 'speckle_noise': CORRUPTION,
             'pgd_linf': ATTACK, 'cospgd_l2': ATTACK, 'worst': ATTACK, 'acdc_fog': SHIFT,
             'foggy_cityscapes': SHIFT}
    assert {name: kind_of(name) for name in cases} == cases
    assert [k.name for k in CELL_KINDS.values() if k.counts_in_mpc] == ['corruption']
    # a name nobody owns is an error that says what to do, not a corruption counted in mPC
    with pytest.raises(UnknownCellError, match="'occlusion_3' is no kind's.*Register"):
        kind_of('occlusion_3')
    with pytest.raises(UnknownCellError, match="'pgd_l1' is no kind's"):
        kind_of('pgd_l1')


def test_a_registered_kind_and_family_are_found_and_left_out_of_mpc(occlusion):
    register_attack_family(AttackFamily('mifgsmx', random_start=False, paper='-',
                                        norms=('linf',)))
    try:
        assert kind_of('occlusion_3') is occlusion and kind_of('mifgsmx_linf') is ATTACK
        cells = {'clean': {0: {'AP': 0.4}}, 'fog': {1: {'AP': 0.3}, 3: {'AP': 0.2}},
                 'occlusion_3': {1: {'AP': 0.0}}, 'mifgsmx_linf': {1: {'AP': 0.0}}}
        summary = robustness_summary(cells)['metrics']['AP']
        # mPC is fog's alone: before the kinds, every name that was not clean, an attack's or a
        # shift's counted as a corruption (corruption_cells listed occlusion_3, and the summary
        # stopped on a KeyError looking up its category)
        assert summary['mPC'] == pytest.approx(0.25)
        assert list(summary['per_corruption']) == ['fog']
        assert corruption_cells({'cells': cells}) == [('fog', 1), ('fog', 3)]
    finally:
        ATTACK_FAMILIES.pop('mifgsmx')
    with pytest.raises(ValueError, match='registered already'):
        register_cell_kind(CellKind('shift', lambda name: False))


def test_two_kinds_claiming_a_name_is_an_error(occlusion):
    register_cell_kind(CellKind('fog_patches', lambda name: name in ('fog', 'occlusion_1')))
    try:
        with pytest.raises(UnknownCellError, match="'fog' is more than one kind's "
                                                   r'\(corruption, fog_patches\)'):
            kind_of('fog')
    finally:
        CELL_KINDS.pop('fog_patches')


def test_the_legacy_results_files_cells_keep_their_kinds():
    data = json.loads(LEGACY.read_text())
    kinds = {name: kind_of(name).name for name in data['cells']}
    assert kinds['clean'] == 'clean' and set(kinds.values()) == {'clean', 'corruption'}
    assert {c for c, _ in corruption_cells(data)} == set(data['cells']) - {'clean'} != set()


class _Occlude:
    """A grey square over the image's top-left corner, ``size`` pixels wide (a test transform)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, results: dict) -> dict:
        results['img'] = results['img'].copy()
        results['img'][:self.size, :self.size] = 128
        return results


def _occlusion_kind():
    """A kind as a user would add it: planned from its options, loaded by its own dataloader."""
    import copy

    from mmrobust.evaluation.cell_kinds.per_cell import PerCellKind
    from mmrobust.evaluation.evaluator_cfg import find_loading_step
    from mmrobust.utils.config_checks import leaf_datasets

    class OcclusionKind(PerCellKind):
        def planned(self, identity):
            return [('occlusion', int(k)) for k in (identity.get('occlusion') or {})]

        def identity(self, spec):
            sizes = spec.kind_options.get('occlusion')
            return {'occlusion': {str(k): size for k, size in enumerate(sizes, 1)}} \
                if sizes else {}

        def dataloader(self, run, cell):
            loader = copy.deepcopy(self.config(run).test_dataloader)
            size = run.spec.kind_options['occlusion'][cell[1] - 1]
            for dataset in leaf_datasets(loader['dataset']):
                pipeline = list(dataset['pipeline'])
                pipeline.insert(find_loading_step(pipeline) + 1, _Occlude(size))
                dataset['pipeline'] = pipeline
            return loader

    return OcclusionKind('occlusion', lambda name: name == 'occlusion', own_images=False)


def test_a_kind_registered_at_run_time_runs_end_to_end(toy_data, tmp_path):
    """One class, nothing else: its cells are planned, identified, inferred and resumed."""
    from test_robustness import _init_checkpoint

    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness
    from mmrobust.evaluation.results import planned_cells

    from helpers import DEMO_DET_CFG, robustness_runner
    kind = register_cell_kind(_occlusion_kind())
    try:
        ckpt = _init_checkpoint(DEMO_DET_CFG, tmp_path / 'det.pth')
        runner, cfg = robustness_runner(DEMO_DET_CFG, str(tmp_path / 'work'), str(ckpt), {
            'test_dataloader.num_workers': 0, 'test_dataloader.persistent_workers': False,
            'test_dataloader.dataset.indices': 2})
        protocol = resolve_protocol(None, ['fog'], [1])
        path = str(tmp_path / 'r.json')

        def run():
            return evaluate_robustness(runner, cfg, protocol, path, RobustnessOptions(
                checkpoint=str(ckpt), metric_queue=0, kind_options={'occlusion': [8, 32]}))
        data = run()
        assert planned_cells(data) == [('clean', 0), ('fog', 1), ('occlusion', 1),
                                       ('occlusion', 2)]
        assert set(data['cells']['occlusion']) == {'1', '2'}
        # its options are compared on resume (a kind's field joins the identity keys)
        assert data['occlusion'] == {'1': 8, '2': 32} and 'occlusion' in data['identity_keys']
        assert list(robustness_summary(data['cells'])['metrics']['coco/bbox_mAP'][
            'per_corruption']) == ['fog']  # NOTE: not in mPC
        again = run()  # NOTE: resumed: nothing inferred, the time kept
        assert again['cells'] == data['cells'] and again['time'] == data['time']
        with pytest.raises(Exception, match='occlusion'):
            evaluate_robustness(runner, cfg, protocol, path, RobustnessOptions(
                checkpoint=str(ckpt), metric_queue=0, kind_options={'occlusion': [16]}))
    finally:
        CELL_KINDS.pop(kind.name)


def test_the_run_spec_is_checked_once_and_again_after_a_change(monkeypatch):
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions
    from mmrobust.evaluation.cell_kinds.corruption import CorruptionKind
    from mmrobust.utils.errors import UsageError
    checked = []
    check = CorruptionKind.check
    monkeypatch.setattr(CorruptionKind, 'check',
                        lambda self, spec: checked.append(self.name) or check(self, spec))
    protocol = resolve_protocol(None, ['fog'], [1])
    options = RobustnessOptions(seed=3)
    spec = options.validated(protocol)
    # the tool validates before it builds the runner; evaluate_robustness gets the same spec
    assert options.validated(protocol) is spec and checked == ['corruption']
    assert spec.seed == 3 and spec.protocol is protocol
    options.checkpoint_load = {'matched': 1}  # NOTE: recorded, not checked
    assert options.validated(protocol) is spec and len(checked) == 1
    options.seed = 4
    assert options.validated(protocol).seed == 4 and len(checked) == 2
    options.metric_queue = -1
    with pytest.raises(UsageError, match=r'--metric-queue \(metric_queue\) must be 0'):
        options.validated(protocol)
    with pytest.raises(UsageError, match='occlusion, which no registered cell kind is'):
        RobustnessOptions(kind_options={'occlusion': [8]}).validated(protocol)


def test_the_built_in_kinds_are_one_list_in_run_order():
    from mmrobust.evaluation.cell_kinds.builtin import BUILTIN_KINDS
    assert list(CELL_KINDS.values())[:len(BUILTIN_KINDS)] == list(BUILTIN_KINDS)
    # a kind asked for alone names the protocol of its run
    assert [(k.name, k.alone) for k in BUILTIN_KINDS] == [
        ('clean', None), ('corruption', None), ('attack', 'attacks'), ('shift', 'shifts')]


def test_the_report_takes_each_cells_category_from_its_kind():
    from mmrobust.evaluation.report import _category
    names = ('clean', 'fog', 'gaussian_noise', 'pgd_linf', 'worst', 'acdc_fog', 'not_a_cell')
    # the worst case over attacks had no category before its kind gave it one
    assert {n: _category(n) for n in names} == {
        'clean': '', 'fog': 'weather', 'gaussian_noise': 'noise', 'pgd_linf': 'adversarial',
        'worst': 'adversarial', 'acdc_fog': 'real-world shift', 'not_a_cell': ''}


def test_a_registered_kind_that_plans_no_cell_says_so(occlusion, monkeypatch):
    from mmrobust.evaluation import robustness
    said = []
    monkeypatch.setattr(robustness, 'print_log', lambda message, **kwargs: said.append(message))
    robustness._say_idle_kinds({'cells_planned': {'fog': [1]}, 'attacks': None})
    assert len(said) == 1 and "'occlusion' is registered but plans no cell" in said[0]
    assert 'robustness_kind_options.occlusion' in said[0]
