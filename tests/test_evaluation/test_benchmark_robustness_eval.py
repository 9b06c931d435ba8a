"""The scale benchmark of the robustness loop runs end to end at a tiny size and prints its table.

The figures themselves are the benchmark's business, not the test's.
"""
import json

import pytest

from helpers import run_tool


@pytest.mark.slow
def test_benchmark_prints_the_table_for_every_configuration(tmp_path):
    out_json = tmp_path / 'figures.json'
    proc = run_tool('analysis_tools/benchmark_robustness_eval.py', '--n', '6', '--cells', '1',
                    '--rates', '400', '--workers', '0', '--work-dir', tmp_path / 'work',
                    '--configurations', 'serial-pycocotools', 'serial-faster',
                    'background-faster', 'one-pass', 'overlapped', '--out', out_json)
    lines = proc.stdout.splitlines()
    assert any(line.startswith('| configuration | images/s |') for line in lines), proc.stdout
    for name in ('serial-pycocotools', 'serial-faster', 'background-faster', 'one-pass',
                 'overlapped'):
        rows = [line for line in lines if line.startswith(f'| {name} | 400 |')]
        assert len(rows) == 1, proc.stdout
        assert rows[0].split('|')[6].strip().endswith('x')  # full / max(i, ii)
        float(rows[0].split('|')[8].split()[0])  # the main thread's ms per image
    figures = json.loads(out_json.read_text())
    assert figures['n'] == 6 and figures['cells'] == ['gaussian_noise/3']
    loop = figures['loops']['serial-faster@400']
    assert set(loop['cells']) == {'clean/0', 'gaussian_noise/3'} and loop['ratio_total'] > 0
    # a serial loop waits for every metric; the background one records what it waited
    assert loop['wait_s'] == loop['metric_s']
    background = figures['loops']['background-faster@400']
    assert set(background['wait_s']) == set(background['metric_s']) == set(loop['cells'])
    # the loop's account of the main thread, per cell; the masks no metric reads not decoded
    assert set(figures['loops']['overlapped@400']['main_thread_ms']) == set(loop['cells'])
    assert figures['loops']['overlapped@400']['gt_masks'].startswith('not decoded')
    # the set is cached: a second run reuses it
    assert (tmp_path / 'work' / 'coco_6' / 'done.json').is_file()
