# Hypothesis: random meshes and specs through the converters and back; random bad arguments
# through the API raise InputError or TypeError, never anything else.
import os

import numpy as np
from hypothesis import given, settings, strategies as st

import shardmm
from conftest import TESTS_DIR

AXIS_NAMES = ["X", "Y", "Z", "dp", "tp", "ep"]
LETTERS = ["I", "J", "K", "L"]


@st.composite
def mesh_and_spec(draw):
    names = draw(st.lists(st.sampled_from(AXIS_NAMES), min_size=1, max_size=4, unique=True))
    sizes = [draw(st.integers(1, 4)) for _ in names]
    mesh = shardmm.Mesh(",".join(f"{n}={s}" for n, s in zip(names, sizes)))
    rank = draw(st.integers(1, 3))
    dims = [[] for _ in range(rank)]
    unreduced = []
    # Each axis shards one dimension, is unreduced, or is unused; the order within a
    # dimension is drawn too (major to minor).
    for name in draw(st.permutations(names)):
        role = draw(st.integers(-2, rank - 1))
        if role >= 0:
            dims[role].append(name)
        elif role == -1:
            unreduced.append(name)

    def axes(list_):
        return "" if not list_ else "_{" + ",".join(list_) + "}"

    text = "T[" + ", ".join(LETTERS[d] + axes(a) for d, a in enumerate(dims)) + "]"
    if unreduced:
        text += "{U_{" + ",".join(unreduced) + "}}"
    return mesh, text, dims


@settings(max_examples=300, deadline=None)
@given(mesh_and_spec())
def test_random_specs_round_trip_through_both_forms(case):
    mesh, text, dims = case
    spec = shardmm.Spec.parse(text, mesh)
    assert shardmm.Spec.parse(str(spec), mesh) == spec
    letters = "T[" + ", ".join(spec.letters) + "]"
    assert shardmm.Spec.from_partition_spec(spec.to_partition_spec(), mesh, letters) == spec
    order = list(mesh.axes)
    if all(a == sorted(a, key=order.index) for a in dims):
        assert shardmm.Spec.from_placements(spec.to_placements(), mesh, letters) == spec
    else:
        try:
            spec.to_placements()
            raise AssertionError("a dimension split out of mesh order has no placements")
        except shardmm.InputError:
            pass


TEXT = st.text(alphabet=st.sampled_from(list("AIJKXYPN_[]{}(),='\" 0123456789@->USharepoNn")), max_size=30)
ANYTHING = st.one_of(st.none(), st.integers(-5, 10**20), st.floats(allow_nan=True), TEXT, st.booleans(),
                     st.lists(st.integers(-3, 5), max_size=3), st.dictionaries(TEXT, st.integers(-3, 9), max_size=3))


def only_input_or_type_errors(call):
    try:
        call()
    except (shardmm.InputError, TypeError):
        pass


@settings(max_examples=300, deadline=None)
@given(TEXT, st.sampled_from(["X=4", "X=2,Y=2", "dp=2,tp=2"]), st.one_of(ANYTHING, TEXT))
def test_random_text_never_crashes_the_parsers(text, mesh, letters):
    only_input_or_type_errors(lambda: shardmm.Spec.parse(text, mesh))
    only_input_or_type_errors(lambda: shardmm.Spec.from_partition_spec(text, mesh, letters))
    only_input_or_type_errors(lambda: shardmm.Spec.from_placements(text, mesh, letters))
    only_input_or_type_errors(lambda: shardmm.check(text, mesh, letters))


@settings(max_examples=150, deadline=None)
@given(ANYTHING, ANYTHING, ANYTHING, ANYTHING)
def test_random_arguments_never_crash_the_entry_points(expr, mesh, dims, extra):
    only_input_or_type_errors(lambda: shardmm.plan(expr, mesh, dims, dtype=extra))
    only_input_or_type_errors(lambda: shardmm.reshard(expr, extra, mesh, dims))
    only_input_or_type_errors(lambda: shardmm.check(expr, mesh, dims, extra))
    only_input_or_type_errors(lambda: shardmm.visualize(expr, mesh, extra))
    only_input_or_type_errors(lambda: shardmm.Mesh(mesh))
    only_input_or_type_errors(lambda: shardmm.Mesh("X=4", split=extra))


def mostly(valid):
    """`valid` nine times in ten, else anything: a call gets past its first argument's check."""
    return st.sampled_from([True] * 9 + [False]).flatmap(lambda ok: valid if ok else ANYTHING)


PROGRAM_FILES = [os.path.join(os.path.dirname(TESTS_DIR), "examples", "programs", name)
                 for name in ("tp_ffn.prog", "mlp_free.prog")]
# Arguments near the programs' own (their letters, tensors and specs).
SOURCES = mostly(st.one_of(st.sampled_from(PROGRAM_FILES), TEXT))
PROGRAM_DIMS = mostly(st.one_of(st.none(), st.dictionaries(st.sampled_from(list("BTDFNE")), st.integers(1, 64),
                                                           max_size=3)))
PINS = mostly(st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["x", "w_in", "a", "b", "zz", ""]),
    st.one_of(TEXT, st.sampled_from(["w_in[D, F_X]", "x[B_X, T, D]", "a[D_Y, F]", "b[F_X, E]{U_X}"])), max_size=2)))
# Solving is dearer than costing: the meshes are small ones, or wrong ones.
PROGRAM_MESHES = mostly(st.sampled_from([None, "X=2", "X=2,Y=2", "X=0", "Y", shardmm.Mesh("X=3", split="chunk")]))
TRAIN = mostly(st.sampled_from([None, True, False]))
OPTIMIZERS = mostly(st.sampled_from(["sgd", "adam", "lion"]))
DTYPES = mostly(st.sampled_from([None, "f32", "bf16", "f7", np.float64]))


@settings(max_examples=100, deadline=None)
@given(SOURCES, PROGRAM_MESHES, PROGRAM_DIMS, PINS, TRAIN, OPTIMIZERS, DTYPES, mostly(st.sampled_from(["array", "chunk"])),
       mostly(st.booleans()))
def test_random_arguments_never_crash_program(source, mesh, dims, specs, train, optimizer, dtype, split, run):
    # run=True runs only what the dense reference allows (tp_ffn's sizes, here).
    only_input_or_type_errors(lambda: shardmm.program(source, mesh, dims, specs, train, optimizer, dtype, split=split,
                                                      run=run))
    only_input_or_type_errors(lambda: shardmm.program(text=source, mesh=mesh, dims=dims, train=train))


@settings(max_examples=60, deadline=None)
@given(SOURCES, PROGRAM_MESHES, PROGRAM_DIMS, PINS,
       mostly(st.one_of(st.none(), st.integers(-1, 2**30), st.sampled_from(["4MiB", "lots", "1e9", "-1"]))),
       TRAIN, OPTIMIZERS, mostly(st.integers(1, 3)), mostly(st.booleans()), DTYPES, mostly(st.floats(0.5, 30)))
def test_random_arguments_never_crash_solve(source, mesh, dims, pins, mem_limit, train, optimizer, top, explain, dtype,
                                            time_limit):
    only_input_or_type_errors(lambda: shardmm.solve(source, mesh, dims, pins, mem_limit, train, optimizer, top, explain,
                                                    dtype, time_limit=time_limit))
    only_input_or_type_errors(lambda: shardmm.solve(text=source, mesh=mesh, mem_limit=mem_limit, top=top))


ARRAYS = st.one_of(
    st.none(), st.integers(), st.lists(st.floats(), max_size=3),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from(["f4", "f8", "i4", "U1", "O", "c8"])).map(
        lambda t: np.zeros((t[0], t[1]), dtype=t[2])))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["A[I, J_X] @ B[J_X, K]", "A[I_X, J] @ B[J, K_X] -> C[I_X, K]", "A[I] @ B[I]", "x"]),
       st.sampled_from(["X=2", "X=2,Y=2", "X=0", "Y=2", 7, shardmm.Mesh("X=3", split="chunk")]),
       st.one_of(st.none(), ANYTHING), ARRAYS, ARRAYS,
       st.sampled_from([None, "f32", "f64", "bf16", "f7", 3, np.int8, np.float32]))
def test_random_run_arguments_never_crash(expr, mesh, dims, a, b, dtype):
    only_input_or_type_errors(lambda: shardmm.run(expr, mesh, dims, a=a, b=b, dtype=dtype))
