"""The loop that runs the step's programs (`train`) and what it alone uses: metric logs,
preemption, throughput (the trace of a window of steps is `profiling.capture`); `step_speed`
times the loop's step for `bench speed`."""
