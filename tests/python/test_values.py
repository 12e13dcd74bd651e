# Mesh and Spec: printing, equality and the PartitionSpec / placements converters.
import pytest

import shardmm
from conftest import golden_specs


def test_mesh_reads_axes_and_numbers_devices_row_major():
    mesh = shardmm.Mesh(" X = 4 , Y = 2 ")
    assert mesh.axes == {"X": 4, "Y": 2}
    assert list(mesh.axes) == ["X", "Y"]
    assert mesh.size == 8 and mesh.axis_names == ("X", "Y") and mesh.shape == {"X": 4, "Y": 2}
    assert mesh.devices.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [mesh.coords(d) for d in (0, 1, 5, 7)] == [{"X": 0, "Y": 0}, {"X": 0, "Y": 1}, {"X": 2, "Y": 1},
                                                       {"X": 3, "Y": 1}]
    assert str(mesh) == "X=4,Y=2" and repr(mesh) == "Mesh('X=4,Y=2')"
    assert mesh == shardmm.Mesh("X=4,Y=2") != shardmm.Mesh("Y=2,X=4")


@pytest.mark.parametrize("mesh, canonical", golden_specs())
def test_every_golden_spec_round_trips(mesh, canonical):
    mesh = shardmm.Mesh(mesh)
    spec = shardmm.Spec.parse(canonical, mesh)
    assert str(spec) == canonical
    assert eval(repr(spec), {"Spec": shardmm.Spec, "Mesh": shardmm.Mesh}) == spec
    letters = f"{spec.tensor}[{', '.join(spec.letters)}]"
    assert shardmm.Spec.from_partition_spec(spec.to_partition_spec(), mesh, letters) == spec
    assert str(shardmm.Spec.from_partition_spec(spec.to_partition_spec(), mesh, spec.letters)) == canonical.replace(
        spec.tensor + "[", "[", 1)
    in_mesh_order = all(list(axes) == sorted(axes, key=list(mesh.axes).index) for _, axes in spec.dims)
    if in_mesh_order:
        assert shardmm.Spec.from_placements(spec.to_placements(), mesh, letters) == spec
    else:
        with pytest.raises(shardmm.InputError, match="has no DTensor placements form"):
            spec.to_placements()


def test_the_books_shardings_in_both_forms():
    mesh = shardmm.Mesh("X=4,Y=2")
    cases = {
        "A[I_X, J]": ("P('X', None)", "[Shard(0), Replicate()]"),
        "A[I_X, J_Y]": ("P('X', 'Y')", "[Shard(0), Shard(1)]"),
        "A[I_XY, J]": ("P(('X', 'Y'), None)", "[Shard(0), Shard(0)]"),
        "C[I, K]{U_X}": ("P(None, None, unreduced={'X'})", "[Partial(), Replicate()]"),
        "A[I, J]": ("P(None, None)", "[Replicate(), Replicate()]"),
    }
    for text, (ps, placements) in cases.items():
        spec = shardmm.Spec.parse(text, mesh)
        assert (spec.to_partition_spec(), spec.to_placements()) == (ps, placements)
        assert shardmm.Spec.parse(f"{spec.tensor}[{', '.join(spec.letters)}] = {ps}", mesh) == spec
    assert str(shardmm.Spec.from_partition_spec("P()", mesh, "I,J")) == "[I, J]"


def test_placement_objects_read_through_their_repr():
    class Shard:
        def __init__(self, dim):
            self.dim = dim

        def __repr__(self):  # as torch.distributed.tensor.Shard prints itself
            return f"Shard(dim={self.dim})"

    class Partial:
        def __repr__(self):
            return "Partial(sum)"

    spec = shardmm.Spec.from_placements([Partial(), Shard(1)], "X=4,Y=2", "C[I, K]")
    assert str(spec) == "C[I, K_Y]{U_X}"


def test_bad_forms_raise_input_error_with_the_commands_message(cli):
    with pytest.raises(shardmm.InputError) as e:
        shardmm.Spec.parse("A[X, Y]", "X=4,Y=2")
    status, out, err = cli("check", "A[X, Y]", "--mesh", "X=4,Y=2")
    assert status == 2 and out == ""
    assert err == "shardmm: error: " + str(e.value) + "\n"
    assert isinstance(e.value, ValueError)
    with pytest.raises(shardmm.InputError, match="unknown mesh axis 'Z'"):
        shardmm.Spec.from_partition_spec("P('Z')", "X=4", "I")
    with pytest.raises(shardmm.InputError, match="one per mesh axis"):
        shardmm.Spec.from_placements("[Shard(0)]", "X=4,Y=2", ["I"])
    with pytest.raises(shardmm.InputError, match="is also a mesh axis"):
        shardmm.Spec.from_partition_spec("P('X')", "X=4", ["X"])
    with pytest.raises(TypeError):
        shardmm.Spec.parse(3, "X=4")
    with pytest.raises(TypeError):
        shardmm.Mesh(4)


def test_visualize_groups_replicas_and_names_partial_sums_and_empty_blocks():
    assert shardmm.visualize("A[I_X, J_Y]", "X=2,Y=2", (4, 4), width=23) == (
        "+----------+----------+\n"
        "|    0     |    1     |\n"
        "+----------+----------+\n"
        "|    2     |    3     |\n"
        "+----------+----------+\n")
    # 10 over X=4 is 3, 3, 2, 2: the columns follow the extents.
    assert shardmm.visualize("A[I_X]", "X=4", (10,), width=25).splitlines()[1] == "|  0   |  1   | 2  | 3  |"
    replicated = shardmm.visualize("A[I, J]", "X=2,Y=4", (3, 3), width=20)
    assert "0-7" in replicated and replicated.count("|") == 2
    partial = shardmm.visualize("C[I_Y, K]{U_X}", "X=2,Y=2", (4, 4), width=20)
    assert "0,2" in partial and "partial sums over X" in partial
    assert "devices 3,5 hold empty blocks" in shardmm.visualize("A[I_XY]", "X=3,Y=2", (4,))
    with pytest.raises(shardmm.InputError, match="1-D and 2-D"):
        shardmm.visualize("A[I, J, K]", "X=2", (2, 2, 2))
    with pytest.raises(shardmm.InputError, match="has 1 dimensions"):
        shardmm.visualize("A[I, J]", "X=2", (2,))
