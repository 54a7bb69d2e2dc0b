"""The GPU tag in results file names (benchmarks/plotting.gpu_tag), and every benchmark that names a results file by
it still imports (a script's module level must not need a GPU)."""

import pytest

from bench_testutil import load_benchmark


@pytest.mark.parametrize("name,tag", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA H100 PCIe", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                      ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"), ("", "gpu")])
def test_gpu_tag(name, tag):
    assert load_benchmark("plotting").gpu_tag(name) == tag


@pytest.mark.parametrize("script", ["attention", "attention_fp8", "attention_host", "attention_varlen",
                                    "decode_step_trace", "fp8_prepass_sweep", "generate_w4a16", "l2_bandwidth",
                                    "parallel_overhead", "train_reference", "w4a16", "w4a16_gemm_probe",
                                    "w4a16_probe"])
def test_scripts_import_the_tag(script):
    assert load_benchmark(script).gpu_tag("NVIDIA H200") == "h200"
