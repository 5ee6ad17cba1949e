"""Chunk throughput of one worker: a local Zarr store against a store given by URL (S3).

One process writes a table chunk by chunk, then reads it back, through the same table
functions a fit's tasks call (``fsll_ooc.storage.write`` / ``read`` on band keys of
``--band`` chunks), once on local disk (backend ``zarr``) and once on an S3-compatible
server (backend ``zarr_url``): by default moto's server started here on 127.0.0.1, or
``--endpoint URL`` for another (MinIO, a real bucket: give ``--bucket``).  The two are
interleaved ``--repeat`` times.  Every chunk's CRC-32C is written and checked as in a fit.

Usage::

    python bench/url_store.py --mib 256 --chunk-kib 128 1024 8192 --repeat 2

Prints one Markdown row per (store, chunk size, repetition): MB/s written, MB/s read, and
requests per second (one PUT or GET per chunk).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import uuid

import numpy as np

from fsll_ooc import storage


def _run(backend: str, where, opts, total: int, chunk_cells: int, band: int) -> tuple[float, float, int]:
    n_chunks = max(band, total // (8 * chunk_cells))
    n_chunks -= n_chunks % band
    shape, chunks = (n_chunks, chunk_cells), (1, chunk_cells)
    if backend == "zarr":
        spec = storage.create_table("zarr", where, "t", shape, chunks)
    else:
        from fsll_ooc.storage.url_store import URLRoot

        spec = URLRoot(where, opts).create_table("zarr", "t", shape, chunks)
    rng = np.random.default_rng(0)
    bands = [rng.random((band, chunk_cells)) for _ in range(4)]
    t0 = time.perf_counter()
    for i in range(0, n_chunks, band):
        storage.write(spec, (slice(i, i + band), slice(None)), bands[(i // band) % 4])
    storage.flush(spec)
    storage.sync_table(spec)
    t1 = time.perf_counter()
    check = 0.0
    for i in range(0, n_chunks, band):
        check += float(storage.read(spec, (slice(i, i + band), slice(None)))[0, 0])
    t2 = time.perf_counter()
    nbytes = n_chunks * chunk_cells * 8
    assert np.isfinite(check)
    return nbytes / (t1 - t0) / 1e6, nbytes / (t2 - t1) / 1e6, n_chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="table size per run (MiB)")
    ap.add_argument("--chunk-kib", type=int, nargs="+", default=[128, 1024, 8192])
    ap.add_argument("--band", type=int, default=8, help="chunks per read/write call (a task's band)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="local directory for the zarr runs (default: a temporary one)")
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint; default: moto's server on 127.0.0.1")
    ap.add_argument("--bucket", default="bench")
    args = ap.parse_args()

    server = None
    if args.endpoint is None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        opts = {"endpoint_url": f"http://{host}:{port}", "key": "bench", "secret": "bench"}
    else:
        opts = {"endpoint_url": args.endpoint}
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    if not fs.exists(args.bucket):
        fs.mkdir(args.bucket)
    print(f"load: {os.getloadavg()}")
    print("| store | chunk | chunks | write MB/s | read MB/s | PUT/s | GET/s |")
    print("|---|---|---|---|---|---|---|")
    try:
        for rep in range(args.repeat):
            for kib in args.chunk_kib:
                cells = kib * 1024 // 8
                for backend in ("zarr", "zarr_url"):
                    if backend == "zarr":
                        d = tempfile.mkdtemp(dir=args.dir, prefix="fsll-url-bench-")
                        where = d
                    else:
                        where = f"s3://{args.bucket}/{uuid.uuid4().hex}"
                    w, r, n = _run(backend, where, opts, args.mib << 20, cells, args.band)
                    if backend == "zarr":
                        shutil.rmtree(d, ignore_errors=True)
                        name = "local disk (zarr)"
                    else:
                        fs.rm(where, recursive=True)
                        name = "S3 at 127.0.0.1 (zarr_url)" if server else f"S3 {args.endpoint}"
                    mb = n * kib / 1024 * 1.048576
                    print(f"| {name} | {kib} KiB | {n} | {w:.0f} | {r:.0f} | {w / mb * n:.0f} | {r / mb * n:.0f} |",
                          flush=True)
        print(f"load: {os.getloadavg()}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
