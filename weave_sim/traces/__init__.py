"""Routing traces: the interchange format, shipped real data, synthetic generators, batch formation, stats.

The one call most code needs is `routing_for(model, num_tokens, ...)`: a batch's expert choices
`[num_tokens, num_moe_layers, top_k]` int64, from a trace or a seeded synthetic generator.
Format and data: traces/README.md; generators and measured statistics: docs/traces.md.
"""
from weave_sim.traces.batches import (decode_batch, decode_indices, prefill_batch, prefill_indices,
                                      request_spans, routing_for)
from weave_sim.traces.format import (RoutingTrace, TraceError, load_trace, resolve_model, save_trace,
                                     validate_trace)
from weave_sim.traces.generators import DEFAULT_IMBALANCE, GENERATORS, fit_params, generate
from weave_sim.traces.shipped import (DEFAULT_TRACE, EXPERT_LOAD_FILE, TRACES_DIR, ExpertLoadProfile,
                                      default_trace, load_expert_load_profiles)
from weave_sim.traces.stats import expert_loads, format_stats_table, token_reuse, trace_stats, zipf_exponent

__all__ = [
    "RoutingTrace", "TraceError", "load_trace", "save_trace", "validate_trace", "resolve_model",
    "GENERATORS", "generate", "fit_params", "DEFAULT_IMBALANCE",
    "prefill_batch", "decode_batch", "prefill_indices", "decode_indices", "request_spans", "routing_for",
    "trace_stats", "format_stats_table", "expert_loads", "token_reuse", "zipf_exponent",
    "DEFAULT_TRACE", "EXPERT_LOAD_FILE", "TRACES_DIR", "ExpertLoadProfile", "default_trace",
    "load_expert_load_profiles",
]
