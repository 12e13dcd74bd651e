// shardmm._shardmm: the C++ half of `import shardmm`. It makes the same library calls as
// the CLI, through the CLI's own functions (src/cli), so that a document here is the one
// `shardmm ... --json` prints. shardmm/__init__.py turns the documents into objects and
// checks Python arguments before they reach this module.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "cli/check.h"
#include "cli/common.h"
#include "cli/program_common.h"
#include "cli/report.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/interop.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/kernels.h"
#include "shardmm/runtime/verify.h"

namespace py = pybind11;

namespace shardmm {
namespace {

// A spec with the mesh it was read on: printing and converting need both.
struct PySpec {
  Spec spec;
  Mesh mesh;
};

std::vector<std::string> letters_of(const Spec& s) {
  std::vector<std::string> out;
  for (const DimSpec& d : s.dims) out.push_back(d.name);
  return out;
}

cli::Planning planning(const std::string& mesh, const std::string& split, const std::optional<std::string>& dims,
                       const std::optional<std::string>& dtype, const std::optional<std::string>& hw,
                       const std::optional<std::string>& mem_limit, double tie_margin, const char* fallback_hw) {
  cli::PlanningFlags flags;
  flags.mesh = mesh;
  flags.split = split;
  flags.dims = dims;
  flags.dtype = dtype;
  flags.hw = hw;
  flags.mem_limit = mem_limit;
  flags.tie_margin = tie_margin;
  flags.fallback_hw = fallback_hw;
  return cli::make_planning(flags);
}

// --- program, solve ---

// The flags `shardmm program FILE` and `shardmm solve FILE` take, from the package's
// arguments (already text): `file` a path, or with `text` the name the program goes by.
// train: unset as neither --train nor --infer, true as --train, false as --infer. run: --run on
// the threads backend. rings: --rings.
cli::ProgramInput program_input(const std::string& file, const std::optional<std::string>& text,
                                const std::optional<std::string>& mesh, const std::string& split,
                                const std::optional<std::string>& dims, const std::vector<std::string>& pins,
                                std::optional<bool> train, const std::string& optimizer,
                                const std::optional<std::string>& dtype, const std::optional<std::string>& hw,
                                bool run, bool rings) {
  cli::ProgramInput in;
  in.file = file;
  in.text = text;
  in.mesh = mesh;
  in.pins = pins;
  in.common.split = split;
  in.common.dims = dims;
  in.common.dtype = dtype;
  in.common.hw = hw;
  in.train = train.value_or(false);
  in.infer = !train.value_or(true);
  in.optimizer = optimizer;
  in.run = run;
  in.rings = rings;
  return in;
}

// --- run ---

bool holds(const py::array& a, DType dtype) {
  return dtype == DType::f32 ? py::isinstance<py::array_t<float>>(a) : py::isinstance<py::array_t<double>>(a);
}

Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// The sizes the arrays' shapes give their letters ("I=8,J=4"), for parse_dims to judge.
std::string dims_from_arrays(const Contraction& c, const py::array& a, const py::array& b) {
  std::map<std::string, std::int64_t> sizes;
  std::vector<std::string> order;
  for (const auto& [spec, arr, name] : {std::tuple{&c.a, &a, "a"}, std::tuple{&c.b, &b, "b"}}) {
    if (arr->ndim() != spec->rank()) {
      throw InputError(std::string(name) + " has " + std::to_string(arr->ndim()) + " dimensions, shape " +
                       shape_text(shape_of(*arr)) + ", but " + spec->tensor + " has " + std::to_string(spec->rank()) +
                       "; give an array with one dimension per letter");
    }
    for (int d = 0; d < spec->rank(); ++d) {
      const std::string& letter = spec->dims[static_cast<std::size_t>(d)].name;
      const std::int64_t n = arr->shape(d);
      if (sizes.count(letter) && sizes[letter] != n) {
        throw InputError("dimension " + letter + " is " + std::to_string(sizes[letter]) + " long in a but " +
                         std::to_string(n) + " in b; a letter has one size");
      }
      if (!sizes.count(letter)) order.push_back(letter);
      sizes[letter] = n;
    }
  }
  std::string text;
  for (const std::string& l : order) text += (text.empty() ? "" : ",") + l + "=" + std::to_string(sizes[l]);
  return text;
}

// Element i of a row-major array as an operand's value: the whole value at unreduced
// member 0 (DistTensor::from_global puts it there and zeros elsewhere).
template <class T>
DistTensor::Generator reader(const py::array& a, const Shape& shape) {
  const T* data = static_cast<const T*>(a.data());
  Shape strides(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) strides[k - 1] = strides[k] * shape[k];
  return [data, strides](const Index& i, std::int64_t member) {
    if (member != 0) return 0.0;
    std::int64_t at = 0;
    for (std::size_t k = 0; k < i.size(); ++k) at += i[k] * strides[k];
    return static_cast<double>(data[at]);
  };
}

// Writes the logical result into `out` from every rank's shard: each block once, by the
// member at coordinate 0 of every axis the spec leaves replicated; partial sums over the
// unreduced axes added in group-rank order (as gather_global sums them), one member a turn.
template <class T>
void write_result(Communicator& comm, const DistTensor& shard, T* out) {
  const Mesh& mesh = comm.mesh();
  const Spec& spec = shard.spec();
  const std::int64_t me = comm.rank();
  bool writer = true;
  for (int a = 0; a < mesh.rank(); ++a) writer = writer && (spec.uses(a) || mesh.coord(me, a) == 0);
  Shape offset;
  for (const Range& r : shard.box()) offset.push_back(r.offset);
  const std::int64_t members = mesh.group_size(spec.unreduced), my_turn = mesh.group_rank(me, spec.unreduced);
  for (std::int64_t turn = 0; turn < members; ++turn) {
    if (writer && turn == my_turn) {
      const Shape zero(offset.size(), 0);
      const Shape& local = shard.local_shape();
      if (turn == 0) {
        copy_box(shard.buffer().as<T>(), local, zero, out, shard.global_shape(), offset, local);
      } else {
        add_box(shard.buffer().as<T>(), local, zero, out, shard.global_shape(), offset, local);
      }
    }
    if (members > 1) comm.barrier();
  }
}

py::tuple run(const std::string& expr, const std::string& mesh_text, const std::string& split,
              const std::optional<std::string>& dims_given, const py::array& a, const py::array& b,
              const std::string& dtype_text, bool return_shards, bool verify, const std::optional<std::string>& hw) {
  const Mesh mesh = cli::parse_mesh(mesh_text, split);
  const Contraction c = parse_contraction(expr, mesh);
  const std::string dims = dims_given ? *dims_given : dims_from_arrays(c, a, b);
  // As `shardmm run`: predictions for h100 unless this machine is calibrated.
  const cli::Planning p =
      planning(mesh_text, split, dims, dtype_text, hw, std::nullopt, PlanOptions{}.tie_margin, "h100");
  cli::check_backend("threads", p.mesh);
  const DType dtype = p.options.dtype;
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw InputError(std::string("cannot run in ") + to_string(dtype) + ": execution computes in f32 or f64");
  }
  const MatmulPlanning m = cli::plan_contraction(p, c);
  const Plan& plan = m.candidates[static_cast<std::size_t>(m.chosen)];
  const Shape a_shape = global_shape(c.a, p.sizes), b_shape = global_shape(c.b, p.sizes);
  for (const auto& [arr, shape, spec, name] :
       {std::tuple{&a, a_shape, &c.a, "a"}, std::tuple{&b, b_shape, &c.b, "b"}}) {
    if (shape_of(*arr) != shape) {
      throw InputError(std::string(name) + " has shape " + shape_text(shape_of(*arr)) + " but " +
                       format_spec(*spec, mesh) + " is " + shape_text(shape) + " under " + field("dims") + " " + dims);
    }
    // __init__.py converts; this guards the raw pointers below.
    if (!holds(*arr, dtype) || !(arr->flags() & py::array::c_style)) {
      throw py::type_error(std::string(name) + " must be a C-contiguous " + to_string(dtype) + " array here");
    }
  }
  const Shape out_shape = global_shape(plan.output, p.sizes);
  const auto empty_array = [dtype](const Shape& shape) {
    return dtype == DType::f32 ? py::array(py::array_t<float>(shape)) : py::array(py::array_t<double>(shape));
  };
  py::array result = empty_array(out_shape);
  std::vector<py::array> shards;
  std::vector<void*> shard_data;
  std::vector<std::size_t> shard_bytes;
  if (return_shards) {
    for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
      const Shape local = local_shape(mesh, plan.output, out_shape, d);
      shards.push_back(empty_array(local));
      shard_data.push_back(shards.back().mutable_data());
      shard_bytes.push_back(static_cast<std::size_t>(shards.back().nbytes()));
    }
  }
  void* out = result.mutable_data();
  const void* a_data = a.data();
  const void* b_data = b.data();
  const auto a_values = dtype == DType::f32 ? reader<float>(a, a_shape) : reader<double>(a, a_shape);
  const auto b_values = dtype == DType::f32 ? reader<float>(b, b_shape) : reader<double>(b, b_shape);
  Verification v;
  v.verified = true;
  {
    // The ranks read the caller's arrays and write the result's: nothing here touches a
    // Python object, so other Python threads run meanwhile.
    py::gil_scoped_release released;
    std::mutex root;
    run_backend("threads", mesh, [&](Communicator& comm) {
      const std::int64_t me = comm.rank();
      // Each rank copies its own block out of the global array (the scatter): the only copy
      // of the inputs.
      const DistTensor ta = DistTensor::from_global(mesh, me, c.a, a_shape, dtype, a_data);
      const DistTensor tb = DistTensor::from_global(mesh, me, c.b, b_shape, dtype, b_data);
      Executor exec(comm, plan, p.sizes, dtype);
      const DistTensor& r = exec.run(ta, &tb);
      if (dtype == DType::f32) {
        write_result(comm, r, static_cast<float*>(out));
      } else {
        write_result(comm, r, static_cast<double*>(out));
      }
      if (return_shards) {
        const auto i = static_cast<std::size_t>(me);
        std::memcpy(shard_data[i], r.data(), shard_bytes[i]);
      }
      if (verify) {
        const Verification mine = verify_contraction(comm, c, p.sizes, dtype, r, a_values, b_values);
        if (me == 0) {
          std::lock_guard lock(root);
          v = mine;
        }
      }
    });
  }
  const std::string plan_doc = cli::matmul_json(p, c, m).dump(2);
  py::dict verification;
  verification["verified"] = v.verified;
  verification["max_abs_error"] = v.max_abs_error;
  verification["max_rel_error"] = v.max_rel_error;
  verification["tolerance"] = v.tolerance;
  verification["rel_tolerance"] = v.rel_tolerance;
  verification["detail"] = v.detail;
  verification["checked"] = verify;
  return py::make_tuple(result, return_shards ? py::object(py::cast(shards)) : py::object(py::none()), plan_doc,
                        m.chosen, verification);
}

}  // namespace
}  // namespace shardmm

PYBIND11_MODULE(_shardmm, m) {
  using namespace shardmm;
  m.doc() = "The compiled half of shardmm; use the `shardmm` package, which wraps it.";
  // The CLI's exit 2: a user's mistake, with the CLI's one-line message (and the caret
  // lines, when the text has them).
  py::register_exception<InputError>(m, "InputError", PyExc_ValueError);
  // A bug in the caller (here: in the wrapper), never the user's input.
  py::register_exception<UsageError>(m, "UsageError", PyExc_RuntimeError);

  py::class_<Mesh>(m, "Mesh")
      .def(py::init([](const std::string& text, const std::string& split) { return cli::parse_mesh(text, split); }),
           py::arg("text"), py::arg("split") = "array")
      .def_property_readonly("split", [](const Mesh& mesh) { return std::string(to_string(mesh.split_rule())); })
      .def_property_readonly("axes",
                             [](const Mesh& mesh) {
                               std::vector<std::pair<std::string, std::int64_t>> out;
                               for (const MeshAxis& a : mesh.axes()) out.emplace_back(a.name, a.size);
                               return out;
                             })
      .def_property_readonly("device_count", &Mesh::device_count)
      .def("coords",
           [](const Mesh& mesh, std::int64_t device) {
             if (device < 0 || device >= mesh.device_count()) {
               throw InputError("device " + std::to_string(device) + " is not on mesh " + mesh.to_string() + " (0 to " +
                                std::to_string(mesh.device_count() - 1) + ")");
             }
             return mesh.coords(device);
           })
      .def("__str__", &Mesh::to_string)
      .def("__eq__", [](const Mesh& x, const Mesh& y) { return x == y; })
      .def("__hash__", [](const Mesh& x) {
        return py::hash(py::make_tuple(x.to_string(), std::string(to_string(x.split_rule()))));
      });

  py::class_<PySpec>(m, "Spec")
      .def_static("parse",
                  [](const std::string& text, const Mesh& mesh) {
                    return PySpec{parse_spec(text, mesh), mesh};
                  })
      .def_static("from_partition_spec",
                  [](const std::string& text, const std::vector<std::string>& letters, const Mesh& mesh) {
                    return PySpec{from_partition_spec(text, letters, mesh), mesh};
                  })
      .def_static("from_placements",
                  [](const std::string& text, const std::vector<std::string>& letters, const Mesh& mesh) {
                    return PySpec{from_placements(text, letters, mesh), mesh};
                  })
      .def("to_partition_spec", [](const PySpec& s) { return to_partition_spec(s.spec, s.mesh); })
      .def("to_placements", [](const PySpec& s) { return to_placements(s.spec, s.mesh); })
      .def("placements_problem", [](const PySpec& s) { return placements_problem(s.spec, s.mesh); })
      .def("with_name",
           [](const PySpec& s, const std::string& name) {
             PySpec out = s;
             out.spec.tensor = name;
             // The name's rules are the parser's.
             return PySpec{parse_spec(format_spec(out.spec, s.mesh), s.mesh), s.mesh};
           })
      .def_property_readonly("mesh", [](const PySpec& s) { return s.mesh; })
      .def_property_readonly("tensor", [](const PySpec& s) { return s.spec.tensor; })
      .def_property_readonly("letters", [](const PySpec& s) { return letters_of(s.spec); })
      .def_property_readonly("dims",
                             [](const PySpec& s) {
                               std::vector<std::pair<std::string, std::vector<std::string>>> out;
                               for (const DimSpec& d : s.spec.dims) {
                                 std::vector<std::string> axes;
                                 for (int a : d.axes) axes.push_back(s.mesh.axis(a).name);
                                 out.emplace_back(d.name, axes);
                               }
                               return out;
                             })
      .def_property_readonly("unreduced",
                             [](const PySpec& s) {
                               std::vector<std::string> out;
                               for (int a : s.spec.unreduced) out.push_back(s.mesh.axis(a).name);
                               return out;
                             })
      .def("__str__", [](const PySpec& s) { return format_spec(s.spec, s.mesh); })
      .def("__eq__", [](const PySpec& x, const PySpec& y) {
        return x.mesh == y.mesh && x.spec == y.spec && x.spec.tensor == y.spec.tensor;
      });

  m.def("check", [](const std::string& spec, const std::string& mesh, const std::string& split,
                    const std::optional<std::string>& dims, const std::optional<std::string>& dtype) {
    return cli::check_json(cli::check_spec({spec, mesh, dims, dtype, split})).dump(2);
  });
  const auto plan = [](const std::string& expr, const std::string& mesh, const std::string& split,
                       const std::string& dims, const std::optional<std::string>& dtype,
                       const std::optional<std::string>& hw, const std::optional<std::string>& mem_limit,
                       double tie_margin) {
    const cli::Planning p = planning(mesh, split, dims, dtype, hw, mem_limit, tie_margin, nullptr);
    const Contraction c = parse_contraction(expr, p.mesh);
    // bytes, not str: a caller that reads a figure parses it (json takes bytes) and only
    // to_json() decodes it, so a plan call pays for no UTF-8 check of the whole document.
    return py::bytes(cli::matmul_json(p, c, cli::plan_contraction(p, c)).dump(2));
  };
  m.def("plan", plan);
  // bench/python_plan_overhead.py: the seconds each of `calls` plans takes in C++ alone, to
  // set against the same call made from Python.
  m.def("_plan_seconds", [plan](const std::string& expr, const std::string& mesh, const std::string& dims, int calls) {
    std::vector<double> seconds;
    for (int i = 0; i < calls; ++i) {
      const auto start = std::chrono::steady_clock::now();
      plan(expr, mesh, "array", dims, std::nullopt, std::nullopt, std::nullopt, PlanOptions{}.tie_margin);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return seconds;
  });
  m.def("reshard",
        [](const std::string& src, const std::string& dst, const std::string& mesh, const std::string& split,
           const std::string& dims, const std::optional<std::string>& dtype, const std::optional<std::string>& hw,
           const std::optional<std::string>& mem_limit, double tie_margin) {
          const cli::Planning p = planning(mesh, split, dims, dtype, hw, mem_limit, tie_margin, nullptr);
          const cli::Reshard r = cli::plan_reshard_specs(p, parse_spec(src, p.mesh), parse_spec(dst, p.mesh));
          return cli::reshard_json(p, r).dump(2);
        });
  m.def("run", &run);
  m.def("program", [](const cli::ProgramInput& in) {
    cli::ProgramRequest request;
    request.input = in;
    py::gil_scoped_release released;
    return cli::program_json(request, cli::evaluate_program(request)).dump(2);
  });
  // The document and the program with every spec pinned (what --emit writes). The GIL is
  // released while the solver runs: an integer program may take up to its time limit.
  m.def("solve", [](const cli::ProgramInput& in, const std::optional<std::string>& mem_limit, int top, bool explain,
                    double seconds, const std::string& search) {
    cli::SolveRequest request;
    request.input = in;
    request.mem_limit = mem_limit;
    request.top = top;
    request.explain = explain;
    request.seconds = seconds;
    request.search = search;
    py::gil_scoped_release released;
    const cli::SolveReport report = cli::evaluate_solve(request);
    return std::make_pair(cli::solve_json(request, report).dump(2), cli::pinned_program_text(report));
  });
  py::class_<cli::ProgramInput>(m, "ProgramInput").def(py::init(&program_input));
  m.attr("default_tie_margin") = PlanOptions{}.tie_margin;
}
