"""course_lib/base/internals.py is the one home of the private torch and Lightning APIs the course uses: no private name
anywhere else in course_lib/ or scripts/, and each helper run for real against the installed torch and Lightning,
so a release that moves one fails here, naming the helper."""
from __future__ import annotations

import ast
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

from course_lib.base import internals
from course_lib.parallel import parallel

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "course_lib" / "base" / "internals.py"
# Lightning's loop internals: public attribute names, private machinery (no underscore to find them by)
LIGHTNING_LOOPS = {"fit_loop", "validate_loop", "test_loop", "predict_loop", "epoch_loop", "batch_progress"}
# underscored names that are public by their own library's documentation
DOCUMENTED_UNDERSCORES = {"os._exit"}  # Python's os docs: exit at once, without cleanup (a second Ctrl+C)


def is_private(name: str) -> bool:
    """A single-underscore name: private by Python's convention (dunders are public protocol)."""
    return name.startswith("_") and not name.startswith("__")


def private_uses(path: Path) -> list[tuple[str, int, str]]:
    """(path, line, expression) for each private torch/Lightning/library name one source file reaches: imports of
    private modules or names, `x._name` on anything but the class's own self/cls, getattr-family calls with a
    private name, and Lightning's loop internals."""
    rel, found = path.relative_to(REPO).as_posix(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(rel, node.lineno, a.name) for a in node.names if any(map(is_private, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith("course_lib"):
            names = node.module.split(".") + [a.name for a in node.names]
            found += [(rel, node.lineno, node.module)] if any(map(is_private, names)) else []
        elif isinstance(node, ast.Attribute) and (is_private(node.attr) or node.attr in LIGHTNING_LOOPS):
            expr = ast.unparse(node)
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and is_private(node.attr)
            inner = isinstance(node.value, ast.Attribute) and node.value.attr in LIGHTNING_LOOPS  # counted once
            if not (own or inner or expr in DOCUMENTED_UNDERSCORES):
                found.append((rel, node.lineno, expr))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and is_private(str(node.args[1].value)) and ast.unparse(node.args[0]) not in ("self", "cls")):
            found.append((rel, node.lineno, ast.unparse(node)))
    return found


def test_private_apis_only_in_internals():
    files = [p for folder in ("course_lib", "scripts") for p in sorted((REPO / folder).rglob("*.py")) if p != HOME]
    uses = [use for path in files for use in private_uses(path)]
    outside = [f"{path}:{line}: {expr}" for path, line, expr in uses]
    assert not outside, ("private torch/Lightning names outside course_lib/base/internals.py: give each a named helper "
                         "there, with the reason no public API fits", outside)


def test_dispatch_mode_sees_the_aten_ops_of_forward_and_backward():
    class Seen(internals.TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func.overloadpacket)
            return func(*args, **(kwargs or {}))

    w = torch.ones(3, requires_grad=True)
    with Seen() as seen:
        (w * 2).sum().backward()
    assert {torch.ops.aten.mul, torch.ops.aten.sum} <= seen.ops  # forward's ops
    assert torch.ops.aten.expand in seen.ops  # sum's backward: what a TorchFunctionMode would not see


def test_inductor_freezing_sets_the_flag_dynamo_reads_and_restores_it():
    import torch._inductor.config as inductor_config  # the flag the helper exists to set

    before = inductor_config.freezing
    with internals.inductor_freezing():
        assert inductor_config.freezing is True
    assert inductor_config.freezing == before


def test_ddp_logging_data_has_the_buckets_and_overlap_times_lesson_06_prints(tmp_path):
    """One gloo process (world 1, no spawn): DDP's statistics after three steps, read as notebook 06 reads them."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        net = nn.parallel.DistributedDataParallel(parallel.toy_model("toy", seed=0))
        xs, ys = parallel.toy_data(steps=3, batch=4, seed=0)
        parallel.train_steps(net, xs, ys)
        stats = internals.ddp_logging_data(net)
    finally:
        dist.destroy_process_group()
    bucket_bytes = [int(b) for b in str(stats["rebuilt_bucket_sizes"]).split(",")]
    assert sum(bucket_bytes) == sum(p.numel() * p.element_size() for p in net.parameters())
    for key in ("avg_backward_comm_time", "avg_backward_compute_comm_overlap_time", "avg_backward_compute_time"):
        assert int(stats[key]) >= 0, key  # present and an integer count of nanoseconds


class _Counters(L.Callback):
    """The helper's counters at every training batch's end, beside the batch_idx Lightning hands the hook."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        progress = internals.epoch_batch_progress(trainer)
        self.seen.append((batch_idx, progress.ready, progress.completed))


class _Tiny(L.LightningModule):
    """A linear classifier on random data: the smallest fit that runs Lightning's training loop."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(6, 4), torch.randint(0, 2, (6,)))
        return torch.utils.data.DataLoader(data, batch_size=2)


def test_epoch_batch_progress_counts_the_epochs_batches(tmp_path):
    """ready = batches fetched (what data.py's resumable loader starts after), completed = batches finished (what
    cli.EpochLines reports): in a batch's end hook, batch_idx + 1 and batch_idx; both restart with each epoch."""
    counters = _Counters()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", callbacks=[counters], logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(_Tiny())
    assert counters.seen == [(i, i + 1, i) for i in range(3)] * 2



def test_profiled_fetch_and_step_s_reads_the_simple_profilers_two_lines(tmp_path):
    """Lesson 03's two figures from a real SimpleProfiler run: time fetching batches and time in training steps."""
    from lightning.pytorch.profilers import SimpleProfiler

    profiler = SimpleProfiler(dirpath=tmp_path, filename="profile")
    L.Trainer(max_epochs=1, accelerator="cpu", profiler=profiler, logger=False, enable_progress_bar=False,
              enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path).fit(_Tiny())
    fetch, step = internals.profiled_fetch_and_step_s(profiler)
    assert fetch > 0 and step > 0


def test_onednn_int8_matmul_is_the_exact_integer_product():
    """uint8 activations times int8 weights, summed in int32: equal to the product in floats (small enough to be
    exact), on the kernel the int8 matmul ceiling times on a CPU."""
    x = torch.randint(0, 256, (64, 48), dtype=torch.uint8)
    w = torch.randint(-128, 128, (32, 48), dtype=torch.int8)
    out = internals.onednn_int8_matmul(x, w)()
    assert out.dtype == torch.float32 and torch.equal(out, x.float() @ w.float().T)
