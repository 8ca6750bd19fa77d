"""``benchmarks/thinker_step_profile.py``: kernels sorted by what they do, summed per
step, and the script run on the CPU on tiny-omni."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import BENCHMARKS, load_script

from omni_actors.models import cache as model_cache

profile = load_script("thinker_step_profile")

# Kernel names as an H200's profiles of the thinker printed them (shortened where long).
NAMES = {
    "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13"
    "GemmUniversalINS5_17GroupProblemShapeINS_5tupleIJiiiEEEEE": "experts_mm",
    "triton_poi_fused__to_copy_clone_expand_index_select_mul_transpose_0": "triton",
    "triton_red_fused_add_mean_mul_pow_rsqrt_1": "triton",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>": "attention",
    "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT": "matmul",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "matmul",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous)": "copy",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<>>": "copy",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>": "copy",
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::Policy>": "sort",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>": "sort",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps<float>>>": "reduce",
    "void at::native::elementwise_kernel<128, 4, gpu_kernel_impl_nocast<CUDAFunctor_add>>": (
        "elementwise"
    ),
    "void at::native::vectorized_elementwise_kernel<4, silu_kernel<>::{lambda}>": "elementwise",
    "_combine_rows_kernel": "other",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_kernel_is_sorted_by_what_it_does(name: str) -> None:
    assert profile.kind(name) == NAMES[name]


def test_a_profile_is_summed_per_step_by_kind() -> None:
    grouped, glue, mm = sorted(NAMES)[0], "triton_poi_fused_mul_silu_2", "nvjet_sm90_tst_x"
    kernels = [(grouped, 96, 48.0), (glue, 48, 6.0), (mm, 96, 20.0), (grouped, 96, 50.0)]
    summary = profile.summarize(kernels, steps=2, top=2)
    assert summary["busy_ms"] == 62.0
    assert summary["kernels"] == 168.0
    assert summary["by_kind"] == {
        **dict.fromkeys(profile.KINDS, 0.0),
        "experts_mm": 49.0,
        "triton": 3.0,
        "matmul": 10.0,
    }
    # The same kernel's calls are one row, the costliest first.
    assert summary["top"] == [[grouped[:100], 96.0, 49.0], [mm, 48.0, 10.0]]
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile.summarize(kernels, steps=0, top=2)


def test_the_script_times_and_profiles_steps_of_first_prompts_on_the_cpu(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    tiny_release = model_cache.prepare("tiny-omni", cache_dir=tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "thinker_step_profile.py"),
            str(tiny_release),
            "--dry",
            "--prompts",
            "1",
            "3",
            "--tokens",
            "200",
            "--max-context",
            "512",
            "--max-sessions",
            "4",
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    config, *steps = lines
    assert config["what"] == "config"
    assert config["device"] == "cpu"
    assert config["graphed"] == []  # no graph on the CPU
    assert [line["prompts"] for line in steps] == [1, 3]
    for line in steps:
        assert line["tokens"] == 200
        assert line["step_ms"] > 0
        assert 0 < line["model_ms"] <= line["step_ms"] * 1.5
        assert line["busy_ms"] > 0
        assert sum(line["by_kind"].values()) == pytest.approx(line["busy_ms"], abs=0.05)
        assert line["top"]
