"""Search: training plan, serving fleet and offload placement (PuLP + HiGHS/CBC)."""
