"""The SimPy engine: task DAG (dag), hardware (hardware), scheduler core (core), policies, metrics, outputs.

Public API: simulate_layer, simulate_model, sweep, write_chrome_trace, plot_gantt, plot_latency_vs_c.
"""
from .metrics import LayerResult
from .plan import Plan
from .run import ModelResult, SimOptions, SweepTable, simulate_layer, simulate_model, sweep

__all__ = ["LayerResult", "ModelResult", "Plan", "SimOptions", "SweepTable", "simulate_layer",
           "simulate_model", "sweep"]
