"""The SimPy engine: task DAG (dag), hardware (hardware), scheduler core (core), policies, metrics, outputs.

Public API: simulate_layer, simulate_model, sweep, write_chrome_trace, plot_gantt, plot_latency_vs_c.
"""
from .metrics import LayerResult
from .plan import Plan
from .plots import plot_gantt, plot_latency_vs_c
from .policies import policy_names
from .run import ModelResult, SimOptions, SweepTable, simulate_layer, simulate_model, sweep
from .timeline import write_chrome_trace

__all__ = ["LayerResult", "ModelResult", "Plan", "SimOptions", "SweepTable", "plot_gantt", "plot_latency_vs_c",
           "policy_names", "simulate_layer", "simulate_model", "sweep", "write_chrome_trace"]
