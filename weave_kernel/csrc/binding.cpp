// The one PYBIND11_MODULE. It fills weave::Params from a dict of plain integers (addresses, sizes) that
// weave_kernel/megakernel.py builds after checking every tensor, and delegates to the C launcher.
// No torch headers: including torch/extension.h costs ~45 s of build per machine; the tensor checks live in
// Python (weave_kernel/validate.py), which also runs them without a GPU in CI.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "calib_params.h"
#include "cost_model.cuh"
#include "params.h"

extern "C" int weave_moe_launch(const weave::Params* params, void* stream, int cooperative);
extern "C" int weave_moe_encode_maps(weave::Params* params, int routed, int shared);
extern "C" int weave_moe_launch_encoded(const weave::Params* params, void* stream, int cooperative, int set_smem_attr);
extern "C" int weave_moe_max_ctas(int device);
extern "C" int weave_moe_instance(const weave::Params* params);
extern "C" const char* weave_cuda_error_string(int code);
extern "C" int weave_static_smem_bytes();
extern "C" int weave_calib_push(const weave::CalibPushArgs* args, int num_ctas, void* stream);
extern "C" int weave_calib_gemm(const weave::CalibGemmArgs* args, int num_ctas, void* stream);
extern "C" int weave_calib_claim(const weave::CalibClaimArgs* args, int num_ctas, void* stream);
extern "C" int weave_calib_signal(const weave::CalibSignalArgs* args, int num_ctas, void* stream);

namespace py = pybind11;

namespace {

template <typename T>
T get(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("weave launch: missing parameter ") + key);
  return d[key].cast<T>();
}

template <typename T>
T* ptr(const py::dict& d, const char* key) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(get<uint64_t>(d, key)));
}

// Every field of Params from the dict MoEMegakernel._params builds (the TMA maps are encoded at launch).
weave::Params read_params(const py::dict& d, int* cooperative) {
  weave::Params p{};
  p.x = ptr<const void>(d, "x");
  p.topk_ids = ptr<const int32_t>(d, "topk_ids");
  p.topk_weights = ptr<const float>(d, "topk_weights");
  p.w13 = ptr<const void>(d, "w13");
  p.w2 = ptr<const void>(d, "w2");
  p.y = ptr<void>(d, "y");
  p.expert_owner = ptr<const int32_t>(d, "expert_owner");
  p.owner_experts = ptr<const int32_t>(d, "owner_experts");
  p.peer_base = ptr<const uint64_t>(d, "peer_base");
  p.off_count_flag = get<int64_t>(d, "off_count_flag");
  p.off_comb_flag = get<int64_t>(d, "off_comb_flag");
  p.off_gcounts = get<int64_t>(d, "off_gcounts");
  p.off_blk_flag = get<int64_t>(d, "off_blk_flag");
  p.off_recv_meta = get<int64_t>(d, "off_recv_meta");
  p.off_comb = get<int64_t>(d, "off_comb");
  p.off_recv_x = get<int64_t>(d, "off_recv_x");
  p.expert_ctr = ptr<int32_t>(d, "expert_ctr");
  p.pair_slot = ptr<int32_t>(d, "pair_slot");
  p.sorted_pair = ptr<int32_t>(d, "sorted_pair");
  p.h = ptr<void>(d, "h");
  p.g0_done = ptr<uint32_t>(d, "g0_done");
  p.sched = ptr<uint32_t>(d, "sched");
  p.grid_bar = ptr<uint32_t>(d, "grid_bar");
  p.err = ptr<int32_t>(d, "err");
  p.timeline = ptr<weave::TimelineRecord>(d, "timeline");
  p.timeline_count = ptr<int32_t>(d, "timeline_count");
  p.cost_table = ptr<const double>(d, "cost_table");
  p.choice = ptr<double>(d, "choice");
  p.rank = get<int32_t>(d, "rank");
  p.world = get<int32_t>(d, "world");
  p.num_tokens = get<int32_t>(d, "num_tokens");
  p.top_k = get<int32_t>(d, "top_k");
  p.hidden = get<int32_t>(d, "hidden");
  p.inter = get<int32_t>(d, "inter");
  p.num_experts = get<int32_t>(d, "num_experts");
  p.num_local_experts = get<int32_t>(d, "num_local_experts");
  p.max_tokens = get<int32_t>(d, "max_tokens");
  p.recv_cap_rows = get<int32_t>(d, "recv_cap_rows");
  p.max_row_blocks = get<int32_t>(d, "max_row_blocks");
  p.num_ctas = get<int32_t>(d, "num_ctas");
  p.num_comm_ctas = get<int32_t>(d, "num_comm_ctas");
  p.policy = get<int32_t>(d, "policy");
  p.timeline_per_cta = get<int32_t>(d, "timeline_per_cta");
  p.dispatch_bulk = get<int32_t>(d, "dispatch_bulk");
  p.steal = get<int32_t>(d, "steal");
  p.epoch_ctr = ptr<uint64_t>(d, "epoch_ctr");
  p.timeout_ns = get<uint64_t>(d, "timeout_ns");
  p.w13s = ptr<const void>(d, "w13s");
  p.w2s = ptr<const void>(d, "w2s");
  p.hs = ptr<void>(d, "hs");
  p.ys = ptr<void>(d, "ys");
  p.shared_scale = ptr<const float>(d, "shared_scale");
  p.g0s_done = ptr<uint32_t>(d, "g0s_done");
  p.inter_shared = get<int32_t>(d, "inter_shared");
  p.shared_first = get<int32_t>(d, "shared_first");
  p.max_shared_blocks = get<int32_t>(d, "max_shared_blocks");
  p.fp8 = get<int32_t>(d, "fp8");
  p.x_q = ptr<void>(d, "x_q");
  p.x_scale = ptr<float>(d, "x_scale");
  p.w13_scale = ptr<const float>(d, "w13_scale");
  p.w2_scale = ptr<const float>(d, "w2_scale");
  p.off_recv_xs = get<int64_t>(d, "off_recv_xs");
  p.h_scale = ptr<float>(d, "h_scale");
  p.w13s_scale = ptr<const float>(d, "w13s_scale");
  p.w2s_scale = ptr<const float>(d, "w2s_scale");
  p.hs_scale = ptr<float>(d, "hs_scale");
  *cooperative = get<int32_t>(d, "cooperative");
  return p;
}

// Invariants the kernel relies on; Python checks them first with friendlier messages.
void check_params(const weave::Params& p) {
  if (p.hidden % 64 || p.inter % 64) throw std::invalid_argument("weave launch: hidden and inter must be multiples of 64");
  // the limits of config.cuh (kMaxRanks, kMaxExperts, kMaxRankExperts; tests/kernel/test_csrc.py checks them)
  if (p.world < 1 || p.world > 8) throw std::invalid_argument("weave launch: world size must be in [1, 8]");
  if (p.dispatch_bulk < 0 || p.dispatch_bulk > weave::kMaxDispatchIssuers)
    throw std::invalid_argument("weave launch: dispatch_bulk (issuing warps) must be in [0, kMaxDispatchIssuers]");
  if (p.num_experts > 512 || p.num_experts != p.world * p.num_local_experts)
    throw std::invalid_argument("weave launch: num_experts must equal world * num_local_experts and be <= 512");
  if (p.world * p.num_experts > 2048)
    throw std::invalid_argument("weave launch: world * num_experts must be <= 2048 (the kernel's count matrix)");
  if (p.num_tokens > p.max_tokens) throw std::invalid_argument("weave launch: num_tokens > max_tokens");
  if (p.epoch_ctr == nullptr) throw std::invalid_argument("weave launch: epoch_ctr (the device epoch counter) is null");
  if (p.policy == weave::kPolicyStatic && (p.num_comm_ctas < 1 || p.num_comm_ctas >= p.num_ctas))
    throw std::invalid_argument("weave launch: static policy needs 1 <= num_comm_ctas < num_ctas");
  if (p.policy == weave::kPolicyWeave) {
    if (p.cost_table == nullptr || p.choice == nullptr)
      throw std::invalid_argument("weave launch: weave policy needs the cost table and the choice buffer");
    if (p.num_comm_ctas < 0 || p.num_comm_ctas >= p.num_ctas || p.num_ctas < 2)
      throw std::invalid_argument("weave launch: weave policy needs 0 <= num_comm_ctas < num_ctas (0 = choose)");
  }
  if (p.inter_shared < 0 || p.inter_shared % 64)
    throw std::invalid_argument("weave launch: inter_shared (the shared expert's width) must be 0 or a multiple of 64");
  if (p.inter_shared > 0) {
    if (p.w13s == nullptr || p.w2s == nullptr || p.hs == nullptr || p.ys == nullptr || p.g0s_done == nullptr)
      throw std::invalid_argument("weave launch: a shared expert needs w13s, w2s, hs, ys and g0s_done");
    if (p.max_shared_blocks * 128 < p.max_tokens)
      throw std::invalid_argument("weave launch: max_shared_blocks must cover max_tokens");
    if (p.shared_first != 0 && p.shared_first != 1)
      throw std::invalid_argument("weave launch: shared_first must be 0 or 1");
  }
  if (p.steal != 0 && p.steal != 1) throw std::invalid_argument("weave launch: steal must be 0 or 1");
  if (p.policy < weave::kPolicySequential || p.policy > weave::kPolicyWeave)
    throw std::invalid_argument("weave launch: unknown policy id");
  if (p.num_ctas < p.world)  // CTA g pushes this rank's counts to rank g
    throw std::invalid_argument("weave launch: num_ctas must be >= the world size");
  if (p.fp8 != 0 && p.fp8 != 1) throw std::invalid_argument("weave launch: fp8 must be 0 or 1");
  if (p.fp8) {
    if (p.hidden % 128 || p.inter % 128 || p.inter_shared % 128)
      throw std::invalid_argument("weave launch: FP8 experts need hidden, inter and inter_shared multiples of 128");
    if (p.inter_shared > 0 && (p.w13s_scale == nullptr || p.w2s_scale == nullptr || p.hs_scale == nullptr))
      throw std::invalid_argument("weave launch: an FP8 shared expert needs w13s_scale, w2s_scale and hs_scale");
    if (p.x_q == nullptr || p.x_scale == nullptr || p.w13_scale == nullptr || p.w2_scale == nullptr ||
        p.h_scale == nullptr || p.off_recv_xs <= 0)
      throw std::invalid_argument("weave launch: FP8 experts need x_q, x_scale, w13_scale, w2_scale, h_scale, off_recv_xs");
    if (reinterpret_cast<uintptr_t>(p.x) % 16)
      throw std::invalid_argument("weave launch: FP8 experts need x 16-byte aligned");
  }
}

void launch_check(int err) {
  if (err != 0) throw std::runtime_error(std::string("weave launch failed: ") + weave_cuda_error_string(err));
}

// One launch from a full parameter dict (tests, tools); MoEMegakernel launches through a Launcher.
void launch(const py::dict& d, uint64_t stream) {
  int cooperative = 0;
  weave::Params p = read_params(d, &cooperative);
  check_params(p);
  launch_check(weave_moe_launch(&p, reinterpret_cast<void*>(static_cast<uintptr_t>(stream)), cooperative));
}

// A layer's launches without the per-call dict: built once from a full dict (the buffers, geometry and options of
// the layer), it takes only what changes between calls, as plain integers, and re-encodes a weight tensor's TMA
// map only when the tensor's address changes (the shapes are the layer's); tests/kernel/host_cost.py times both
// paths. Every call runs check_params on the whole Params, as launch does.
class Launcher {
 public:
  explicit Launcher(const py::dict& d) {
    p_ = read_params(d, &cooperative_);
    check_params(p_);
  }

  void launch(uint64_t x, uint64_t topk_ids, uint64_t topk_weights, uint64_t w13, uint64_t w2, uint64_t y,
              int32_t num_tokens, int32_t policy, int32_t num_comm_ctas, int32_t steal, uint64_t timeline,
              uint64_t w13s, uint64_t w2s, uint64_t shared_scale, int32_t inter_shared, int32_t shared_first,
              uint64_t x_scale, uint64_t w13_scale, uint64_t w2_scale, uint64_t w13s_scale, uint64_t w2s_scale,
              uint64_t stream) {
    weave::Params& p = p_;
    p.x = as_ptr<const void>(x);
    p.topk_ids = as_ptr<const int32_t>(topk_ids);
    p.topk_weights = as_ptr<const float>(topk_weights);
    p.w13 = as_ptr<const void>(w13);
    p.w2 = as_ptr<const void>(w2);
    p.y = as_ptr<void>(y);
    p.num_tokens = num_tokens;
    p.policy = policy;
    p.num_comm_ctas = num_comm_ctas;
    p.steal = steal;
    p.timeline = as_ptr<weave::TimelineRecord>(timeline);
    p.w13s = as_ptr<const void>(w13s);
    p.w2s = as_ptr<const void>(w2s);
    p.shared_scale = as_ptr<const float>(shared_scale);
    p.inter_shared = inter_shared;
    p.shared_first = shared_first;
    p.x_scale = as_ptr<float>(x_scale);
    p.w13_scale = as_ptr<const float>(w13_scale);
    p.w2_scale = as_ptr<const float>(w2_scale);
    p.w13s_scale = as_ptr<const float>(w13s_scale);
    p.w2s_scale = as_ptr<const float>(w2s_scale);
    check_params(p);
    const bool routed = p.w13 != maps_w13_ || p.w2 != maps_w2_;
    const bool shared = inter_shared > 0 && (p.w13s != maps_w13s_ || p.w2s != maps_w2s_ || inter_shared != maps_is_);
    if (routed || shared) {
      if (routed) maps_w13_ = maps_w2_ = nullptr;  // stay unset if the encode fails
      if (shared) maps_w13s_ = maps_w2s_ = nullptr;
      launch_check(weave_moe_encode_maps(&p, routed ? 1 : 0, shared ? 1 : 0));
      if (routed) maps_w13_ = p.w13, maps_w2_ = p.w2;
      if (shared) maps_w13s_ = p.w13s, maps_w2s_ = p.w2s, maps_is_ = inter_shared;
    }
    const int inst = weave_moe_instance(&p);
    launch_check(weave_moe_launch_encoded(&p, reinterpret_cast<void*>(static_cast<uintptr_t>(stream)), cooperative_,
                                          attr_set_[inst] ? 0 : 1));
    attr_set_[inst] = true;
  }

 private:
  template <typename T>
  static T* as_ptr(uint64_t v) { return reinterpret_cast<T*>(static_cast<uintptr_t>(v)); }
  weave::Params p_{};
  int cooperative_ = 1;
  const void* maps_w13_ = nullptr;
  const void* maps_w2_ = nullptr;
  const void* maps_w13s_ = nullptr;
  const void* maps_w2s_ = nullptr;
  int32_t maps_is_ = 0;
  bool attr_set_[4] = {false, false, false, false};  // per kernel instantiation (launch.cu)
};

py::dict timeline_layout() {
  py::dict d;
  d["itemsize"] = sizeof(weave::TimelineRecord);
  d["start_ns"] = offsetof(weave::TimelineRecord, start_ns);
  d["end_ns"] = offsetof(weave::TimelineRecord, end_ns);
  d["sm"] = offsetof(weave::TimelineRecord, sm);
  d["role"] = offsetof(weave::TimelineRecord, role);
  d["kind"] = offsetof(weave::TimelineRecord, kind);
  d["arg0"] = offsetof(weave::TimelineRecord, arg0);
  d["arg1"] = offsetof(weave::TimelineRecord, arg1);
  return d;
}


// ---- calibration microbenchmarks (calib.cuh; weave_kernel/calibrate.py checks the tensors) ----------------

// The fields of Params the calibration kernels' spins, grid barrier and sym() read; the rest stay null.
weave::Params calib_sync(const py::dict& d, int num_ctas) {
  weave::Params p{};
  p.err = ptr<int32_t>(d, "err");
  p.timeout_ns = get<uint64_t>(d, "timeout_ns");
  p.num_ctas = num_ctas;
  if (d.contains("grid_bar")) p.grid_bar = ptr<uint32_t>(d, "grid_bar");
  if (d.contains("peer_base")) p.peer_base = ptr<const uint64_t>(d, "peer_base");
  if (d.contains("dispatch_bulk")) p.dispatch_bulk = get<int32_t>(d, "dispatch_bulk");
  if (p.err == nullptr || p.timeout_ns == 0) throw std::invalid_argument("weave calib: needs err and timeout_ns > 0");
  return p;
}

void calib_check(int err, const char* what) {
  if (err != 0) throw std::runtime_error(std::string(what) + " failed: " + weave_cuda_error_string(err));
}

void calib_push(const py::dict& d, int num_ctas, uint64_t stream) {
  weave::CalibPushArgs a{};
  a.src = ptr<const void>(d, "src");
  a.off_start_flag = get<int64_t>(d, "off_start_flag");
  a.off_blk_flag = get<int64_t>(d, "off_blk_flag");
  a.off_dst = get<int64_t>(d, "off_dst");
  a.slot_bytes = get<int64_t>(d, "slot_bytes");
  a.times = ptr<uint64_t>(d, "times");
  a.rank = get<int32_t>(d, "rank");
  a.world = get<int32_t>(d, "world");
  a.num_peers = get<int32_t>(d, "num_peers");
  a.num_blocks = get<int32_t>(d, "num_blocks");
  a.block_rows = get<int32_t>(d, "block_rows");
  a.row_chunks = get<int32_t>(d, "row_chunks");
  a.epoch = get<uint64_t>(d, "epoch");
  a.sync = calib_sync(d, num_ctas);
  if (a.sync.peer_base == nullptr) throw std::invalid_argument("weave calib push: needs peer_base");
  if (a.world < 2 || a.world > 8 || a.rank < 0 || a.rank >= a.world || a.num_peers < 1 || a.num_peers >= a.world)
    throw std::invalid_argument("weave calib push: needs 2 <= world <= 8 and 1 <= num_peers < world");
  if (a.num_blocks < 1 || a.num_blocks > weave::kCalibMaxBlocks || a.block_rows < 1 || a.row_chunks < 1 ||
      a.epoch == 0 || num_ctas < 1)
    throw std::invalid_argument("weave calib push: bad sizes");
  const int64_t rows_per_peer = static_cast<int64_t>((a.num_blocks + a.num_peers - 1) / a.num_peers) * a.block_rows;
  if (rows_per_peer * a.row_chunks * 16 > a.slot_bytes)
    throw std::invalid_argument("weave calib push: a peer's rows do not fit its receive slot");
  calib_check(weave_calib_push(&a, num_ctas, reinterpret_cast<void*>(static_cast<uintptr_t>(stream))), "calib push");
}

void calib_gemm(const py::dict& d, int num_ctas, uint64_t stream) {
  weave::CalibGemmArgs a{};
  a.a = ptr<const void>(d, "a");
  a.b = ptr<const void>(d, "b");
  a.c = ptr<void>(d, "c");
  a.tickets = ptr<uint32_t>(d, "tickets");
  a.num_experts = get<int32_t>(d, "num_experts");
  a.rows_per_expert = get<int32_t>(d, "rows_per_expert");
  a.n = get<int32_t>(d, "n");
  a.k = get<int32_t>(d, "k");
  a.num_chunks = get<int32_t>(d, "num_chunks");
  a.sync = calib_sync(d, num_ctas);
  if (a.k % 64 || a.n % 64 || a.k < 64 || a.n < 64)
    throw std::invalid_argument("weave calib gemm: n and k must be positive multiples of 64");
  if (a.num_experts < 1 || a.rows_per_expert < 1 || a.num_chunks < 1 || num_ctas < 1)
    throw std::invalid_argument("weave calib gemm: bad sizes");
  if (static_cast<int64_t>(a.n) * a.k >= (int64_t{1} << 31) || 128 * static_cast<int64_t>(a.k) >= (int64_t{1} << 31))
    throw std::invalid_argument("weave calib gemm: 32-bit operand offsets overflow");
  if (a.num_chunks > 1 && a.sync.grid_bar == nullptr)
    throw std::invalid_argument("weave calib gemm: chunks need grid_bar");
  calib_check(weave_calib_gemm(&a, num_ctas, reinterpret_cast<void*>(static_cast<uintptr_t>(stream))), "calib gemm");
}

void calib_claim(const py::dict& d, int num_ctas, uint64_t stream) {
  weave::CalibClaimArgs a{};
  a.counter = ptr<uint32_t>(d, "counter");
  a.times = ptr<uint64_t>(d, "times");
  a.claims = ptr<int32_t>(d, "claims");
  a.total_tickets = get<int32_t>(d, "total_tickets");
  a.sync = calib_sync(d, num_ctas);
  if (a.total_tickets < 0 || num_ctas < 1) throw std::invalid_argument("weave calib claim: bad sizes");
  calib_check(weave_calib_claim(&a, num_ctas, reinterpret_cast<void*>(static_cast<uintptr_t>(stream))), "calib claim");
}

void calib_signal(const py::dict& d, int num_ctas, uint64_t stream) {
  weave::CalibSignalArgs a{};
  const py::list wait = get<py::list>(d, "wait"), post = get<py::list>(d, "post");
  if (num_ctas < 1 || num_ctas > 2 || static_cast<int>(wait.size()) != num_ctas || static_cast<int>(post.size()) != num_ctas)
    throw std::invalid_argument("weave calib signal: 1 or 2 CTAs, one wait and one post flag each");
  for (int i = 0; i < num_ctas; ++i) {
    a.wait[i] = reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(wait[i].cast<uint64_t>()));
    a.post[i] = reinterpret_cast<uint64_t*>(static_cast<uintptr_t>(post[i].cast<uint64_t>()));
  }
  a.times = ptr<uint64_t>(d, "times");
  a.base = get<uint64_t>(d, "base");
  a.role0 = get<int32_t>(d, "role0");
  a.rounds = get<int32_t>(d, "rounds");
  a.warmup = get<int32_t>(d, "warmup");
  a.sync = calib_sync(d, num_ctas);
  if (a.role0 < 0 || a.role0 + num_ctas > 2 || a.rounds < 1 || a.warmup < 0 || a.warmup >= a.rounds)
    throw std::invalid_argument("weave calib signal: roles in {0, 1}, 0 <= warmup < rounds");
  calib_check(weave_calib_signal(&a, num_ctas, reinterpret_cast<void*>(static_cast<uintptr_t>(stream))), "calib signal");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Weave MoE megakernel launcher (raw addresses; tensors are checked in Python)";
  m.def("launch", &launch, py::arg("params"), py::arg("stream"));
  py::class_<Launcher>(m, "Launcher")
      .def(py::init<const py::dict&>(), py::arg("params"))
      .def("launch", &Launcher::launch);
  m.def("max_ctas", &weave_moe_max_ctas, py::arg("device"));
  m.def("timeline_layout", &timeline_layout);
  m.def("static_smem_bytes", &weave_static_smem_bytes);
  m.attr("block_m") = 128;
  m.attr("block_n") = 256;
  m.attr("dim_align") = 64;
  m.attr("max_experts") = 512;
  m.attr("max_ranks") = 8;
  m.attr("max_rank_experts") = 2048;
  m.attr("cost_table_len") = weave::cost_table::kLen;
  m.attr("cost_table_version") = weave::cost_table::kVersion;
  m.attr("choice_len") = static_cast<int>(weave::kChoiceLen);
  m.attr("fp8_experts") = 2;  // Launcher.launch takes x_scale, w13_scale, w2_scale, w13s_scale, w2s_scale (2: FP8
                              // shared experts too; builds before FP8: no attribute)
  m.def("calib_push", &calib_push, py::arg("params"), py::arg("num_ctas"), py::arg("stream"));
  m.def("calib_gemm", &calib_gemm, py::arg("params"), py::arg("num_ctas"), py::arg("stream"));
  m.def("calib_claim", &calib_claim, py::arg("params"), py::arg("num_ctas"), py::arg("stream"));
  m.def("calib_signal", &calib_signal, py::arg("params"), py::arg("num_ctas"), py::arg("stream"));
  m.attr("calib_max_blocks") = weave::kCalibMaxBlocks;
}
