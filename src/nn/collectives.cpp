#include "shardmm/nn/collectives.h"

#include <algorithm>

namespace shardmm::nn {

std::vector<CollectiveTally> tally_collectives(const std::vector<autodiff::TapeEvent>& events,
                                               const std::vector<std::int64_t>* bytes) {
  std::vector<CollectiveTally> out;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const autodiff::TapeEvent& e = events[i];
    if (!is_collective(e.step.op) && !is_collective_matmul(e.step.op)) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const CollectiveTally& t) {
      return t.phase == e.phase && t.op == e.step.op && t.axes == e.step.axes && t.reduce == e.step.reduce;
    });
    if (it == out.end())
      it = out.insert(out.end(), CollectiveTally{e.phase, e.step.op, e.step.axes, 0, 0, 0, e.step.reduce});
    ++it->count;
    it->bytes += bytes ? (*bytes)[i] : e.step.bytes_sent;
    it->time_s += e.step.time_s;
  }
  return out;
}

}  // namespace shardmm::nn
