"""A run's configuration, from the user's ConfigDict to the frozen parts the code takes, and
the plumbing every command shares around it.

`run_config`: the frozen `RunConfig` every layer takes (and `ConfigError`); `paths`: the one
path layer (gs://, local, `file://`); `rules`: every key's allowed values; `defaults`: every
key's default, documented (configs/base.py hands them to the user's configs); `configdict`:
the ConfigDict checked against the rules and frozen, the one place below the commands that
reads ml_collections besides the defaults; `cli`: how a command parses its flags and turns
bad input into one line. They sit at different layers (tests/test_layering.py): `run_config`,
`paths` and `rules` under everything (the model reads the remat policies' names from the
rules), `configdict` and `defaults` above the model, `cli` beside the commands.
"""
