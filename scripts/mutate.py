"""Hand-written mutation testing: does the test suite notice a wrong number?

Each mutant is one plausible slip in the code that makes the numbers (a byte count, a dropped term,
a flipped comparison, a lost factor, a wrong unit): in the memory formulas, the time model, the
verdict and the site's number formatting. The script copies the checkout to a temporary folder,
applies one mutant at a time there (never to the checkout), runs the tests that guard the mutant's
area against it and counts the mutant **killed** when a test fails and **survived** when they all
pass. A survivor is a slip the suite would let through: write the test that catches it, or say why
the mutant changes nothing a user can see and drop it.

    python scripts/mutate.py --jobs 4         # every mutant, four at a time
    python scripts/mutate.py --area verdict   # one area
    python scripts/mutate.py --match "tight"  # the mutants whose description says so
    python scripts/mutate.py --list           # the mutants, nothing run

It exits 1 when fewer than ``--min-kill`` (default 90 %) of the mutants are killed, and 2 when a
mutant no longer applies (its ``old`` text is not exactly once in its file: the code moved, so the
list must follow it) or when some of the unmutated tests fail (they are left out of the mutant runs
and listed; the kill rate is still reported). ``.github/workflows/mutation.yml`` runs it
weekly; the kill rate is in the README's development section.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parents[1]

#: the tests that guard each area, fastest and most sensitive first (pytest stops at the first failure)
TESTS = {
    "formulas": ["tests/test_terms.py", "tests/test_accuracy.py", "tests/test_sharding_terms.py",
                 "tests/test_fsdp_terms.py", "tests/test_reserved.py", "tests/test_recipe_effects.py",
                 "tests/test_recipe_dtypes.py", "tests/test_family_activations.py", "tests/test_logits_published.py",
                 "tests/test_dora.py", "tests/test_memory_timeline.py", "tests/test_published.py",
                 "tests/test_gpu_memory.py", "tests/test_activations_vs_torch.py"],
    "time": ["tests/test_time_definitions.py", "tests/test_time_physics.py", "tests/test_terms.py", "tests/test_host_cpu.py",
             "tests/test_accuracy.py", "tests/test_estimate_speed.py",
             "tests/test_comm_terms.py", "tests/test_memory_timeline.py", "tests/test_compile.py",
             "tests/test_dora.py", "tests/test_published_speed.py", "tests/test_published_consumer.py",
             "tests/test_cli.py"],
    "verdict": ["tests/test_verdict.py", "tests/test_error_band.py", "tests/test_memory_timeline.py",
                "tests/test_context_limit.py", "tests/test_one_answer.py", "tests/test_cards.py"],
    "format": ["tests/test_format.py", "tests/test_cli.py", "tests/test_one_answer.py", "tests/test_render.py",
               "tests/test_calculator.py"],
}


@dataclass(frozen=True)
class Mutant:
    area: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    what: str  # the slip, in words


def m(area: str, path: str, old: str, new: str, what: str) -> Mutant:
    return Mutant(area, path, old, new, what)


E = "reportgen/estimate/"
MUTANTS = [
    # ----- formulas: dtypes and parameter-side terms ---------------------------------------------
    m("formulas", E + "dtypes.py", "base = 2 if setup.precision == Precision.bf16 else 4",
      "base = 4 if setup.precision == Precision.bf16 else 4", "pure-bf16 full fine-tuning stored as fp32"),
    m("formulas", E + "dtypes.py", "adapter = 2 if setup.precision == Precision.bf16 or (\n"
      "        setup.recipe in (Recipe.trl_sft, Recipe.grpo) and setup.method == Method.qlora) else 4", "adapter = 2",
      "LoRA adapters in 16 bit under mixed precision"),
    m("formulas", E + "params.py", "return q // 2 + (model.total_params - q - embed)",
      "return q + (model.total_params - q - embed)", "4-bit weights one byte each"),
    m("formulas", E + "params.py", "total += blocks + nested * 4 + 4 + 256 * 4 + code",
      "total += blocks * 4 + nested * 4 + 4 + 256 * 4 + code", "double quantization keeps fp32 absmax"),
    m("formulas", E + "params.py", "code = 16 * 4  # the 16-value", "code = 0  # the 16-value",
      "4-bit code book forgotten"),
    m("formulas", E + "params.py", "torch_bytes += count * 2 * n * pbytes", "torch_bytes += count * n * pbytes",
      "AdamW keeps one state"),
    m("formulas", E + "params.py", "BNB_MIN_8BIT_SIZE = 4096", "BNB_MIN_8BIT_SIZE = 0",
      "8-bit states also for small tensors"),
    m("formulas", E + "params.py", "torch_bytes += count * (shape[0] + shape[1]) * 4",
      "torch_bytes += count * (shape[0] * shape[1]) * 4", "Adafactor's second moment not factored"),
    m("formulas", E + "params.py", "torch_bytes += 2 * 256 * 4  # qmap1/qmap2", "torch_bytes += 0  # qmap1/qmap2",
      "8-bit optimizers' quantization maps forgotten"),
    m("formulas", E + "params.py", "return trainable_params(model, setup) * trainable_dtype_bytes(setup, dt)",
      "return trainable_params(model, setup) * 2", "gradients always 16-bit"),
    m("formulas", E + "params.py", "if lin.count == 1) * dt.compute\n    if dt.adapter == 2",
      "if lin.count == 1) * 4\n    if dt.adapter == 2", "autocast weight copies in fp32"),
    m("formulas", E + "params.py", "return (sel.head * r * (h + v) + sel.embed * h * r) * dt.compute",
      "return (sel.head * r * (h + v)) * dt.compute", "embedding adapter copy forgotten"),
    m("formulas", E + "params.py", "    if not model.tie_word_embeddings:\n        out.append(((model.vocab_size, h), 1))",
      "    if model.tie_word_embeddings:\n        out.append(((model.vocab_size, h), 1))", "tied head counted twice"),
    # ----- formulas: activations and logits ------------------------------------------------------
    m("formulas", E + "activations.py", "converts = not (dt.quantized and dt.autocast)", "converts = True",
      "peft's 4-bit layers cast x under autocast"),
    m("formulas", E + "activations.py", "if lg else 3 * mlp_dt * i", "if lg else 2 * mlp_dt * i",
      "one MLP intermediate forgotten"),
    m("formulas", E + "activations.py", "per_token += c * hd * (nq + 2 * kv_heads) + c * nq * hd + 4 * nq",
      "per_token += c * hd * (nq + 2 * kv_heads) + c * nq * hd", "SDPA's logsumexp forgotten"),
    m("formulas", E + "activations.py", "per_sq += 4 * nq + (0 if c == 4 or not v_req else c * nq)",
      "per_sq += 4 * nq", "eager attention's 16-bit probabilities forgotten"),
    m("formulas", E + "activations.py", "kv_heads = nkv if nkv == nq else nq  # repeat_kv",
      "kv_heads = nkv  # repeat_kv", "eager attention's repeated k, v counted at the kv heads"),
    m("formulas", E + "activations.py", "input_grad = not (first_layer and setup.is_peft and not setup.grad_ckpt)",
      "input_grad = True", "LoRA's first layer saves input-side tensors"),
    m("formulas", E + "activations.py", "saved += kept + (dt.compute if dt.autocast else dt.adapter) * rank * lin.count",
      "saved += kept + dt.adapter * rank * lin.count", "lora_A output in the adapter dtype under autocast"),
    m("formulas", E + "activations.py", "kept += DROPOUT_MASK_BYTES * width", "kept += 0 * width",
      "LoRA dropout mask forgotten"),
    m("formulas", E + "activations.py", "            per_sq += c\n", "            per_sq += 0\n",
      "SDPA's additive mask forgotten"),
    m("formulas", E + "activations.py", "const += 4 * model.num_experts  # MoE", "const += 0  # MoE",
      "MoE offsets forgotten"),
    m("formulas", E + "logits.py", "backward_live = tokens * (12 * v + soft + 8)",
      "backward_live = tokens * (8 * v + soft + 8)", "loss backward holds two fp32 tensors, not three"),
    m("formulas", E + "logits.py", "head_out = c * v if c != 4 else 0  # with fp32",
      "head_out = c * v  # with fp32", "fp32 logits counted twice"),
    m("formulas", E + "logits.py", "saved = tokens * (4 * v + 8 + soft) + 4  # + nll_loss",
      "saved = tokens * (4 * v + soft) + 4  # + nll_loss", "int64 targets forgotten"),
    m("formulas", E + "logits.py", "work = chunk * v * c  # one chunk's logits", "work = chunk * c  # one chunk's logits",
      "fused loss chunk without its vocabulary"),
    m("formulas", E + "logits.py", "math.ceil(tokens / CHUNKS) * 4 * v\n", "tokens * 4 * v\n",
      "chunked loss upcasts all chunks at once"),
    # ----- formulas: the timeline, reserved, sharding --------------------------------------------
    m("formulas", E + "memory.py", "MLP_BACKWARD_GRADIENTS if liger_on else 3", "MLP_BACKWARD_GRADIENTS if liger_on else 2",
      "one MLP gradient forgotten in the backward"),
    m("formulas", E + "memory.py", "    return 2 * layer_bytes\n", "    return layer_bytes\n",
      "FSDP stream pool holds one layer"),
    m("formulas", E + "constants.py", "CUDA_CONTEXT_BYTES = 758 * MIB", "CUDA_CONTEXT_BYTES = 1258 * MIB",
      "CUDA context 500 MiB larger"),
    m("formulas", E + "memory.py",
      "return reserved + (cuda_context_bytes(gpu) if gpu is not None else K.CUDA_CONTEXT_BYTES)", "return reserved",
      "device total without the CUDA context"),
    m("formulas", E + "memory.py", "else g_head // shard + g_layer)", "else g_head // shard)",
      "the top layer's gradients forgotten"),
    m("formulas", E + "memory.py", '"optimizer-step": base + g_opt + opt_temp + after_fwd,',
      '"optimizer-step": base + g_opt + after_fwd,', "optimizer temporaries forgotten"),
    m("formulas", E + "memory.py", "copies_held = (0 if setup.grad_ckpt else model.num_layers * c_layer)",
      "copies_held = (model.num_layers * c_layer)", "checkpointing keeps the autocast copies"),
    m("formulas", E + "memory.py", "return 4 if P.trainable_dtype_bytes(setup, dt) == 2 else 2", "return 2",
      "Adafactor's fp32 copies of 16-bit parameters"),
    m("formulas", E + "memory.py", "per = K.CUBLAS_WORKSPACE_HOPPER if gpu.is_hopper_or_newer else K.CUBLAS_WORKSPACE_OTHER",
      "per = K.CUBLAS_WORKSPACE_OTHER if gpu.is_hopper_or_newer else K.CUBLAS_WORKSPACE_HOPPER",
      "cuBLAS workspace sizes swapped"),
    m("formulas", E + "memory.py", '"forward-end": base + gathered_bytes + fixed + stack',
      '"forward-end": base + gathered_bytes + stack', "embedding-side activations forgotten at the forward's end"),
    m("formulas", E + "memory.py", "w_dev = (weights + adapters) // g + quant", "w_dev = (weights + adapters + quant) // g",
      "FSDP shards the 4-bit quantization state"),
    m("formulas", E + "memory.py", "host += s_dev + P.trainable_params(model, setup) * 4 // place.states",
      "host += s_dev", "optimizer offload without the fp32 master copy on the host"),
    m("formulas", E + "memory.py", "ddp_buckets = SH.ddp_bucket_bytes(grads) if setup.sharding == Sharding.ddp else 0",
      "ddp_buckets = 0", "DDP's gradient buckets forgotten"),
    m("formulas", E + "memory.py", "limited = min(usable, peak + int(K.CACHED_AFTER_RELEASE * working)",
      "limited = min(usable, peak", "a released cache keeps nothing"),
    m("formulas", E + "sharding.py", "return 2 * layer_bytes + root_bytes - root_bytes // n",
      "return layer_bytes + root_bytes - root_bytes // n", "FULL_SHARD gathers one layer, no prefetch"),
    m("formulas", E + "sharding.py", "return min(setup.gpus, NODE_GPUS)", "return setup.gpus",
      "HYBRID_SHARD shards across nodes"),
    m("formulas", E + "sharding.py", "    if s == Sharding.zero2:\n        return Placement(1, g, g)",
      "    if s == Sharding.zero2:\n        return Placement(1, 1, g)", "ZeRO-2 keeps whole gradients"),
    m("formulas", E + "dora.py", "layers = model.num_layers * sum(lin.out_features for lin in adapted_linears",
      "layers = model.num_layers * sum(lin.in_features for lin in adapted_linears",
      "DoRA's magnitudes per input feature"),
    # ----- time: FLOPs, device, host, overlap ----------------------------------------------------
    m("time", E + "work.py", "return Work(kernels=n, bytes=nbytes if n else 0.0, views=views)",
      "return Work(kernels=n, bytes=nbytes, views=views)", "a cast the setup does not need still moves bytes"),
    m("time", E + "time.py", 'att = min(1.0, K.ATTENTION_EFFICIENCY * eff / K.MATMUL_EFFICIENCY["hopper"])',
      "att = K.ATTENTION_EFFICIENCY", "attention at the H100's share of the peak on every card"),
    m("time", E + "logits.py", "head * ((c + 4) * upcast + 2 * w + 4)", "head * (2 * w + 4)",
      "Liger's head gradient summed without its fp32 copy"),
    m("time", E + "libraries.py", "return v >= (0, 8, 3) and w == c and c != 4", "return w == c and c != 4",
      "every Liger release sums a 16-bit head gradient in place"),
    m("time", E + "constants.py", 'MATMUL_EFFICIENCY = {"hopper": 0.7411,', 'MATMUL_EFFICIENCY = {"hopper": 0.49,',
      "Hopper's matmul efficiency a third lower"),
    m("time", E + "constants.py", "HOST_S_PER_KERNEL = 1.978e-5", "HOST_S_PER_KERNEL = 1.978e-4",
      "host time per kernel launch ten times longer"),
    m("time", E + "dispatch.py", "    return reference_cpu().single_thread / cpu.single_thread",
      "    return cpu.single_thread / reference_cpu().single_thread", "a faster host CPU dispatches slower"),
    m("time", E + "time.py", "causal = 0.5 if attn == Attention.sdpa else 1.0", "causal = 1.0",
      "causal SDPA computes the whole square"),
    m("time", E + "time.py", "weights = 6 * n if setup.method == Method.full else 4 * n + 6 * lora",
      "weights = 6 * n if setup.method == Method.full else 6 * n + 6 * lora", "frozen weights get weight gradients"),
    m("time", E + "time.py", "hardware = weights + 4 * redo + (3.5 if attn == Attention.sdpa else 3.0) * kernel",
      "hardware = weights + 4 * redo + 3.0 * kernel", "SDPA's backward without its recomputed scores"),
    m("time", E + "time.py", "hardware += 2 * (layer_matmul_params_per_token(model) + lora + redo) + kernel",
      "hardware += 2 * (layer_matmul_params_per_token(model) + lora + redo)", "recomputed attention forgotten"),
    m("time", E + "time.py", "count = model.experts_per_token if lin.count > 1 else 1", "count = lin.count",
      "MoE: every expert multiplies every token"),
    m("time", E + "time.py", "passes = 2 + (1 if setup.grad_ckpt else 0)\n    return passes * P.quantized",
      "passes = 2\n    return passes * P.quantized", "QLoRA's recomputed dequantization forgotten"),
    m("time", E + "time.py", "device = max(device + g, host + c / n + g, host + c + g / n)", "device = device + g",
      "the device never waits for the host"),
    # not a mutant: "return device" for "return max(host, device)" is equivalent, since every phase ends the
    # device at or after the host's end (device >= host + c + g / n), so no test can tell them apart
    m("time", E + "time.py", "return out[:2] * work.accum + out[2:]", "return out[:2] + out[2:]",
      "gradient accumulation runs one micro-batch"),
    m("time", E + "time.py", "mfu = model_flops * tps / (peak * setup.gpus)", "mfu = model_flops * tps / peak",
      "MFU of several GPUs against one card's peak"),
    m("time", E + "time.py", "    tps = real / step\n", "    tps = setup.tokens_per_step / step\n",
      "padding counted as data"),
    m("time", E + "time.py", "max(0.0, copies - backward_s) + max(trainable / cpu_adam_params_per_s(gpu), copies)",
      "max(0.0, copies - backward_s) + trainable / cpu_adam_params_per_s(gpu)", "offload's copies back forgotten"),
    m("time", E + "time.py", "dollars = (hours * gpu.price_usd_per_hour * setup.gpus",
      "dollars = (hours * gpu.price_usd_per_hour", "dollars of one GPU for several"),
    m("time", E + "time.py", "eff = matmul_efficiency or matmul_efficiency_of(gpu.generation)[0]",
      'eff = matmul_efficiency or matmul_efficiency_of("hopper")[0]', "every generation at Hopper's matmul rate"),
    m("time", E + "time.py", "return gpu.memory_bandwidth_gbs * 1e9 * c.dram_efficiency / (1.0 -",
      "return gpu.memory_bandwidth_gbs * 1e9 / (1.0 -", "memory-bound kernels at the datasheet bandwidth"),
    m("time", E + "time.py", "return c.l2_reuse * min(1.0, gpu.l2_cache_bytes / working_bytes)",
      "return c.l2_reuse", "the L2's share whatever the L2's size"),
    m("time", E + "time.py", "w.calls * c.host_s_per_call + autocast_kernels * c.host_s_per_autocast_kernel",
      "w.calls * c.host_s_per_call", "autocast's dispatch cost forgotten"),
    m("time", E + "work.py", "GEMM_RIDGE_FLOPS_PER_BYTE * c * (m * k + k * n + m * n)",
      "GEMM_RIDGE_FLOPS_PER_BYTE * (m * k + k * n + m * n)", "GEMM ridge ignores the element size"),
    m("time", E + "work.py", "per = 0.5 + 4 / P.BNB_4BIT_BLOCKSIZE + dtypes_for(setup).compute",
      "per = 0.5 + 4 / P.BNB_4BIT_BLOCKSIZE", "dequantization's output write forgotten"),
    m("time", E + "work.py", "per += (1 + 4 / P.BNB_NESTED_BLOCKSIZE + 4) / P.BNB_4BIT_BLOCKSIZE", "per += 0",
      "double quantization's second dequantization forgotten"),
    m("time", E + "work.py", "return trainable * 3 * pbytes + 2 * (state + managed)",
      "return trainable * 2 * pbytes + 2 * (state + managed)", "the optimizer does not write the parameters"),
    m("time", E + "work.py", "recompute = (f + tail * -1) * L if setup.grad_ckpt else Work()", "recompute = Work()",
      "checkpointing's recomputation is free"),
    m("time", E + "work.py", "return work + _k(5, w * 6 * xa + n_out * (xa + 4 * a), views=3)",
      "return work + _k(5, n_out * (xa + 4 * a), views=3)", "DoRA's norm of W + scale B A is free"),
    m("time", E + "work.py", "bwd += _k(1, n * 2 * p2) + _k(2, n * (2 * p2 + mm + p2))",
      "bwd += _k(2, n * (2 * p2 + mm + p2))", "DoRA's LoRA-output gradient is free"),
    m("time", E + "work.py", "fwd, bwd = f * L, b * (L - 1)", "fwd, bwd = f * L, b * L",
      "the first layer's backward counted twice"),
    m("time", E + "comm.py", "return 0.0 if n <= 1 else (n - 1) / n * nbytes / bytes_per_s",
      "return 0.0 if n <= 1 else nbytes / bytes_per_s", "all-gather moves the whole buffer"),
    m("time", E + "comm.py", "return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bytes_per_s",
      "return 0.0 if n <= 1 else (n - 1) / n * nbytes / bytes_per_s", "all-reduce as one pass"),
    m("time", E + "comm.py", "    return max(0.0, comm_s - compute_s)\n", "    return comm_s\n",
      "collectives never overlap compute"),
    m("time", E + "comm.py", "total = (6 if setup.method == Method.full else 4) + (2 if setup.grad_ckpt else 0)",
      "total = 6 + (2 if setup.grad_ckpt else 0)", "LoRA's forward share as full fine-tuning's"),
    m("time", E + "comm.py", "total, exposed = a * ar, a * (exposed_s(ar, bwd) + ar / L)",
      "total, exposed = ar, exposed_s(ar, bwd) + ar / L", "NO_SHARD reduces once per step"),
    # ----- the verdict and the searches ----------------------------------------------------------
    m("verdict", E + "band.py", "    if hi <= capacity:\n", "    if lo <= capacity:\n", "fits when the low end fits"),
    m("verdict", E + "band.py", "    if lo > capacity:\n", "    if hi > capacity:\n", "never tight"),
    m("verdict", E + "band.py", 'measure = "reserved" if measure == "device_total" else measure',
      'measure = "allocated" if measure == "device_total" else measure', "device total takes the allocated band"),
    m("verdict", E + "band.py", 'if g and g["n"] >= MIN_ROWS:', "if g:", "a band from too few comparisons"),
    m("verdict", E + "band.py", "return estimate * (1 + self.lo), estimate * (1 + self.hi)",
      "return estimate * (1 - self.hi), estimate * (1 + self.hi)", "the band made symmetric"),
    m("verdict", E + "band.py", 'return "fits" if device_total <= capacity else "does not fit"',
      'return "fits" if device_total <= 1.1 * capacity else "does not fit"', "no band: 10 % over counts as fitting"),
    m("verdict", E + "verdict.py", 'return self.kind == "fits"', 'return self.kind != "does not fit"',
      "tight counted as fitting"),
    m("verdict", E + "verdict.py", "        return self.capacity - self.demand\n", "        return self.demand - self.capacity\n",
      "margin's sign flipped"),
    m("verdict", E + "verdict.py", 'if mem.cache_released and kind == "does not fit" and phase == "train":',
      'if kind == "does not fit" and phase == "train":',
      "every no becomes tight"),
    m("verdict", E + "verdict.py", "    demand = mem.card_demand if demand is None else demand\n",
      "    demand = mem.device_total if demand is None else demand\n",
      "the cache the allocator would release not asked of the card"),
    m("verdict", E + "verdict.py", 'word = "tight" if kind == "tight" else "no"', 'word = "yes" if kind == "tight" else "no"',
      'tight shown as "yes"'),
    m("verdict", E + "verdict.py", 'return f"fits: {need}, {_g(margin)} GiB free{expected}"',
      'return f"fits: {need}, {_g(-margin)} GiB free{expected}"', "free memory's sign flipped in the sentence"),
    m("verdict", E + "verdict.py", 'band = band_for("device_total", method)', 'band = band_for("device_total", "all")',
      "one band for every technique"),
    m("verdict", E + "search.py", "            lo = mid\n        else:\n            hi = mid",
      "            hi = mid\n        else:\n            lo = mid", "the bisection turned round"),
    m("verdict", E + "search.py", "        if not ok(nxt):\n            hi = nxt\n            break\n        lo = hi = nxt",
      "        if not ok(nxt):\n            lo = hi = nxt\n            break\n        lo = hi = nxt",
      "the first size that does not fit is reported"),
    m("time", "reportgen/published/consumer.py",
      "return ((1 - b ** k) * shown - b * (1 - b ** (k - 1)) * previous) / smoothing", "return shown",
      "tqdm's early s/it read as the step's own seconds"),
    # ----- the site's and the terminal's number formatting ---------------------------------------
    m("format", "reportgen/format.py", 'return "-" if n is None else f"{n / GIB:.{digits}f}"',
      'return "-" if n is None else f"{n / 1e9:.{digits}f}"', "GiB column in GB"),
    m("format", "reportgen/format.py", 'return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"',
      'return f"{x:.0f}" if x >= 100 else f"{x:.1f}"', "no thousands separator in rates"),
    m("format", "reportgen/format.py", 'return "-" if x is None else f"{100 * x:.1f}%"',
      'return "-" if x is None else f"{x:.1f}%"', "a fraction shown as percent"),
    m("format", "reportgen/format.py", 'return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"',
      'return f"{x * 100:.0f} ms" if x < 1 else f"{x:.2f} s"', "milliseconds off by ten"),
    m("format", "reportgen/format.py", 'return "-" if x is None else f"${x:,.2f}"',
      'return "-" if x is None else f"${x:,.0f}"', "dollars rounded to whole dollars"),
    m("format", "reportgen/report/render.py", 'return "-" if n is None else f"{n / 2**30:,.{digits}f}"',
      'return "-" if n is None else f"{n / 1e9:,.{digits}f}"', "pages' GiB in GB"),
    m("format", "reportgen/report/render.py", 'return "-" if x is None else f"{100 * x:+.{digits}f}%"',
      'return "-" if x is None else f"{100 * x:.{digits}f}%"', "signed errors without their sign"),
    m("format", "reportgen/report/render.py", 'return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"',
      'return f"{x}" if isinstance(x, int) else f"{x:,.1f}"', "integers without thousands separators"),
    m("format", "reportgen/report/rows.py", '"hours_per_100m": None if hours is None or scale is None else hours * scale,',
      '"hours_per_100m": hours,', "hours not scaled to 100M tokens"),
    m("format", "reportgen/report/rows.py", '"margin": capacity - demand if known else None,',
      '"margin": demand - capacity if known else None,', "pages' margin sign flipped"),
    m("format", "reportgen/report/rows.py", '"fits": None if kind is None else kind == "fits",',
      '"fits": None if kind is None else kind != "does not fit",', "pages count tight as fitting"),
    m("format", "reportgen/report/rows.py", '"device_total": mem.get("device_total"),\n        "terms"',
      '"device_total": mem.get("peak_reserved"),\n        "terms"', "device-total column filled with peak_reserved"),
    m("format", "reportgen/report/rows.py", "return None if n is None else round(n / GIB, digits)",
      "return None if n is None else round(n / GIB, 1)", "CSV GiB rounded to 0.1"),
    m("format", "reportgen/report/rows.py", "rel = [(e - m) / m for e, m in pairs if m]",
      "rel = [(e - m) / e for e, m in pairs if m]", "error relative to the estimate"),
    m("format", "reportgen/browser.py", "f\"margin {d['margin'] / GIB:+.2f} GiB of {capacity}\"",
      "f\"margin {d['margin'] / 1e9:+.2f} GiB of {capacity}\"", "calculator's margin in GB"),
]


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _pytest(copy: Path, tests: list[str], timeout: float, first_failure: bool = True,
            deselect: tuple[str, ...] = ()) -> tuple[int, list[str], float]:
    """Run ``tests`` in ``copy``: (exit status, the FAILED/ERROR lines, seconds); status -1 on timeout."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("REPORTGEN_REQUIRE_ALL", None)
    args = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    args += ["-x"] if first_failure else []
    for node in deselect:
        args += ["--deselect", node]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, ["timed out"], time.monotonic() - t0
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    if proc.returncode and not failed:
        failed = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:]
    return proc.returncode, failed, time.monotonic() - t0


def _node(line: str) -> str:
    """``tests/x.py::test_y[a]`` of a ``FAILED tests/x.py::test_y[a] - message`` line."""
    return line.split(" ", 1)[1].split(" - ", 1)[0].strip()


def check_applies(mutants: list[Mutant]) -> list[str]:
    """Mutants whose ``old`` text is not exactly once in their file (the code moved)."""
    bad = []
    for mu in mutants:
        text = (ROOT / mu.path).read_text()
        if text.count(mu.old) != 1:
            bad.append(f"{mu.path}: {text.count(mu.old)} matches of {mu.old!r} ({mu.what})")
        elif mu.old == mu.new:
            bad.append(f"{mu.path}: a mutant that changes nothing ({mu.what})")
    return bad


def run(mutants: list[Mutant], jobs: int, timeout: float) -> tuple[list[tuple[Mutant, str, str, float]], list[str]]:
    """Every mutant's (mutant, killed | survived | timeout, the first failing test, seconds), and the
    tests that already failed without a mutant (left out of the mutant runs, reported)."""
    with tempfile.TemporaryDirectory(prefix="reportgen-mutants-") as tmp:
        copies: Queue[Path] = Queue()
        for j in range(jobs):
            dest = Path(tmp) / f"copy{j}"
            _copy_checkout(dest)
            copies.put(dest)
        areas = sorted({mu.area for mu in mutants})
        print(f"baseline: the tests of {', '.join(areas)} on the unmutated copy", flush=True)
        base = copies.get()
        broken: dict[str, tuple[str, ...]] = {}
        for area in areas:
            rc, failed, secs = _pytest(base, TESTS[area], timeout, first_failure=False)
            broken[area] = tuple(_node(ln) for ln in failed if ln.startswith(("FAILED ", "ERROR ")))
            if rc not in (0, 1) or (rc == 1 and not broken[area]):
                sys.exit(f"the unmutated tests of {area} cannot run ({failed}): fix them first")
            print(f"  {area}: {secs:.0f} s" + (f"; failing without a mutant, left out: {', '.join(broken[area])}"
                                               if broken[area] else ", all passed"), flush=True)
        copies.put(base)

        def one(mu: Mutant) -> tuple[Mutant, str, str, float]:
            copy = copies.get()
            path = copy / mu.path
            original = path.read_text()
            try:
                path.write_text(original.replace(mu.old, mu.new, 1))
                rc, failed, secs = 0, [], 0.0
                for test_file in TESTS[mu.area]:  # one file at a time: most mutants die in the first,
                    # and collecting every file (torch, transformers) would cost each mutant that much
                    rc, failed, s = _pytest(copy, [test_file], timeout,
                                            deselect=tuple(n for n in broken[mu.area] if n.startswith(test_file)))
                    secs += s
                    if rc == 5:  # every test of the file left out
                        rc = 0
                    if rc != 0:
                        break
            finally:
                path.write_text(original)
                copies.put(copy)
            outcome = "survived" if rc == 0 else "timeout" if rc == -1 else "killed"
            first = failed[0] if failed else ""
            print(f"{outcome:8s} {secs:5.0f} s  {mu.area:8s} {mu.path}: {mu.what}" +
                  (f"\n         by {first}" if outcome == "killed" else ""), flush=True)
            return mu, outcome, first, secs

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, mutants))
        return results, sorted({n for nodes in broken.values() for n in nodes})


def summary(results: list[tuple[Mutant, str, str, float]]) -> tuple[str, float]:
    lines = ["| area | mutants | killed | kill rate |", "|:--|--:|--:|--:|"]
    for area in TESTS:
        sel = [r for r in results if r[0].area == area]
        if sel:
            k = sum(r[1] != "survived" for r in sel)
            lines.append(f"| {area} | {len(sel)} | {k} | {100 * k / len(sel):.0f} % |")
    killed = sum(r[1] != "survived" for r in results)
    rate = killed / len(results) if results else 1.0
    lines.append(f"| **all** | {len(results)} | {killed} | **{100 * rate:.0f} %** |")
    survivors = [r[0] for r in results if r[1] == "survived"]
    if survivors:
        lines += ["", "Survivors:"] + [f"- {mu.path}: {mu.what} (`{mu.old.strip()[:60]}`)" for mu in survivors]
    return "\n".join(lines), rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--area", choices=sorted(TESTS), action="append", help="only these areas (repeatable)")
    ap.add_argument("--match", action="append",
                    help="only the mutants whose description contains this text (repeatable: any of them)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one test run may take (default 900)")
    ap.add_argument("--min-kill", type=float, default=0.9, help="fail below this kill rate (default 0.9)")
    ap.add_argument("--report", type=Path, help="also write the summary table (Markdown) here")
    args = ap.parse_args(argv)
    mutants = [mu for mu in MUTANTS if (not args.area or mu.area in args.area)
               and (not args.match or any(t in mu.what for t in args.match))]
    bad = check_applies(mutants)
    if bad:
        print("mutants that no longer apply (update MUTANTS in scripts/mutate.py):\n  " + "\n  ".join(bad),
              file=sys.stderr)
        return 2
    if args.list:
        for mu in mutants:
            print(f"{mu.area:8s} {mu.path}: {mu.what}")
        return 0
    results, broken = run(mutants, max(1, args.jobs), args.timeout)
    text, rate = summary(results)
    if broken:
        text += "\n\nFailing without any mutant (left out of the mutant runs):\n" + "\n".join(f"- {n}" for n in broken)
    print("\n" + text)
    if args.report:
        args.report.write_text(text + "\n")
    if rate < args.min_kill:
        print(f"\nkill rate {100 * rate:.0f} % is below {100 * args.min_kill:.0f} %", file=sys.stderr)
        return 1
    return 2 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
