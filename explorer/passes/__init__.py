"""Middle-end passes: affine decomposition (sympy) and scan plans (numpy)."""

from explorer.passes.plans import STRATEGIES, Level, ScanPlan, Step, make_plan, run_plan

__all__ = ["STRATEGIES", "Level", "ScanPlan", "Step", "make_plan", "run_plan"]
