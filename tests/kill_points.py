"""Kill-point harness: SIGKILL an out-of-core fit at every write it makes, resume, compare.

For each *kill point* a child process runs ``FSLL(store=...).fit(X)`` with fault
injection and kills itself (``SIGKILL``, no clean-up of any kind) at one write:

* ``chunk``  a zarr chunk or metadata write (``zarr.storage._local._put``; a band's chunk
  file: ``fsll_ooc.storage.zarr_tables._put_chunk``), modes ``torn-tmp`` (half of a
  ``*.partial`` temporary file written), ``torn-final`` (half of the final chunk file
  written in place: what a kill during an in-place rewrite, a store without atomic
  rename, or a power cut, can leave), ``after`` (right after the write);
* ``band``   a memmap band write (``fsll_ooc.storage.memmap._write_memmap``), modes ``torn``
  (half of the band's bytes written), ``data-no-crc`` (data written, checksums not),
  ``after``;
* ``file``   a small-file replacement (``fsll_ooc.storage.write_bytes_atomic``: the fit
  state, the data file, memmap checksum files), modes ``torn-tmp`` (half of the temporary
  file), ``before-rename`` (temporary file complete and fsynced), ``after``.

Events are numbered in execution order (deterministic with ``--scheduler serial``).
Then ``FSLL.resume(store)`` runs (in another child) and its model is compared with an
uninterrupted fit: same support, ``theta`` within 1e-9, ``cost`` within 1e-10, same
number of iterations.  A kill before the fit's first state write may instead end in
``FileNotFoundError`` ("nothing to resume": nothing was started) and counts as a clean
refusal.  Also checked at every point: a store whose state says ``complete`` must hold
the final model (no store claims to be complete when it is not).

``--double K`` additionally kills the *resume* at a random one of its writes for ``K``
of the points, then resumes again.

Children are forked from a "zygote" process that has imported everything but never ran
zarr, dask or numba code (so forking is safe and each point costs no interpreter start).

Usage::

    python bench/kill_points.py                                 # zarr and memmap, every point
    python bench/kill_points.py --backend zarr --max-points 60  # an even sample of 60 points
    python bench/kill_points.py --scheduler threads --double 20 --json kill_points.json
    python bench/kill_points.py --n-samples 1000 --resync-every 4 --max-points 200  # longer fit, resyncs

Exit status 0 when every point survived, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CARDS = (2, 3, 4, 5, 2, 3)
LAYOUT = (1, 2)
N_SAMPLES = 300
RESYNC_EVERY = 256  # the library default; a small value puts exact re-derivation passes among the points
EPSILON = 1e-4  # the paper's setting (no corrective steps); "auto" adds corrective Newton steps and their writes
MODES = {"chunk": ("torn-tmp", "torn-final", "after"),
         "band": ("torn", "data-no-crc", "after"),
         "file": ("torn-tmp", "before-rename", "after")}
THETA_TOL, COST_TOL = 1e-9, 1e-10


def make_data(n_samples: int = N_SAMPLES, seed: int = 1):
    from fsll_ooc import datasets

    p, _ = datasets.random_bayesnet(CARDS, 2, seed=3)
    return datasets.sample_table(p, n_samples, seed=seed)


def with_holes(X, frac: float, seed: int = 2):
    """``X`` with a share ``frac`` of its cells missing (``-1``, completely at random): an EM fit."""
    import numpy as np

    out = np.array(X, np.int64)
    out[np.random.default_rng(seed).random(out.shape) < frac] = -1
    return out


# ============================================================================ child side

class Faults:
    """Counts writes; at write number ``target`` applies ``mode`` and SIGKILLs the process."""

    def __init__(self, target: int | None, mode: str | None):
        self.target, self.mode = target, mode
        self.n = 0
        self.events: list[list] = []  # [kind, detail, status-so-far]
        self.status = None
        self.lock = threading.Lock()

    def event(self, kind: str, detail: str, modes) -> str | None:
        with self.lock:
            i = self.n
            self.n += 1
            self.events.append([kind, detail, self.status])
            if i == self.target and self.mode in modes:
                return self.mode
            return None

    @staticmethod
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # pragma: no cover


def install_faults(faults: Faults) -> None:
    import uuid

    import zarr.storage._local as zl

    import fsll_ooc.storage
    from fsll_ooc.storage import files, memmap

    orig_put = zl._put

    def _put(path, value, exclusive=False):
        parts = Path(path).parts
        # the table is the last such component (the work directory may itself be called "scratch")
        table = next((p for p in reversed(parts) if p in ("dbar", "thetabar", "scratch")), "?")
        detail = f"{table}/{'zarr.json' if Path(path).name == 'zarr.json' else 'chunk'}"
        mode = faults.event("chunk", detail, MODES["chunk"])
        if mode in ("torn-tmp", "torn-final"):
            data = bytes(value.as_buffer_like())
            target = Path(path).with_suffix(f".{uuid.uuid4().hex}.partial") if mode == "torn-tmp" else Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data[: len(data) // 2])
            faults.die()
        out = orig_put(path, value, exclusive=exclusive)
        if mode == "after":
            faults.die()
        return out

    zl._put = _put

    from fsll_ooc.storage import zarr_tables

    orig_pc = zarr_tables._put_chunk

    def _put_chunk(spec, f, view, crc, direct):
        mode = faults.event("chunk", f"{Path(spec.path).name}/chunk", MODES["chunk"])
        if mode in ("torn-tmp", "torn-final"):
            value = crc.get()
            data = bytes(view) + int(value).to_bytes(4, "little")
            target = f"{f}.{uuid.uuid4().hex}.partial" if mode == "torn-tmp" else f
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT)  # in place: the old bytes stay past the torn part
            os.pwrite(fd, data[: len(data) // 2], 0)
            os.close(fd)
            faults.die()
        orig_pc(spec, f, view, crc, direct)
        if mode == "after":
            faults.die()

    zarr_tables._put_chunk = _put_chunk

    orig_wm = memmap._write_memmap

    def _write_memmap(spec, arr, key, value):
        mode = faults.event("band", Path(spec.path).stem, MODES["band"])
        if mode == "torn":
            cur = __import__("numpy").array(arr[key])
            flat, new = cur.reshape(-1), __import__("numpy").asarray(value).reshape(-1)
            flat[: new.size // 2] = new[: new.size // 2]
            arr[key] = cur
            arr.flush()
            faults.die()
        if mode == "data-no-crc":
            arr[key] = value
            faults.die()
        orig_wm(spec, arr, key, value)
        if mode == "after":
            faults.die()

    memmap._write_memmap = _write_memmap

    orig_wb = files.write_bytes_atomic

    def write_bytes_atomic(path, data):
        name = Path(path).name
        if name == "fsll_state.json":
            try:
                faults.status = json.loads(data.decode()).get("status")
            except ValueError:
                pass
        mode = faults.event("file", name + (f"[{faults.status}]" if name == "fsll_state.json" else ""),
                            MODES["file"])
        if mode in ("torn-tmp", "before-rename"):
            p = Path(path)
            tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{threading.get_ident()}")
            with open(tmp, "wb") as fh:
                fh.write(data if mode == "before-rename" else data[: len(data) // 2])
                fh.flush()
                os.fsync(fh.fileno())
            faults.die()
        orig_wb(path, data)
        if mode == "after":
            faults.die()

    files.write_bytes_atomic = write_bytes_atomic
    fsll_ooc.storage.write_bytes_atomic = write_bytes_atomic


def summary(m) -> dict:
    return {"theta": [[list(map(int, y)), float(v)] for y, v in m.theta_.items()], "cost": float(m.cost_),
            "n_iter": int(m.n_iter_), "log_z": float(m.log_z_), "kl_data": m.kl_data_}


def run_child(req: dict, X) -> None:
    """In a forked child: run one fit or resume with faults; write the outcome; exit."""
    faults = Faults(req.get("target"), req.get("mode"))
    out = {"ok": False}
    try:
        install_faults(faults)
        from fsll_ooc import FSLL

        sched = req.get("scheduler", "serial")
        if req["op"] == "fit":
            em = {"missing": "em"} if req.get("missing") else {}
            m = FSLL(progress=False, store=req["store"], backend=req["backend"], layout=tuple(req["layout"]),
                     scheduler=sched, resync_every=req.get("resync_every", RESYNC_EVERY),
                     epsilon=req.get("epsilon", EPSILON), **em).fit(
                with_holes(X, req["missing"]) if em else X)
        else:
            m = FSLL.resume(req["store"], progress=False, scheduler=sched)
        out = {"ok": True, "model": summary(m)}
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out = {"ok": False, "error": type(e).__name__, "message": str(e)[:2000]}
    out["events"] = faults.events
    with open(req["out"], "w") as fh:
        json.dump(out, fh)
    os._exit(0)


def _warm_up(X, layout=LAYOUT) -> None:
    """Load the compiled kernels once, here, so that forked children start warm.

    zarr resets its I/O thread in forked children; numba's thread pool does not survive a
    fork, so the caller checks it did not start (else it runs cold).
    """
    from fsll_ooc import FSLL

    d = tempfile.mkdtemp(prefix="fsll-kill-warm-")
    try:
        for be in ("zarr", "memmap"):
            FSLL(progress=False, store=os.path.join(d, be), backend=be, layout=layout, scheduler="serial",
                 max_iter=3).fit(X)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _numba_threads_started() -> bool:
    try:
        from numba.np.ufunc import parallel as npp
    except ImportError:  # pragma: no cover
        return False
    return bool(getattr(npp, "_is_initialized", False))


def zygote_main(cold: bool = False, n_samples: int = N_SAMPLES, layout=LAYOUT) -> None:
    """Serve requests (one JSON per line on stdin): fork, run, answer with the exit status."""
    import numpy as np  # noqa: F401
    import zarr  # noqa: F401
    import dask  # noqa: F401

    import fsll_ooc.estimator  # noqa: F401
    from fsll_ooc import storage  # noqa: F401

    X = make_data(n_samples)
    if not cold:
        _warm_up(X, layout)
        if _numba_threads_started():
            # loading some kernels started numba's thread pool, which does not survive fork():
            # start again without warming up (the kernels are now in numba's disk cache)
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, __file__, "--zygote", "--cold", "--n-samples", str(n_samples),
                                      "--layout", ",".join(map(str, layout))])
    print(json.dumps({"ready": True, "warm": not cold}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                sys.stdin.close()
                run_child(req, X)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        print(json.dumps({"signal": sig, "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}),
              flush=True)


# ============================================================================ parent side

class Zygote:
    def __init__(self, n_samples: int = N_SAMPLES, layout=LAYOUT):
        self.p = subprocess.Popen([sys.executable, __file__, "--zygote", "--n-samples", str(n_samples),
                                   "--layout", ",".join(map(str, layout))], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        line = self.p.stdout.readline()
        if not line or not json.loads(line).get("ready"):
            raise RuntimeError("kill-point zygote did not start")
        self.lock = threading.Lock()

    def run(self, req: dict) -> dict:
        with self.lock:
            self.p.stdin.write(json.dumps(req) + "\n")
            self.p.stdin.flush()
            status = json.loads(self.p.stdout.readline())
        try:
            with open(req["out"]) as fh:
                out = json.load(fh)
        except (OSError, ValueError):
            out = {"ok": False, "events": None}
        out.update(status)
        return out

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.p.kill()


def same_model(a: dict, b: dict) -> str | None:
    """None if the two model summaries agree (support, theta, cost, iterations), else why not."""
    ta = {tuple(y): v for y, v in a["theta"]}
    tb = {tuple(y): v for y, v in b["theta"]}
    if set(ta) != set(tb):
        return f"support differs ({len(ta)} vs {len(tb)} terms)"
    worst = max((abs(ta[y] - tb[y]) for y in ta), default=0.0)
    if worst > THETA_TOL:
        return f"theta differs by {worst:.3e}"
    if abs(a["cost"] - b["cost"]) > COST_TOL:
        return f"cost differs by {abs(a['cost'] - b['cost']):.3e}"
    if a["n_iter"] != b["n_iter"]:
        return f"n_iter {a['n_iter']} vs {b['n_iter']}"
    return None


def state_status(store: Path):
    from fsll_ooc import storage

    sf = store / "fsll_state.json"
    if not sf.exists():
        return None, None
    try:
        obj = storage.read_json(sf, checksum=True)
    except storage.IntegrityError as e:
        return "untrusted", str(e)
    return obj.get("status"), obj


class Harness:
    def __init__(self, backend: str, scheduler: str, workdir: Path, n_zygotes: int = 2, n_samples: int = N_SAMPLES,
                 layout=LAYOUT, resync_every: int = RESYNC_EVERY, epsilon=EPSILON, missing: float = 0.0):
        self.backend, self.scheduler = backend, scheduler
        self.n_samples, self.layout, self.resync_every = n_samples, tuple(layout), resync_every
        self.epsilon = epsilon
        self.missing = missing  # > 0: that share of the cells missing, fitted by EM
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.zygotes = [Zygote(n_samples, self.layout) for _ in range(max(1, n_zygotes))]
        self._rr = 0
        self._rr_lock = threading.Lock()
        self.reference = None
        self.events = None

    def close(self):
        for z in self.zygotes:
            z.close()

    def _zygote(self) -> Zygote:
        with self._rr_lock:
            z = self.zygotes[self._rr % len(self.zygotes)]
            self._rr += 1
            return z

    def _req(self, op, store, tag, target=None, mode=None) -> dict:
        return {"op": op, "store": str(store), "backend": self.backend, "layout": list(self.layout),
                "scheduler": self.scheduler, "target": target, "mode": mode, "resync_every": self.resync_every,
                "epsilon": self.epsilon, "missing": self.missing,
                "out": str(self.workdir / f"{tag}.json")}

    def prepare(self) -> None:
        """Uninterrupted fit: the reference model and the list of write events."""
        store = self.workdir / "reference"
        shutil.rmtree(store, ignore_errors=True)
        r = self._zygote().run(self._req("fit", store, "reference"))
        if not r.get("ok"):
            raise RuntimeError(f"reference fit failed: {r}")
        self.reference, self.events = r["model"], r["events"]
        shutil.rmtree(store, ignore_errors=True)

    def points(self) -> list[tuple[int, str]]:
        return [(i, mode) for i, (kind, _, _) in enumerate(self.events) for mode in MODES[kind]]

    def run_point(self, i: int, mode: str, double: bool = False, rng: random.Random | None = None) -> dict:
        kind, detail, status = self.events[i]
        tag = f"p{i}-{mode}"
        store = self.workdir / tag
        shutil.rmtree(store, ignore_errors=True)
        rec = {"event": i, "kind": kind, "detail": detail, "status_before": status, "mode": mode}
        try:
            r = self._zygote().run(self._req("fit", store, tag + "-fit", i, mode))
            if r.get("signal") != signal.SIGKILL:
                rec.update(outcome="not-reached", note=str(r.get("error") or "finished without reaching the point"))
                return rec
            st, obj = state_status(store)
            rec["status_after_kill"] = st
            if st == "complete":
                bad = same_model(summary_of_state(obj), self.reference)
                if bad:
                    rec.update(outcome="FAILED", note=f"store claims complete but {bad}")
                    return rec
            if double and st in ("starting", "running"):
                rec["double"] = self._second_kill(store, tag, rng or random.Random(i))
            r2 = self._zygote().run(self._req("resume", store, tag + "-resume"))
            if r2.get("ok"):
                bad = same_model(r2["model"], self.reference)
                rec.update(outcome="FAILED" if bad else "resumed-identical", note=bad or "")
            elif r2.get("error") == "FileNotFoundError" and st is None:
                rec.update(outcome="refused-not-started", note=r2.get("message", "")[:200])
            else:
                rec.update(outcome="FAILED", note=f"resume: {r2.get('error')}: {r2.get('message', '')[:300]}"
                                                  f" (signal {r2.get('signal')})")
            return rec
        finally:
            shutil.rmtree(store, ignore_errors=True)
            for suffix in ("-fit", "-resume", "-count", "-kill2"):
                try:
                    os.unlink(self.workdir / f"{tag}{suffix}.json")
                except OSError:
                    pass

    def _second_kill(self, store: Path, tag: str, rng: random.Random) -> dict:
        copy = self.workdir / (tag + "-copy")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(store, copy)
        try:
            cnt = self._zygote().run(self._req("resume", copy, tag + "-count"))
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        evs = cnt.get("events") or []
        if not evs:
            return {"skipped": "resume has no writes"}
        j = rng.randrange(len(evs))
        mode = rng.choice(MODES[evs[j][0]])
        r = self._zygote().run(self._req("resume", store, tag + "-kill2", j, mode))
        return {"event": j, "kind": evs[j][0], "detail": evs[j][1], "mode": mode, "signal": r.get("signal"),
                "of": len(evs)}


def summary_of_state(obj: dict) -> dict:
    import numpy as np

    st = obj["state"]
    cards = tuple(st["cards"])
    theta = [[list(map(int, np.unravel_index(int(y), cards))), float(v)] for y, v in st["theta"]]
    from fsll_ooc.learn import FitState

    fs = FitState.from_json(st)
    return {"theta": theta, "cost": fs.cost(), "n_iter": int(st["n_iter"]), "log_z": st["log_z"]}


def select(points, max_points: int | None, seed: int):
    """``max_points`` distinct points, spread over the whole fit (each point has its own store)."""
    if max_points is None or len(points) <= max_points:
        return points
    rng = random.Random(seed)
    return [points[i] for i in sorted(rng.sample(range(len(points)), max_points))]


def run(backend: str, scheduler: str, max_points: int | None, double: int, seed: int, workdir: Path,
        jobs: int = 2, log=print, n_samples: int = N_SAMPLES, layout=LAYOUT, resync_every: int = RESYNC_EVERY,
        epsilon=EPSILON, missing: float = 0.0) -> dict:
    h = Harness(backend, scheduler, workdir / backend, n_zygotes=jobs, n_samples=n_samples, layout=layout,
                resync_every=resync_every, epsilon=epsilon, missing=missing)
    t0 = time.perf_counter()
    try:
        h.prepare()
        pts = select(h.points(), max_points, seed)
        rng = random.Random(seed)
        doubles = set(rng.sample(range(len(pts)), min(double, len(pts)))) if double else set()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = [pool.submit(h.run_point, i, m, k in doubles, random.Random(seed * 1000 + k))
                    for k, (i, m) in enumerate(pts)]
            results = []
            for k, f in enumerate(futs):
                results.append(f.result())
                if log and (k + 1) % 50 == 0:
                    log(f"  {backend}: {k + 1}/{len(pts)} points")
    finally:
        h.close()
    return {"backend": backend, "scheduler": scheduler, "n_samples": n_samples, "layout": list(layout),
            "resync_every": resync_every, "epsilon": epsilon, "missing": missing,
            "events": len(h.events or []),
            "points_total": len(h.points()) if h.events else 0, "points_tried": len(results),
            "seconds": time.perf_counter() - t0, "reference": {k: h.reference[k] for k in ("cost", "n_iter")},
            "results": results}


def report(res: dict) -> str:
    from collections import Counter

    rs = res["results"]
    out = Counter(r["outcome"] for r in rs)
    lines = [f"backend {res['backend']}, scheduler {res['scheduler']}, N={res['n_samples']}, "
             f"layout {tuple(res['layout'])}, epsilon {res.get('epsilon', EPSILON)}, "
             + (f"EM with {res['missing']:.0%} of the cells missing, " if res.get("missing") else "")
             + f"resync every {res.get('resync_every', RESYNC_EVERY)}, "
             f"reference fit {res['reference']['n_iter']} iterations: "
             f"{res['events']} write events, "
             f"{res['points_total']} kill points, {res['points_tried']} tried in {res['seconds']:.0f} s",
             "  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(out.items()))]
    by = Counter((r["kind"], r["mode"], r["outcome"]) for r in rs)
    for (kind, mode, oc), v in sorted(by.items()):
        lines.append(f"    {kind:<6} {mode:<14} {oc:<22} {v}")
    phases = Counter((r["status_before"] or "before-start", r["outcome"]) for r in rs)
    lines.append("  by state status at the kill: " + ", ".join(f"{p}/{o} {v}" for (p, o), v in sorted(phases.items())))
    d = [r for r in rs if "double" in r]
    if d:
        ok = sum(r["outcome"] == "resumed-identical" for r in d)
        killed = sum(r["double"].get("signal") == signal.SIGKILL for r in d)
        lines.append(f"  double kills (fit killed, resume killed, resumed again): {len(d)} tried, "
                     f"{killed} second kills landed, {ok} resumed identical")
    for r in rs:
        if r["outcome"] == "FAILED":
            lines.append(f"  FAILED at event {r['event']} ({r['kind']} {r['detail']} {r['mode']}): {r['note']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n-samples", type=int, default=N_SAMPLES, help="training rows (default %(default)s)")
    ap.add_argument("--layout", default=",".join(map(str, LAYOUT)),
                    help="chunk layout cut points a,c (default %(default)s)")
    ap.add_argument("--resync-every", type=int, default=RESYNC_EVERY,
                    help="the fit's resync_every: a small value puts exact re-derivations among the kill points "
                         "(default %(default)s)")
    ap.add_argument("--epsilon", type=lambda v: v if v == "auto" else float(v), default=EPSILON,
                    help="the fit's epsilon: a number, or 'auto' (corrective steps too) (default %(default)s)")
    ap.add_argument("--missing", type=float, default=0.0,
                    help="remove this share of the cells (at random) and fit by EM (missing='em') (default 0)")
    ap.add_argument("--backend", choices=("zarr", "memmap", "both"), default="both")
    ap.add_argument("--scheduler", choices=("serial", "threads"), default="serial")
    ap.add_argument("--max-points", type=int, default=None, help="even sample of this many points per backend")
    ap.add_argument("--double", type=int, default=0, help="also kill the resume at this many points")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="points run at once")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write all results here")
    args = ap.parse_args(argv)
    layout = tuple(int(v) for v in args.layout.split(","))
    if args.zygote:
        zygote_main(cold=args.cold, n_samples=args.n_samples, layout=layout)
        return 0
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fsll-kill-"))
    backends = ("zarr", "memmap") if args.backend == "both" else (args.backend,)
    allres = []
    failed = 0
    try:
        for be in backends:
            res = run(be, args.scheduler, args.max_points, args.double, args.seed, work, args.jobs,
                      n_samples=args.n_samples, layout=layout, resync_every=args.resync_every,
                      epsilon=args.epsilon, missing=args.missing)
            allres.append(res)
            print(report(res), flush=True)
            failed += sum(r["outcome"] == "FAILED" for r in res["results"])
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(allres, fh, indent=1)
    print(f"command: python bench/kill_points.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
