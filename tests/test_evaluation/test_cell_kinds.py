"""Cell kinds (mmrobust.evaluation.cell_kinds): each name one kind's, mPC over the corruptions'."""
import json

import pytest

from mmrobust.evaluation.attack_families import (
    ATTACK_FAMILIES,
    AttackFamily,
    register_attack_family,
)
from mmrobust.evaluation.cell_kinds import (
    ATTACK,
    CELL_KINDS,
    CLEAN_SET,
    CORRUPTION,
    SHIFT,
    CellKind,
    UnknownCellError,
    kind_of,
    register_cell_kind,
)
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
