"""The GPU check for lesson 06: DDP throughput on 1..N GPUs, the torchrun CLI path, and the over-request error.

    python -m scripts.gpu_ddp_check --data data/carry/cifar10-15k.pt   # on a GPU machine (about 1 minute per GPU)
    python -m scripts.gpu_ddp_check                                    # no GPU: a dry run on 1 and 2 CPU processes

Every measurement runs in fresh processes (`python -m course_lib.parallel.scaling`, strategy ddp), as a cluster
job would. Writes docs/results/<gpu>-ddp.md, or build/gpu_ddp_check-dryrun.md without a GPU (docs/ holds GPU
figures only).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from course_lib.base import config, hardware, results
from course_lib.benchmark import bench
from course_lib.measure import timing
from course_lib.parallel import scaling
from scripts import gpu_check  # its warm-up rule

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str], timeout: float = 600, env: dict | None = None) -> tuple[int, str, float]:
    """Exit code, combined output and wall time of a command run in the repository root (env: extra variables)."""
    with timing.Stopwatch() as wall:  # the child's own work: nothing of this process's to synchronize
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                             env={**config.child_env(), **(env or {})})
    return res.returncode, res.stdout + res.stderr, wall.seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="image folder or .pt file (default: COURSE_DATA)")
    p.add_argument("--model", help="backbone (default: resnet9 on GPUs, lenet on the CPU)")
    size = config.run_size("gpu_ddp_check")  # COURSE_SIZE, scaled for this device in config.LESSON_SCALES
    p.add_argument("--batch", type=int, default=size.batch_size, help="images per process")
    p.add_argument("--steps", type=int, default=size.bench_steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=gpu_check.warmup_steps(size), help="untimed steps")
    args = p.parse_args()
    n_gpus = scaling.num_cuda_devices()
    gpu = n_gpus > 0
    accel, counts = ("gpu", list(range(1, n_gpus + 1))) if gpu else ("cpu", [1, 2])
    model, batch, steps, warmup = args.model or ("resnet9" if gpu else "lenet"), args.batch, args.steps, args.warmup
    precision = hardware.choose_precision() if gpu else "32-true"
    data = config.data_source(args.data)
    out = config.build_dir() / "gpu_ddp_check"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run folder, so the rank-0-only check sees this run's files
    out.mkdir(parents=True)
    whole = timing.Stopwatch().start()  # every measurement below runs in child processes
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in counts:
            row = scaling.measure_script(k, Path(tmp) / f"{k}.json", accelerator=accel, model=model, batch=batch,
                                          precision=precision, warmup=warmup, steps=steps,
                                          workers=4 if gpu else 0, data=data)
            label = f"{k} GPU{'s' if k > 1 else ''}" if gpu else f"{k} CPU process{'es' if k > 1 else ''}"
            rows.append(replace(row, name=label))
            print(f"{label}: {row.images_per_s:,.0f} images/s", flush=True)
    rows = bench.add_speedups(rows, rows[0].name)
    base = rows[0].images_per_s
    eff = [f"- {r.name}: {r.images_per_s / (r.processes * base):.0%} scaling efficiency "
           f"({r.images_per_s:,.0f} images/s vs {r.processes} x {base:,.0f})" for r in rows[1:]]

    k = counts[-1]  # the CLI under torchrun on every device, as in docs/multi_gpu.md, for a few steps
    cli = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(k),
           "-m", "course_lib", "fit", "--config", "configs/lenet.yaml", "--trainer.accelerator", accel,
           "--trainer.devices", str(k), "--trainer.strategy", "ddp", "--trainer.max_steps", "20",
           "--trainer.limit_val_batches", "2", "--run_name", "ddp_check"]
    cli += ["--data.image_folder", data] if data else []
    shutil.rmtree(out / "runs" / "ddp_check", ignore_errors=True)  # a fresh run: the CLI keeps an earlier last.ckpt
    rc, log, secs = run(cli, env={config.BUILD_ENV: str(out)})  # outputs in $COURSE_BUILD/runs/<run_name>
    ckpts = sorted(p.name for p in (out / "runs" / "ddp_check" / "checkpoints").glob("*.ckpt"))
    versions = sorted(p.name for p in (out / "runs" / "ddp_check" / "logs").glob("version_*"))
    over = [sys.executable, "-m", "course_lib", "fit", "--config", "configs/lenet.yaml",
            "--trainer.accelerator", "gpu", "--trainer.devices", str(n_gpus + 1)]
    over_rc, over_log, _ = run(over, timeout=120)
    message = over_log.strip().splitlines()[-1] if over_log.strip() else "(no output)"  # the exception's line

    lines = [f"Data: {data}; {model}, {batch} images per process, {precision}; {warmup} warm-up + {steps} timed "
             f"steps per row, one run each, each in fresh processes (strategy ddp); total "
             f"{whole.elapsed():.0f} s.", "", bench.table(rows), "", "## Scaling efficiency", "",
             *(eff or ["- one device only: no multi-device row"]), "",
             "## torchrun + `python -m course_lib fit`", "", f"`{' '.join(cli[1:])}`", "",
             f"- exit code {rc} in {secs:.0f} s; log folders {versions}; checkpoints {ckpts} "
             f"(rank 0 writes them once); {'ok' if rc == 0 and versions == ['version_0'] else 'FAILED'}",
             *([f"- output tail: ```{log[-1500:]}```"] if rc else []), "",
             f"## Asking for {n_gpus + 1} GPU(s) with {n_gpus} present", "",
             f"- exit code {over_rc} ({'fails as it should' if over_rc else 'DID NOT FAIL'}): {message}"]
    info = hardware.facts()
    path = results.report_path("gpu_ddp_check", info["gpu"], suffix="-ddp")  # no GPU: a dry run, out of docs/
    results.write_report(path, f"DDP check on {hardware.label(info)}", lines, info)
    results.save_rows(rows, "gpu_ddp_check")
    print(path.read_text() + f"\nwritten to {path}")
    return 0 if rc == 0 and over_rc != 0 else 1


if __name__ == "__main__":
    sys.exit(main())
