"""Memory, measured and predicted: the meter (CUDA allocator / CPU profiler), the analytic
breakdown and the planner at scale. Imports `logra.optim` and the shared modules."""
