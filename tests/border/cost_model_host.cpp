// Host driver for tests/border/test_cost_model_border.py: builds weave_kernel/csrc/cost_model.cuh as plain
// C++ and answers on stdout what the kernel's scheduler would choose for counts read from stdin.
#include <cstdio>
#include <vector>

#include "cost_model.cuh"
#include "host_input.h"

int main() {
  using namespace weave::cost_table;
  std::printf("layout %d %d %d %d %d %d %d %d\n", kVersion, kHeaderLen, kMaxSms, kNumRowBuckets,
              kMaxChunkChoices, kOffBw, kOffEff, kLen);
  std::vector<double> table;
  if (!host_input::read_table(table)) return 1;
  int num_cases = 0;
  if (std::scanf("%d", &num_cases) != 1) return 1;
  for (int i = 0; i < num_cases; ++i) {
    host_input::CaseHeader h;
    if (!host_input::read_case_header(h)) return 1;
    const int g = h.g, e = h.e, hidden = h.hidden, ffn = h.ffn;
    const std::vector<int>& owner = h.owner;
    std::vector<int64_t> pairs((size_t)g * e), rows((size_t)g * g);
    for (int64_t& p : pairs) std::scanf("%lld", (long long*)&p);
    for (int64_t& r : rows) std::scanf("%lld", (long long*)&r);
    const int c_max = (int)table[kOffHeader + kMaxCommSms];  // the grid's end, as in the kernel
    for (int gpu = 0; gpu < g; ++gpu) {
      weave::CostVolumes v =
          weave::volumes_for_gpu(table.data(), gpu, g, e, owner.data(), pairs.data(), rows.data(), hidden, ffn);
      weave::CostChoice c = weave::choose_split(table.data(), v, 1, c_max);
      std::printf("%d %d %.17g\n", c.num_comm_sms, c.num_chunks, c.time_ns);
    }
  }
  return 0;
}
