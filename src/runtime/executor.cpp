#include "shardmm/runtime/executor.h"

#include <chrono>
#include <cstring>
#include <optional>

#include "shardmm/core/error.h"
#include "shardmm/runtime/kernels.h"

namespace shardmm {

namespace {

std::int64_t product(const Shape& s, std::size_t from, std::size_t to) {
  std::int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= s[i];
  return n;
}

Shape with_extent(Shape s, int dim, std::int64_t extent) {
  s[static_cast<std::size_t>(dim)] = extent;
  return s;
}

// Elements of a block per unit of dimension `dim`: the product of the other extents.
std::int64_t elements_across(const Shape& s, int dim) { return product(with_extent(s, dim, 1), 0, s.size()); }

Shape zeros(std::size_t rank) { return Shape(rank, 0); }

Shape at_dim(std::size_t rank, int dim, std::int64_t offset) {
  Shape s(rank, 0);
  s[static_cast<std::size_t>(dim)] = offset;
  return s;
}

// The staging copies a collective needs on one device, in elements; absent where it
// works on the blocks in place. A gather into (or a scatter from) a block is in place
// when the dimensions before the step's dimension have extent 1: each member's piece is
// then one contiguous run.
struct Staging {
  std::optional<std::int64_t> send, recv;
};

Staging staging(const Step& step, const Shape& in_local, const Shape& out_local) {
  const auto in_place = [&](const Shape& s) { return product(s, 0, static_cast<std::size_t>(step.dim)) == 1; };
  Staging st;
  switch (step.op) {
    case OpKind::all_gather:
      if (!in_place(out_local)) st.recv = product(out_local, 0, out_local.size());
      break;
    case OpKind::reduce_scatter:
      if (!in_place(in_local)) st.send = product(in_local, 0, in_local.size());
      break;
    case OpKind::all_to_all:
      st.send = product(in_local, 0, in_local.size());
      st.recv = product(out_local, 0, out_local.size());
      break;
    default:
      break;
  }
  return st;
}

// An einsum step's operand orders and this device's extents, for LocalEinsum.
std::pair<EinsumLayout, std::map<std::string, std::int64_t>> einsum_shape(const Mesh& mesh, const Step& step,
                                                                          const DimSizes& sizes, std::int64_t device) {
  EinsumLayout layout;
  std::map<std::string, std::int64_t> extents;
  for (const auto& [spec, names] :
       {std::pair{&step.from, &layout.a}, std::pair{&step.from_b, &layout.b}, std::pair{&step.to, &layout.c}}) {
    const std::vector<Range> box = shard_box(mesh, *spec, global_shape(*spec, sizes), device);
    for (std::size_t i = 0; i < spec->dims.size(); ++i) {
      names->push_back(spec->dims[i].name);
      extents[spec->dims[i].name] = box[i].extent;
    }
  }
  return {std::move(layout), std::move(extents)};
}

}  // namespace

// What one step needs on this rank, worked out once when the executor is built.
struct StepState {
  DistTensor out;
  Buffer send, recv;                 // staging, when the data is not contiguous in place
  Counts counts, recv_counts;        // per group member, in elements
  std::vector<Range> pieces;         // per member: its range along the step's dimension(s)
  std::vector<Range> recv_pieces;    // all_to_all: the members' ranges along the source dim
  Range mine;                        // slice: my range relative to my block
  bool direct = false;               // the collective can work on the buffers in place
  bool keeps = false;                // to_partial: this device keeps the value
  std::unique_ptr<LocalEinsum> einsum;
};

struct Executor::Impl {
  Communicator& comm;
  const Mesh& mesh;
  Plan plan;
  DimSizes sizes;
  DType dtype;
  std::int64_t me;
  std::vector<StepState> states;
  std::vector<TraceEvent> events;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  Impl(Communicator& c, const Plan& p, const DimSizes& s, DType d)
      : comm(c), mesh(c.mesh()), plan(p), sizes(s), dtype(d), me(c.rank()) {
    if (dtype != DType::f32 && dtype != DType::f64) {
      throw InputError(std::string("execution computes in f32 or f64; got ") + to_string(dtype));
    }
    for (const Step& step : plan.steps) states.push_back(prepare(step));
  }

  Shape shape_of(const Spec& spec) const { return global_shape(spec, sizes); }

  // The range of dimension `dim` that `device` holds under `spec`.
  Range range(const Spec& spec, int dim, std::int64_t device) const {
    return shard_range(mesh, sizes.at(spec.dims[static_cast<std::size_t>(dim)].name),
                       spec.dims[static_cast<std::size_t>(dim)].axes, device);
  }

  StepState prepare(const Step& step) {
    StepState st;
    st.out = DistTensor(mesh, me, step.to, shape_of(step.to), dtype);
    const Shape in_local = local_shape(mesh, step.from, shape_of(step.from), me);
    const Shape& out_local = st.out.local_shape();
    const Staging stage = staging(step, in_local, out_local);
    if (stage.send) st.send = Buffer(*stage.send, dtype);
    if (stage.recv) st.recv = Buffer(*stage.recv, dtype);
    st.direct = !stage.send && !stage.recv;
    const std::vector<std::int64_t> members =
        step.axes.empty() ? std::vector<std::int64_t>{me} : mesh.group_members(me, step.axes);
    switch (step.op) {
      case OpKind::all_gather: {
        const std::int64_t inner = elements_across(out_local, step.dim);
        for (std::int64_t m : members) {
          st.pieces.push_back(range(step.from, step.dim, m));
          st.counts.push_back(st.pieces.back().extent * inner);
        }
        break;
      }
      case OpKind::reduce_scatter: {
        const Range block = range(step.from, step.dim, me);
        const std::int64_t inner = elements_across(in_local, step.dim);
        for (std::int64_t m : members) {
          Range r = range(step.to, step.dim, m);
          r.offset -= block.offset;
          st.pieces.push_back(r);
          st.counts.push_back(r.extent * inner);
        }
        break;
      }
      case OpKind::all_to_all: {
        const Range b_block = range(step.from, step.dst_dim, me);
        const Range a_block = range(step.to, step.dim, me);
        const std::int64_t send_inner = elements_across(in_local, step.dst_dim);
        const std::int64_t recv_inner = elements_across(out_local, step.dim);
        for (std::int64_t m : members) {
          Range rb = range(step.to, step.dst_dim, m);
          rb.offset -= b_block.offset;
          st.pieces.push_back(rb);
          st.counts.push_back(rb.extent * send_inner);
          Range ra = range(step.from, step.dim, m);
          ra.offset -= a_block.offset;
          st.recv_pieces.push_back(ra);
          st.recv_counts.push_back(ra.extent * recv_inner);
        }
        break;
      }
      case OpKind::slice: {
        st.mine = range(step.to, step.dim, me);
        st.mine.offset -= range(step.from, step.dim, me).offset;
        break;
      }
      case OpKind::to_partial: {
        st.keeps = mesh.group_rank(me, step.axes) == 0;
        break;
      }
      case OpKind::all_reduce:
        break;
      case OpKind::einsum: {
        auto [layout, extents] = einsum_shape(mesh, step, sizes, me);
        st.einsum = std::make_unique<LocalEinsum>(std::move(layout), std::move(extents), dtype);
        break;
      }
    }
    return st;
  }

  template <class T>
  void execute(const Step& step, StepState& st, const DistTensor& in, const DistTensor* in_b, TraceEvent& ev) {
    T* out = st.out.buffer().as<T>();
    const T* src = in.buffer().as<T>();
    const Shape& in_local = in.local_shape();
    const Shape& out_local = st.out.local_shape();
    const std::size_t rank = in_local.size();
    const std::int64_t eb = dtype_bytes(dtype);
    const std::int64_t g = mesh.group_size(step.axes);
    switch (step.op) {
      case OpKind::all_gather: {
        T* recv = st.direct ? out : st.recv.as<T>();
        comm.all_gather(src, recv, st.counts, dtype, step.axes);
        if (!st.direct) {
          std::int64_t at = 0, offset = 0;
          for (std::size_t m = 0; m < st.pieces.size(); ++m) {
            const Shape chunk = with_extent(out_local, step.dim, st.pieces[m].extent);
            copy_box(recv + at, chunk, zeros(rank), out, out_local, at_dim(rank, step.dim, offset), chunk);
            at += st.counts[m];
            offset += st.pieces[m].extent;
          }
        }
        ev.bytes_sent = ev.bytes_received = (st.out.elements() - in.elements()) * eb;
        break;
      }
      case OpKind::reduce_scatter: {
        const T* send = src;
        if (!st.direct) {
          T* staging = st.send.as<T>();
          std::int64_t at = 0;
          for (std::size_t m = 0; m < st.pieces.size(); ++m) {
            const Shape chunk = with_extent(in_local, step.dim, st.pieces[m].extent);
            copy_box(src, in_local, at_dim(rank, step.dim, st.pieces[m].offset), staging + at, chunk, zeros(rank), chunk);
            at += st.counts[m];
          }
          send = staging;
        }
        comm.reduce_scatter(send, out, st.counts, dtype, step.axes);
        ev.bytes_sent = ev.bytes_received = (in.elements() - st.out.elements()) * eb;
        break;
      }
      case OpKind::all_reduce: {
        std::memcpy(out, src, static_cast<std::size_t>(in.buffer().bytes()));
        comm.all_reduce(out, st.out.elements(), dtype, step.axes);
        ev.bytes_sent = ev.bytes_received = 2 * (in.elements() - in.elements() / g) * eb;
        break;
      }
      case OpKind::all_to_all: {
        T* send = st.send.as<T>();
        T* recv = st.recv.as<T>();
        std::int64_t at = 0;
        for (std::size_t m = 0; m < st.pieces.size(); ++m) {
          const Shape chunk = with_extent(in_local, step.dst_dim, st.pieces[m].extent);
          copy_box(src, in_local, at_dim(rank, step.dst_dim, st.pieces[m].offset), send + at, chunk, zeros(rank), chunk);
          at += st.counts[m];
        }
        comm.all_to_all(send, st.counts, recv, st.recv_counts, dtype, step.axes);
        at = 0;
        for (std::size_t m = 0; m < st.recv_pieces.size(); ++m) {
          const Shape chunk = with_extent(out_local, step.dim, st.recv_pieces[m].extent);
          copy_box(recv + at, chunk, zeros(rank), out, out_local, at_dim(rank, step.dim, st.recv_pieces[m].offset), chunk);
          at += st.recv_counts[m];
        }
        const std::int64_t kept = st.counts[static_cast<std::size_t>(mesh.group_rank(me, step.axes))];
        ev.bytes_sent = (in.elements() - kept) * eb;
        ev.bytes_received = (st.out.elements() - kept) * eb;
        break;
      }
      case OpKind::slice:
        copy_box(src, in_local, at_dim(rank, step.dim, st.mine.offset), out, out_local, zeros(rank), out_local);
        break;
      case OpKind::to_partial:
        if (st.keeps) {
          std::memcpy(out, src, static_cast<std::size_t>(in.buffer().bytes()));
        } else {
          std::memset(out, 0, static_cast<std::size_t>(st.out.buffer().bytes()));
        }
        break;
      case OpKind::einsum:
        st.einsum->run(src, in_b->data(), out);
        ev.flops = st.einsum->flops();
        break;
    }
  }

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count(); }

  void check_input(const DistTensor& t, const Spec& expected, const char* which) const {
    if (!(t.spec() == expected) || t.dtype() != dtype || t.device() != me) {
      throw InputError(std::string("the plan starts from ") + which + " = " + format_spec(expected, mesh) +
                       " in " + to_string(dtype) + " on device " + std::to_string(me) + "; got " +
                       format_spec(t.spec(), mesh) + " in " + to_string(t.dtype()) + " on device " +
                       std::to_string(t.device()));
    }
  }

  const DistTensor& run(const DistTensor& a, const DistTensor* b) {
    const DistTensor* current[3] = {&a, b, nullptr};
    bool checked[2] = {false, false};
    events.clear();
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& step = plan.steps[i];
      StepState& st = states[i];
      const int which = step.op == OpKind::einsum ? 0 : step.operand;
      const DistTensor* in = current[which];
      if (!in) throw InputError("this plan multiplies two operands; pass both to Executor::run");
      if (which < 2 && !checked[which]) {
        check_input(*in, step.from, which == 0 ? "the first operand" : "the second operand");
        checked[which] = true;
      }
      if (step.op == OpKind::einsum && current[1] && !checked[1]) {
        check_input(*current[1], step.from_b, "the second operand");
        checked[1] = true;
      }
      TraceEvent ev{static_cast<int>(i), step.op, step.axes, step.tensor, 0, 0, 0, now(), 0};
      if (dtype == DType::f32) {
        execute<float>(step, st, *in, current[1], ev);
      } else {
        execute<double>(step, st, *in, current[1], ev);
      }
      ev.end_s = now();
      events.push_back(std::move(ev));
      current[step.op == OpKind::einsum ? 2 : step.operand] = &st.out;
    }
    const bool matmul = current[2] != nullptr;
    return matmul ? *current[2] : *current[0];
  }
};

Executor::Executor(Communicator& comm, const Plan& plan, const DimSizes& sizes, DType dtype)
    : impl_(std::make_unique<Impl>(comm, plan, sizes, dtype)) {}
Executor::~Executor() = default;

const DistTensor& Executor::run(const DistTensor& a, const DistTensor* b) { return impl_->run(a, b); }

const std::vector<TraceEvent>& Executor::trace() const { return impl_->events; }

double Executor::clock() const { return impl_->now(); }

std::int64_t Executor::bytes_needed(const Mesh& mesh, const Plan& plan, const DimSizes& sizes, DType dtype,
                                    std::int64_t device) {
  const std::int64_t eb = dtype_bytes(dtype);
  // As Buffer allocates: whole 64-byte lines, at least one.
  const auto buffer = [&](std::int64_t elements) {
    return (std::max<std::int64_t>(checked_mul(elements, eb, "a buffer's size"), 1) + 63) / 64 * 64;
  };
  std::int64_t total = 0;
  const auto add = [&](std::int64_t bytes) { total = checked_add(total, bytes, "an executor's bytes"); };
  for (const Step& step : plan.steps) {
    const Shape in_local = local_shape(mesh, step.from, global_shape(step.from, sizes), device);
    const Shape out_local = local_shape(mesh, step.to, global_shape(step.to, sizes), device);
    add(buffer(product(out_local, 0, out_local.size())));
    const Staging stage = staging(step, in_local, out_local);
    if (stage.send) add(buffer(*stage.send));
    if (stage.recv) add(buffer(*stage.recv));
    if (step.op == OpKind::einsum) {
      auto [layout, extents] = einsum_shape(mesh, step, sizes, device);
      add(LocalEinsum::workspace_bytes_for(std::move(layout), extents, dtype));
    }
  }
  return total;
}

}  // namespace shardmm
