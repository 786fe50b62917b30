"""weave_kernel: the persistent MoE megakernel (dispatch, expert SwiGLU FFN, combine) across GPUs."""
