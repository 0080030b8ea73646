"""The loop that runs the step's programs (`train`) and what it alone uses: metric logs,
preemption, throughput, the XProf trace of a window of steps (`profile_window`);
`step_speed` times the loop's step for `bench speed`."""
