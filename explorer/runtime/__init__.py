"""Running compiled recurrences: shape rules, the CPU ExecutionEngine path and the CuPy path.

Nothing here imports MLIR or sympy at import time: an artifact compiled elsewhere runs with
NumPy and CuPy alone.
"""
