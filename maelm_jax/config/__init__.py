"""A run's configuration, from the user's ConfigDict to the frozen parts the code takes, and
the plumbing every command shares around it.

`run_config`: the frozen `RunConfig` every layer takes (and `ConfigError`); `paths`: the one
path layer (gs://, local, `file://`); `rules`: every key's allowed values; `configdict`: the
ConfigDict checked against them and frozen, the one place below the commands that reads
ml_collections; `cli`: how a command parses its flags and turns bad input into one line.
They sit at different layers (tests/test_layering.py): `run_config` and `paths` under
everything, `rules` and `configdict` above the model (the rules name its remat policies),
`cli` beside the commands.
"""
