"""weave_sim: a discrete-event model of expert-parallel MoE layers on multi-GPU nodes.

Never imports torch: the simulator installs and runs on any CPU machine.
"""
__version__ = "0.1.0"
