// stdin of the host test drivers (tests/border/cost_model_host.cpp, tests/kernel/choice_host.cpp): the cost
// table (kLen doubles), the number of cases, then per case "G E hidden ffn", owner [E], and per-driver data.
#pragma once
#include <cstdio>
#include <vector>

#include "cost_model.cuh"

namespace host_input {

inline bool read_table(std::vector<double>& table) {
  table.resize(weave::cost_table::kLen);
  for (double& x : table)
    if (std::scanf("%lf", &x) != 1) return false;
  return true;
}

struct CaseHeader {
  int g = 0, e = 0, hidden = 0, ffn = 0;
  std::vector<int> owner;  // [E]
};

inline bool read_case_header(CaseHeader& c) {
  if (std::scanf("%d %d %d %d", &c.g, &c.e, &c.hidden, &c.ffn) != 4) return false;
  c.owner.resize(c.e);
  for (int& o : c.owner)
    if (std::scanf("%d", &o) != 1) return false;
  return true;
}

}  // namespace host_input
