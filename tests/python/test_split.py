# Mesh(split=...): where uneven blocks lie. 'chunk' must be PyTorch's own torch.chunk (what
# DTensor's Shard uses), nested as DTensor nests placements; checked against torch itself.
import numpy as np
import pytest

import shardmm

RNG = np.random.default_rng(2804)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def pad(pieces, parts):
    """torch.chunk returns fewer than `parts` pieces where they would be empty; DTensor's Shard
    gives those devices empty shards (None here)."""
    pieces = [p if len(p) else None for p in pieces]
    return pieces + [None] * (parts - len(pieces))


def torch_blocks(torch, n, parts, split):
    """[(begin, end) or None] of each of `parts` pieces of range(n), as torch splits it: chunk
    (DTensor's Shard) or tensor_split (numpy.array_split)."""
    pieces = torch.chunk(torch.arange(n), parts) if split == "chunk" else torch.tensor_split(torch.arange(n), parts)
    return [(int(p[0]), int(p[-1]) + 1) if p is not None else None for p in pad(pieces, parts)]


def same_blocks(ours, theirs):
    # An empty block's offset is not torch's business: compare extents there.
    return all((b == e) if t is None else (b, e) == t for (b, e), t in zip(ours, theirs)) and len(ours) == len(theirs)


@pytest.mark.parametrize("split", ["chunk", "array"])
def test_one_axis_blocks_are_torchs(torch, split):
    for _ in range(150):
        n, parts = int(RNG.integers(1, 60)), int(RNG.integers(1, 12))
        doc = shardmm.check("A[I_X]", shardmm.Mesh(f"X={parts}", split=split), {"I": n})
        ours = [tuple(s["block"][0]) for s in doc.shards]
        assert same_blocks(ours, torch_blocks(torch, n, parts, split)), (split, n, parts, ours)


def test_nested_blocks_are_dtensors_chunk_of_a_chunk(torch):
    # [Shard(0), Shard(0)] on a 2-D mesh: chunk over X, then chunk each piece over Y.
    for _ in range(80):
        n, px, py = int(RNG.integers(1, 50)), int(RNG.integers(1, 6)), int(RNG.integers(1, 6))
        mesh = shardmm.Mesh(f"X={px},Y={py}", split="chunk")
        spec = shardmm.Spec.from_placements("[Shard(0), Shard(0)]", mesh, letters="A[I]")
        doc = shardmm.check(spec, mesh, {"I": n})
        want = []
        for x_piece in pad(torch.chunk(torch.arange(n), px), px):
            y_pieces = torch.chunk(x_piece, py) if x_piece is not None else ()
            want += [(int(p[0]), int(p[-1]) + 1) if p is not None else None for p in pad(y_pieces, py)]
        ours = [tuple(s["block"][0]) for s in doc.shards]
        assert same_blocks(ours, want), (n, px, py, ours, want)


def test_run_under_chunk_returns_torch_chunk_pieces(torch):
    a, b = RNG.standard_normal((10, 3)), RNG.standard_normal((3, 5))
    mesh = shardmm.Mesh("X=3,Y=2", split="chunk")
    r = shardmm.run("A[I_X, J] @ B[J, K] -> C[I_X, K_Y]", mesh, a=a, b=b, return_shards=True)
    assert r.verified and r.plan.to_json() == shardmm.plan(
        "A[I_X, J] @ B[J, K] -> C[I_X, K_Y]", mesh, {"I": 10, "J": 3, "K": 5}, dtype="f64", hw="h100").to_json()
    expected = torch.from_numpy(a @ b)
    for d, shard in enumerate(r.shards):
        x, y = divmod(d, 2)
        rows = torch.chunk(expected, 3, dim=0)[x]  # 10 over 3: 4, 4, 2
        piece = torch.chunk(rows, 2, dim=1)[y]     # 5 over 2: 3, 2
        np.testing.assert_allclose(shard, piece.numpy(), rtol=1e-12, atol=1e-12)
    # 5 rows over 4 devices: torch.chunk gives 2, 2, 1 and DTensor an empty fourth shard.
    a = RNG.standard_normal((5, 2))
    r = shardmm.run("A[I_X, J] @ B[J, K] -> C[I_X, K]", shardmm.Mesh("X=4", split="chunk"), a=a, b=np.eye(2),
                    return_shards=True)
    pieces = torch.chunk(torch.from_numpy(a), 4)
    assert [s.shape[0] for s in r.shards] == [2, 2, 1, 0] and len(pieces) == 3
    for shard, piece in zip(r.shards, pieces):
        np.testing.assert_allclose(shard, piece.numpy(), rtol=1e-12, atol=1e-12)


def test_the_rule_is_part_of_the_mesh():
    chunk = shardmm.Mesh("X=4", split="chunk")
    assert chunk.split == "chunk" and shardmm.Mesh("X=4").split == "array"
    assert repr(chunk) == "Mesh('X=4', split='chunk')" and str(chunk) == "X=4"
    assert chunk != shardmm.Mesh("X=4") and chunk == shardmm.Mesh(chunk) == shardmm.Mesh("X=4", "chunk")
    assert len({chunk, shardmm.Mesh("X=4"), shardmm.Mesh("X=4", split="array")}) == 2
    assert shardmm.Mesh(chunk, split="array") == shardmm.Mesh("X=4")
    assert repr(shardmm.Spec("A[I_X]", chunk)) == "Spec('A[I_X]', Mesh('X=4', split='chunk'))"
    assert shardmm.reshard("A[I_X]", "A[I]", chunk, {"I": 5}).split == "chunk"
    assert shardmm.check("A[I_X]", "X=4").split == "array"
    # A chunk mesh's costs are chunk's: gathering 5 rows over 4 gives device 3 (empty) all 5.
    moved = {split: shardmm.reshard("A[I_X, J]", "A[I, J]", shardmm.Mesh("X=4", split=split), "I=5,J=1",
                                    dtype="f32").steps[0].bytes_received for split in ("array", "chunk")}
    assert moved == {"array": 16, "chunk": 20}


def test_a_bad_rule_is_an_input_error():
    with pytest.raises(shardmm.InputError, match=r"^unknown split rule 'torch'; the rules are array \(numpy"):
        shardmm.Mesh("X=4", split="torch")
    with pytest.raises(TypeError, match="split must be 'array' or 'chunk', not int"):
        shardmm.Mesh("X=4", split=1)
