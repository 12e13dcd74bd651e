"""shardmm: sharded tensors on a named device mesh, in the JAX Scaling Book's notation.

A mesh names its axes (``Mesh("X=4,Y=2")``: 8 devices, numbered row-major, first axis
major, as ``jax.make_mesh`` does). A spec says which mesh axes split which dimension of a
tensor, and over which axes it holds partial sums: ``A[I_X, J_Y]``, ``A[I_XY, J]``,
``C[I, K]{U_X}`` (docs/notation.md). The same sharding can be written as a JAX
PartitionSpec or as PyTorch DTensor placements:

>>> import shardmm
>>> mesh = shardmm.Mesh("X=4,Y=2")
>>> spec = shardmm.Spec.parse("A[I_XY, J]", mesh)
>>> spec.to_partition_spec()
"P(('X', 'Y'), None)"
>>> spec.to_placements()
'[Shard(0), Shard(0)]'
>>> shardmm.Spec.from_partition_spec("P('X', None)", mesh, letters="A[I, J]")
Spec('A[I_X, J]', Mesh('X=4,Y=2'))

``check``, ``plan``, ``reshard``, ``program`` and ``solve`` return objects whose
``to_json()`` is what the ``shardmm`` command prints with ``--json``; ``run`` multiplies numpy arrays on one thread
per device and checks the answer; ``visualize`` draws which devices hold which tile.
Every mistake in the arguments raises ``shardmm.InputError`` (a ``ValueError``) with the
command's message, or ``TypeError`` for an argument of the wrong Python type.
"""

import json as _json
import numbers as _numbers
import os as _os

import numpy as _np

from . import _shardmm as _core

InputError = _core.InputError
InputError.__module__ = "shardmm"
InputError.__doc__ = """A mistake in the input: the message names the offending text and the rule.

The ``shardmm`` command reports the same mistake with the same line and exits 2. It is a
``ValueError``, so ``except ValueError`` catches it too."""
UsageError = _core.UsageError
UsageError.__module__ = "shardmm"
UsageError.__doc__ = """A bug in the code calling shardmm's library, not in the input (a ``RuntimeError``)."""

__all__ = ["InputError", "UsageError", "Mesh", "Spec", "Step", "Candidate", "Check", "Plan", "Reshard", "RunResult", "Program",
           "Solution", "Strategy", "check", "plan", "reshard", "run", "program", "solve", "visualize"]


def _type_name(value):
    return type(value).__name__


# --- arguments: each is turned into the text the command would take --------------------


def _mesh_args(mesh):
    """(the --mesh text, the --split rule): a str mesh splits as 'array'."""
    if type(mesh) is str:
        return mesh, "array"
    if isinstance(mesh, Mesh):
        return str(mesh), mesh.split
    if isinstance(mesh, str):
        return mesh, "array"
    raise TypeError(f"mesh must be a shardmm.Mesh or a str such as 'X=4,Y=2', not {_type_name(mesh)}")


def _mesh(mesh):
    return mesh if isinstance(mesh, Mesh) else Mesh(*_mesh_args(mesh))


def _spec_text(spec, what="spec"):
    if isinstance(spec, Spec):
        return str(spec)
    if isinstance(spec, str):
        return spec
    raise TypeError(f"{what} must be a shardmm.Spec or a str such as 'A[I_X, J]', not {_type_name(spec)}")


def _dims_text(dims):
    """None, 'I=8,J=4' or {'I': 8, 'J': 4} -> the --dims text (None stays None)."""
    if dims is None or isinstance(dims, str):
        return dims
    if not hasattr(dims, "items"):
        raise TypeError(f"dims must be a str such as 'I=8,J=4' or a dict such as {{'I': 8}}, not {_type_name(dims)}")
    parts = []
    for name, size in dims.items():
        if not isinstance(name, str):
            raise TypeError(f"dims: a dimension's name is a str, not {_type_name(name)}")
        if isinstance(size, bool) or not isinstance(size, _numbers.Integral):
            raise TypeError(f"dims: the size of {name} must be an int, not {_type_name(size)}")
        parts.append(f"{name}={int(size)}")
    return ",".join(parts)


_DTYPES = {_np.dtype(_np.float16): "f16", _np.dtype(_np.float32): "f32", _np.dtype(_np.float64): "f64"}


def _dtype_text(dtype):
    """None, 'f32', numpy.float32 or numpy.dtype('float32') -> the --dtype text."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    try:
        as_numpy = _np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a str such as 'f32' or a numpy float type, not {_type_name(dtype)}") from None
    if as_numpy not in _DTYPES:
        raise InputError(f"dtype {as_numpy}: shardmm's element types are bf16, f16, f32 and f64")
    return _DTYPES[as_numpy]


def _optional_text(value, what):
    if value is None or isinstance(value, str):
        return value
    if what == "mem_limit" and isinstance(value, _numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"{what} must be a str, not {_type_name(value)}")


def _tie_margin(value):
    if type(value) is float:  # the common case, without the numbers.Real check's cost
        return value
    if isinstance(value, bool) or not isinstance(value, _numbers.Real):
        raise TypeError(f"tie_margin must be a number, not {_type_name(value)}")
    return float(value)


# --- values ------------------------------------------------------------------------------


class Mesh:
    """A named device mesh: axes with sizes, in order.

    >>> mesh = Mesh("X=4,Y=2")
    >>> mesh.axes
    {'X': 4, 'Y': 2}
    >>> mesh.size
    8
    >>> mesh.devices
    array([[0, 1],
           [2, 3],
           [4, 5],
           [6, 7]])
    >>> mesh.coords(5)
    {'X': 2, 'Y': 1}

    Device ids are row-major over the axes, first axis major (device 5 is x=2, y=1), as
    ``jax.make_mesh`` lays them out; ``devices`` is that layout, as JAX's ``Mesh.devices``.

    ``split`` says how an axis splits a dimension it does not divide, everywhere this mesh is
    used (``check``, ``plan``, ``reshard``, ``run``, ``visualize``; ``shardmm --split``):
    ``'array'`` (the default) as ``numpy.array_split``, the first n mod p blocks one longer
    (10 over 4: 3, 3, 2, 2); ``'chunk'`` as ``torch.chunk``, which is how PyTorch DTensor's
    ``Shard`` places a tensor: blocks of ceil(n/p), the last ones short or empty (10 over 4:
    3, 3, 3, 1).

    >>> Mesh("X=4", split="chunk")
    Mesh('X=4', split='chunk')
    >>> check("A[I_X]", Mesh("X=4", split="chunk"), {"I": 10}).shards[3]["block"]
    [[9, 10]]
    """

    def __init__(self, text, split=None):
        if isinstance(text, Mesh):
            split = text.split if split is None else split
            text = str(text)
        if not isinstance(text, str):
            raise TypeError(f"Mesh takes a str such as 'X=4,Y=2', not {_type_name(text)}")
        split = "array" if split is None else split
        if not isinstance(split, str):
            raise TypeError(f"split must be 'array' or 'chunk', not {_type_name(split)}")
        self._mesh = _core.Mesh(text, split)

    @property
    def axes(self):
        """{name: size}, in the mesh's order."""
        return dict(self._mesh.axes)

    @property
    def split(self):
        """How uneven dimensions split: 'array' (numpy.array_split) or 'chunk' (torch.chunk)."""
        return self._mesh.split

    @property
    def axis_names(self):
        """The axes' names, in order."""
        return tuple(self.axes)

    @property
    def shape(self):
        """{name: size}, as JAX's ``Mesh.shape``."""
        return self.axes

    @property
    def size(self):
        """The number of devices: the product of the sizes."""
        return self._mesh.device_count

    @property
    def devices(self):
        """The device ids laid out on the mesh: an int array of shape (sizes...)."""
        return _np.arange(self.size).reshape(tuple(self.axes.values()))

    def coords(self, device):
        """{axis: coordinate} of ``device``."""
        if isinstance(device, bool) or not isinstance(device, _numbers.Integral):
            raise TypeError(f"device must be an int, not {_type_name(device)}")
        return dict(zip(self.axes, self._mesh.coords(int(device))))

    def __str__(self):
        return str(self._mesh)

    def __repr__(self):
        split = "" if self.split == "array" else f", split={self.split!r}"
        return f"Mesh({str(self)!r}{split})"

    def __eq__(self, other):
        return isinstance(other, Mesh) and self._mesh == other._mesh

    def __hash__(self):
        return hash((str(self), self.split))


def _letters(letters, mesh):
    """(tensor name, [letters]) from 'A[I, J]', 'I,J' or ['I', 'J']."""
    if isinstance(letters, str):
        if "[" in letters:
            spec = _core.Spec.parse(letters, mesh._mesh)
            if any(axes for _, axes in spec.dims) or spec.unreduced:
                raise InputError(f"letters {letters!r}: give the dimensions' letters only, e.g. A[I, J]")
            return spec.tensor, spec.letters
        return "", [part.strip() for part in letters.split(",")]
    if isinstance(letters, (list, tuple)) and all(isinstance(x, str) for x in letters):
        return "", list(letters)
    raise TypeError(f"letters must be a str such as 'A[I, J]' or 'I,J', or a list of str, not {_type_name(letters)}")


def _form_text(form, what):
    # A JAX PartitionSpec or a list of DTensor placements reads as its repr:
    # PartitionSpec('X', None), [Shard(dim=0), Replicate()].
    return form if isinstance(form, str) else repr(form)


class Spec:
    """A tensor's sharding on a mesh, in the Scaling Book's notation.

    >>> mesh = Mesh("X=4,Y=2")
    >>> s = Spec.parse("A[IX, J]", mesh)
    >>> str(s), s.dims
    ('A[I_X, J]', [('I', ['X']), ('J', [])])
    >>> Spec.parse(str(s), mesh) == s
    True
    >>> Spec.from_placements("[Partial(), Shard(1)]", mesh, letters="C[I, K]")
    Spec('C[I, K_Y]{U_X}', Mesh('X=4,Y=2'))

    ``str`` is the canonical form, which parses back to an equal spec; ``repr`` is the
    call that makes it.
    """

    def __init__(self, text, mesh):
        mesh = _mesh(mesh)
        self._spec = _core.Spec.parse(_spec_text(text), mesh._mesh)
        self._mesh_value = mesh

    @classmethod
    def _of(cls, core_spec, mesh):
        spec = cls.__new__(cls)
        spec._spec, spec._mesh_value = core_spec, mesh
        return spec

    @classmethod
    def parse(cls, text, mesh):
        """Reads ``text``: ``A[I_X, J]``, or the letters and a PartitionSpec or placements,
        ``A[I, J] = P('X', None)``, ``A[I, J] = [Shard(0), Replicate()]``."""
        return cls(text, mesh)

    @classmethod
    def from_partition_spec(cls, partition_spec, mesh, letters):
        """The spec of a JAX PartitionSpec: ``"P('X', None)"`` (or a PartitionSpec object,
        read through its repr) on ``mesh``, for a tensor whose dimensions ``letters`` names:
        ``'A[I, J]'``, ``'I,J'`` or ``['I', 'J']``. A tuple entry is major to minor;
        unreduced axes are ``unreduced={'X'}``."""
        mesh = _mesh(mesh)
        name, names = _letters(letters, mesh)
        core = _core.Spec.from_partition_spec(_form_text(partition_spec, "partition_spec"), names, mesh._mesh)
        return cls._of(core.with_name(name) if name else core, mesh)

    @classmethod
    def from_placements(cls, placements, mesh, letters):
        """The spec of DTensor placements, one per mesh axis in mesh order: ``Shard(d)``,
        ``Replicate()``, ``Partial()`` (a string such as ``'[Shard(0), Replicate()]'``, or
        the placement objects, read through their repr). Several ``Shard(d)`` of one
        dimension nest in mesh order: ``[Shard(0), Shard(0)]`` is ``I_XY``. DTensor's
        ``Shard`` splits an uneven dimension as ``torch.chunk`` (10 over 4: 3, 3, 3, 1):
        for the same blocks as DTensor, use a ``Mesh(..., split='chunk')``."""
        mesh = _mesh(mesh)
        name, names = _letters(letters, mesh)
        core = _core.Spec.from_placements(_form_text(placements, "placements"), names, mesh._mesh)
        return cls._of(core.with_name(name) if name else core, mesh)

    def to_partition_spec(self):
        """The JAX PartitionSpec's text: ``P(('X', 'Y'), None)``."""
        return self._spec.to_partition_spec()

    def to_placements(self):
        """DTensor placements' text, ``[Shard(0), Replicate()]``; InputError when a dimension
        is split over axes out of mesh order (``I_YX``), which DTensor cannot express. DTensor
        places uneven blocks as ``torch.chunk`` does: the same blocks as this spec's where
        its mesh has ``split='chunk'`` or the sizes divide evenly."""
        return self._spec.to_placements()

    @property
    def mesh(self):
        return self._mesh_value

    @property
    def tensor(self):
        """The tensor's name ('' when the spec has none)."""
        return self._spec.tensor

    @property
    def letters(self):
        """The dimensions' names, in order."""
        return self._spec.letters

    @property
    def dims(self):
        """[(letter, [mesh axes, major to minor])] per dimension."""
        return [(name, list(axes)) for name, axes in self._spec.dims]

    @property
    def unreduced(self):
        """The axes over which the tensor holds partial sums, in mesh order."""
        return list(self._spec.unreduced)

    def __str__(self):
        return str(self._spec)

    def __repr__(self):
        return f"Spec({str(self)!r}, {self._mesh_value!r})"

    def __eq__(self, other):
        return isinstance(other, Spec) and self._spec == other._spec

    def __hash__(self):
        return hash((str(self), str(self._mesh_value)))


# --- results: the command's JSON documents as objects ----------------------------------


class _Record:
    """A JSON object's keys as attributes (``step.time_s``); ``record["time_s"]`` too."""

    _aliases = {}

    def __init__(self, doc):
        self._doc = doc

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        key = self._aliases.get(name, name)
        try:
            return self._doc[key]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}; its keys: {', '.join(self._doc)}") from None

    def __getitem__(self, key):
        return self._doc[key]

    def keys(self):
        return self._doc.keys()

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._doc) | set(self._aliases))


class Step(_Record):
    """One step of a plan: ``op`` (einsum, all_gather, reduce_scatter, all_reduce,
    all_to_all, ...), ``axes``, ``tensor``, ``from_spec`` -> ``to_spec``, ``bytes_sent`` and
    ``bytes_received`` per device, ``flops``, the predicted ``time_s`` and what ``bound`` s
    it (docs/json-schema.md lists every key)."""

    _aliases = {"from_spec": "from", "to_spec": "to", "from_b_spec": "from_b"}

    def __repr__(self):
        sides = f"{self._doc['from']} @ {self._doc['from_b']}" if self._doc.get("from_b") else self._doc["from"]
        axes = "".join(self._doc["axes"]) or "-"
        return f"<Step {self._doc['op']} over {axes}: {sides} -> {self._doc['to']}, {self._doc['time_s']:.3g} s>"


class Candidate(_Record):
    """A strategy: its ``steps``, ``description``, ``output`` spec and totals
    (``total_time_s``, ``comm_time_s``, ``compute_time_s``, ``peak_bytes_per_device``...)."""

    @property
    def steps(self):
        return [Step(s) for s in self._doc["steps"]]

    def __repr__(self):
        return f"<Candidate {self._doc['description']!r}: {self._doc['total_time_s']:.3g} s>"


class _Document(_Record):
    # Parsed on first use: a caller that only wants to_json() pays nothing for it.
    def __init__(self, text):
        self._text, self._parsed = text, None

    @property
    def _doc(self):
        if self._parsed is None:
            self._parsed = _json.loads(self._text)
        return self._parsed

    def to_json(self):
        """The document ``shardmm ... --json`` prints for the same arguments (without its
        final newline)."""
        text = self._text
        return text.decode() if isinstance(text, bytes) else text


class Check(_Document):
    """A validated spec: ``spec`` (canonical), ``partition_spec``, ``placements``, and with
    dims the ``global_shape`` and every device's ``shards`` (block, local shape, bytes)."""

    def __repr__(self):
        return f"<Check {self._doc['spec']} on {_mesh_from_doc(self._doc)}>"


def _mesh_from_doc(doc):
    return ",".join(f"{k}={v}" for k, v in doc["mesh"].items())


class _Planned(_Document):
    @property
    def candidates(self):
        """Every strategy weighed, cheapest first."""
        return [Candidate(c) for c in self._doc["candidates"]]

    @property
    def chosen(self):
        """The candidate the planner picked."""
        return Candidate(self._doc["candidates"][self._doc["chosen"]])

    @property
    def steps(self):
        """The chosen candidate's steps."""
        return self.chosen.steps

    @property
    def total_time_s(self):
        """The chosen candidate's predicted time."""
        return self.chosen.total_time_s


class Plan(_Planned):
    """A planned contraction: its ``cases`` (the Scaling Book's case per mesh axis),
    ``roles`` of the letters, ``candidates`` and the ``chosen`` one with its ``steps``."""

    def __repr__(self):
        return f"<Plan {self._doc['expr']} on {_mesh_from_doc(self._doc)}: {self.chosen.description}>"


class Reshard(_Planned):
    """A planned reshard: its ``candidates`` and the ``chosen`` one with its ``steps``."""

    def __repr__(self):
        return f"<Reshard {self._doc['expr']} on {_mesh_from_doc(self._doc)}: {self.chosen.description}>"


def _specs_by_tensor(doc):
    return {t["name"]: t["spec"] for t in doc["tensors"]}


class Program(_Document):
    """A whole program's step, costed: ``tensors`` (each with ``name``, ``role``, ``spec``,
    ``how`` it got it, ``shape`` and ``device0_shape``), ``ops`` (each op's ``steps`` forward
    and backward, with the ``reshards`` it needs and why), ``collectives`` per phase,
    ``memory`` per device and ``predicted_time_s`` per phase (docs/json-schema.md lists every
    key). ``specs`` and ``time_s`` are the main figures at hand."""

    @property
    def specs(self):
        """{tensor: spec} of every tensor, as the step shards it."""
        return _specs_by_tensor(self._doc)

    @property
    def time_s(self):
        """The predicted step time, every op serialized."""
        return self._doc["predicted_time_s"]["serialized"]

    @property
    def memory_bytes(self):
        """Per device: params, inputs, gradients, optimizer state and activations, held at once."""
        return self._doc["memory"]["total_bytes"]

    @property
    def peak_bytes(self):
        """Per device: the peak of the step's memory timeline (``memory["timeline"]``), what
        ``solve``'s ``mem_limit`` bounds."""
        return self._doc["memory"]["peak_bytes"]

    def __repr__(self):
        return (f"<Program {self._doc['file']} on {_mesh_from_doc(self._doc)}: {self.time_s:.3g} s, "
                f"{self.memory_bytes} bytes per device>")


class Strategy(_Record):
    """A solver's answer: ``status`` ('optimal', 'feasible', 'local' (a neighbourhood
    search's), 'infeasible'), ``method``, ``time_s`` (its objective), ``memory_bytes`` (the
    step's peak per device), ``lower_bound_s`` (proven: no sharding in its space is faster; a
    search's, the compute bound) and ``specs`` {tensor: spec} of the tensors it chose (the
    three figures None and ``specs`` empty where it found nothing); a named strategy has its
    ``name`` too, and ``why_not`` ('infeasible': why it found nothing; else None)."""

    def __repr__(self):
        name = f"{self._doc['name']}: " if "name" in self._doc else ""
        time = self._doc["time_s"]
        return f"<Strategy {name}{self._doc['status']}" + (f", {time:.3g} s>" if time is not None else ">")


class Solution(_Document):
    """The fastest sharding ``solve`` found: ``status`` ('optimal', or 'feasible' with a
    proven gap; past two mesh axes 'local', a neighbourhood search's local optimum, with
    ``search`` saying how far it got), ``method``, ``objective_s`` and ``lower_bound_s``
    (after a neighbourhood search the compute bound: every device computing an even share,
    nothing communicated), ``specs`` {tensor: spec}
    of every tensor, ``tensors`` (each with how it got its spec), ``predicted`` (the step's
    time and memory as ``program`` costs it), ``named_strategies``, ``alternatives`` (with
    ``explain``), ``top`` (the best distinct shardings), ``unconstrained`` (with a memory
    limit: the fastest without it). ``pinned_program()`` is the program with every spec
    pinned."""

    def __init__(self, text, pinned):
        super().__init__(text)
        self._pinned = pinned

    @property
    def specs(self):
        """{tensor: spec} of every tensor of the answer (chosen, pinned or following from its op)."""
        return _specs_by_tensor(self._doc)

    @property
    def named_strategies(self):
        """The named strategies (fsdp(X), tp(X), dp(X), ...), each solved the same way."""
        return [Strategy(s) for s in self._doc["named_strategies"]]

    @property
    def top(self):
        """The best distinct shardings, the answer first (``top`` of them)."""
        return [Strategy(s) for s in self._doc["top"]]

    def pinned_program(self):
        """The program text with every spec pinned, as ``shardmm solve --emit FILE`` writes it;
        ``program(text=...)`` costs it as this answer. A program file has no split line: a
        chunk mesh's program needs ``split='chunk'`` again."""
        return self._pinned

    def __repr__(self):
        return (f"<Solution {self._doc['file']} on {_mesh_from_doc(self._doc)}: {self._doc['status']}, "
                f"{self._doc['objective_s']:.3g} s>")


class RunResult:
    """What ``run`` returns: ``result`` (the global numpy array), ``shards`` (per device,
    its block of the result, when asked for), ``plan`` (the Plan that ran), and the
    verification against a dense float64 reference: ``verified``, ``max_abs_error``,
    ``tolerance``."""

    def __init__(self, result, shards, plan, verification):
        self.result, self.shards, self.plan = result, shards, plan
        self.verified = verification["verified"]
        self.max_abs_error = verification["max_abs_error"]
        self.max_rel_error = verification["max_rel_error"]
        self.tolerance = verification["tolerance"]
        self.rel_tolerance = verification["rel_tolerance"]

    def __repr__(self):
        return f"<RunResult {self.result.dtype} {self.result.shape}, verified={self.verified}>"


# --- entry points --------------------------------------------------------------------------


def check(spec, mesh, dims=None, dtype=None):
    """Validates ``spec`` on ``mesh``, as ``shardmm check`` does.

    >>> c = check("A[I_XY, J]", "X=3,Y=2", dims={"I": 10, "J": 4})
    >>> c.partition_spec, [s["local_shape"] for s in c.shards][:3]
    ("P(('X', 'Y'), None)", [[2, 4], [2, 4], [2, 4]])

    ``dims``: the sizes, ``'I=10,J=4'`` or ``{'I': 10, 'J': 4}``; without them there are
    no shards. ``dtype``: bf16 (the default), f16, f32 or f64 (a str or numpy type), for
    the bytes. Returns a Check; ``.to_json()`` is ``shardmm check ... --json``.
    """
    return Check(_core.check(_spec_text(spec), *_mesh_args(mesh), _dims_text(dims), _dtype_text(dtype)))


def plan(expr, mesh, dims, dtype=None, hw=None, mem_limit=None, tie_margin=_core.default_tie_margin):
    """Plans the sharded contraction ``expr`` on ``mesh``, as ``shardmm plan`` does.

    >>> p = plan("A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", {"I": 8192, "J": 4096, "K": 16384})
    >>> p.cases[0]["case"], [s.op for s in p.steps]
    (3, ['einsum', 'all_reduce'])

    ``expr``: ``A[...] @ B[...]``, optionally ``-> C[...]`` (each operand may be the letters
    and a PartitionSpec or placements: ``A[I, J] = P(None, 'X')``). ``dims``: every
    letter's size. ``dtype``: bf16 (default), f16, f32, f64. ``hw``: a built-in profile
    (tpu-v5e, h100, ...), 'calibrated' or a profile file; default: this machine's
    calibrated profile if ``shardmm calibrate`` wrote one, else tpu-v5e. ``mem_limit``:
    bytes per device a plan may hold ('16GiB' or an int). ``tie_margin``: plans this
    fraction from the cheapest tie, and the one that synchronizes least wins.

    Returns a Plan: ``cases``, ``candidates``, ``chosen``, ``steps`` (each with op, axes,
    bytes and predicted time) and ``total_time_s``; ``.to_json()`` is ``shardmm plan ...
    --json`` for the same arguments.
    """
    return Plan(_core.plan(_spec_text(expr, "expr"), *_mesh_args(mesh), _required_dims(dims), _dtype_text(dtype),
                           _optional_text(hw, "hw"), _optional_text(mem_limit, "mem_limit"), _tie_margin(tie_margin)))


def reshard(src, dst, mesh, dims, dtype=None, hw=None, mem_limit=None, tie_margin=_core.default_tie_margin):
    """Plans moving one tensor from sharding ``src`` to ``dst``, as ``shardmm reshard`` does.

    >>> r = reshard("A[I, J_X]", "A[I_X, J]", "X=4", {"I": 8192, "J": 4096})
    >>> [s.op for s in r.steps]
    ['all_to_all']

    Arguments as for ``plan``. Returns a Reshard; ``.to_json()`` is ``shardmm reshard ...
    --json``.
    """
    return Reshard(_core.reshard(_spec_text(src, "src"), _spec_text(dst, "dst"), *_mesh_args(mesh),
                                 _required_dims(dims), _dtype_text(dtype), _optional_text(hw, "hw"),
                                 _optional_text(mem_limit, "mem_limit"), _tie_margin(tie_margin)))


def _required_dims(dims):
    text = _dims_text(dims)
    if text is None:
        raise TypeError("dims is required: every letter's size, e.g. {'I': 8192, 'J': 4096}")
    return text


def _operand(array, name, dtype):
    """``array`` as a C-contiguous array of ``dtype``: as it is when it already is one (no
    copy), else converted once (a copy)."""
    if array is None:
        raise TypeError(f"{name} is required: the global array of operand {name.upper()}")
    if not isinstance(array, _np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {_type_name(array)}")
    if array.dtype == dtype and array.flags.c_contiguous:
        return array
    if array.dtype.kind not in "biuf":
        raise InputError(f"{name} holds {array.dtype}; shardmm multiplies real numbers (f32 or f64)")
    return _np.ascontiguousarray(array, dtype=dtype)


def run(expr, mesh, dims=None, *, a, b, dtype=None, return_shards=False, verify=True, hw=None):
    """Runs the sharded contraction ``expr`` on numpy arrays, one thread per device.

    >>> import numpy as np
    >>> a = np.arange(12, dtype=np.float64).reshape(4, 3)
    >>> b = np.ones((3, 2))
    >>> r = run("A[I_X, J] @ B[J, K] -> C[I_X, K]", "X=2", a=a, b=b)
    >>> bool((r.result == a @ b).all()), r.verified
    (True, True)

    ``mesh``: a Mesh, whose ``split`` says where uneven blocks lie (``Mesh('X=4',
    split='chunk')`` for torch.chunk's, as DTensor's Shard), or a str (split 'array').
    ``a`` and ``b`` are the GLOBAL arrays, shaped as the letters say (``dims``, optional,
    must agree; without it the arrays' shapes give the sizes). Each device's thread copies
    its own block out of them (the scatter: no other copy is made; an operand replicated
    over an axis is held whole by each of its devices, as that layout says), the plan that
    ``shardmm run`` chooses for the same arguments (predicted for h100, or for this
    machine's calibrated profile; ``hw`` names another) runs on those blocks, and every
    device writes its block of the result straight into ``result`` (partial sums are added
    there in device order). The GIL is released while the devices run (and Ctrl-C waits
    for them).

    ``dtype``: 'f32' or 'f64' (or numpy's float32/float64); by default the arrays' own,
    which must then be float32 or float64 and the same for both. An array of another
    dtype, or one that is not C-contiguous, is converted first: one copy of it.
    ``return_shards``: also return each device's block of the result (``shards[d]``).
    ``verify``: check the result against a dense float64 reference of the same inputs, as
    ``shardmm run`` does (tolerance from the contracted length); a mismatch raises
    RuntimeError. The reference is the one other copy: device 0 builds float64 copies of
    ``a``, ``b`` and the expected product, and gathers the result's blocks to compare.
    ``verify=False`` skips it, leaving the scatter the only copy of the inputs.

    Returns a RunResult: ``result``, ``shards``, ``plan``, ``verified``, ``max_abs_error``.
    """
    if dtype is None:
        kinds = {x.dtype for x in (a, b) if isinstance(x, _np.ndarray)}
        if len(kinds) == 2:
            raise InputError(f"a is {a.dtype} and b is {b.dtype}: pass dtype='f32' or dtype='f64' to convert them")
        dtype = next(iter(kinds), None)
        if dtype is not None and dtype not in (_np.float32, _np.float64):
            raise InputError(f"the arrays hold {dtype}; pass dtype='f32' or dtype='f64' to convert them (a copy)")
    dtype_text = _dtype_text(dtype) if dtype is not None else "f64"
    if dtype_text not in ("f32", "f64"):
        raise InputError(f"cannot run in {dtype_text}: execution computes in f32 or f64")
    np_dtype = _np.float32 if dtype_text == "f32" else _np.float64
    a, b = _operand(a, "a", np_dtype), _operand(b, "b", np_dtype)
    if not isinstance(return_shards, bool) or not isinstance(verify, bool):
        raise TypeError("return_shards and verify are True or False")
    result, shards, plan_doc, _, verification = _core.run(
        _spec_text(expr, "expr"), *_mesh_args(mesh), _dims_text(dims), a, b, dtype_text, return_shards, verify,
        _optional_text(hw, "hw"))
    if verify and not verification["verified"]:
        raise RuntimeError("the result does not match the dense reference (max abs error "
                           f"{verification['max_abs_error']:.3g}, tolerance {verification['tolerance']:.3g}"
                           f"{'; ' + verification['detail'] if verification['detail'] else ''})")
    return RunResult(result, shards, Plan(plan_doc), verification)

# --- programs ----------------------------------------------------------------------------


def _program_input(source, text, mesh, dims, pins, pins_name, train, optimizer, dtype, hw, split, run, rings):
    """The ProgramInput of ``shardmm program``/``solve``'s FILE and flags."""
    if text is not None:
        if source is not None:
            raise TypeError("give the program as a path or as text=, not both")
        if not isinstance(text, str):
            raise TypeError(f"text must be a str (the program itself), not {_type_name(text)}")
        file = "<program>"
    else:
        if source is None:
            raise TypeError("give the program: a .prog file's path, or the program itself as text=...")
        if not isinstance(source, (str, _os.PathLike)):
            raise TypeError(f"source must be a path (str or os.PathLike) of a .prog file, not {_type_name(source)}")
        file = _os.fspath(source)
        if not isinstance(file, str):
            raise TypeError(f"source must be a str path, not {_type_name(file)}")
    mesh_text = None
    if mesh is not None:
        mesh_text, mesh_split = _mesh_args(mesh)
        if isinstance(mesh, Mesh):
            if split is not None and split != mesh_split:
                raise InputError(f"split={split!r} contradicts {mesh!r}; give one of them")
            split = mesh_split
    if split is None:
        split = "array"
    if not isinstance(split, str):
        raise TypeError(f"split must be 'array' or 'chunk', not {_type_name(split)}")
    if pins is None:
        pins = {}
    if not hasattr(pins, "items"):
        raise TypeError(f"{pins_name} must be a dict such as {{'w_in': 'w_in[D, F_X]'}}, not {_type_name(pins)}")
    pin_list = []
    for name, spec in pins.items():
        if not isinstance(name, str):
            raise TypeError(f"{pins_name}: a tensor's name is a str, not {_type_name(name)}")
        pin_list.append(f"{name}={_spec_text(spec, f'{pins_name}[{name!r}]')}")
    if train is not None and not isinstance(train, bool):
        raise TypeError(f"train must be True (a training step), False (inference) or None (training when the "
                        f"program has a loss), not {_type_name(train)}")
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be 'sgd' or 'adam', not {_type_name(optimizer)}")
    if not isinstance(run, bool):
        raise TypeError(f"run must be True or False, not {_type_name(run)}")
    if not isinstance(rings, bool):
        raise TypeError(f"rings must be True or False, not {_type_name(rings)}")
    return _core.ProgramInput(file, text, mesh_text, split, _dims_text(dims), pin_list, train, optimizer,
                              _dtype_text(dtype), _optional_text(hw, "hw"), run, rings)


def _verified(document):
    """``document``, once its step (run=True) matched the dense reference."""
    step = document._doc["run"]
    if step is not None and not step["verified"]:
        raise RuntimeError(f"the step does not match the dense reference (max abs error {step['max_abs_error']:.3g}, "
                           f"tolerance {step['tolerance']:.3g}; {step['detail']})")
    return document


def program(source=None, mesh=None, dims=None, specs=None, train=None, optimizer="sgd", dtype=None, hw=None,
            split=None, run=False, *, text=None, rings=False):
    """Costs one step of a whole program (docs/programs.md), as ``shardmm program`` does.

    >>> p = program(text='''
    ... mesh   X=2
    ... dims   N=8, D=16, F=32
    ... input  x[N, D]
    ... param  a[D, F]  : a[D, F_X]
    ... param  b[F, D]  : b[F_X, D]
    ... h[N, F] = x @ a
    ... y[N, D] = relu(h) @ b  : y[N, D]
    ... loss sum(y)
    ... ''')
    >>> p.specs["y"], [(c["phase"], c["op"]) for c in p.collectives]
    ('y[N, D]', [('forward', 'all_reduce'), ('backward', 'all_reduce')])

    ``source``: the path of a ``.prog`` file (a str or ``os.PathLike``); or give the program
    itself as ``text=`` (then its messages call it ``<program>``). ``mesh`` (a Mesh or 'X=4')
    replaces the file's mesh line; ``split`` ('array' or 'chunk') is how its axes split
    uneven letters (a Mesh brings its own). ``dims`` ('B=4,T=16' or a dict) replaces those
    letters' sizes. ``specs`` pins tensors, replacing the file's pins: ``{'w_in':
    'w_in[D, F_X]'}`` (a str or Spec each). ``train``: True for a training step (forward,
    backward and the ``optimizer``'s update: 'sgd' or 'adam'), False for inference, None
    (default) for training when the program has a loss. ``dtype``: bf16 (default), f16, f32,
    f64. ``hw``: a profile (h100 by default, or this machine's calibrated one). ``run``: also
    execute the step on one thread per device, in f64 unless ``dtype`` is f32, and check every
    computed tensor, gradient and updated param against the dense f64 step (small ``dims``):
    ``.run['verified']``, ``.run['max_abs_error']``; a mismatch raises RuntimeError.
    ``rings``: einsums may run as collective matmul rings where a ring's backward costs what the
    unfused pair's does (``--rings``, docs/programs.md).

    Returns a Program: ``specs`` {tensor: spec}, ``tensors``, ``ops``, ``collectives``,
    ``memory``, ``time_s``; ``.to_json()`` is ``shardmm program FILE ... --json``.
    """
    return _verified(Program(_core.program(_program_input(source, text, mesh, dims, specs, "specs", train, optimizer,
                                                          dtype, hw, split, run, rings))))


def solve(source=None, mesh=None, dims=None, pins=None, mem_limit=None, train=None, optimizer="sgd", top=1,
          explain=False, dtype=None, hw=None, split=None, time_limit=60, run=False, *, text=None, rings=False,
          search="auto"):
    """Finds the fastest sharding of a whole program within a memory limit, as ``shardmm
    solve`` does (docs/solve.md), and says whether it is proven optimal.

    >>> s = solve(text='''
    ... mesh   X=4
    ... dims   B=8, T=1024, D=4096, F=16384
    ... input  x[B, T, D]
    ... param  w_in[D, F]
    ... param  w_out[F, D]
    ... u[B, T, F] = x @ w_in
    ... y[B, T, D] = gelu(u) @ w_out
    ... loss sum(y)
    ... ''', pins={"x": "x[B, T, D]"})
    >>> s.status, s.specs["w_in"], s.specs["w_out"]
    ('optimal', 'w_in[D, F_X]', 'w_out[F_X, D]')
    >>> [(n.name, n.status) for n in s.named_strategies]  # x pinned replicated: no data parallelism
    [('tp(X)', 'optimal'), ('dp(X)', 'infeasible'), ('fsdp(X)', 'infeasible'), ('sp(X)', 'infeasible')]
    >>> s.named_strategies[1].why_not
    "contradicts x's pin x[B, T, D] (dp on X)"
    >>> print(s.pinned_program().splitlines()[4])
    param w_out[F, D] : w_out[F_X, D]

    Arguments as for ``program`` (``pins`` is its ``specs``: the tensors whose sharding is
    fixed), and: ``mem_limit``, the memory per device the step may use ('16GiB', '512MiB' or
    an int of bytes; InputError when no sharding fits); ``top``, also list the K best distinct
    shardings (1 to 100); ``explain``, each chosen tensor's runner-up layout and what it would
    add; ``time_limit``, the whole solve's time limit in seconds: building the problem (on up
    to two axes a search that cannot finish in it raises InputError at once; past two the
    neighbourhood search answers with the best it found), then each integer program with what
    is left (past it the answer is 'feasible' with its proven gap); ``run``, execute the
    answer and check it; ``rings``, as ``program``'s; ``search``, 'auto' (the whole space where it can be built, else
    by neighbourhoods: status 'local'), 'whole' (the proven optimum, or InputError when the space
    cannot be built in time) or 'neighbourhoods' (``--search``, docs/solve.md). The GIL is
    released while the solver runs.

    Returns a Solution: ``status``, ``method``, ``objective_s``, ``lower_bound_s``, ``specs``,
    ``named_strategies``, ``alternatives``, ``top`` and ``pinned_program()`` (what ``--emit``
    writes); ``.to_json()`` is ``shardmm solve FILE ... --json`` (but ``solve_seconds`` and
    ``search``'s seconds, the times the solver took).
    """
    if isinstance(top, bool) or not isinstance(top, _numbers.Integral):
        raise TypeError(f"top must be an int, not {_type_name(top)}")
    if not isinstance(explain, bool):
        raise TypeError(f"explain must be True or False, not {_type_name(explain)}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, _numbers.Real):
        raise TypeError(f"time_limit must be a number, not {_type_name(time_limit)}")
    if not isinstance(search, str):
        raise TypeError(f"search must be a str, not {_type_name(search)}")
    if not -2**31 <= top < 2**31:
        raise InputError(f"top {top}: lists 1 to 100 shardings, e.g. top 3")
    doc, pinned = _core.solve(
        _program_input(source, text, mesh, dims, pins, "pins", train, optimizer, dtype, hw, split, run, rings),
        _optional_text(mem_limit, "mem_limit"), int(top), explain, float(time_limit), search)
    return _verified(Solution(doc, pinned))



def _device_list(devices):
    """[0, 1, 2, 3, 6, 7] -> '0-3,6,7': runs of three or more as ranges."""
    parts, start = [], None
    for i, d in enumerate(devices):
        if start is None:
            start = d
        if i + 1 == len(devices) or devices[i + 1] != d + 1:
            parts += [f"{start}-{d}"] if d - start >= 2 else [str(x) for x in range(start, d + 1)]
            start = None
    return ",".join(parts)


def visualize(spec, mesh, shape, width=60):
    """The tiles of a 1-D or 2-D array sharded by ``spec``, with the devices that hold each,
    as ``jax.debug.visualize_array_sharding`` draws them (in plain text):

    >>> print(visualize("A[I_X, J]", "X=2,Y=2", (4, 6), width=24))
    +----------------------+
    |         0,1          |
    +----------------------+
    |         2,3          |
    +----------------------+
    <BLANKLINE>

    A tile's devices are its replicas (``0,1``: devices 0 and 1 hold copies; ``0-3``:
    devices 0 to 3). Column widths follow the tiles' extents (``width`` columns in all, or
    wider where a label needs it). Partial sums and empty blocks get a line below.
    """
    spec_text, mesh = _spec_text(spec), _mesh(mesh)
    parsed = Spec(spec_text, mesh)
    if isinstance(shape, _numbers.Integral):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(n, _numbers.Integral) for n in shape):
        raise TypeError(f"shape must be a tuple of ints, not {_type_name(shape)}")
    if isinstance(width, bool) or not isinstance(width, _numbers.Integral):
        raise TypeError(f"width must be an int, not {_type_name(width)}")
    letters = parsed.letters
    if len(letters) not in (1, 2):
        raise InputError(f"visualize draws 1-D and 2-D arrays; {parsed} has {len(letters)} dimensions")
    if len(shape) != len(letters):
        raise InputError(f"shape {tuple(shape)} has {len(shape)} dimensions but {parsed} has {len(letters)}")
    doc = check(spec_text, mesh, dict(zip(letters, shape)))
    tiles, empty = {}, []
    for shard in doc.shards:
        block = tuple(tuple(r) for r in shard["block"])
        if any(end == begin for begin, end in block):
            empty.append(shard["device"])
        else:
            tiles.setdefault(block, []).append(shard["device"])
    if len(letters) == 1:
        tiles = {(((0, 1),) + block): devices for block, devices in tiles.items()}
        shape = (1,) + tuple(shape)
    rows = sorted({block[0] for block in tiles})
    cols = sorted({block[1] for block in tiles})
    labels = {block: _device_list(sorted(devices)) for block, devices in tiles.items()}
    col_width = []
    for col in cols:
        need = max(len(labels[block]) for block in tiles if block[1] == col) + 2
        col_width.append(max(need, round((col[1] - col[0]) / shape[1] * (width - len(cols) - 1))))
    rule = "+" + "+".join("-" * w for w in col_width) + "+"
    lines = [rule]
    for row in rows:
        lines.append("|" + "|".join(labels.get((row, col), "").center(w) for col, w in zip(cols, col_width)) + "|")
        lines.append(rule)
    if parsed.unreduced:
        lines.append(f"partial sums over {','.join(parsed.unreduced)}: a tile is the sum of what its devices hold")
    if empty:
        lines.append(f"devices {_device_list(sorted(empty))} hold empty blocks")
    return "\n".join(lines) + "\n"
