// Built against an installed shardmm; prints what the install_consumer test checks.
#include <atomic>
#include <iostream>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/runtime/communicator.h"

int main() {
  const shardmm::Mesh mesh = shardmm::Mesh::parse("X=4,Y=2");
  const shardmm::Spec spec = shardmm::parse_spec("A[I_X, J_Y]", mesh);
  std::cout << "mesh " << mesh.to_string() << " devices " << mesh.device_count() << "\n";
  std::cout << "spec " << shardmm::format_spec(spec, mesh) << "\n";

  // The runtime too, so that the link needs every static layer and what they link.
  std::atomic<int> agreeing = 0;
  shardmm::run_backend("threads", mesh, [&](shardmm::Communicator& comm) {
    double sum = static_cast<double>(comm.rank());
    comm.all_reduce(&sum, 1, shardmm::DType::f64, {0, 1});
    if (sum == 28.0) ++agreeing;
  });
  std::cout << "all_reduce 28 on " << agreeing << " of " << mesh.device_count() << " ranks\n";
  return 0;
}
