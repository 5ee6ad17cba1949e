"""numba's cache of the kernels keyed on all their sources (fsll_ooc.kernels.cache_key)."""
import os
import subprocess
import sys
import textwrap

import numba

from fsll_ooc.kernels import cache_key, scan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_digest_follows_every_source_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    d0 = cache_key.sources_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("not a source\n")
    assert cache_key.sources_digest(str(tmp_path)) == d0
    (tmp_path / "a.py").write_text("x = 2\n")
    d1 = cache_key.sources_digest(str(tmp_path))
    assert d1 != d0
    (tmp_path / "c.py").write_text("")
    assert cache_key.sources_digest(str(tmp_path)) not in (d0, d1)


def test_kernels_cache_entries_carry_the_digest():
    disps = [v for v in vars(scan).values()
             if isinstance(v, numba.core.registry.CPUDispatcher) and v._cache is not None
             and hasattr(v._cache, "_impl")]
    assert disps, "no cached kernel found in fsll_ooc.kernels.scan"
    for d in disps:
        loc = d._cache._impl.locator if hasattr(d._cache._impl, "locator") else d._cache._impl._locator
        assert type(loc).__name__.startswith("Sources")
        assert loc.get_source_stamp()[1] == cache_key.sources_digest()


CALLER = """\
from numba import njit
from .a import f


@njit(cache=True)
def g():
    return f() + 10
"""


def _run(tmp_path):
    code = textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, {ROOT!r})
        sys.path.insert(0, {str(tmp_path)!r})
        from fsll_ooc.kernels import cache_key
        assert cache_key.install(os.path.join({str(tmp_path)!r}, "kpkg"))
        from kpkg import b
        print(b.g())
        """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_a_changed_callee_is_compiled_again(tmp_path):
    """The caller's file is untouched (numba's own stamp of it is the same): the callee's new
    code must run, not the cached caller built on the old one."""
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from numba import njit\n\n\n@njit(inline='always')\ndef f():\n    return 1\n")
    (pkg / "b.py").write_text(CALLER)
    assert _run(tmp_path) == 11
    assert any(n.endswith(".nbi") for n in os.listdir(pkg / "__pycache__"))  # it was cached
    assert _run(tmp_path) == 11  # from the cache
    (pkg / "a.py").write_text("from numba import njit\n\n\n@njit(inline='always')\ndef f():\n    return 2\n")
    assert _run(tmp_path) == 12
