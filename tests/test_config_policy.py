"""The precision policy: bf16 only where the hardware computes it natively, from injected capability facts."""
import pytest
import torch

from course_lib import config

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
    assert config.choose_precision(None, info) == expected


def test_explicit_bf16_on_a_cpu_without_it_is_honoured_but_never_the_default():
    """Emulated bf16 runs (lesson 04 measures it), so an explicit request stands; the policy never picks it."""
    assert config.choose_precision("bf16-mixed", CPU_PLAIN) == "bf16-mixed"
    assert config.choose_precision(None, CPU_PLAIN) == "32-true"
    assert config.choose_precision("bf16-mixed", CPU_BF16) == "bf16-mixed"
    assert config.choose_precision("32-true", CPU_PLAIN) == "32-true"


def test_precision_errors_name_the_remedy():
    """Requests the hardware lacks, or unknown names, fail with the alternative named."""
    with pytest.raises(ValueError, match="16-mixed"):
        config.choose_precision("bf16-mixed", GPU_OLD)
    assert config.choose_precision("bf16-mixed", GPU_NEW) == "bf16-mixed"
    for cpu in (CPU_BF16, CPU_PLAIN):
        with pytest.raises(ValueError, match="GPU technique.*'32-true'"):
            config.choose_precision("16-mixed", cpu)
    with pytest.raises(ValueError, match="Unknown precision"):
        config.choose_precision("fp8", GPU_NEW)


@pytest.mark.parametrize("extra, native", [("", False), (" avx512f avx512_bf16", True), (" amx_bf16 amx_tile", True),
                                           (" avx512f avx512_vnni amx_int8", False)])
def test_cpuinfo_flags_parser(extra, native):
    """The first flags line decides; other lines and lookalike flags (amx_int8, avx512_vnni) do not."""
    text = CPUINFO.format(n=0, flags=FLAGS_AVX2 + extra) + CPUINFO.format(n=1, flags=FLAGS_AVX2 + " avx512_bf16")
    assert config.bf16_flags_in_cpuinfo(text) is native
    assert config.bf16_flags_in_cpuinfo("model name : avx512_bf16 inside a name\n") is False  # not a flags line


def test_detection_reads_torch_capabilities_else_cpuinfo(monkeypatch, tmp_path):
    """cpu_bf16_native asks torch.cpu.get_capabilities(); without it, /proc/cpuinfo's flags; hardware() reports it."""
    for caps, native in (({"avx2": True, "avx512_bf16": False}, False), ({"amx_bf16": True}, True)):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps, raising=False)
        config.cpu_bf16_native.cache_clear()
        assert config.cpu_bf16_native() is native
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    real_read = config.Path.read_text
    fake = CPUINFO.format(n=0, flags=FLAGS_AVX2 + " avx512_bf16")
    monkeypatch.setattr(config.Path, "read_text",
                        lambda self, *a, **k: fake if str(self) == "/proc/cpuinfo" else real_read(self, *a, **k))
    config.cpu_bf16_native.cache_clear()
    try:
        assert config.cpu_bf16_native() is True
        assert config.hardware()["cpu_bf16_native"] is True
    finally:
        config.cpu_bf16_native.cache_clear()  # the next caller detects this machine again
