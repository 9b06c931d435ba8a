"""Shared utilities: safe checkpoint reading, atomic I/O, errors, progress, benchmarks."""
from .checkpoint import (
    NotACheckpointError,
    UnsafeCheckpointError,
    install_safe_checkpoint_loader,
    load_from_local,
    load_lightning_checkpoint,
    register_safe_globals,
    safe_globals,
    safe_load,
)
from .config_checks import (
    DatasetNotFoundError,
    MissingCustomImportsError,
    RegistryLookupError,
    check_custom_imports,
    check_dataset_paths,
    config_scope,
    explain_registry_error,
    explain_registry_errors,
    leaf_datasets,
)
from .io import (
    TMP_MARK,
    FileLockedError,
    ResultsMismatchError,
    ResultsStore,
    atomic_bytes,
    atomic_image,
    atomic_json,
    atomic_write,
    exclusive_lock,
    save_figure,
)

__all__ = [
    'NotACheckpointError', 'UnsafeCheckpointError', 'install_safe_checkpoint_loader',
    'load_from_local', 'load_lightning_checkpoint',
    'register_safe_globals', 'safe_globals', 'safe_load', 'DatasetNotFoundError',
    'MissingCustomImportsError', 'RegistryLookupError', 'check_custom_imports',
    'check_dataset_paths', 'config_scope', 'explain_registry_error', 'explain_registry_errors',
    'leaf_datasets', 'TMP_MARK', 'ResultsMismatchError', 'ResultsStore', 'atomic_bytes',
    'atomic_image', 'atomic_json', 'atomic_write', 'save_figure', 'FileLockedError',
    'exclusive_lock'
]
