"""Rules for ASTRA-sim 1.0 text workloads and training-iteration replay."""

import gzip
import hashlib
import json

import pytest
from harness import DATA, cli_jobs, in_process

from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

REFERENCE = DATA / "astra-sim-1.0-text"
REFERENCE_FILES = sorted(REFERENCE.glob("*.txt"))
GOOD_LAYER = "conv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 1048576 5"


def test_reference_folder_is_there():
    """The ten reference workloads ship with the tests."""
    assert len(REFERENCE_FILES) == 10


def test_shipped_data_are_verbatim_copies():
    """Every file under tests/data has the SHA-256 its source had when it was copied (tests/data/SHA256SUMS)."""
    listed = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    shipped = sorted(
        str(p.relative_to(DATA)).removesuffix(".gz")
        for p in DATA.rglob("*")
        if p.is_file() and (p.suffix in (".txt", ".csv", ".et") or p.name.endswith(".et.gz"))
    )
    assert sorted(listed) == shipped
    for name, digest in listed.items():
        path = DATA / name
        data = path.read_bytes() if path.exists() else gzip.decompress((DATA / f"{name}.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=lambda p: p.name)
def test_reference_workload_parses(path):
    """Every reference workload parses to as many layers as its header says."""
    wl = parse_workload(str(path))
    declared = int(path.read_text().splitlines()[1].split()[0])  # line 2 holds the layer count
    assert len(wl.layers) == declared
    assert [layer.name for layer in wl.layers] == [
        line.split()[0] for line in path.read_text().splitlines()[2 : 2 + declared]
    ]


def test_transformer_header_arguments():
    """The recompute transformer's group size, checkpoints and initiators are read."""
    wl = parse_workload(str(REFERENCE / "Transformer_HybridParallel_Fwd_In_Bckwd.txt"))
    assert (wl.model_parallel_group, wl.checkpoints, wl.checkpoint_initiates) == (4, (2, 11), (19, 10))
    assert len(wl.layers) == 21


def test_customized_layers_carry_their_own_policy():
    """HYBRID_CUSTOMIZED reads a policy at the end of every layer."""
    wl = parse_workload(str(REFERENCE / "sample_per_layer_parallel_HybridCustomized.txt"))
    assert [layer.policy for layer in wl.layers] == [
        "HYBRID_DATA_MODEL",
        "HYBRID_MODEL_DATA",
        "DATA",
        "MODEL",
        "MODEL",
        "HYBRID_MODEL_DATA",
    ]


@pytest.mark.parametrize(
    "policy,fwd,wg",
    [
        ("DATA", (), (0, 1, 2)),
        ("MODEL", (0, 1, 2), ()),
        ("HYBRID_DATA_MODEL", (0,), (1, 2)),
        ("HYBRID_MODEL_DATA", (1, 2), (0,)),
    ],
)
def test_phase_dims_follow_the_parallelism(tmp_path, policy, fwd, wg):
    """Model-parallel phases and data-parallel weight gradients land on the documented dims."""
    path = tmp_path / "w.txt"
    path.write_text(f"{policy}\n1\n{GOOD_LAYER}\n")
    wl = parse_workload(str(path))
    topo = parse_topology("2x2x2")
    assert wl.dims(wl.layers[0], "fwd", topo) == fwd and wl.dims(wl.layers[0], "wg", topo) == wg


def test_transformer_group_takes_the_leading_dims(tmp_path):
    """model_parallel_NPU_group: 4 on 2x2x2 puts the model on dims 0-1 and the data on dim 2."""
    path = tmp_path / "w.txt"
    path.write_text(f"HYBRID_TRANSFORMER model_parallel_NPU_group: 4\n1\n{GOOD_LAYER}\n")
    wl = parse_workload(str(path))
    topo = parse_topology("2x2x2")
    assert wl.dims(wl.layers[0], "fwd", topo) == (0, 1) and wl.dims(wl.layers[0], "wg", topo) == (2,)
    path.write_text(f"HYBRID_TRANSFORMER model_parallel_NPU_group: 3\n1\n{GOOD_LAYER}\n")
    with pytest.raises(UsageError, match="does not match the leading dims"):
        parse_workload(str(path)).dims(wl.layers[0], "fwd", topo)


@pytest.mark.parametrize(
    "text,line,token",
    [
        ("DATAX\n1\n" + GOOD_LAYER, 1, "DATAX"),
        ("DATA\nabc\n" + GOOD_LAYER, 2, "abc"),
        ("DATA\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCES 1048576 5", 3, "ALLREDUCES"),
        ("DATA\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE -8 5", 3, "-8"),
        ("DATA\n2\n" + GOOD_LAYER, 3, None),
        ("DATA\n1\n" + GOOD_LAYER + " extra", 3, "extra"),
        ("HYBRID_TRANSFORMER model_parallel_NPU_group 4\n1\n" + GOOD_LAYER, 1, "model_parallel_NPU_group"),
        ("HYBRID_CUSTOMIZED\n1\n" + GOOD_LAYER + " WHATEVER", 3, "WHATEVER"),
    ],
)
def test_malformed_workload_names_line_and_token(tmp_path, text, line, token):
    """A malformed workload raises one error naming the line (and the token, if any)."""
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        parse_workload(str(path))
    message = str(err.value)
    assert f"bad.txt:{line}:" in message
    assert (f"token {token!r}" in message) if token else "end of file" in message


def test_compute_only_workload_has_no_exposed_communication(tmp_path):
    """With no collectives, an iteration is exactly the sum of its compute and update times."""
    path = tmp_path / "c.txt"
    path.write_text(
        "DATA\n2\nl0 -1 100 NONE 0 50 NONE 0 70 NONE 0 5\nl1 -1 30 NONE 0 20 NONE 0 10 NONE 0 5\n"
    )
    row = model_training(
        parse_workload(str(path)), parse_topology("2x2x2"), "baseline", TrainingSpec(iterations=3)
    )
    # forward 100 + 30; backward l1: wg 10 + ig 20; l0: wg 70 (no ig) -> 230 ns. The update time
    # follows collectives only (ASTRA-sim's Layer::call), so no iteration waits for it.
    assert row.total_us * 1e3 == pytest.approx(3 * 230)
    assert row.last_iteration_us * 1e3 == pytest.approx(230)
    assert row.compute_us * 1e3 == pytest.approx(230) and row.collectives == 0


def test_weight_gradient_collective_delays_the_next_forward(tmp_path):
    """The next iteration's forward of a layer waits for its all-reduce and the update."""
    path = tmp_path / "w.txt"
    path.write_text("DATA\n1\nl0 -1 100 NONE 0 0 NONE 0 100 ALLREDUCE 67108864 1000\n")
    row = model_training(
        parse_workload(str(path)),
        parse_topology("SW(2,100,0)"),
        "baseline",
        TrainingSpec(chunks=1, iterations=2),
        RunConfig(network="ideal"),
    )
    ar_ns = 2 * (2**25) / (100 * 2**30 / 1e9)  # RS + AG of 32 MiB each over 100 GB/s
    # each iteration: forward 100, wg 100, the all-reduce, its update; the second forward waits for
    # the first update, and the run ends when the last update is done
    assert row.total_us * 1e3 == pytest.approx(2 * (100 + 100 + ar_ns + 1000), rel=1e-9)


EMULATED = [
    ("Resnet50_DataParallel.txt", "2x2x2", 8),
    ("MLP_HybridParallel_Data_Model.txt", "4x2", 8),
    ("DLRM_HybridParallel.txt", "Ring(2,100,20)_SW(2,50,700)", 4),
    ("sample_per_layer_parallel_HybridCustomized.txt", "2x2x2", 8),
    ("Transformer_HybridParallel_Fwd_In_Bckwd.txt", "Ring(2,100,20)_FC(2,100,700)_SW(2,50,700)", 8),
    ("Transformer_HybridParallel.txt", "SW(8,100,700)", 8),  # the group of 4 splits the dim: 4x2
    ("DLRM_HybridParallel.txt", "Ring(2,100,20)_SW(2,50,700) --compat astra-sim-1.0", 4),
]


def train_args(name: str, topology: str) -> list[str]:
    """`train` of a reference workload on `topology` (its words: a flag may follow), 4 chunks."""
    args = ["train", str(REFERENCE / name), "-t", *topology.split(), "-c", "4"]
    if name.startswith("Transformer"):  # 300 MB collectives: shrink them for 8 ranks on one machine
        args += ["--comm-scale", "0.001"]
    return args


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """Each `EMULATED` case trained on the emulator, one mpiexec per rank count; its JSON file."""
    tmp = tmp_path_factory.mktemp("emu")
    runs = {case: (case[2], [*train_args(*case[:2]), "--json", str(tmp / f"{i}.json")])
            for i, case in enumerate(EMULATED)}  # fmt: skip
    done = cli_jobs(runs, tmp)
    return {case: (done[case], tmp / f"{i}.json") for i, case in enumerate(EMULATED)}


@pytest.mark.parametrize("name,topology,ranks", EMULATED)
def test_emulator_iteration_time_equals_the_model(tmp_path, emulated, name, topology, ranks):
    """On real data (wrong = 0), the emulator's iteration time equals the model's exactly."""
    args = train_args(name, topology)
    out_model = tmp_path / "model.json"
    proc, out_emu = emulated[(name, topology, ranks)]
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = in_process([*args, "--json", str(out_model)])
    assert model.returncode == 0, model.stderr
    emu, mod = json.loads(out_emu.read_text()), json.loads(out_model.read_text())
    for e, m in zip(emu, mod):
        assert e["wrong"] == 0 and e["transport"] == "mpi" and m["transport"] == "model"
        assert e["iteration_us"] == m["iteration_us"] and e["exposed_comm_us"] == m["exposed_comm_us"]
        assert e["collectives"] == m["collectives"] > 0
