"""Make the real sglang modules importable on a CPU-only machine (tests only; never imported by flashtree itself).

Three things stand between a CPU box and `import sglang.srt...`:
  * sgl_kernel (CUDA-only wheel): a stand-in package whose every attribute chain resolves (MagicMock-backed), registered
    in sys.modules before sglang is imported. Code that would call into it does nothing useful on CPU; tests must not
    rely on it.
  * torchvision (CUDA-linked PyPI build): importing it on CPU torch dies registering fake kernels for ops that do not
    exist. Import it once with torch.library.register_fake tolerant of exactly that error.
  * sglang's Triton tree kernels: they run under TRITON_INTERPRET=1 (set before triton/sglang import) once the module
    flag `_is_xpu` is forced true (see force_triton_tree_kernels).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SGLANG_PLUGINS", "none-for-tests")  # sglang's own load_plugins() stays away from flashtree


class _AnyAttrModule(types.ModuleType):
    """A module whose missing attributes are MagicMocks (so `from sgl_kernel.x import y` and `a.b.c` resolve)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path, target=None):
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _AnyAttrModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+flashtree-cpu-stand-in"
        return module

    def exec_module(self, module):
        pass


def _install_sgl_kernel_stand_in() -> None:
    if any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        return
    try:  # a real sgl_kernel (GPU machine) wins
        importlib.util.find_spec("sgl_kernel")
        if importlib.util.find_spec("sgl_kernel") is not None:
            return
    except (ImportError, ValueError):
        pass
    sys.meta_path.insert(0, _StandInFinder("sgl_kernel"))


def _import_torchvision_on_cpu() -> None:
    if "torchvision" in sys.modules:
        return
    import torch

    original = torch.library.register_fake

    def tolerant_register_fake(op, *args, **kwargs):
        inner = original(op, *args, **kwargs)
        if not callable(inner):
            return inner

        def apply(fn):
            try:
                return inner(fn)
            except RuntimeError as err:
                if "does not exist" in str(err):
                    return fn
                raise

        return apply

    torch.library.register_fake = tolerant_register_fake
    try:
        try:
            import torchvision  # noqa: F401
        except RuntimeError as err:
            if "does not exist" not in str(err):
                raise
    finally:
        torch.library.register_fake = original


def prepare() -> None:
    """Call before importing anything from sglang."""
    _install_sgl_kernel_stand_in()
    _import_torchvision_on_cpu()


def force_triton_tree_kernels() -> None:
    """Route sglang's tree kernels (build_tree_kernel_efficient, verify_tree_greedy_func) to their Triton versions."""
    for name in ("sglang.srt.speculative.eagle_utils", "sglang.kernels.ops.speculative.spec_tree"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "_is_xpu"):
            mod._is_xpu = True


@contextlib.contextmanager
def cpu_model_construction():
    """Around building sglang's draft models on CPU: CPU RoPE (the CUDA/vllm kernels are absent), the server exec
    config 0.5.17's layers read at construction (a stand-in when none is published), TP 1 rank 0."""
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt import runtime_context
    from sglang.srt.runtime_context import get_parallel

    patched = [(rope_base, "_is_cpu", rope_base._is_cpu)]
    rope_base._is_cpu = True
    if hasattr(runtime_context, "get_exec"):
        try:
            runtime_context.get_exec().deterministic
        except ValueError:  # 0.5.17: unpublished
            det = types.SimpleNamespace(rl_on_policy_target=None)
            stand_in = lambda: types.SimpleNamespace(deterministic=det)  # noqa: E731
            for mod in [m for n, m in sys.modules.items() if n.startswith("sglang.") and hasattr(m, "get_exec")]:
                patched.append((mod, "get_exec", mod.get_exec))
                mod.get_exec = stand_in
    try:
        with get_parallel().override(tp_size=1, tp_rank=0):
            yield
    finally:
        for mod, name, value in patched:
            setattr(mod, name, value)
