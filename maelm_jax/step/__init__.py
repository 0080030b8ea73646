"""What a train step is made of: the state, the update, the optimizer, the mesh and the
sharded, jitted programs that `training`, `checkpoints` and `aot` all start from."""
