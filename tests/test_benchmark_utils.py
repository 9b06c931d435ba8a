"""The interleaving helpers every benchmark shares (mmrobust.utils.benchmark)."""
import os

import pytest

from mmrobust.utils.benchmark import (
    fmt_range,
    interleave,
    interleave_processes,
    ratio_summary,
    summary,
)


def test_interleave_alternates_cases_step_by_step_and_rotates_the_order():
    calls = []
    cases = {name: (lambda name=name: calls.append(name)) for name in 'abc'}
    times = interleave(cases, rounds=3, warmup=1)
    # one step per case and round, the first case of each round rotating: no case always first
    assert calls == list('abc' 'bca' 'cab' 'abc')
    assert {k: len(v) for k, v in times.items()} == {'a': 3, 'b': 3, 'c': 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_a_step_may_report_its_own_duration():
    times = interleave({'remote': lambda: 0.25, 'local': lambda: None}, rounds=2, warmup=0)
    assert times['remote'] == [0.25, 0.25] and len(times['local']) == 2


def test_summaries_and_round_by_round_ratios():
    assert summary([3.0, 1.0, 2.0]) == {'median': 2.0, 'min': 1.0, 'max': 3.0}
    # ratios pair the rounds: (2/1, 6/2, 4/4)
    assert ratio_summary([2.0, 6.0, 4.0], [1.0, 2.0, 4.0]) == {'median': 2.0, 'min': 1.0,
                                                               'max': 3.0}
    assert fmt_range({'median': 2.0, 'min': 1.0, 'max': 3.0}, '.1f', 'x') == '2.0x (1.0x-3.0x)'


def _counter_case(scale: int):
    """A worker-side case: its step returns nothing, its info names its process."""
    state = {'n': 0}

    def step() -> None:
        state['n'] += 1
        sum(range(1000 * scale))

    return step, {'pid': os.getpid(), 'scale': scale, 'steps': lambda: {'n': state['n']}}


@pytest.mark.slow
def test_cases_in_their_own_processes_take_steps_in_turn():
    out = interleave_processes({'small': (_counter_case, (1, )), 'large': (_counter_case, (50, ))},
                               rounds=3, warmup=1)
    assert out['small']['info']['pid'] != out['large']['info']['pid'] != os.getpid()
    assert out['small']['info']['scale'] == 1 and 'steps' not in out['small']['info']
    assert len(out['small']['times']) == len(out['large']['times']) == 3
    assert out['large']['stats']['peak_rss_mb'] > 0


def _failing_case():
    raise ValueError('no such model')


@pytest.mark.slow
def test_a_failing_case_reports_its_traceback():
    with pytest.raises(RuntimeError, match="(?s)case 'bad' failed.*no such model"):
        interleave_processes({'bad': (_failing_case, ())}, rounds=1)
