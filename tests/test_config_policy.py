"""base.hardware: the one CPU-capability reader, and the precision policy (bf16 only where the hardware computes
it natively), from injected capability facts."""
import re
from pathlib import Path

import pytest
import torch

from course_lib.base import config, hardware

GPU_OLD = {"gpu": "Tesla T4", "compute_capability": "7.5", "bf16_native": False}
GPU_NEW = {"gpu": "NVIDIA H100", "compute_capability": "9.0", "bf16_native": True}
CPU_BF16 = {"gpu": None, "cpu": "Intel Xeon Platinum 8480+", "cpu_bf16_native": True}  # AMX
CPU_PLAIN = {"gpu": None, "cpu": "AMD EPYC 7B12", "cpu_bf16_native": False}  # AVX2 only
# cpuinfo's first flags line on an AVX2-only EPYC (Zen 2), and the flags an AMX Xeon adds
FLAGS_AVX2 = "fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c avx2 sha_ni"
CPUINFO = "processor\t: {n}\nvendor_id\t: X\nmodel name\t: X\nflags\t\t: {flags}\nbugs\t\t: sysret_ss_attrs\n\n"


@pytest.mark.parametrize("info, expected", [(GPU_NEW, "bf16-mixed"), (GPU_OLD, "16-mixed"), (CPU_BF16, "bf16-mixed"),
                                            (CPU_PLAIN, "32-true"), ({"gpu": None}, "32-true")])
def test_precision_default_follows_hardware(info, expected):
    """bf16 where native (GPU sm80+, CPU with AVX512_BF16/AMX), fp16 on older GPUs, fp32 on other CPUs."""
    assert hardware.choose_precision(None, info) == expected


def test_explicit_bf16_on_a_cpu_without_it_is_honoured_but_never_the_default():
    """Emulated bf16 runs (lesson 04 measures it), so an explicit request stands; the policy never picks it."""
    assert hardware.choose_precision("bf16-mixed", CPU_PLAIN) == "bf16-mixed"
    assert hardware.choose_precision(None, CPU_PLAIN) == "32-true"
    assert hardware.choose_precision("bf16-mixed", CPU_BF16) == "bf16-mixed"
    assert hardware.choose_precision("32-true", CPU_PLAIN) == "32-true"


def test_precision_errors_name_the_remedy():
    """Requests the hardware lacks, or unknown names, fail with the alternative named."""
    with pytest.raises(ValueError, match="16-mixed"):
        hardware.choose_precision("bf16-mixed", GPU_OLD)
    assert hardware.choose_precision("bf16-mixed", GPU_NEW) == "bf16-mixed"
    for cpu in (CPU_BF16, CPU_PLAIN):
        with pytest.raises(ValueError, match="GPU technique.*'32-true'"):
            hardware.choose_precision("16-mixed", cpu)
    with pytest.raises(ValueError, match="Unknown precision"):
        hardware.choose_precision("fp8", GPU_NEW)


@pytest.mark.parametrize("extra, bf16, int8", [("", False, False), (" avx512f avx512_bf16", True, False),
                                                (" amx_bf16 amx_tile", True, False), (" avx_vnni", False, True),
                                                (" avx512f avx512_vnni amx_int8", False, True)])
def test_cpuinfo_flags_parser(extra, bf16, int8):
    """The first flags line decides, in torch's spelling (avx512f -> avx512_f); other lines and lookalike flags do
    not; Arm's `Features` line counts too."""
    other_core = CPUINFO.format(n=1, flags=FLAGS_AVX2 + " avx512_bf16 amx_int8")
    text = CPUINFO.format(n=0, flags=FLAGS_AVX2 + extra) + other_core
    flags = hardware.cpuinfo_flags(text)
    assert "avx2" in flags and "sha_ni" in flags and ("avx512_f" in flags) is ("avx512f" in extra)
    assert bool(flags & set(hardware.CPU_BF16_FLAGS)) is bf16 and bool(flags & set(hardware.CPU_INT8_FLAGS)) is int8
    assert hardware.cpuinfo_flags("model name : avx512_bf16 inside a name\n") == frozenset()  # not a flags line
    assert "bf16" in hardware.cpuinfo_flags("processor : 0\nFeatures : fp asimd bf16 i8mm\n")  # Arm (Graviton 3)


@pytest.fixture
def fresh_flags(monkeypatch):
    """cpu_flags re-read for the test (this CPU's reader: no emulated class), and again afterwards, so later callers
    see this machine."""
    monkeypatch.delenv(hardware.HARDWARE_ENV, raising=False)
    hardware.own_cpu_flags.cache_clear()
    yield
    hardware.own_cpu_flags.cache_clear()


@pytest.mark.parametrize("caps, bf16, int8", [
    ({"avx2": True, "avx512_bf16": False, "l2_cache_size": 2048}, False, False),
    ({"amx_bf16": True, "amx_int8": True}, True, True),
    ({"avx512_vnni": True, "architecture": "x86_64"}, False, True)])
def test_detection_reads_torch_capabilities(monkeypatch, fresh_flags, caps, bf16, int8):
    """torch.cpu.get_capabilities() where torch has it: only True flags count (sizes and names do not)."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps, raising=False)
    assert hardware.cpu_flags() == {k for k, v in caps.items() if v is True}
    assert hardware.cpu_bf16_native() is bf16 and hardware.cpu_int8_native() is int8
    assert hardware.facts()["cpu_bf16_native"] is bf16


def test_detection_falls_back_to_cpuinfo(monkeypatch, fresh_flags, tmp_path):
    """Without torch's reader, /proc/cpuinfo's flags; without either, nothing native (the safe answer)."""
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    (tmp_path / "cpuinfo").write_text(CPUINFO.format(n=0, flags=FLAGS_AVX2 + " avx512_bf16"))
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "cpuinfo")
    assert hardware.cpu_bf16_native() is True and hardware.cpu_int8_native() is False
    hardware.own_cpu_flags.cache_clear()
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "absent")
    assert hardware.cpu_flags() == frozenset() and hardware.cpu_bf16_native() is False



def test_gpu_presence_is_asked_only_through_hardware_gpu_count():
    """'Is there a GPU?' has one home, hardware.gpu_count (NVML, so ddp_notebook can still fork): course_lib and the
    scripts never call torch.cuda.is_available or device_count elsewhere (check_cuda asks is_available in a child)."""
    root = Path(__file__).resolve().parents[1]
    files = [p for part in ("course_lib", "scripts") for p in (root / part).rglob("*.py") if p.name != "hardware.py"]
    callers = [f"{p.relative_to(root)}:{n}" for p in files
               for n, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"cuda\.(is_available|device_count)\(", line)]
    assert not callers, f"ask hardware.gpu_count() instead: {callers}"


def test_run_size_asks_hardware_for_the_device_kind(monkeypatch, hardware_class):
    """run_size(lesson) takes the lesson's GPU scale where hardware.has_gpu() says so (a visible GPU, or an emulated
    GPU class), its CPU scale otherwise."""
    monkeypatch.delenv(hardware.HARDWARE_ENV, raising=False)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 1)
    on_gpu = config.run_size("08_capstone", size="full")
    monkeypatch.setattr(hardware, "gpu_count", lambda: 0)
    on_cpu = config.run_size("08_capstone", size="full")
    assert on_gpu == config.run_size("08_capstone", gpu=True, size="full") and on_gpu.batch_size == 1024
    assert on_cpu == config.run_size("08_capstone", gpu=False, size="full") and on_cpu != on_gpu
    hardware_class("gpu-t4")
    assert config.run_size("08_capstone", size="full") == on_gpu
    hardware_class("cpu-amx")
    assert config.run_size("08_capstone", size="full") == on_cpu
