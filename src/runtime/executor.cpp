#include "shardmm/runtime/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "shardmm/core/error.h"
#include "shardmm/plan/memory.h"
#include "shardmm/runtime/kernels.h"
#include "ordered_sum.h"

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

Shape zeros(std::size_t rank) { return Shape(rank, 0); }

Shape box_offsets(const std::vector<Range>& box) {
  Shape s;
  for (const Range& r : box) s.push_back(r.offset);
  return s;
}

Shape box_extents(const std::vector<Range>& box) {
  Shape s;
  for (const Range& r : box) s.push_back(r.extent);
  return s;
}

std::int64_t box_elements(const std::vector<Range>& box) {
  std::int64_t n = 1;
  for (const Range& r : box) n *= r.extent;
  return n;
}

Shape at_dim(std::size_t rank, int dim, std::int64_t offset) {
  Shape s(rank, 0);
  s[static_cast<std::size_t>(dim)] = offset;
  return s;
}

// Lays the pieces of dimension `dim` of a block (ranges relative to it) one after another
// in `staging`, in member order, as a collective sends them.
template <class T>
void pack(const T* block, const Shape& shape, int dim, const std::vector<Range>& pieces, T* staging) {
  for (const Range& piece : pieces) {
    const Shape chunk = with_extent(shape, dim, piece.extent);
    copy_box(block, shape, at_dim(shape.size(), dim, piece.offset), staging, chunk, zeros(shape.size()), chunk);
    staging += product(chunk, 0, chunk.size());
  }
}

// The inverse of pack: the pieces that arrived one after another into their places.
template <class T>
void unpack(const T* staging, T* block, const Shape& shape, int dim, const std::vector<Range>& pieces) {
  for (const Range& piece : pieces) {
    const Shape chunk = with_extent(shape, dim, piece.extent);
    copy_box(staging, chunk, zeros(shape.size()), block, shape, at_dim(shape.size(), dim, piece.offset), chunk);
    staging += product(chunk, 0, chunk.size());
  }
}

// The ring tags of the collective matmuls, one per direction round the ring; apart from the
// runner's (0x71e) and gather_global's (0x5e7f), and within any MPI's tag range (>= 32767).
constexpr int kRingTags[2] = {0x7a10, 0x7a11};
// How often a ring's transfers are tested while a chunk is multiplied, where they move only
// inside the communicator's calls (mpi). Each test wakes a thread on a core the GEMM uses.
constexpr std::chrono::microseconds kPollInterval{50};

// Waits for a ring's request, where there is one, and drops it.
void complete(Request& r) {
  if (!r) return;
  r->wait();
  r.reset();
}

}  // namespace

// What one step needs on this rank, worked out once when the executor is built.
struct StepState {
  DistTensor out;
  Buffer send, recv;               // staging, when the data is not contiguous in place
  Counts counts, recv_counts;      // per group member, in elements
  std::vector<Range> pieces;       // per member: its range along the step's dimension(s), relative to my block
  std::vector<Range> recv_pieces;  // all_to_all: the members' ranges along the source dim
  std::vector<std::vector<Range>> send_boxes, recv_boxes;  // exchange: per member, in my blocks
  Range mine;                                              // slice: my range relative to my block
  bool packs = false, unpacks = false;                     // through the staging buffers (else in place)
  bool keeps = false;                                      // to_partial: this device keeps the value
  std::unique_ptr<LocalEinsum> einsum;
  // Collective matmuls: the ring, its buffers, and the einsum of one chunk by D's extent.
  std::unique_ptr<RingGeometry> ring;
  Buffer chunks, product, partial[2][2], incoming[2][2];  // by way round the ring and step parity
  std::map<std::int64_t, std::unique_ptr<LocalEinsum>> chunk_einsum;
};

struct Executor::Impl {
  Communicator& comm;
  const Mesh& mesh;
  Plan plan;
  DimSizes sizes;
  DType dtype;
  std::int64_t me;
  std::vector<StepState> states;
  const DistTensor* result = nullptr;  // the latest run's
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
    const Staging stage = staging_of(step, in_local, out_local);
    if (stage.send) st.send = Buffer(*stage.send, dtype);
    if (stage.recv) st.recv = Buffer(*stage.recv, dtype);
    st.packs = stage.send.has_value();
    st.unpacks = stage.recv.has_value();
    const std::vector<std::int64_t> members =
        step.axes.empty() ? std::vector<std::int64_t>{me} : mesh.group_members(me, step.axes);
    switch (step.op) {
      case OpKind::all_gather: {
        const std::int64_t inner = elements_across(out_local, step.dim);
        const Range block = range(step.to, step.dim, me);
        for (std::int64_t m : members) {
          Range r = range(step.from, step.dim, m);
          r.offset -= block.offset;
          st.pieces.push_back(r);
          st.counts.push_back(r.extent * inner);
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
        if (step.dim >= 0) {  // padded: my piece at its place in the block it pads to
          st.mine = range(step.from, step.dim, me);
          st.mine.offset -= range(step.to, step.dim, me).offset;
        } else {
          st.keeps = mesh.group_rank(me, step.axes) == 0;
        }
        break;
      }
      case OpKind::all_reduce:
        break;
      case OpKind::exchange: {
        const Shape shape = shape_of(step.from);
        const std::vector<Range> mine_before = shard_box(mesh, step.from, shape, me);
        const std::vector<Range> mine_after = shard_box(mesh, step.to, shape, me);
        std::int64_t sent = 0, received = 0;
        for (std::int64_t m : members) {
          st.send_boxes.push_back(intersect_boxes(shard_box(mesh, step.to, shape, m), mine_before));
          st.recv_boxes.push_back(intersect_boxes(shard_box(mesh, step.from, shape, m), mine_after));
          // What I keep goes straight from block to block, not through the collective.
          const bool self = m == me;
          st.counts.push_back(self ? 0 : box_elements(st.send_boxes.back()));
          st.recv_counts.push_back(self ? 0 : box_elements(st.recv_boxes.back()));
          sent += st.counts.back();
          received += box_elements(st.recv_boxes.back());
        }
        // The members' old blocks tile what the group holds (plan/step.h), so the pieces
        // received and kept fill the new block exactly once.
        if (received != st.out.elements()) {
          throw std::logic_error("exchange " + format_spec(step.from, mesh) + " -> " + format_spec(step.to, mesh) +
                                 ": device " + std::to_string(me) + " would receive " + std::to_string(received) +
                                 " elements for a block of " + std::to_string(st.out.elements()));
        }
        st.send = Buffer(sent, dtype);
        st.recv = Buffer(std::accumulate(st.recv_counts.begin(), st.recv_counts.end(), std::int64_t{0}), dtype);
        st.packs = st.unpacks = true;
        break;
      }
      case OpKind::einsum: {
        auto [layout, extents] = local_einsum_shape(mesh, step, sizes, me);
        st.einsum = std::make_unique<LocalEinsum>(std::move(layout), std::move(extents), dtype);
        break;
      }
      case OpKind::local:
        throw std::logic_error("Executor: a local step is the autodiff tape's own work, never a plan's");
      case OpKind::all_gather_einsum:
      case OpKind::einsum_reduce_scatter: {
        st.ring = std::make_unique<RingGeometry>(ring_geometry(mesh, step, sizes, me));
        const RingGeometry& g = *st.ring;
        if (g.chunk_elements > 0) st.chunks = Buffer(g.chunk_elements, dtype);
        if (step.op == OpKind::all_gather_einsum) {
          if (g.product_elements > 0) st.product = Buffer(g.product_elements, dtype);
        } else {
          for (int w = 0; w < (step.bidirectional ? 2 : 1); ++w) {
            for (int i = 0; i < 2; ++i) {
              st.partial[w][i] = Buffer(g.product_elements, dtype);
              st.incoming[w][i] = Buffer(g.product_elements, dtype);
            }
          }
        }
        for (std::size_t m = 0; m < g.members.size(); ++m) {
          std::unique_ptr<LocalEinsum>& e = st.chunk_einsum[g.pieces[m].extent];
          if (!e) e = std::make_unique<LocalEinsum>(g.layout, g.chunk_extents(m), dtype, g.chunk_buffers());
        }
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
        T* recv = st.unpacks ? st.recv.as<T>() : out;
        comm.all_gather(src, recv, st.counts, dtype, step.axes);
        if (st.unpacks) unpack(recv, out, out_local, step.dim, st.pieces);
        ev.bytes_sent = ev.bytes_received = (st.out.elements() - in.elements()) * eb;
        break;
      }
      case OpKind::reduce_scatter: {
        if (st.packs) pack(src, in_local, step.dim, st.pieces, st.send.as<T>());
        comm.reduce_scatter(st.packs ? st.send.as<T>() : src, out, st.counts, dtype, step.axes);
        ev.bytes_sent = ev.bytes_received = (in.elements() - st.out.elements()) * eb;
        break;
      }
      case OpKind::all_reduce: {
        std::memcpy(out, src, static_cast<std::size_t>(in.buffer().bytes()));
        comm.all_reduce(out, st.out.elements(), dtype, step.axes, step.reduce);
        ev.bytes_sent = ev.bytes_received = 2 * (in.elements() - in.elements() / g) * eb;
        break;
      }
      case OpKind::all_to_all: {
        if (st.packs) pack(src, in_local, step.dst_dim, st.pieces, st.send.as<T>());
        T* recv = st.unpacks ? st.recv.as<T>() : out;
        comm.all_to_all(st.packs ? st.send.as<T>() : src, st.counts, recv, st.recv_counts, dtype, step.axes);
        if (st.unpacks) unpack(recv, out, out_local, step.dim, st.recv_pieces);
        const std::int64_t kept = st.counts[static_cast<std::size_t>(mesh.group_rank(me, step.axes))];
        ev.bytes_sent = (in.elements() - kept) * eb;
        ev.bytes_received = (st.out.elements() - kept) * eb;
        break;
      }
      case OpKind::exchange: {
        // Pieces in member order; my own is copied in place.
        const auto self = static_cast<std::size_t>(step.axes.empty() ? 0 : mesh.group_rank(me, step.axes));
        T* send = st.send.as<T>();
        for (std::size_t m = 0; m < st.send_boxes.size(); ++m) {
          const Shape extent = box_extents(st.send_boxes[m]);
          if (m == self) {
            copy_box(src, in_local, box_offsets(st.send_boxes[m]), out, out_local, box_offsets(st.recv_boxes[m]),
                     extent);
            continue;
          }
          copy_box(src, in_local, box_offsets(st.send_boxes[m]), send, extent, zeros(rank), extent);
          send += st.counts[m];
        }
        comm.all_to_all(st.send.as<T>(), st.counts, st.recv.as<T>(), st.recv_counts, dtype, step.axes);
        const T* recv = st.recv.as<T>();
        for (std::size_t m = 0; m < st.recv_boxes.size(); ++m) {
          if (st.recv_counts[m] == 0) continue;
          const Shape extent = box_extents(st.recv_boxes[m]);
          copy_box(recv, extent, zeros(rank), out, out_local, box_offsets(st.recv_boxes[m]), extent);
          recv += st.recv_counts[m];
        }
        ev.bytes_sent = st.send.elements() * eb;  // the staging holds every piece sent or received
        ev.bytes_received = st.recv.elements() * eb;
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
          if (step.dim >= 0)
            copy_box(src, in_local, zeros(rank), out, out_local, at_dim(rank, step.dim, st.mine.offset), in_local);
        }
        break;
      case OpKind::einsum:
        st.einsum->run(src, in_b->data(), out);
        ev.flops = st.einsum->flops();
        break;
      case OpKind::all_gather_einsum:
        all_gather_einsum<T>(step, st, in, *in_b, ev);
        break;
      case OpKind::einsum_reduce_scatter:
        einsum_reduce_scatter<T>(step, st, in, *in_b, ev);
        break;
      case OpKind::local:  // refused by prepare()
        break;
    }
  }

  // One chunk's product: the chunked operand's chunk `x` times the other operand (D
  // contracted: its rows of D), into `c` or, accumulating, added to it, while the transfers
  // `in_flight` move.
  template <class T>
  void multiply_chunk(StepState& st, std::size_t m, const T* x, const DistTensor& a, const DistTensor& b, T* c,
                      bool accumulate, const std::vector<Request*>& in_flight, TraceEvent& ev) {
    const RingGeometry& g = *st.ring;
    LocalEinsum& e = *st.chunk_einsum.at(g.pieces[m].extent);
    const T* y = static_cast<const T*>(g.operand == 0 ? b.data() : a.data()) + g.other_offset(m);
    const T* a_in = g.operand == 0 ? x : y;
    const T* b_in = g.operand == 0 ? y : x;
    while_moving(in_flight, [&] { accumulate ? e.accumulate(a_in, b_in, c) : e.run(a_in, b_in, c); });
    ev.flops += e.flops();
  }

  // Runs `compute` while the requests in flight move: where they move only inside the
  // communicator's calls (mpi), they are tested once here, which starts them, and then by a
  // helper thread every kPollInterval until they are done or `compute` returns. This thread
  // makes no call meanwhile. No thread when they have already completed (eager messages).
  template <class F>
  void while_moving(const std::vector<Request*>& in_flight, F&& compute) {
    // One test() drives every transfer (MPI progresses them all), so stopping at the first
    // unfinished request is enough.
    const auto moving = [&] {
      return std::any_of(in_flight.begin(), in_flight.end(), [](Request* r) { return *r && !(*r)->test(); });
    };
    if (!comm.wants_progress_thread() || !moving()) {
      compute();
      return;
    }
    std::atomic<bool> computing{true};
    std::thread poller([&] {
      while (computing.load(std::memory_order_acquire) && moving()) std::this_thread::sleep_for(kPollInterval);
    });
    struct Join {
      std::atomic<bool>& computing;
      std::thread& poller;
      ~Join() {
        computing.store(false, std::memory_order_release);
        poller.join();
      }
    } join{computing, poller};
    compute();
  }

  // A shard the gather ring received: the receive (lent on threads) and the send that passes
  // it on, if it goes further than this rank.
  struct HeldShard {
    Request arrival;
    Request forward;
    std::int64_t hops_left = 0;  // after this rank, on its way
    // The forward first: dropped unwaited it waits for the next member to let go; then the
    // receive, which lets go at once.
    void let_go() {
      forward.reset();
      arrival.reset();
    }
  };
  // The order a ring lets go of its shards in: those nearest the end of their way first.
  static std::vector<std::size_t> nearest_the_end_first(const std::vector<HeldShard>& held) {
    std::vector<std::size_t> order(held.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t l, std::size_t r) { return held[l].hops_left < held[r].hops_left; });
    return order;
  }

  // The ring of plan/step.h's all_gather_einsum. Shards travel one way (prev -> me -> next),
  // or both ways when bidirectional: ceil((n-1)/2) arrive from the left, floor((n-1)/2)
  // from the right. Step s multiplies what arrived during step s-1 (step 0: my own shard)
  // while the next shards are in flight, and forwards what it holds.
  //
  // Shards are received lent (Communicator::irecv_lent): on threads every member multiplies
  // and forwards the owner's own buffer, and nothing is copied. A lent shard stays lent until
  // the members after this one on its way have let go of it too, so the ring ends by letting
  // go of its shards nearest the end of their way first: a shard that goes no further is let
  // go at once, one that goes one more hop once the next member has let go of it, and so on;
  // no member ever waits for one that waits for it.
  template <class T>
  void all_gather_einsum(const Step& step, StepState& st, const DistTensor& a, const DistTensor& b, TraceEvent& ev) {
    const RingGeometry& g = *st.ring;
    const DistTensor& x = g.operand == 0 ? a : b;
    const auto n = static_cast<std::int64_t>(g.members.size());
    const auto me_g = static_cast<std::int64_t>(g.me);
    const std::int64_t from_left = step.bidirectional ? n / 2 : n - 1;
    const std::int64_t from_right = step.bidirectional ? (n - 1) / 2 : 0;
    const std::int64_t next = g.members[static_cast<std::size_t>((me_g + 1) % n)];
    const std::int64_t prev = g.members[static_cast<std::size_t>((me_g + n - 1) % n)];
    const std::int64_t eb = dtype_bytes(dtype);
    const auto member = [&](std::int64_t k) { return static_cast<std::size_t>(((k % n) + n) % n); };
    const auto chunk_bytes = [&](std::size_t m) {
      return g.pieces[m].extent * elements_across(g.operand_local, g.operand_dim) * eb;
    };
    // Where each shard lies once it has arrived: the sender's buffer where lent, else this
    // rank's chunk buffer.
    std::vector<const T*> at(g.members.size(), nullptr);
    at[g.me] = x.buffer().template as<T>();
    std::vector<HeldShard> held(g.members.size());
    std::vector<Request> own;  // my shard, to each neighbour it leaves for
    own.reserve(2);            // `sent` points into it
    // Lets go in the same order when an exception unwinds the ring.
    struct LetGo {
      std::vector<HeldShard>& held;
      std::vector<Request>& own;
      ~LetGo() {
        for (std::size_t m : nearest_the_end_first(held)) held[m].let_go();
        own.clear();
      }
    } let_go{held, own};
    std::vector<std::size_t> arriving;
    std::vector<Request*> sent;  // this step's sends
    T* out = st.out.buffer().as<T>();
    std::vector<Request*> in_flight;
    // D free: each chunk fills its own rows of C. D contracted: the own chunk (step 0)
    // writes all of C and each one after it adds to it, in ring order.
    const auto multiply = [&](std::size_t m) {
      in_flight = sent;
      for (std::size_t k : arriving) in_flight.push_back(&held[k].arrival);
      if (g.contracted()) {
        multiply_chunk<T>(st, m, at[m], a, b, out, m != g.me, in_flight, ev);
        return;
      }
      const Range& rows = g.pieces[m];
      if (st.product.elements() == 0) {
        multiply_chunk<T>(st, m, at[m], a, b, out + rows.offset * elements_across(g.out_local, g.out_dim), false,
                          in_flight, ev);
        return;
      }
      T* staged = st.product.as<T>();
      multiply_chunk<T>(st, m, at[m], a, b, staged, false, in_flight, ev);
      const Shape piece = with_extent(g.out_local, g.out_dim, rows.extent);
      copy_box(staged, piece, zeros(piece.size()), out, g.out_local, at_dim(piece.size(), g.out_dim, rows.offset),
               piece);
    };
    // Way 0 receives from prev and sends to next, way 1 the other way round; a shard `hop`
    // members from its owner goes `last - hop` further.
    const auto pass = [&](std::size_t in, std::size_t fwd, std::int64_t from, std::int64_t to, int tag,
                          std::int64_t hops_left_after) {
      held[in].arrival = comm.irecv_lent(st.chunks.as<T>() + g.chunk_at[in], chunk_bytes(in), from, tag);
      held[in].hops_left = hops_left_after;
      arriving.push_back(in);
      Request& send = fwd == g.me ? own.emplace_back() : held[fwd].forward;
      send = comm.isend(at[fwd], chunk_bytes(fwd), to, tag);
      sent.push_back(&send);
    };
    for (std::int64_t s = 0; s <= from_left; ++s) {
      arriving.clear();
      sent.clear();
      if (s + 1 <= from_left) pass(member(me_g - s - 1), member(me_g - s), prev, next, kRingTags[0], from_left - s - 1);
      if (s + 1 <= from_right)
        pass(member(me_g + s + 1), member(me_g + s), next, prev, kRingTags[1], from_right - s - 1);
      if (s == 0) {
        multiply(g.me);
      } else {
        multiply(member(me_g - s));
        if (s <= from_right) multiply(member(me_g + s));
      }
      for (std::size_t k : arriving) {
        held[k].arrival->wait();
        at[k] = static_cast<const T*>(held[k].arrival->received());
      }
      if (comm.moves_only_in_calls()) {  // nothing is lent there
        for (Request* r : sent) complete(*r);
      }
    }
    // Every forward and my own shard waited for (each completes once the next member lets go),
    // in the order LetGo then lets go in.
    for (std::size_t m : nearest_the_end_first(held)) {
      complete(held[m].forward);
      held[m].let_go();
    }
    for (Request& r : own) complete(r);
    ev.bytes_sent = ev.bytes_received = (g.chunk_elements - x.elements()) * eb;
  }

  // The ring of plan/step.h's einsum_reduce_scatter, all_gather_einsum's transpose. Block b's
  // partial sums travel towards its owner b: one way round from b+1, which starts the sum,
  // through b+2, ... (leftwards); both ways round also from b-L, ... , b-1 (rightwards), with
  // L = floor(n/2) steps from the left and R = floor((n-1)/2) from the right, both arriving
  // for the last step. Here "way 0" sends to the next member and "way 1" to the previous
  // one; one way round uses way 0 alone with L = n-1. At step s < L this rank computes its
  // partial of block me + (L - s) (way 0) and, from step L - R on, of block me - (L - s)
  // (way 1), adds the running sum of that block which arrived during step s-1, and passes it
  // on. At step L it computes its own block and adds what arrived: ((way 0's sum) + x[b]) +
  // way 1's sum, each way's sum in the order its members added to it.
  template <class T>
  void einsum_reduce_scatter(const Step& step, StepState& st, const DistTensor& a, const DistTensor& b,
                             TraceEvent& ev) {
    const RingGeometry& g = *st.ring;
    const DistTensor& x = g.operand == 0 ? a : b;
    const auto n = static_cast<std::int64_t>(g.members.size());
    const auto me_g = static_cast<std::int64_t>(g.me);
    const std::int64_t last = step.bidirectional ? n / 2 : n - 1;
    const std::int64_t from_right = step.bidirectional ? (n - 1) / 2 : 0;
    const std::int64_t next = g.members[static_cast<std::size_t>((me_g + 1) % n)];
    const std::int64_t prev = g.members[static_cast<std::size_t>((me_g + n - 1) % n)];
    const std::int64_t eb = dtype_bytes(dtype);
    const auto member = [&](std::int64_t k) { return static_cast<std::size_t>(((k % n) + n) % n); };
    const std::int64_t out_across = elements_across(g.out_local, g.out_dim);
    const T* src = x.buffer().template as<T>();
    const std::int64_t x_across = elements_across(g.operand_local, g.operand_dim);
    if (st.chunks.elements() > 0) {  // D is not leading in the operand: lay its chunks out one after another
      for (std::size_t m = 0; m < g.members.size(); ++m) {
        const Shape piece = with_extent(g.operand_local, g.operand_dim, g.pieces[m].extent);
        copy_box(src, g.operand_local, at_dim(piece.size(), g.operand_dim, g.pieces[m].offset),
                 st.chunks.as<T>() + g.chunk_at[m], piece, zeros(piece.size()), piece);
      }
    }
    const auto chunk = [&](std::size_t m) {
      return st.chunks.elements() > 0 ? st.chunks.as<T>() + g.chunk_at[m] : src + g.pieces[m].offset * x_across;
    };
    const int ways = step.bidirectional ? 2 : 1;
    const std::int64_t to[2] = {next, prev}, from[2] = {prev, next};
    const std::int64_t first[2] = {0, last - from_right};  // the step at which each way starts a sum
    // The block a way carries at step s (its own block at the last step).
    const auto block = [&](int w, std::int64_t s) { return member(w == 0 ? me_g + last - s : me_g - last + s); };
    const auto block_bytes = [&](std::size_t m) { return g.pieces[m].extent * out_across * eb; };
    // By way and step parity, like the buffers they use. Declared in this order so that an
    // exception unwinding the ring lets go of the running sums it holds (lent, on threads)
    // before it waits for the next member to let go of the ones it sent.
    Request sending[2][2], receiving[2][2];
    std::vector<Request*> in_flight;
    for (int w = 0; w < ways; ++w) {
      for (int p = 0; p < 2; ++p) in_flight.insert(in_flight.end(), {&receiving[w][p], &sending[w][p]});
    }
    // running + sum, the order the serialized reduce_scatter adds in. The running sum is read
    // where it lies (threads: in the sender's buffer, lent), then let go. Where requests move
    // only in calls, the sends of step s-1 complete here too: their receivers wait for them now.
    const auto add_arrived = [&](int w, std::int64_t s, T* sum, std::int64_t count) {
      Request& r = receiving[w][s % 2];
      r->wait();
      detail::sum_in_order(dtype, {r->received(), sum}, count, sum);
      r.reset();
      if (!comm.moves_only_in_calls()) return;
      for (auto& way : sending) complete(way[(s + 1) % 2]);
    };
    for (std::int64_t s = 0; s <= last; ++s) {
      for (int w = 0; w < ways; ++w) {  // the running sums for the next step
        if (s + 1 <= last && s + 1 > first[w]) {
          receiving[w][(s + 1) % 2] =
              comm.irecv_lent(st.incoming[w][(s + 1) % 2].as<T>(), block_bytes(block(w, s + 1)), from[w], kRingTags[w]);
        }
      }
      if (s == last) {
        T* out = st.out.buffer().as<T>();
        multiply_chunk<T>(st, g.me, chunk(g.me), a, b, out, false, in_flight, ev);
        const std::int64_t count = g.pieces[g.me].extent * out_across;
        for (int w = 0; w < ways; ++w) {
          if (last > first[w]) add_arrived(w, s, out, count);
        }
        break;
      }
      for (int w = 0; w < ways; ++w) {
        if (s < first[w]) continue;
        complete(sending[w][s % 2]);  // the buffer's previous running sum must have left
        const std::size_t m = block(w, s);
        T* sum = st.partial[w][s % 2].as<T>();
        multiply_chunk<T>(st, m, chunk(m), a, b, sum, false, in_flight, ev);
        if (s > first[w]) add_arrived(w, s, sum, g.pieces[m].extent * out_across);
        sending[w][s % 2] = comm.isend(sum, block_bytes(m), to[w], kRingTags[w]);
      }
    }
    for (auto& way : sending) {
      for (Request& r : way) complete(r);
    }
    const std::int64_t whole = product(g.out_local, 0, g.out_local.size());
    ev.bytes_sent = ev.bytes_received = (whole - st.out.elements()) * eb;
  }

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count(); }

  std::int64_t bytes_held() const {
    std::int64_t total = 0;
    const auto buffer = [&](const Buffer& b) {
      if (b.data()) total += buffer_bytes(b.elements(), b.dtype());
    };
    for (const StepState& st : states) {
      buffer(st.out.buffer());
      for (const Buffer* b : {&st.send, &st.recv, &st.chunks, &st.product}) buffer(*b);
      for (int w = 0; w < 2; ++w) {
        for (int i = 0; i < 2; ++i) {
          buffer(st.partial[w][i]);
          buffer(st.incoming[w][i]);
        }
      }
      if (st.einsum) total += st.einsum->workspace_bytes();
      for (const auto& [extent, e] : st.chunk_einsum) total += e->workspace_bytes();
    }
    return total;
  }

  void check_input(const DistTensor& t, const Spec& expected, const char* which) const {
    if (!(t.spec() == expected) || t.dtype() != dtype || t.device() != me) {
      throw UsageError(std::string("the plan starts from ") + which + " = " + format_spec(expected, mesh) + " in " +
                       to_string(dtype) + " on device " + std::to_string(me) + "; got " + format_spec(t.spec(), mesh) +
                       " in " + to_string(t.dtype()) + " on device " + std::to_string(t.device()));
    }
  }

  const DistTensor& run(const DistTensor& a, const DistTensor* b) {
    const DistTensor* current[3] = {&a, b, nullptr};
    bool checked[2] = {false, false};
    events.clear();
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& step = plan.steps[i];
      StepState& st = states[i];
      const int which = multiplies(step.op) ? 0 : step.operand;
      const DistTensor* in = current[which];
      if (!in) throw UsageError("this plan multiplies two operands; pass both to Executor::run");
      if (which < 2 && !checked[which]) {
        check_input(*in, step.from, which == 0 ? "the first operand" : "the second operand");
        checked[which] = true;
      }
      if (multiplies(step.op) && current[1] && !checked[1]) {
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
      current[multiplies(step.op) ? 2 : step.operand] = &st.out;
    }
    const bool matmul = current[2] != nullptr;
    result = matmul ? current[2] : current[0];
    return *result;
  }

  DistTensor release() {
    for (StepState& st : states) {
      if (result == &st.out) {
        result = nullptr;
        return std::move(st.out);
      }
    }
    throw UsageError("Executor::release: no step of this run made its result (run first, and once per release)");
  }
};

Executor::Executor(Communicator& comm, const Plan& plan, const DimSizes& sizes, DType dtype)
    : impl_(std::make_unique<Impl>(comm, plan, sizes, dtype)) {}
Executor::~Executor() = default;

const DistTensor& Executor::run(const DistTensor& a, const DistTensor* b) { return impl_->run(a, b); }

DistTensor Executor::release() { return impl_->release(); }

const std::vector<TraceEvent>& Executor::trace() const { return impl_->events; }

double Executor::clock() const { return impl_->now(); }

std::int64_t Executor::bytes_held() const { return impl_->bytes_held(); }

}  // namespace shardmm
