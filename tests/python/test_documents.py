# check, plan and reshard: the objects, and to_json() equal to the command's --json output.
import json

import pytest

import shardmm

CHECKS = [
    (("A[I_XY, J]", "X=3,Y=2"), {"dims": "I=10,J=4", "dtype": "f32"}, ["--dims", "I=10,J=4", "--dtype", "f32"]),
    (("C[I, K] = [Partial(), Shard(1)]", "X=2,Y=2"), {}, []),
    (("A[I_YX, J]", "X=2,Y=2"), {"dims": {"I": 7, "J": 3}}, ["--dims", "I=7,J=3"]),
]


@pytest.mark.parametrize("args, kwargs, flags", CHECKS)
def test_check_document_is_the_commands(cli, args, kwargs, flags):
    doc = shardmm.check(*args, **kwargs)
    status, out, err = cli("check", args[0], "--mesh", args[1], *flags, "--json")
    assert status == 0, err
    assert doc.to_json() + "\n" == out
    assert doc.spec == json.loads(out)["spec"]


PLANS = [
    ("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", {"I": 8192, "J": 4096, "K": 16384}, {}),
    ("A[I_X, J] @ B[J, K_X]", "X=4,Y=2", {"I": 8192, "J": 4096, "K": 16384}, {"hw": "h100", "mem_limit": "16GiB"}),
    ("A[I, J] = P(None, 'X') @ B[J, K] = [Shard(0), Replicate()] -> C[I, K_Y]", "X=2,Y=2", "I=100,J=30,K=7",
     {"dtype": "f32", "tie_margin": 0}),
]


@pytest.mark.parametrize("expr, mesh, dims, kwargs", PLANS)
def test_plan_document_is_the_commands(cli, expr, mesh, dims, kwargs):
    p = shardmm.plan(expr, shardmm.Mesh(mesh), dims, **kwargs)
    dims_text = dims if isinstance(dims, str) else ",".join(f"{k}={v}" for k, v in dims.items())
    flags = {"dtype": "--dtype", "hw": "--hw", "mem_limit": "--mem-limit", "tie_margin": "--tie-margin"}
    extra = [x for k, v in kwargs.items() for x in (flags[k], str(v))]
    status, out, err = cli("plan", expr, "--mesh", mesh, "--dims", dims_text, *extra, "--json")
    assert status == 0, err
    assert p.to_json() + "\n" == out
    doc = json.loads(out)
    assert p.chosen.description == doc["candidates"][doc["chosen"]]["description"]
    assert [s.op for s in p.steps] == [s["op"] for s in doc["candidates"][doc["chosen"]]["steps"]]
    assert p.total_time_s == doc["candidates"][doc["chosen"]]["total_time_s"] > 0
    assert all(s.bytes_sent >= 0 and s.time_s >= 0 for c in p.candidates for s in c.steps)


def test_the_books_case_3_plans_an_all_reduce():
    p = shardmm.plan("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", "I=8192,J=4096,K=16384")
    assert [c["case"] for c in p.cases] == [3]
    assert [(s.op, s.axes) for s in p.steps] == [("einsum", []), ("all_reduce", ["X"])]
    assert p.steps[1].from_spec == "C[I, K]{U_X}" and p.steps[1].to_spec == "C[I, K]"
    # all_reduce of 8192 x 16384 bf16 over 4 devices sends 2 (p-1)/p of the array per device
    assert p.steps[1].bytes_sent == 2 * 3 * 8192 * 16384 * 2 // 4


def test_reshard_document_is_the_commands(cli):
    r = shardmm.reshard("A[I, J_X]", "A[I, J] = P('X', None)", "X=4", {"I": 8192, "J": 4096})
    status, out, err = cli("reshard", "A[I, J_X]", "A[I, J] = P('X', None)", "--mesh", "X=4", "--dims",
                           "I=8192,J=4096", "--json")
    assert status == 0, err
    assert r.to_json() + "\n" == out
    assert [s.op for s in r.steps] == ["all_to_all"]


@pytest.mark.parametrize("call, flags", [
    (lambda: shardmm.plan("A[I, J_X] @ B[J_X, K]", "X=4", "I=8,J=4"),
     ["plan", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=4", "--dims", "I=8,J=4"]),
    (lambda: shardmm.check("A[I_X, J_X]", "X=4"), ["check", "A[I_X, J_X]", "--mesh", "X=4"]),
    (lambda: shardmm.plan("A[I] @ B[I]", "X=0", "I=4"), ["plan", "A[I] @ B[I]", "--mesh", "X=0", "--dims", "I=4"]),
    (lambda: shardmm.reshard("A[I]", "B[I]", "X=2", "I=4"), ["reshard", "A[I]", "B[I]", "--mesh", "X=2", "--dims", "I=4"]),
])
def test_errors_carry_the_commands_message(cli, call, flags):
    with pytest.raises(shardmm.InputError) as e:
        call()
    status, out, err = cli(*flags)
    assert status == 2
    # A field the message names is spelled as each front end takes it: --dims there, dims here.
    assert err == "shardmm: error: " + str(e.value).replace("to dims", "to --dims") + "\n"


def test_wrong_types_raise_type_error():
    for call in (lambda: shardmm.plan("A[I, J] @ B[J, K]", "X=4", None),
                 lambda: shardmm.plan("A[I, J] @ B[J, K]", 4, "I=4,J=4,K=4"),
                 lambda: shardmm.plan("A[I, J] @ B[J, K]", "X=4", {"I": 4.5}),
                 lambda: shardmm.check("A[I]", "X=4", dims=["I=4"]),
                 lambda: shardmm.check("A[I]", "X=4", dtype=3.0)):
        with pytest.raises(TypeError):
            call()


def test_help_teaches():
    assert "PartitionSpec" in shardmm.plan.__doc__ and "to_json" in shardmm.plan.__doc__
    assert "GIL" in shardmm.run.__doc__ and "copy" in shardmm.run.__doc__
