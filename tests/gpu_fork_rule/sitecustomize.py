"""The GPU machine's fork rule, emulated on any machine: tests/conftest.py puts this folder first on PYTHONPATH, so
every Python process the tests start (nbval's kernels, spawned workers, torchrun's ranks) loads it at start-up.

With a visible GPU, a process's first backward starts autograd's device threads, named pt_autograd_<device>
(torch/csrc/autograd/engine.cpp), and a child forked after that raises torch's error below in its own first
backward. Emulated: the first torch.autograd.backward or .grad call (Tensor.backward calls the former) starts a
thread named pt_autograd_0, and a child forked from a process holding it raises that error in its first backward.
DataLoader workers forked after a backward stay fine, as on a GPU: they run none."""
from __future__ import annotations

import ctypes
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading

MESSAGE = ("Unable to handle autograd's threading in combination with fork-based multiprocessing. "
           "See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")
PR_SET_NAME = 15  # prctl(2): names the calling OS thread, as c10::setThreadName does
STATE = {"threads": False, "poisoned": False, "backwards": 0}


def _start_device_thread() -> None:
    if STATE["threads"]:
        return
    STATE["threads"] = True
    named = threading.Event()

    def device_thread():
        try:
            ctypes.CDLL(None).prctl(PR_SET_NAME, b"pt_autograd_0", 0, 0, 0)
        finally:
            named.set()
        threading.Event().wait()  # idles for the life of the process, as autograd's device threads do

    threading.Thread(target=device_thread, name="pt_autograd_0", daemon=True).start()
    named.wait()


def _after_fork_in_child() -> None:
    if STATE["threads"]:  # the parent had run a backward: this child's autograd is unusable
        STATE["poisoned"], STATE["threads"] = True, False  # threads do not survive a fork


def _guarded(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if STATE["poisoned"]:
            raise RuntimeError(MESSAGE)
        STATE["backwards"] += 1
        _start_device_thread()
        return fn(*args, **kwargs)
    call.__fork_rule__ = True
    return call


def install(torch) -> None:
    """Guard torch.autograd.backward and .grad in this process (idempotent)."""
    if getattr(torch.autograd.backward, "__fork_rule__", False):
        return
    torch.autograd.backward = _guarded(torch.autograd.backward)
    torch.autograd.grad = _guarded(torch.autograd.grad)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Installs the guard right after `import torch` finishes, so processes that never import torch pay nothing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_install(module):
            exec_module(module)
            install(module)
        spec.loader.exec_module = exec_and_install
        return spec


os.register_at_fork(after_in_child=_after_fork_in_child)
if "torch" in sys.modules:
    install(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _TorchHook())
