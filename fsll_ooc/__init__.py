"""fsll-ooc: full-span log-linear models of discrete data, in core or out of core."""
__version__ = "0.1.0"
