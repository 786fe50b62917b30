// Host driver for tests/kernel/test_weave_policy.py: builds weave_kernel/csrc/choice.cuh (the weave policy's
// parallel spatial choice) as plain C++ and checks it against cost_model.cuh's serial volumes_for_gpu /
// choose_split on counts read from stdin. The device code splits the work over kThreads threads and reduces
// in a tree; here the same pieces run for several "thread" counts and reduction orders.
// stdin: the table (kLen doubles), the number of cases, then per case "G E hidden ffn", owner [E],
// pair counts [G*E] (source-major). dispatch_rows are pair-based (rows of s for experts owned by d).
// stdout per (case, gpu): "c K time same_volumes same_choice".
#include <cstdio>
#include <cstring>
#include <vector>

#include "choice.cuh"
#include "host_input.h"

using namespace weave;

static bool same_volumes(const CostVolumes& a, const CostVolumes& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

int main() {
  using namespace weave::cost_table;
  std::vector<double> table;
  if (!host_input::read_table(table)) return 1;
  int num_cases = 0;
  if (std::scanf("%d", &num_cases) != 1) return 1;
  for (int i = 0; i < num_cases; ++i) {
    host_input::CaseHeader h;
    if (!host_input::read_case_header(h)) return 1;
    const int g = h.g, e = h.e, hidden = h.hidden, ffn = h.ffn;
    const std::vector<int>& owner = h.owner;
    std::vector<int> cnt((size_t)g * e);
    std::vector<int64_t> pairs((size_t)g * e), rows((size_t)g * g, 0);
    for (size_t j = 0; j < pairs.size(); ++j) {
      std::scanf("%d", &cnt[j]);
      pairs[j] = cnt[j];
    }
    for (int s = 0; s < g; ++s)
      for (int x = 0; x < e; ++x) rows[(size_t)s * g + owner[x]] += pairs[(size_t)s * e + x];
    const int c_max = (int)table[kOffHeader + kMaxCommSms];  // the kernel's grid: c in [1, max_comm_sms]
    const int64_t tile_rows = (int64_t)table[kOffHeader + kTileRows];
    for (int gpu = 0; gpu < g; ++gpu) {
      const CostVolumes ref = volumes_for_gpu(table.data(), gpu, g, e, owner.data(), pairs.data(), rows.data(),
                                              hidden, ffn);
      const CostChoice want = choose_split(table.data(), ref, 1, c_max);
      bool vol_ok = true, choice_ok = true;
      for (int threads : {1, 7, 32, 256}) {
        // volumes: per-thread strided sums, then a tree over threads (any order: integer sums are exact)
        std::vector<VolumeSums> part(threads, VolumeSums{0, 0, 0, 0, 0});
        for (int t = 0; t < threads; ++t)
          for (int x = t; x < e; x += threads) {
            int64_t r = 0;
            for (int s = 0; s < g; ++s) r += cnt[(size_t)s * e + x];
            accumulate_expert(part[t], r, cnt[(size_t)gpu * e + x], owner[x] == gpu, tile_rows);
          }
        for (int stride = 1; stride < threads; stride *= 2)
          for (int t = 0; t + stride < threads; t += 2 * stride) add_sums(part[t], part[t + stride]);
        const CostVolumes v = volumes_from_sums(table.data(), part[0], hidden, ffn);
        vol_ok = vol_ok && same_volumes(v, ref);
        // argmin: per-thread strided slices, combined in reverse order with the tie-break
        std::vector<GridBest> best(threads);
        for (int t = 0; t < threads; ++t) best[t] = grid_slice_best(table.data(), v, 1, c_max, t, threads);
        GridBest b = grid_none();
        for (int t = threads - 1; t >= 0; --t)
          if (grid_better(best[t], b)) b = best[t];
        const CostChoice got = grid_to_choice(table.data(), b, 1);
        choice_ok = choice_ok && got.num_comm_sms == want.num_comm_sms && got.num_chunks == want.num_chunks &&
                    got.time_ns == want.time_ns;
      }
      std::printf("%d %d %.17g %d %d\n", want.num_comm_sms, want.num_chunks, want.time_ns, (int)vol_ok,
                  (int)choice_ok);
    }
  }
  return 0;
}
