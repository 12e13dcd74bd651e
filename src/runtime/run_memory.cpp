// What a run holds in memory, worked out from its plan before anything is allocated, and the
// checks against the request's limit, the machine's memory and the process's address space.
#include "runtime/run_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <string>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/memory.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/kernels.h"

namespace shardmm {

namespace {

// Byte counts saturate (core/error.h): a run that would need more than 2^63 bytes is refused
// all the same.

std::int64_t block_bytes(const Mesh& mesh, const Spec& spec, const DimSizes& sizes, DType dtype, std::int64_t device) {
  return buffer_bytes(local_elements(mesh, spec, global_shape(spec, sizes), device), dtype);
}

// Ranks of this mpirun job on this node; they share its memory.
std::int64_t ranks_on_node() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  }
  return 1;
}

// The first number in a file ("max" in a cgroup v2 limit is no number: no limit).
std::optional<std::int64_t> file_number(const char* path) {
  std::ifstream in(path);
  std::int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

}  // namespace

namespace detail {

void check_operands(const RunRequest& req) {
  if ((req.contraction != nullptr) == (req.reshard_from != nullptr)) {
    throw InputError("run_plan needs exactly one of a contraction or a reshard source");
  }
}

void check_memory(const RunRequest& req, const MemoryNeed& need) {
  const std::string verifying =
      need.verify_bytes ? " + " + format_bytes(need.verify_bytes) + " to verify on device 0" : std::string();
  // What each device holds at most, its copy of the result for verification included.
  const std::int64_t per_device = saturating_add(need.device_bytes, need.verify_copy_bytes);
  // The limit is the devices' memory; verification is the host's check, outside it.
  if (req.mem_limit_bytes && need.device_bytes > *req.mem_limit_bytes) {
    // Exact where rounded, as the planner prints its limit and peaks: one byte over shows.
    const auto exact = [](std::int64_t bytes) {
      return format_bytes(bytes) + (bytes < 1024 ? "" : " (" + std::to_string(bytes) + " B)");
    };
    throw InputError("the run needs " + exact(need.device_bytes) + " per device, the plan's peak (its inputs, and " +
                     "every step's buffers, which the executor keeps between repeats), over the memory limit of " +
                     exact(*req.mem_limit_bytes) + " per device" +
                     (need.verify_bytes ? " (verifying takes " +
                                              format_bytes(saturating_add(need.verify_copy_bytes, need.verify_bytes)) +
                                              " more on device 0, not counted against the limit)"
                                        : std::string()) +
                     "; use smaller " + field("dims") + " or more devices");
  }
  const bool threads = backend_capabilities(req.backend).ranks_in_one_process;
  // Under an address-space limit, a mapping that fails inside BLAS hangs it (OpenBLAS retries
  // forever): refuse up front what this process's ranks would map.
  if (const auto left = address_space_left(); left && !req.available_bytes) {
    const std::int64_t ranks = threads ? req.mesh.device_count() : 1;
    const bool holds_device0 = threads || process_rank(req.backend) == 0;  // verification's gathering
    const std::int64_t process =
        saturating_add(saturating_mul(saturating_add(per_device, kRankAddressSpaceBytes), ranks),
                       holds_device0 ? need.verify_bytes : 0);
    if (process > *left) {
      throw InputError("the run maps " + format_bytes(process) + " in this process (" + std::to_string(ranks) +
                       (ranks == 1 ? " rank" : " ranks") + " x (" + format_bytes(per_device) + " + " +
                       format_bytes(kRankAddressSpaceBytes) + " for BLAS's work buffer and the rank's stack)" +
                       (holds_device0 ? verifying : std::string()) +
                       "), but its address-space limit (ulimit -v) leaves " + format_bytes(*left) +
                       "; raise the limit, or use smaller " + field("dims") + " or more devices");
    }
  }
  const std::int64_t available = req.available_bytes ? *req.available_bytes : available_memory();
  if (need.total_bytes > available) {
    const std::string sharing =
        threads ? std::to_string(need.devices_sharing) + (need.devices_sharing == 1 ? " device" : " devices") +
                      " in this process"
                : std::to_string(need.devices_sharing) +
                      (need.devices_sharing == 1 ? " process (device)" : " processes (devices)") + " on this node";
    throw InputError("the run needs " + format_bytes(per_device) + " per device x " + sharing + verifying + " = " +
                     format_bytes(need.total_bytes) + ", but only " + format_bytes(available) +
                     " is available; use smaller " + field("dims") + " or " +
                     (threads ? "more processes (" + field("backend") + " mpi, across machines)" : "more machines"));
  }
}

std::function<void(Communicator&)> allocation_failure_as_input_error(const MemoryNeed& need,
                                                                     std::function<void(Communicator&)> body) {
  return [&need, body = std::move(body)](Communicator& comm) {
    try {
      body(comm);
    } catch (const std::bad_alloc&) {
      throw InputError("out of memory on device " + std::to_string(comm.rank()) + " (the run was estimated at " +
                       format_bytes(need.device_bytes) + " per device); use smaller " + field("dims") +
                       " or more devices");
    }
  };
}

}  // namespace detail

std::string format_bytes(std::int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (u + 1 < std::size(units) && v >= 1024) {
    v /= 1024;
    ++u;
  }
  char text[32];
  if (u == 0) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s", v, units[u]);
  }
  return text;
}

MemoryNeed memory_need(const RunRequest& req) {
  detail::check_operands(req);
  const bool matmul = req.contraction != nullptr;
  const Mesh& mesh = req.mesh;
  const Spec& a_spec = matmul ? req.contraction->a : *req.reshard_from;
  MemoryNeed need;
  // The plan layer's formula (plan/memory.h), the one behind the plan's peak_bytes_per_device.
  std::vector<Spec> inputs{a_spec};
  if (matmul) inputs.push_back(req.contraction->b);
  const BackendCapabilities backend = backend_capabilities(req.backend);
  need.device_bytes = plan_peak_bytes(mesh, req.plan, inputs, req.sizes, req.dtype, backend.reduces_into_workspace);
  if (req.verify) {
    // Every device sends device 0 a copy of its result block (verify.h), which device 0
    // keeps, with the dense reference in f64.
    const Spec& out = req.plan.output;
    need.verify_copy_bytes = block_bytes(mesh, out, req.sizes, req.dtype, 0);
    for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
      need.verify_bytes = saturating_add(need.verify_bytes, block_bytes(mesh, out, req.sizes, req.dtype, d));
    }
    const auto dense = [&](const Spec& s) { return saturating_mul(elements_of(global_shape(s, req.sizes)), 8); };
    if (matmul) {
      // The inputs, the expected and the assembled result, and the reference einsum's workspace.
      const Contraction& c = *req.contraction;
      EinsumLayout layout;
      for (const DimSpec& d : c.a.dims) layout.a.push_back(d.name);
      for (const DimSpec& d : c.b.dims) layout.b.push_back(d.name);
      layout.c = c.out_dims;
      const std::map<std::string, std::int64_t> extents(req.sizes.begin(), req.sizes.end());
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_add(dense(c.a), dense(c.b)));
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_mul(dense(out), 2));
      need.verify_bytes =
          saturating_add(need.verify_bytes, LocalEinsum::workspace_bytes_for(std::move(layout), extents, DType::f64));
    } else {
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_mul(dense(out), 2));  // assembled and expected
    }
  }
  need.devices_sharing = backend.ranks_in_one_process ? mesh.device_count() : ranks_on_node();
  need.total_bytes =
      saturating_add(saturating_mul(saturating_add(need.device_bytes, need.verify_copy_bytes), need.devices_sharing),
                     need.verify_bytes);
  return need;
}

std::int64_t available_memory() {
  std::int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, rest;
  std::int64_t kib = 0;
  while (meminfo >> key >> kib && std::getline(meminfo, rest)) {
    if (key == "MemAvailable:") {
      available = saturating_mul(kib, 1024);
      break;
    }
  }
  if (available < 0) available = saturating_mul(sysconf(_SC_AVPHYS_PAGES), sysconf(_SC_PAGESIZE));
  // A container's memory limit (cgroup v2, else v1), which MemAvailable does not see.
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (const auto bytes = file_number(limit)) available = std::min(available, *bytes);
  }
  return available;
}

std::optional<std::int64_t> address_space_left() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  // /proc/self/statm's first field: the pages mapped now.
  const std::optional<std::int64_t> pages = file_number("/proc/self/statm");
  const std::int64_t mapped = pages ? saturating_mul(*pages, sysconf(_SC_PAGESIZE)) : 0;
  const auto cap =
      static_cast<std::int64_t>(std::min<rlim_t>(limit.rlim_cur, std::numeric_limits<std::int64_t>::max()));
  return std::max<std::int64_t>(0, cap - mapped);
}
}  // namespace shardmm
