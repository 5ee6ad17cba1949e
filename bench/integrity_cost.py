"""Cost of the integrity checks: band read/write throughput with and without them.

``plain``: a zarr array without the checksum codec / a bare ``np.memmap``;
``checked``: the same table through :mod:`fsll_ooc.storage` (zarr: CRC-32C codec per
chunk, chunk-file size and place checks, checksums bound to table, chunk number and fit
in the ``TABLE.crc32c`` side file; memmap: the bound checksum side file).  Bands of 8
chunks, as a fit's tasks read and write them.  The paths alternate within each repeat
(plain, checked, plain, checked, ...) so a swing of the shared machine's speed hits both;
the best of the repeats is reported.  The table stays in the page cache (128 MiB at the
default size), so this isolates the CPU cost of the checks, not the disk.

Usage::

    python bench/integrity_cost.py                       # 2^24 cells, 2^20-cell chunks, 5 repeats
    python bench/integrity_cost.py --dir /work/scratch/ic --repeats 7 --json ic.json

Needs twice the table's size in the work directory (256 MiB at the default size).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _paths(backend: str, d: Path, shape, chunks, band: int):
    """(name, write(i, v), read(i), flush()) for the plain and the checked table."""
    import numpy as np
    import zarr

    from fsll_ooc import storage

    checked = storage.create_table(backend, d, "checked", shape, chunks, fit_id="bench")
    if backend == "zarr":
        plain = zarr.create_array(store=str(d / "plain"), shape=shape, chunks=chunks, dtype="float64",
                                  compressors=None, fill_value=0.0, zarr_format=3, overwrite=True)

        def pflush():
            pass

        def pread(i):
            return np.ascontiguousarray(plain[i:i + band])
    else:
        plain = np.memmap(d / "plain.f64", dtype="float64", mode="w+", shape=shape)
        pflush = plain.flush

        def pread(i):
            return np.array(plain[i:i + band], order="C")

    def pwrite(i, v):
        plain[i:i + band] = v

    def cwrite(i, v):
        storage.write(checked, (slice(i, i + band),), v)

    def cread(i):
        return storage.read(checked, (slice(i, i + band),))

    def cflush():
        storage.flush(checked)

    return (("plain", pwrite, pread, pflush), ("checked", cwrite, cread, cflush))


def measure(workdir: Path, log2_cells: int = 24, log2_chunk: int = 20, repeats: int = 5) -> list[dict]:
    """Best-of-``repeats`` write and read GB/s per backend and path (plain, checked)."""
    import numpy as np

    n_chunks = 2 ** (log2_cells - log2_chunk)
    shape, chunks, band = (n_chunks, 2**log2_chunk), (1, 2**log2_chunk), 8
    x = np.random.default_rng(0).random(shape)
    out = []
    for backend in ("zarr", "memmap"):
        d = Path(tempfile.mkdtemp(prefix="fsll-ic-", dir=workdir))
        try:
            paths = _paths(backend, d, shape, chunks, band)
            times = {name: ([], []) for name, *_ in paths}
            for _ in range(repeats):
                for name, w, r, fl in paths:
                    t = time.perf_counter()
                    for i in range(0, n_chunks, band):
                        w(i, x[i:i + band])
                    fl()
                    times[name][0].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    s = 0.0
                    for i in range(0, n_chunks, band):
                        s += float(r(i)[0, 0])
                    times[name][1].append(time.perf_counter() - t)
                    if s != float(x[::band, 0].sum()):
                        raise RuntimeError(f"{backend} {name}: read back other values than written")
            for name, (tw, tr) in times.items():
                out.append({"backend": backend, "path": name, "write_GBps": x.nbytes / min(tw) / 1e9,
                            "read_GBps": x.nbytes / min(tr) / 1e9})
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--log2-cells", type=int, default=24)
    ap.add_argument("--log2-chunk", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.gettempdir())
    work.mkdir(parents=True, exist_ok=True)
    need = 2 * 8 * 2**args.log2_cells
    free = shutil.disk_usage(work).free
    if free < need * 1.2:
        print(f"needs {need / 2**20:.0f} MiB free in {work}, has {free / 2**20:.0f} MiB", file=sys.stderr)
        return 2
    rows = measure(work, args.log2_cells, args.log2_chunk, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f}; 2^{args.log2_cells} cells, 2^{args.log2_chunk}-cell chunks, "
          f"bands of 8 chunks, best of {args.repeats}, dir {work}")
    print(f"{'backend':<8} {'path':<8} {'write GB/s':>10} {'read GB/s':>10}")
    for r in rows:
        print(f"{r['backend']:<8} {r['path']:<8} {r['write_GBps']:>10.2f} {r['read_GBps']:>10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
