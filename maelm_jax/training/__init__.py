"""The loop that runs the step's programs (`train`) and what it alone uses: metric logs,
preemption, profiling, throughput; `step_speed` times the loop's step for `bench speed`."""
