"""Print the chunk plan of a fit, as `fsll-ooc plan` (exit 0 feasible, 3 infeasible, 2 bad input)."""
import pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # also from a checkout
from fsll_ooc.cli import plan_main
if __name__ == "__main__":
    raise SystemExit(plan_main())
