# run: numpy arrays in, the product out, on one thread per device, checked against a @ b.
import sys
import threading
import time

import numpy as np
import pytest

import shardmm

RNG = np.random.default_rng(28)

# The Scaling Book's four cases, and what the planner must add to each.
BOOK = [
    "A[I_X, J] @ B[J, K_Y] -> C[I_X, K_Y]",   # case 1: no communication
    "A[I, J_X] @ B[J, K] -> C[I, K]",         # case 2: one input splits the contracted J
    "A[I, J_X] @ B[J_X, K] -> C[I, K]",       # case 3: partial sums, all_reduce
    "A[I, J_X] @ B[J_X, K] -> C[I, K_X]",     # case 3: reduce_scatter
    "A[I_X, J] @ B[J, K_X] -> C[I_X, K]",     # case 4: all_gather one side
    "A[I, J_X] @ B[J_X, K] -> C[I, K]{U_X}",  # kept unreduced: the result is the sum
]


@pytest.mark.parametrize("expr", BOOK)
@pytest.mark.parametrize("shape", [(16, 8, 12), (10, 7, 5), (3, 2, 1)])
def test_the_books_cases_give_a_at_b(expr, shape):
    i, j, k = shape
    a, b = RNG.standard_normal((i, j)), RNG.standard_normal((j, k))
    r = shardmm.run(expr, "X=2,Y=2", a=a, b=b)
    assert r.verified and r.result.dtype == np.float64 and r.result.shape == (i, k)
    np.testing.assert_allclose(r.result, a @ b, rtol=1e-12, atol=1e-12)


def test_f32_batch_dims_and_a_plan_given_as_placements():
    a = RNG.standard_normal((3, 10, 6)).astype(np.float32)
    b = RNG.standard_normal((3, 6, 4)).astype(np.float32)
    r = shardmm.run("A[B1, I, J] = [Shard(1), Shard(2)] @ B[B1, J, K] = P(None, 'Y') -> C[B1, I, K]",
                    "X=4,Y=2", {"B1": 3, "I": 10, "J": 6, "K": 4}, a=a, b=b)
    assert r.result.dtype == np.float32
    np.testing.assert_allclose(r.result, a @ b, rtol=1e-5, atol=1e-5)
    assert r.plan.to_json() == shardmm.plan(
        "A[B1, I_X, J_Y] @ B[B1, J_Y, K] -> C[B1, I, K]", "X=4,Y=2", "B1=3,I=10,J=6,K=4", dtype="f32",
        hw="h100").to_json().replace("A[B1, I_X, J_Y] @ B[B1, J_Y, K]", "A[B1, I_X, J_Y] @ B[B1, J_Y, K]")


def test_shards_are_each_devices_block():
    a, b = RNG.standard_normal((10, 3)), RNG.standard_normal((3, 9))
    r = shardmm.run("A[I_X, J] @ B[J, K] -> C[I_X, K_Y]", "X=3,Y=2", a=a, b=b, return_shards=True)
    doc = shardmm.check("C[I_X, K_Y]", "X=3,Y=2", {"I": 10, "K": 9})
    assert len(r.shards) == 6
    for shard, placed in zip(r.shards, doc.shards):
        (i0, i1), (k0, k1) = placed["block"]
        np.testing.assert_array_equal(shard, r.result[i0:i1, k0:k1])


def test_inputs_of_the_right_kind_are_not_copied_and_not_changed():
    a = np.asfortranarray(RNG.standard_normal((8, 4)))  # not C-contiguous: copied once
    b = RNG.standard_normal((4, 6))
    kept_a, kept_b = a.copy(), b.copy()
    assert shardmm._operand(b, "b", np.float64) is b
    assert shardmm._operand(a, "a", np.float64) is not a
    r = shardmm.run("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=2", a=a, b=b)
    np.testing.assert_array_equal(a, kept_a)
    np.testing.assert_array_equal(b, kept_b)
    np.testing.assert_allclose(r.result, a @ b, rtol=1e-12)


def test_other_dtypes_are_converted_when_asked_and_refused_otherwise():
    a, b = np.arange(12).reshape(3, 4), np.ones((4, 2), dtype=np.int32)
    with pytest.raises(shardmm.InputError, match="pass dtype='f32' or dtype='f64'"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=a, b=b)
    r = shardmm.run("A[I, J] @ B[J, K]", "X=2", a=a, b=b, dtype=np.float32)
    np.testing.assert_array_equal(r.result, (a @ b).astype(np.float32))
    with pytest.raises(shardmm.InputError, match="a is float32 and b is float64"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=np.ones((2, 2), np.float32), b=np.ones((2, 2)))
    with pytest.raises(shardmm.InputError, match="holds <U1"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=np.array([["x"]]), b=np.ones((1, 1)), dtype="f64")
    with pytest.raises(shardmm.InputError, match="cannot run in bf16"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=np.ones((2, 2)), b=np.ones((2, 2)), dtype="bf16")


def test_shapes_must_match_the_letters():
    a, b = np.ones((4, 3)), np.ones((5, 2))
    with pytest.raises(shardmm.InputError, match="dimension J is 3 long in a but 5 in b"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=a, b=b)
    with pytest.raises(shardmm.InputError, match=r"a has shape \(4, 3\) but A\[I, J\] is \(4, 5\)"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", {"I": 4, "J": 5, "K": 2}, a=a, b=b)
    with pytest.raises(shardmm.InputError, match="a has 1 dimensions"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=np.ones(4), b=b)
    with pytest.raises(shardmm.InputError, match="size 0"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=np.ones((0, 5)), b=b)
    with pytest.raises(TypeError, match="a must be a numpy array"):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=[[1.0]], b=b)
    with pytest.raises(TypeError):
        shardmm.run("A[I, J] @ B[J, K]", "X=2", a=a)


def test_other_python_threads_run_while_the_ranks_do():
    # With a switch interval longer than the test, this thread keeps the GIL until it blocks:
    # the counter, which sleeps between counts, can count only while the run releases it.
    a, b = RNG.standard_normal((400, 400)), RNG.standard_normal((400, 400))
    counts, done = [0], threading.Event()

    def count():
        while not done.is_set():
            counts[0] += 1
            time.sleep(0.0001)

    interval = sys.getswitchinterval()
    counter = threading.Thread(target=count)
    counter.start()
    sys.setswitchinterval(1000)
    try:
        time.sleep(0.01)
        before = counts[0]
        shardmm.run("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", a=a, b=b)
        during = counts[0] - before
    finally:
        sys.setswitchinterval(interval)
        done.set()
        counter.join()
    assert during > 0
