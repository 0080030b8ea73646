"""Train state on disk: Orbax saves and restores, their integrity, the workdir lease."""
