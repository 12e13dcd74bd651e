#include "shardmm/plan/step.h"

#include <algorithm>
#include <stdexcept>

namespace shardmm {

const char* to_string(OpKind op) {
  switch (op) {
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::all_to_all:
      return "all_to_all";
    case OpKind::slice:
      return "slice";
    case OpKind::to_partial:
      return "to_partial";
    case OpKind::einsum:
      return "einsum";
    case OpKind::all_gather_einsum:
      return "all_gather_einsum";
    case OpKind::einsum_reduce_scatter:
      return "einsum_reduce_scatter";
    case OpKind::exchange:
      return "exchange";
    case OpKind::local:
      return "local";
  }
  return "?";
}

std::string op_name(const Step& step) {
  if (step.op == OpKind::local) return step.function;
  if (step.op == OpKind::all_reduce && step.reduce != ReduceOp::sum) {
    return std::string(to_string(step.op)) + "(" + to_string(step.reduce) + ")";
  }
  return to_string(step.op);
}

const char* to_string(Bound bound) {
  switch (bound) {
    case Bound::none:
      return "none";
    case Bound::latency:
      return "latency";
    case Bound::bandwidth:
      return "bandwidth";
    case Bound::compute:
      return "compute";
    case Bound::memory:
      return "memory";
  }
  return "?";
}

bool is_collective(OpKind op) {
  return op == OpKind::all_gather || op == OpKind::reduce_scatter || op == OpKind::all_reduce ||
         op == OpKind::all_to_all || op == OpKind::exchange;
}

bool multiplies(OpKind op) { return op == OpKind::einsum || is_collective_matmul(op); }

bool is_collective_matmul(OpKind op) { return op == OpKind::all_gather_einsum || op == OpKind::einsum_reduce_scatter; }

bool gathers_contracted(const Step& step) {
  if (step.op != OpKind::all_gather_einsum) return false;
  const Spec& gathered = step.ring_operand == 1 ? step.from_b : step.from;
  return step.to.find_dim(gathered.dims[static_cast<std::size_t>(step.dim)].name) < 0;
}

namespace {

std::int64_t elements(const std::vector<std::int64_t>& shape, std::size_t from, std::size_t to) {
  std::int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= shape[i];
  return n;
}

}  // namespace

int synchronizations(const Step& step) {
  if (is_collective_matmul(step.op)) return step.ring_steps;
  return is_collective(step.op) ? 1 : 0;
}

int synchronizations(const Plan& plan) {
  int n = 0;
  for (const Step& s : plan.steps) n += synchronizations(s);
  return n;
}

bool contiguous_along(const std::vector<std::int64_t>& block, int dim) {
  return elements(block, 0, static_cast<std::size_t>(dim)) <= 1;
}

Staging staging_of(const Step& step, const std::vector<std::int64_t>& in_local,
                   const std::vector<std::int64_t>& out_local) {
  Staging st;
  switch (step.op) {
    case OpKind::all_gather:
      if (!contiguous_along(out_local, step.dim)) st.recv = elements(out_local, 0, out_local.size());
      break;
    case OpKind::reduce_scatter:
      if (!contiguous_along(in_local, step.dim)) st.send = elements(in_local, 0, in_local.size());
      break;
    case OpKind::all_to_all:  // sends pieces of dst_dim, receives pieces of dim
      if (!contiguous_along(in_local, step.dst_dim)) st.send = elements(in_local, 0, in_local.size());
      if (!contiguous_along(out_local, step.dim)) st.recv = elements(out_local, 0, out_local.size());
      break;
    default:
      break;
  }
  return st;
}

std::int64_t local_copy_elements(const Step& step, const std::vector<std::int64_t>& in_local,
                                 const std::vector<std::int64_t>& out_local) {
  const Staging st = staging_of(step, in_local, out_local);
  const std::int64_t staged = st.send.value_or(0) + st.recv.value_or(0);
  const std::int64_t in = elements(in_local, 0, in_local.size());
  switch (step.op) {
    case OpKind::all_gather:  // the own piece into the output (or into the staging buffer)
    case OpKind::all_reduce:  // the input into the output, which is then reduced in place
      return in + staged;
    case OpKind::reduce_scatter:
    case OpKind::all_to_all:
      return staged;
    case OpKind::exchange:  // its pieces are boxes: StepCoster::cost_exchange counts them
      throw std::logic_error("local_copy_elements: an exchange's copies depend on its pieces, not its blocks");
    default:
      return 0;
  }
}

void Confidence::add(const std::string& reason, double seconds) {
  if (std::find(why.begin(), why.end(), reason) == why.end()) why.push_back(reason);
  uncertainty_s = std::max(uncertainty_s, seconds);
}

void Confidence::add_part(const Confidence& part) {
  for (const std::string& reason : part.why) {
    if (std::find(why.begin(), why.end(), reason) == why.end()) why.push_back(reason);
  }
  uncertainty_s += part.uncertainty_s;
}

}  // namespace shardmm
