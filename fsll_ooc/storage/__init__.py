"""Storage: where a fit's tables and files live.

Tables are stored by *backends*, classes registered by name (``base.TableBackend``,
``register_backend``): in-memory numpy (``memory``), memmap files with a checksum side
file (``memmap``), Zarr v3 arrays with the crc32c codec (``zarr_tables``), the same
arrays at a URL (``zarr_url``, fsspec: ``s3://`` ...; see ``url_store``).  The
functions below dispatch to a table's backend; callers ask a backend's capabilities
(``spec.backend_impl.persistent``, ...), never its name.  Also here: atomic and
checksummed small files (``files``), direct I/O for the file backends (``direct_io``), the store directory's checks (``store_dir``), and
the store's writer lock (``lock``).  Nothing here knows about the model or the learner.
"""
from . import base, direct_io, errors, files, lock, store_dir, tables  # noqa: F401
# the built-in backends register themselves on import, in this order
from . import memory, memmap, zarr_tables, zarr_url  # noqa: F401,E402
from .base import (  # noqa: F401
    CHECKSUM_BYTES,
    TableBackend,
    TableSpec,
    backend_names,
    forget,
    get_backend,
    open_table,
    register_backend,
    unregister_backend,
)
from .errors import DiskFullError, IntegrityError  # noqa: F401
from .files import (  # noqa: F401
    array_file_bytes,
    file_sha256,
    fsync_path,
    read_array_file,
    read_json,
    refuse_link,
    write_bytes_atomic,
    write_json_atomic,
)
from .store_dir import STORE_MARKERS, check_store_dir, remove_leftovers  # noqa: F401
from .tables import (  # noqa: F401
    as_array,
    check_fingerprint,
    check_table,
    create_table,
    flush,
    gather,
    overhead_bytes,
    quiesce,
    read,
    read_ahead,
    settle,
    sync_table,
    table_fingerprint,
    table_path,
    verify_table,
    write,
)

#: Former name of :func:`fsync_path` (kept until every caller uses the public name).
_fsync_path = fsync_path


def __getattr__(name):
    if name == "BACKENDS":  # the registered names, including backends registered later
        return backend_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
