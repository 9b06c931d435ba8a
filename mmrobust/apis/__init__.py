from .launch import (apply_common_args, apply_test_args, apply_train_args, build_runner,
                     setup_distributed)

__all__ = ['apply_common_args', 'apply_train_args', 'apply_test_args', 'build_runner',
           'setup_distributed']
