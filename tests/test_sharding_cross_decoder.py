"""The sharded train step of MAE-LM with the cross decoder: the same numbers on every mesh
as on one device (test_sharding.py's check; a module of its own so that --dist loadfile
runs it beside that module's two cases, not after them)."""

from test_sharding import assert_every_mesh_matches_one_device


def test_every_mesh_matches_one_device_with_the_cross_decoder():
    assert_every_mesh_matches_one_device("mae_lm", "cross")
