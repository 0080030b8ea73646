"""The sharded programs and the loop that runs them: step, state, optimizer, mesh."""
