"""The suite's helpers, imported as a package (``from helpers import REPO, run_tool``).

Paths and configs, the tool runners, the launcher of spawned ranks. The fixtures stay in
``tests/conftest.py``; the harness (time limits, watchdog, process reaper) is the pytest plugin
:mod:`helpers.harness`; ``cpu_sync_bn`` and ``reference_corruptions`` are imported by module.
"""
from .paths import ALL_CONFIGS, CONFIGS, DEMO_DET_CFG, REPO, TOKENIZER_CONFIGS, config_id
from .ranks import free_port, run_ranks
from .tools import (
    assert_user_error,
    init_checkpoint,
    robustness_runner,
    run_cmd,
    run_tool,
    run_tool_here,
    run_tool_in_process,
)

__all__ = ['ALL_CONFIGS', 'CONFIGS', 'DEMO_DET_CFG', 'REPO', 'TOKENIZER_CONFIGS',
           'assert_user_error', 'config_id', 'free_port', 'init_checkpoint', 'run_cmd',
           'run_ranks', 'run_tool', 'run_tool_here', 'run_tool_in_process', 'robustness_runner']
