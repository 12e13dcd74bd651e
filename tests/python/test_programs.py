# program and solve: the objects, to_json() equal to the command's --json output for the same
# arguments, solve's pinned program equal to what --emit writes, and the commands' messages.
import json
import os
import pathlib

import pytest

import shardmm
from conftest import TESTS_DIR

EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples", "programs")
MLP, MLP_FREE, TP_FFN = (os.path.join(EXAMPLES, name) for name in ("mlp.prog", "mlp_free.prog", "tp_ffn.prog"))

# (the keyword arguments, the same as the command's flags)
PROGRAMS = [
    (MLP, {}, []),
    (MLP, {"mesh": "X=2,Y=2", "dims": {"B": 4, "T": 16}, "specs": {"w_in": "w_in[D, F_XY]"}, "optimizer": "adam",
           "dtype": "f32", "hw": "tpu-v5e"},
     ["--mesh", "X=2,Y=2", "--dims", "B=4,T=16", "--spec", "w_in=w_in[D, F_XY]", "--optimizer", "adam", "--dtype",
      "f32", "--hw", "tpu-v5e"]),
    (MLP, {"mesh": shardmm.Mesh("X=3", split="chunk"), "dims": "F=7", "train": False},
     ["--mesh", "X=3", "--split", "chunk", "--dims", "F=7", "--infer"]),
    (TP_FFN, {"split": "chunk", "train": True}, ["--split", "chunk", "--train"]),
]


@pytest.mark.parametrize("path, kwargs, flags", PROGRAMS)
def test_program_document_is_the_commands(cli, path, kwargs, flags):
    p = shardmm.program(path, **kwargs)
    status, out, err = cli("program", path, *flags, "--json")
    assert status == 0, err
    assert p.to_json() + "\n" == out
    doc = json.loads(out)
    assert p.specs == {t["name"]: t["spec"] for t in doc["tensors"]}
    assert p.time_s == doc["predicted_time_s"]["serialized"] > 0
    assert p.memory_bytes == doc["memory"]["total_bytes"] > 0
    assert p.peak_bytes == doc["memory"]["timeline"][doc["memory"]["peak_point"]]["total_bytes"] > 0
    assert [c["op"] for c in p.collectives] == [c["op"] for c in doc["collectives"]]


FSDP = """mesh X=4
dims B=8, T=256, D=1024, F=2048
input x[B, T, D] : x[B_X, T, D]
param w_in[D, F] regathered : w_in[D_X, F]
param w_out[F, D] regathered : w_out[F_X, D]
input g[B, T, D] : g[B_X, T, D]
u[B, T, F] = x @ w_in
y[B, T, D] = gelu(u) @ w_out
loss sum(y * g)
"""


def test_rings_gather_fsdps_weights_under_the_einsum(cli, tmp_path):
    plain = shardmm.program(text=FSDP, hw="tpu-v5e")
    rings = shardmm.program(text=FSDP, hw="tpu-v5e", rings=True)
    forward = lambda p: [c["op"] for c in p.collectives if c["phase"] == "forward"]
    assert forward(plain) == ["all_gather"] and forward(rings) == ["all_gather_einsum"]
    assert rings.time_s < plain.time_s
    path = tmp_path / "fsdp.prog"
    path.write_text(FSDP)
    status, out, err = cli("program", str(path), "--hw", "tpu-v5e", "--rings", "--json")
    assert status == 0, err
    assert json.loads(out)["collectives"] == json.loads(rings.to_json())["collectives"]
    with pytest.raises(TypeError, match="rings must be True or False"):
        shardmm.program(text=FSDP, rings="yes")
    s = shardmm.solve(text=FSDP, hw="tpu-v5e", rings=True, pins={"w_in": "w_in[D_X, F]", "w_out": "w_out[F_X, D]"})
    assert s.to_json() and json.loads(s.to_json())["rings"] is True


def test_the_books_ffn_reduces_once_each_way():
    p = shardmm.program(pathlib.Path(TP_FFN))
    assert p.file == TP_FFN and p.train
    assert p.specs["a"] == "a[D, F_X]" and p.specs["y"] == "y[N, E]"
    assert [(c["phase"], c["op"], c["axes"], c["count"]) for c in p.collectives] == [
        ("forward", "all_reduce", ["X"], 1), ("backward", "all_reduce", ["X"], 1)]


def test_run_executes_and_verifies_the_step(cli):
    p = shardmm.program(MLP, mesh=shardmm.Mesh("X=3", split="chunk"), dims="B=2,T=2,D=4,F=7", optimizer="adam",
                        run=True)
    assert p.run["verified"] and p.run["backend"] == "threads" and p.dtype == "f64"
    assert 0 <= p.run["max_abs_error"] <= p.run["tolerance"]
    status, out, err = cli("program", MLP, "--mesh", "X=3", "--split", "chunk", "--dims", "B=2,T=2,D=4,F=7",
                           "--optimizer", "adam", "--run", "--json")
    assert status == 0, err
    assert p.to_json() + "\n" == out
    s = shardmm.solve(MLP_FREE, mesh="X=2", dims="B=2,T=4,D=8,F=16", pins={"w_in": "w_in[D, F_X]"}, dtype="f32",
                      run=True)
    assert s.run["verified"] and s.dtype == "f32" and s.specs["w_in"] == "w_in[D, F_X]"
    with pytest.raises(shardmm.InputError, match="give smaller dims with run"):
        shardmm.solve(MLP_FREE, run=True)


def test_text_is_the_file_under_another_name():
    with open(MLP, encoding="utf-8") as f:
        text = f.read()
    from_text = json.loads(shardmm.program(text=text, dims="B=2").to_json())
    from_file = json.loads(shardmm.program(MLP, dims="B=2").to_json())
    assert from_text.pop("file") == "<program>"
    from_file.pop("file")
    assert from_text == from_file


def without_solve_seconds(doc):
    """The document without the seconds the build and the solver took, which differ from run to run."""
    if isinstance(doc, dict):
        return {k: without_solve_seconds(v) for k, v in doc.items() if k not in ("solve_seconds", "build_seconds")}
    if isinstance(doc, list):
        return [without_solve_seconds(v) for v in doc]
    return doc


SOLVES = [
    (MLP_FREE, {}, []),
    (MLP_FREE, {"pins": {"x": "x[B, T, D]", "g": shardmm.Spec("g[B, T, D]", "X=4")}, "explain": True, "top": 3},
     ["--pin", "x=x[B, T, D]", "--pin", "g=g[B, T, D]", "--explain", "--top", "3"]),
    (MLP_FREE, {"mesh": "X=2,Y=2", "dims": {"B": 8, "T": 64, "D": 256, "F": 1024}, "train": False, "dtype": "f32"},
     ["--mesh", "X=2,Y=2", "--dims", "B=8,T=64,D=256,F=1024", "--infer", "--dtype", "f32"]),
    # At these sizes the replicated step is fastest and needs 5.5 MiB: the limit binds (CBC).
    (MLP_FREE, {"dims": "B=8,T=64,D=256,F=1024", "mem_limit": "4MiB", "optimizer": "adam", "time_limit": 30},
     ["--dims", "B=8,T=64,D=256,F=1024", "--mem-limit", "4MiB", "--optimizer", "adam", "--time-limit", "30"]),
]


@pytest.mark.parametrize("path, kwargs, flags", SOLVES)
def test_solve_document_is_the_commands(cli, tmp_path, path, kwargs, flags):
    s = shardmm.solve(path, **kwargs)
    status, out, err = cli("solve", path, *flags, "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert without_solve_seconds(json.loads(s.to_json())) == without_solve_seconds(doc)
    assert s.status == doc["status"] and s.method == doc["method"]
    assert s.objective_s == doc["objective_s"] and s.lower_bound_s == doc["lower_bound_s"]
    assert s.specs == {t["name"]: t["spec"] for t in doc["tensors"]}
    assert [n.name for n in s.named_strategies] == [n["name"] for n in doc["named_strategies"]]
    assert [t.specs for t in s.top] == [t["specs"] for t in doc["top"]]
    assert len(s.top) == kwargs.get("top", 1)
    # The pinned program is --emit's file, and `program` costs it as the answer.
    emitted = tmp_path / "solved.prog"
    status, _, err = cli("solve", path, *flags, "--emit", str(emitted))
    assert status == 0, err
    assert s.pinned_program() == emitted.read_text(encoding="utf-8")
    again = shardmm.program(text=s.pinned_program(), dtype=kwargs.get("dtype"), train=kwargs.get("train"),
                            optimizer=kwargs.get("optimizer", "sgd"))
    assert again.time_s == pytest.approx(s.predicted["time_s"], rel=1e-12)  # summed in another order
    assert again.memory_bytes == s.predicted["memory"]["total_bytes"]
    assert again.peak_bytes == s.predicted["memory"]["peak_bytes"] == s.top[0].memory_bytes


# Two matmuls of two-letter tensors: searched on three axes in about a second.
TWO_LETTER_MLP = """input x[B, D]
param w_in[D, F]
param w_out[F, D]
u[B, F] = x @ w_in
a[B, F] = gelu(u)
y[B, D] = a @ w_out
loss sum(y * y)
"""


def test_a_search_by_neighbourhoods_is_the_commands(cli, tmp_path):
    path = tmp_path / "mlp.prog"
    path.write_text(TWO_LETTER_MLP, encoding="utf-8")
    s = shardmm.solve(str(path), mesh="a=2,b=2,c=2", dims="B=64,D=256,F=1024", time_limit=600,
                      search="neighbourhoods")
    assert s.status == "local" and s.method == "neighbourhood search" and 0 < s.lower_bound_s <= s.objective_s
    assert s.search["converged_axes"] == 2 and s.search["neighbourhoods"] > 3
    status, out, err = cli("solve", str(path), "--mesh", "a=2,b=2,c=2", "--dims", "B=64,D=256,F=1024",
                           "--time-limit", "600", "--search", "neighbourhoods", "--json")
    assert status == 0, err

    def timeless(doc):
        doc = without_solve_seconds(doc)
        doc["search"] = {k: v for k, v in doc["search"].items() if not k.endswith("seconds")}
        return doc

    assert timeless(json.loads(s.to_json())) == timeless(json.loads(out))


def test_a_binding_limit_is_kept_and_reported():
    s = shardmm.solve(MLP_FREE, dims="B=8,T=64,D=256,F=1024", mem_limit=4 << 20)
    assert s.method == "integer program (CBC)" and s.memory_limit_bytes == 4 << 20
    assert s.predicted["memory"]["peak_bytes"] <= 4 << 20
    assert s.unconstrained["time_s"] < s.objective_s
    assert s.unconstrained["memory_bytes"] > 4 << 20


def test_a_named_strategy_that_finds_nothing_has_no_figures():
    # B=4 cannot be split eight ways (nor T=1): only tp applies.
    s = shardmm.solve(MLP_FREE, mesh="X=8", dims="B=4,T=1,D=64,F=64")
    found = {n.name: n for n in s.named_strategies if n.status != "infeasible"}
    assert list(found) == ["tp(X)"] and found["tp(X)"].time_s > 0
    for n in s.named_strategies:
        if n.name in found:
            continue
        assert n.time_s is None and n.memory_bytes is None and n.lower_bound_s is None
        assert n.specs == {} and n.why_not.startswith("fits no spec of x")
        assert repr(n) == f"<Strategy {n.name}: infeasible>"


def test_solve_finds_megatron_on_the_free_mlp():
    s = shardmm.solve(MLP_FREE, explain=True)
    assert s.status == "optimal" and s.objective_s == s.lower_bound_s > 0
    assert s.specs["w_in"] == "w_in[D, F_X]" and s.specs["w_out"] == "w_out[F_X, D]"
    assert all(n.time_s >= s.objective_s * (1 - 1e-12) for n in s.named_strategies if n.status == "optimal")
    assert {a["tensor"] for a in s.alternatives} >= {"w_in", "w_out"}


def flags_spelled(message, fields):
    """`message` with the fields it names spelled as the command's flags: each (as Python
    names it, as the command does), e.g. ("in dims", "in --dims")."""
    for ours, theirs in fields:
        assert ours in message, (ours, message)
        message = message.replace(ours, theirs)
    return message


@pytest.mark.parametrize("call, flags, fields", [
    (lambda: shardmm.program("/nonexistent/x.prog"), ["program", "/nonexistent/x.prog"], []),
    (lambda: shardmm.program(MLP, specs={"zz": "zz[A]"}), ["program", MLP, "--spec", "zz=zz[A]"],
     [("in spec", "in --spec")]),
    (lambda: shardmm.program(MLP, specs={"w_in": "w_in[D_Y, F]"}), ["program", MLP, "--spec", "w_in=w_in[D_Y, F]"],
     [("in spec", "in --spec")]),
    (lambda: shardmm.program(MLP, optimizer="lion"), ["program", MLP, "--optimizer", "lion"],
     [("in optimizer", "in --optimizer")]),
    (lambda: shardmm.program(MLP, mesh="X=0"), ["program", MLP, "--mesh", "X=0"], []),
    (lambda: shardmm.program(MLP, dims={"Q": 3}), ["program", MLP, "--dims", "Q=3"], [("in dims", "in --dims")]),
    (lambda: shardmm.program(MLP, split="torch"), ["program", MLP, "--split", "torch"], []),
    (lambda: shardmm.program(MLP, hw="abacus"), ["program", MLP, "--hw", "abacus"], []),
    (lambda: shardmm.solve(MLP_FREE, mem_limit="1MiB"), ["solve", MLP_FREE, "--mem-limit", "1MiB"],
     [("mem_limit 1 MiB", "--mem-limit 1 MiB")]),
    (lambda: shardmm.solve(MLP_FREE, mem_limit="lots"), ["solve", MLP_FREE, "--mem-limit", "lots"],
     [("bad mem_limit", "bad --mem-limit")]),
    (lambda: shardmm.solve(MLP_FREE, pins={"zz": "zz[A]"}), ["solve", MLP_FREE, "--pin", "zz=zz[A]"],
     [("in pin", "in --pin")]),
    (lambda: shardmm.solve(MLP_FREE, top=0), ["solve", MLP_FREE, "--top", "0"], [("top", "--top")]),
    (lambda: shardmm.solve(MLP_FREE, time_limit=-1), ["solve", MLP_FREE, "--time-limit", "-1"],
     [("time_limit -1", "--time-limit -1"), ("e.g. time_limit", "e.g. --time-limit")]),
    (lambda: shardmm.solve(MLP_FREE, dtype="f7"), ["solve", MLP_FREE, "--dtype", "f7"], []),
    (lambda: shardmm.solve(MLP_FREE, search="local"), ["solve", MLP_FREE, "--search", "local"],
     [("search 'local'", "--search 'local'"), ("e.g. search", "e.g. --search")]),
])
def test_errors_carry_the_commands_message(cli, tmp_path, call, flags, fields):
    with pytest.raises(shardmm.InputError) as e:
        call()
    expected = str(e.value)
    status, out, err = cli(*flags)
    assert status == 2 and out == ""
    assert err == "shardmm: error: " + flags_spelled(expected, fields) + "\n"


@pytest.mark.parametrize("command, text, kwargs, flags, fields", [
    ("program", "mesh X=2\ninput x[N]\ny[N] = frob(x)\n", {}, [], []),
    ("solve", "mesh X=2\ndims N=4\ninput x[N]\ny[N] = relu(x)\n", {"train": True}, ["--train"],
     [("train:", "--train:")]),
])
def test_text_errors_are_the_files_under_its_name(cli, tmp_path, command, text, kwargs, flags, fields):
    with pytest.raises(shardmm.InputError) as e:
        getattr(shardmm, command)(text=text, **kwargs)
    path = tmp_path / "p.prog"
    path.write_text(text, encoding="utf-8")
    status, out, err = cli(command, str(path), *flags)
    assert status == 2 and out == ""
    assert err == "shardmm: error: " + flags_spelled(str(e.value).replace("<program>", str(path)), fields) + "\n"


def test_wrong_types_raise_type_error():
    for call in (lambda: shardmm.program(),
                 lambda: shardmm.program(3),
                 lambda: shardmm.program(MLP, text="mesh X=2"),
                 lambda: shardmm.program(text=b"mesh X=2"),
                 lambda: shardmm.program(MLP, mesh=4),
                 lambda: shardmm.program(MLP, specs=["w_in=w_in[D, F_X]"]),
                 lambda: shardmm.program(MLP, specs={1: "w_in[D, F_X]"}),
                 lambda: shardmm.program(MLP, specs={"w_in": 3}),
                 lambda: shardmm.program(MLP, train="yes"),
                 lambda: shardmm.program(MLP, optimizer=None),
                 lambda: shardmm.program(MLP, dims=[1]),
                 lambda: shardmm.solve(MLP_FREE, top="2"),
                 lambda: shardmm.solve(MLP_FREE, top=True),
                 lambda: shardmm.solve(MLP_FREE, explain=1),
                 lambda: shardmm.solve(MLP_FREE, time_limit="10"),
                 lambda: shardmm.solve(MLP_FREE, mem_limit=1.5),
                 lambda: shardmm.solve(MLP_FREE, search=None),
                 lambda: shardmm.program(MLP, run="yes")):
        with pytest.raises(TypeError):
            call()


def test_a_mesh_and_a_contrary_split_are_refused():
    with pytest.raises(shardmm.InputError, match="contradicts"):
        shardmm.program(MLP, mesh=shardmm.Mesh("X=2", split="chunk"), split="array")
    assert json.loads(shardmm.program(MLP, mesh=shardmm.Mesh("X=2", split="chunk"), split="chunk").to_json())[
        "split"] == "chunk"


def test_help_teaches():
    for f in (shardmm.program, shardmm.solve):
        assert ">>> " in f.__doc__ and "to_json" in f.__doc__ and "text=" in f.__doc__
    assert "pinned_program" in shardmm.solve.__doc__ and "mem_limit" in shardmm.solve.__doc__
