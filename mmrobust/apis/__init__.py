"""What the tools call: launching train / test runs, strict model initialisation."""
from ..models.checkpoint import load_checkpoint_strict
from .launch import (
    add_launch_args,
    add_partial_load_arg,
    apply_common_args,
    apply_test_args,
    apply_train_args,
    build_runner,
    init_model,
    parse_launch_args,
    setup_distributed,
)

__all__ = ['add_launch_args', 'add_partial_load_arg', 'apply_common_args', 'apply_train_args',
           'apply_test_args', 'build_runner', 'init_model', 'load_checkpoint_strict',
           'parse_launch_args', 'setup_distributed']
