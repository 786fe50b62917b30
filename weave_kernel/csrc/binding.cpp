// The one PYBIND11_MODULE. It fills weave::Params from a dict of plain integers (addresses, sizes) that
// weave_kernel/megakernel.py builds after checking every tensor, and delegates to the C launcher.
// No torch headers: including torch/extension.h costs ~45 s of build per machine; the tensor checks live in
// Python (weave_kernel/validate.py), which also runs them without a GPU in CI.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cost_model.cuh"
#include "params.h"

extern "C" int weave_moe_launch(const weave::Params* params, void* stream);
extern "C" int weave_moe_max_ctas(int device);
extern "C" const char* weave_cuda_error_string(int code);
extern "C" int weave_static_smem_bytes();

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

void launch(const py::dict& d, uint64_t stream) {
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
  p.cta_hist = ptr<int32_t>(d, "cta_hist");
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
  p.epoch = get<uint64_t>(d, "epoch");
  p.timeout_ns = get<uint64_t>(d, "timeout_ns");
  // Invariants the kernel relies on; Python checks them first with friendlier messages.
  if (p.hidden % 64 || p.inter % 64) throw std::invalid_argument("weave launch: hidden and inter must be multiples of 64");
  if (p.world < 1 || p.world > 8) throw std::invalid_argument("weave launch: world size must be in [1, 8]");
  if (p.num_experts > 512 || p.num_experts != p.world * p.num_local_experts)
    throw std::invalid_argument("weave launch: num_experts must equal world * num_local_experts and be <= 512");
  if (p.num_tokens > p.max_tokens) throw std::invalid_argument("weave launch: num_tokens > max_tokens");
  if (p.epoch == 0) throw std::invalid_argument("weave launch: epoch must be >= 1");
  if (p.policy == weave::kPolicyStatic && (p.num_comm_ctas < 1 || p.num_comm_ctas >= p.num_ctas))
    throw std::invalid_argument("weave launch: static policy needs 1 <= num_comm_ctas < num_ctas");
  if (p.policy == weave::kPolicyWeave) {
    if (p.cost_table == nullptr || p.choice == nullptr)
      throw std::invalid_argument("weave launch: weave policy needs the cost table and the choice buffer");
    if (p.num_comm_ctas < 0 || p.num_comm_ctas >= p.num_ctas || p.num_ctas < 2)
      throw std::invalid_argument("weave launch: weave policy needs 0 <= num_comm_ctas < num_ctas (0 = choose)");
  }
  if (p.policy < weave::kPolicySequential || p.policy > weave::kPolicyWeave)
    throw std::invalid_argument("weave launch: unknown policy id");
  const int err = weave_moe_launch(&p, reinterpret_cast<void*>(static_cast<uintptr_t>(stream)));
  if (err != 0) throw std::runtime_error(std::string("weave launch failed: ") + weave_cuda_error_string(err));
}

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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Weave MoE megakernel launcher (raw addresses; tensors are checked in Python)";
  m.def("launch", &launch, py::arg("params"), py::arg("stream"));
  m.def("max_ctas", &weave_moe_max_ctas, py::arg("device"));
  m.def("timeline_layout", &timeline_layout);
  m.def("static_smem_bytes", &weave_static_smem_bytes);
  m.attr("block_m") = 128;
  m.attr("block_n") = 256;
  m.attr("dim_align") = 64;
  m.attr("max_experts") = 512;
  m.attr("max_ranks") = 8;
  m.attr("cost_table_len") = weave::cost_table::kLen;
  m.attr("cost_table_version") = weave::cost_table::kVersion;
  m.attr("choice_len") = static_cast<int>(weave::kChoiceLen);
}
