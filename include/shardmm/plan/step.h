// Plans: printable lists of steps that turn sharded inputs into a sharded output.
//
//   Plan p = plan_reshard(mesh, from, to, shape, DType::f32, profile);
//   for (const Step& s : p.steps) std::cout << to_string(s.op) << "\n";
//
// Each collective's layout transition (group G = `axes`, major to minor):
//   all_gather(G, dim d)      [.., D_{P G}, ..]  -> [.., D_P, ..]     G a suffix of d's axes
//   slice(G, dim d)           [.., D_P, ..]      -> [.., D_{P G}, ..] local, no communication
//   all_to_all(G, d -> e)     [D_{P G}, E_Q]     -> [D_P, E_{Q G}]    G a suffix of d's axes
//   reduce_scatter(G, dim d)  [.., D_P, ..]{U_G} -> [.., D_{P G}, ..]
//   all_reduce(G)             [..]{U_G}          -> [..]
//   to_partial(G)             [..]               -> [..]{U_G}         local: coordinate 0 of G
//                                                                      keeps the value, others 0
//   einsum                    local contraction of the two operands' shards
// Planning never touches a communicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

enum class OpKind { all_gather, reduce_scatter, all_reduce, all_to_all, slice, to_partial, einsum };
const char* to_string(OpKind op);
bool is_collective(OpKind op);

enum class DType { bf16, f16, f32, f64 };
const char* to_string(DType dtype);
int dtype_bytes(DType dtype);
DType parse_dtype(std::string_view text);  // throws InputError

struct Step {
  OpKind op = OpKind::einsum;
  AxisList axes;             // the collective's group (empty for einsum)
  int dim = -1;              // dimension index in `from` (gather, slice, reduce_scatter, all_to_all source)
  int dst_dim = -1;          // all_to_all destination dimension index
  std::string tensor;        // the tensor this step produces or transforms
  int operand = 0;           // which: 0 the first input (or a reshard's tensor), 1 the second, 2 the output
  Spec from;                 // layout before (einsum: the A operand)
  Spec from_b;               // einsum only: the B operand
  Spec to;                   // layout after
  std::int64_t bytes_sent = 0;      // per device, the most any device sends
  std::int64_t bytes_received = 0;  // per device, the most any device receives
  double flops = 0;                 // per device, the most any device computes
  double time_s = 0;                // predicted
};

struct Plan {
  std::string description;   // e.g. "all_gather A over X, then local einsum"
  std::vector<Step> steps;
  Spec output;               // the layout the plan delivers
  double comm_time_s = 0;
  double compute_time_s = 0;
  double total_time_s = 0;          // serialized: comm + compute
  double overlapped_time_s = 0;     // with perfect overlap: max(comm, compute)
  std::int64_t peak_bytes_per_device = 0;
  bool fits_memory = true;          // within the planning memory limit
};

}  // namespace shardmm
