"""Command-line interface: ``fsll-ooc <command> ...`` (also ``python -m fsll_ooc.cli``).

Commands (each has ``--help``):

* ``demo``   fit the paper's dataset(s) and print the paper-style result row(s);
* ``fit``    read a text (``.csv``/``.tsv``/``.txt``), ``.npy`` or ``.parquet`` file, fit a
  model (in core, or out of core with ``--store``), save it;
* ``resume`` continue an interrupted out-of-core fit from its store;
* ``info``   summary of a saved model and its terms sorted by their share of the cost
  reduction (:func:`fsll_ooc.queries.interactions`);
* ``sample`` draw samples from a saved model, as CSV with the original labels;
* ``score``  mean log-likelihood of a data file under a saved model;
* ``plot``   save PNGs: cost per iteration and the interaction graph;
* ``plan``   the chunk plan of a fit (memory, disk, passes) before anything is allocated;
  ``tools/plan_memory.py`` is the same command.

``MODEL`` arguments are a file written by ``fit``, or the store directory of a
completed out-of-core fit (then queries stream over its tables).

Exit codes: 0 success; 2 bad input or usage, or a refusal that says what to do: a store
or model file that is damaged or altered (the message names the file), a store locked
by another writer, a full disk, a budget the fit cannot meet (printed as one line
``fsll-ooc: error: ...`` on stderr, no traceback); 1 unexpected failure (one line,
``--debug`` shows the traceback); 3 ``plan`` found the problem infeasible; 130 / 143
stopped by Ctrl-C / SIGTERM (one line, with the resume command when a store holds the
fit).  Progress bars go to stderr, and only when stderr is a terminal and ``--quiet``
is not given; warnings are one line ``fsll-ooc: warning: ...``.

No command replaces a file it did not write: ``fit`` replaces a model file (recognised
by its format header) and ``plot`` its PNGs (their ``Software: fsll-ooc`` text chunk);
anything else needs ``--force``, and a command's input is never its output.

Each command is a module of this package (``demo.py``, ``fit.py``, ...) over one shared
layer (:mod:`fsll_ooc.cli.common`: argument types, reading data and models, output checks).
Adding a command: a module ``fsll_ooc/cli/<name>.py`` with ``register(subparsers)`` that
adds a sub-parser and sets ``func=`` to ``run(args) -> int``, and its ``register`` in
``_REGISTRARS`` below.  Raise :class:`~fsll_ooc.io.DataError` (or use ``with
common.user_input():``) for problems
with the user's input so that they exit with code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
import warnings
from typing import Sequence

from .. import __version__
from ..io import DataError
from . import common
from . import demo, fit, resume, info, sample, score, plot, plan
from .common import EXIT_INFEASIBLE, PROG, UsageError, practical_subset  # noqa: F401 (public names of the command line)

__all__ = ["main", "build_parser", "plan_main", "practical_subset", "UsageError", "EXIT_INFEASIBLE", "PROG"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage + exit; we report one line
        raise common.UsageError(f"{message} (see '{self.prog} --help')")


def _refusals() -> tuple:
    """The library's clear refusals (exit 2): imported only when an error reaches ``main``."""
    from ..storage.lock import StoreLockedError
    from ..planner import PlanError
    from ..storage import DiskFullError, IntegrityError

    return (IntegrityError, StoreLockedError, DiskFullError, PlanError)


def _err(message: str) -> None:
    one_line = " ".join(str(message).split())
    print(f"{common.PROG}: error: {one_line}", file=sys.stderr)


def plan_main(argv: Sequence[str] | None = None) -> int:
    """``fsll-ooc plan ARGS`` as a function (the body of ``tools/plan_memory.py``)."""
    return main(["plan", *(sys.argv[1:] if argv is None else argv)])


#: One function per command; each adds its sub-parser.  Append new ones here.
_REGISTRARS = [demo.register, fit.register, resume.register, info.register, sample.register,
               score.register, plot.register, plan.register]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=common.PROG,
        description="Full-span log-linear (FSLL) models of discrete data: fit, inspect, "
                    "sample, score, plot, plan. Exit codes: 0 ok, 2 bad input or usage, 1 "
                    "unexpected failure, 3 infeasible plan.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of unexpected failures")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _REGISTRARS:
        register(sub)
    return parser


#: Options that take a size: a value given after them is theirs even when it starts with "-"
#: (argparse would read ``--memory -5GiB`` as two options), so that the size's own check
#: says what is wrong with it.
SIZE_OPTIONS = ("--memory", "--memory-limit", "--disk", "--disk-speed")


def _sizes_joined(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in SIZE_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input/usage, 1 unexpected failure)."""
    parser = build_parser()
    try:
        args = parser.parse_args(_sizes_joined(sys.argv[1:] if argv is None else list(argv)))
    except common.UsageError as exc:
        _err(str(exc))
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    common.RESUME_STORE = None
    try:
        with _one_line_warnings(), _terminate_as_interrupt():
            return int(args.func(args) or 0)
    except (DataError, common.UsageError) as exc:
        _err(_with_notes(common.cli_words(str(exc), args.command)))
        return 2
    except _refusals() as exc:  # damaged or locked store, full disk, infeasible budget: said plainly
        _err(_with_notes(common.cli_words(str(exc), args.command)))
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        _err(_with_notes(common.os_message(exc)))
        return 2
    except KeyboardInterrupt as exc:
        common.PENDING_WARNINGS.clear()
        sig = getattr(exc, "signum", signal.SIGINT)
        name = "terminated" if sig == signal.SIGTERM else "interrupted"
        if common.RESUME_STORE is not None:
            store, out = common.RESUME_STORE
            _err(f"{name}; the fit is kept in store '{store}': continue it with: {common.PROG} resume {store}"
                 + (f" -o {out}" if out else ""))
        else:
            _err(name)
        _silence_stderr()  # library threads winding down after an interrupt would print tracebacks
        return 128 + int(sig)
    except BrokenPipeError:  # e.g. 'fsll-ooc sample ... | head'
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ImportError as exc:  # a missing optional dependency: say which, no traceback
        _err(str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - last resort: one line, exit 1
        if getattr(args, "debug", False):
            traceback.print_exc()
        _err(f"unexpected failure: {type(exc).__name__}: {exc}"
             + ("" if getattr(args, "debug", False) else f" (run '{common.PROG} --debug ...' for the traceback)"))
        return 1


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean stop runs."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM stops a command as Ctrl-C does (only possible in the main thread)."""
    def handler(signum, frame):
        raise _Terminated()

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _one_line_warnings():
    """A warning is one line ``fsll-ooc: warning: ...`` on stderr (no source line), each once.

    They wait until the command succeeds, or until :func:`common.flush_warnings` (before a long
    fit): a command that fails says one line, its error, with the pending warnings as notes
    (a file that reads as one column explains the error that follows)."""
    seen = set()
    common.PENDING_WARNINGS.clear()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            common.PENDING_WARNINGS.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = show
        yield
        common.flush_warnings()


def _with_notes(message: str) -> str:
    """An error line with the warnings not yet printed, as notes."""
    notes = "".join(f" (note: {w})" for w in common.PENDING_WARNINGS)
    common.PENDING_WARNINGS.clear()
    return message + notes


def _silence_stderr() -> None:
    if sys.stderr is not sys.__stderr__:  # called in process (tests, notebooks): leave their stderr alone
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        sys.stderr = open(os.devnull, "w")
