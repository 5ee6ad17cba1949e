"""``python -m fsll_ooc.cli``: the command line (:func:`fsll_ooc.cli.main`)."""
from . import main

raise SystemExit(main())
