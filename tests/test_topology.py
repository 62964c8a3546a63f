"""Rules for topology parsing: presets, inline strings, ASTRA-sim YAML, and their errors."""

import pytest

from themis_mpi.errors import UsageError
from themis_mpi.topology import PRESETS, Dim, parse_topology


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trips_through_inline_form(name):
    """Every preset's inline spec parses back to the same dims."""
    topo = parse_topology(name)
    assert parse_topology(topo.spec()).dims == topo.dims


def test_paper_topologies_have_1024_npus():
    """The four paper presets are 1024-NPU systems with the bandwidths of docs/design.md#the-papers-systems."""
    bws = {
        "3D-SW_SW_SW_hetero": (200, 100, 50),
        "3D-FC_Ring_SW": (175, 100, 50),
        "4D-Ring_SW_SW_SW": (250, 200, 100, 50),
        "4D-Ring_FC_Ring_SW": (375, 175, 150, 100),
    }
    for name, bw in bws.items():
        topo = parse_topology(name)
        assert topo.npus == 1024
        assert tuple(d.bandwidth_gbps for d in topo.dims) == bw


def test_inline_string_sets_kind_bandwidth_latency_and_default_algorithm():
    """SW(16,200,700)_FC(8,100,700)_Ring(8,50,1700) gives three dims with per-kind defaults."""
    topo = parse_topology("SW(16,200,700)_FC(8,100,700)_Ring(8,50,1700)")
    assert [d.kind for d in topo.dims] == ["Switch", "FullyConnected", "Ring"]
    assert [d.algorithm for d in topo.dims] == ["halving_doubling", "direct", "ring"]
    assert topo.dims[2].latency_ns == 1700 and topo.npus == 1024


def test_switch_that_is_not_a_power_of_two_defaults_to_direct():
    """A 6-NPU switch cannot halve and double, so it runs direct."""
    assert parse_topology("SW(6,100,700)").dims[0].algorithm == "direct"


def test_yaml_network_file(tmp_path):
    """An ASTRA-sim 2.x network YAML gives the same dims as the inline form."""
    path = tmp_path / "net.yml"
    path.write_text(
        "topology: [ Ring, FullyConnected, Switch ]\nnpus_count: [ 4, 2, 8 ]\n"
        "bandwidth: [ 50.0, 100.0, 25 ]\nlatency: [ 500.0, 20, 1 ]\n"
    )
    assert parse_topology(str(path)).dims == parse_topology("Ring(4,50,500)_FC(2,100,20)_SW(8,25,1)").dims


def test_bandwidth_uses_binary_gigabytes():
    """1 GB/s is 2^30 bytes per second."""
    assert Dim("Ring", 2, 1.0, 0).bandwidth_bytes_per_ns == pytest.approx(2**30 / 1e9)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("nope", "unknown topology preset"),
        ("SW(8,100", "malformed topology dim"),
        ("XX(8,100,700)", "unknown dim kind"),
        ("SW(8,100)", "needs 3 or 4 fields"),
        ("SW(8,abc,700)", "bad GB/s"),
        ("SW(0,100,700)", "an integer between 1 and"),
        ("SW(2.5,100,700)", "integer"),
        ("SW(8,-1,700)", "bandwidth must be between"),
        ("SW(8,100,-5)", "latency must be between"),
        ("SW(6,100,700,hd)", "power-of-two"),
        ("SW(8,100,700,tree)", "unknown algorithm"),
    ],
)
def test_malformed_topology_gets_a_clear_error(text, fragment):
    """Each malformed topology raises a UsageError naming the problem."""
    with pytest.raises(UsageError, match=fragment):
        parse_topology(text)


def test_yaml_with_missing_keys_is_refused(tmp_path):
    """A YAML file without the four keys is a clear error."""
    path = tmp_path / "bad.yml"
    path.write_text("topology: [ Ring ]\n")
    with pytest.raises(UsageError, match="needs the keys"):
        parse_topology(str(path))


@pytest.mark.parametrize(
    ("shape", "spec"),
    [
        ("8x8x8", "Ring(8,100,20,ring)_FC(8,100,700,direct)_SW(8,100,700,hd)"),
        ("16", "Ring(16,100,20,ring)"),
        ("4x8x2x2", "Ring(4,100,20,ring)_FC(8,100,700,direct)_SW(2,100,700,hd)_SW(2,100,700,hd)"),
    ],
)
def test_a_shape_that_is_no_preset_gets_the_documented_defaults(shape, spec):
    """`-t 8x8x8`: a Ring, a FullyConnected, then Switch dims (100 GB/s; 20, then 700 ns), named by its shape."""
    topo = parse_topology(shape)
    assert topo.spec() == spec and topo.label() == shape


def test_preset_shapes_keep_their_meaning():
    """2x2x2, 4x2 and 8 are presets: the generic rule does not replace them."""
    for name in ("2x2x2", "4x2", "8"):
        assert parse_topology(name).spec() == parse_topology(PRESETS[name]).spec()
    assert parse_topology("4x2").dims[1].kind == "Switch"  # (the generic rule would make it FullyConnected)
