"""tools/analysis_tools/suite_durations.py: the suite's time table from a pytest log."""
from helpers import assert_user_error, run_tool_in_process

LOG = """\
[gw0] [ 33%] PASSED tests/test_a.py::test_trains@trained_toy_detector
[gw1] [ 66%] PASSED tests/test_b.py::test_one
[gw1] [100%] FAILED tests/test_b.py::test_two
============================= slowest durations ==============================
300.00s setup    tests/test_a.py::test_trains@trained_toy_detector
20.50s call     tests/test_a.py::test_trains@trained_toy_detector
12.25s call     tests/test_b.py::test_one
3.00s call     tests/test_b.py::test_two
0.20s teardown tests/test_b.py::test_two
========== 1 failed, 2 passed, 4 warnings in 330.10s (0:05:30) ==========
"""


def test_the_table_adds_up_each_workers_share_and_each_file(tmp_path):
    log = tmp_path / 'suite.log'
    log.write_text(LOG)
    status, out, _ = run_tool_in_process('analysis_tools/suite_durations.py', log, '--top', '2')
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == ("tests: 1 failed, 2 passed; wall 330.1 s; the tests' own time 336 s")
    # the grouped test's setup (its fixture, the training) is counted to the worker that ran it
    assert lines[1] == 'per worker: gw0 320 s, gw1 15 s'
    rows = [line for line in lines if line.startswith('| ') and not line.startswith('| s |')]
    assert rows[:2] == ['| 300.0 | setup | `tests/test_a.py::test_trains@trained_toy_detector` |',
                        '| 20.5 | call | `tests/test_a.py::test_trains@trained_toy_detector` |']
    assert rows[2:] == ['| 320 | `tests/test_a.py` |', '| 15 | `tests/test_b.py` |']


def test_a_log_without_durations_says_how_to_get_them(tmp_path):
    log = tmp_path / 'quiet.log'
    log.write_text('2 passed in 3.0s\n')
    status, _, err = run_tool_in_process('analysis_tools/suite_durations.py', log)
    assert_user_error(status, err, 2, 'no durations in the log', '--durations=0')
    status, _, err = run_tool_in_process('analysis_tools/suite_durations.py', log.with_name('x'))
    assert_user_error(status, err, 1, 'x is not a file')
