"""Storage: where a fit's tables and files live (numpy arrays, memmap files, Zarr v3 arrays).

Owns chunked tables with per-chunk checksums, atomic and checksummed small files, and the
store's writer lock.  Nothing here knows about the model or the learner.
"""
from . import lock, tables  # noqa: F401
from .tables import (  # noqa: F401
    BACKENDS,
    DiskFullError,
    IntegrityError,
    TableSpec,
    _fsync_path,
    _write_memmap,
    array_file_bytes,
    check_fingerprint,
    check_store_dir,
    check_table,
    create_table,
    file_sha256,
    flush,
    forget,
    open_table,
    overhead_bytes,
    quiesce,
    read,
    read_array_file,
    read_json,
    remove_leftovers,
    sync_table,
    table_fingerprint,
    table_path,
    verify_table,
    write,
    write_bytes_atomic,
    write_json_atomic,
)
