"""A process whose interrupt lands while one of its pools starts a worker still exits.

The interrupt is made to land at the worst place: after ``submit`` has started a new
worker and before :mod:`concurrent.futures` registers it (the registry that wakes idle
workers at exit).  Such a worker waits for work forever, and without
:func:`fsll_ooc.threads.pool` the interpreter waits for it at exit: the hang a stopped
fit showed on a busy machine."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent('''
    import sys
    import concurrent.futures.thread as cft

    class Interrupting(dict):
        def __setitem__(self, key, value):  # where a new worker is registered
            raise KeyboardInterrupt

    which = sys.argv[1]
    if which == "storage":
        from fsll_ooc.storage.base import thread_pool
        ex = thread_pool("exit-test", 1)
    else:
        from fsll_ooc.kernels.threadpool import helpers
        ex = helpers(2)
    cft._threads_queues = Interrupting()
    try:
        ex.submit(int, 1)
    except KeyboardInterrupt:
        print("interrupted;", len(ex._threads), "worker started")
''')


@pytest.mark.parametrize("which", ["storage", "kernels"])
def test_an_interrupt_while_a_worker_starts_does_not_hang_the_exit(which):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:  # a guard against the hang, not a time limit on the work: the child ends at once
        out = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True,
                             env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the interrupted process did not exit: a pool's unregistered worker kept it alive")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted; 1 worker started", out.stdout
