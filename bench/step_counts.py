"""What one training step runs, counted two ways (bench/train_step.py's ops and kernels columns).

- ops: the aten ops the step dispatches (a TorchDispatchMode; views and metadata ops included). Eager code only:
  under a dispatch mode dynamo steps aside and a compiled function runs its Python eagerly, so a compiled run's
  ops are its eager twin's.
- kernels: the kernels the step runs, counted as bench/decode_kernels.py counts a compiled decode step, so eager and
  compiled runs compare: torch.profiler's outermost aten ops (a composite op once, not its parts), views and
  allocations apart (they launch nothing), plus inductor's generated kernels (its per-kernel profiling turned on,
  which must be so when the graphs are compiled: the warm-up step runs under `kernel_profiling()`).
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LIBRARIES = ("aten::", "mkldnn::", "mkl::")
# bench/decode_kernels.py's list (not imported: that file imports this checkout's minigrpo, and the anchor run of
# train_step.py must import only the other checkout's)
NO_KERNEL = {"aten::view", "aten::as_strided", "aten::as_strided_", "aten::reshape", "aten::_reshape_alias",
             "aten::empty", "aten::empty_strided", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze",
             "aten::slice", "aten::select", "aten::alias", "aten::detach", "aten::resolve_conj", "aten::resolve_neg"}


def count_ops(fn):
    """Ops one call of fn dispatches (aten ops: what a CPU runs as kernels; views and metadata ops included)."""

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def kernel_profiling():
    """Inductor's generated CPU kernels record themselves in torch.profiler (set while they are compiled)."""
    import torch._inductor.config as inductor_config
    return inductor_config.patch({"cpp.enable_kernel_profile": True})


def count_kernels(fn):
    """Kernels one call of fn runs (the module docstring): outermost library ops but views, + inductor's kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    n = 0
    for e in prof.events():
        library = e.name.startswith(LIBRARIES) and e.name not in NO_KERNEL
        nested = e.cpu_parent is not None and e.cpu_parent.name.startswith(LIBRARIES)
        n += "cpp_fused" in e.name or (library and not nested)
    return n
