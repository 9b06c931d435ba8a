from .launch import (
    add_launch_args,
    apply_common_args,
    apply_test_args,
    apply_train_args,
    build_runner,
    parse_launch_args,
    setup_distributed,
)

__all__ = ['add_launch_args', 'apply_common_args', 'apply_train_args', 'apply_test_args',
           'build_runner', 'parse_launch_args', 'setup_distributed']
