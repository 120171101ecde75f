"""Named constants of the estimator that are assumptions or calibrations, each with its source.

Constants marked ASSUMED are placeholders until the measured results under ``results/`` allow a
fit; ``scripts/calibrate.py`` prints the fit and its held-out error, and a changed constant names
the fit's commit in its comment.
"""

from __future__ import annotations

MIB = 2**20

#: cuBLAS workspace per handle that PyTorch allocates through its caching allocator (so it counts
#: in ``memory_allocated``): 32 MiB on sm90 (Hopper), else 4096 KiB * 2 + 16 KiB * 8.
#: Source: PyTorch ``aten/src/ATen/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``.
CUBLAS_WORKSPACE_HOPPER = 32 * MIB
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
#: handles in use during a training step: the main thread (forward, optimizer) and the autograd
#: engine's device thread (backward) each get their own. ASSUMED from the handle pool's per-thread
#: design; to be checked against measurements.
CUBLAS_HANDLES = 2

#: The CUDA context (driver state, loaded kernels, the local-memory reservation) that nvidia-smi
#: counts per process but PyTorch's allocator does not. FITTED to the 51 measured cases of
#: ``results/validation`` by ``python scripts/calibrate.py`` (median of measured ``device_used -
#: peak_reserved``, NVML's per-process figure; commit 7147a1f: one H100 80GB HBM3, driver 580.159.04,
#: CUDA 13.0, torch 2.11.0): 758 MiB, leave-one-out |error| median 0.0 %, worst 8.5 %. 48 cases give
#: exactly 758 MiB; the runs that load no FlashAttention kernels (fp32, eager attention) 742 MiB;
#: torchao's CPU-offload optimizer 828 MiB. It was an assumption, 500 MiB. It depends on the card: the
#: driver reserves local memory for every thread the card can hold (max threads per SM x SMs x
#: local memory per thread, NVIDIA developer forum "Local memory management", 2024), and the kernel
#: images loaded depend on the architecture, driver and CUDA version (lazy module loading since
#: CUDA 11.7). Only H100 measurements exist, so other cards use the H100 figure.
CUDA_CONTEXT_BYTES = 758 * MIB

#: Reserved but not allocated (``memory.cached_free_bytes``, which lists what each share scales and
#: why): the caching allocator keeps every freed block cached and reuses one only for a request it can
#: hold (best fit; large-pool blocks are split only when more than 1 MiB is left), so the blocks of
#: a layer's temporaries, of attention's s x s scores, of the 16-bit head output and, in full
#: fine-tuning, of the gradients an optimizer state does not take and of gradients too large for
#: the activation blocks stay reserved while the peak is reached elsewhere. Fitted to the allocator
#: simulation (``trace/allocator.py``, PyTorch's CUDACachingAllocator rules) of the 141 committed
#: traced cases of ``sweeps/traced.yaml`` that fit their card without releasing the cache, by
#: ``python scripts/calibrate.py``: 1.205, 0.609, 0.833, 0.484, 0.233, held-out |error| of reserved
#: median 1.1 %, signed -0.3 %, worst -8.9 % (Llama-3.2-3B full bf16-mixed with 8-bit AdamW at 1,024
#: tokens). Against the 50 H100 measurements that did not release the cache (not fitted to them):
#: median 0.6 %, worst 4.5 %. They replace CACHED_WORKING_SETS = 2.226 x the largest working set
#: (the optimizer's included) + CACHED_LOGITS_SHARE = 0.150 x the fp32 logits, which the
#: measurements found 29 % high with Adafactor, 7-12 % low for stateless optimizers and full
#: bf16-mixed fine-tuning, 6.5 % high with eager attention.
CACHED_WORKING_SETS = 1.205
CACHED_SCORES = 0.609
CACHED_HEAD_BLOCK = 0.833
CACHED_STATELESS = 0.484
CACHED_GRAD_EXCESS = 0.233
#: Reserved beyond the cached free blocks: one 20 MiB large-pool segment (``CUDACachingAllocator.cpp``
#: ``kLargeBuffer``) and one 2 MiB small-pool segment per stream.
ALLOCATOR_SEGMENTS_BYTES = 2 * (20 * MIB + 2 * MIB)
#: Cached free bytes, in working sets (``cache_inputs["working"]``), of a step whose cache would pass
#: the card: after ``release_cached_blocks`` only parts of segments that hold live tensors stay
#: cached (``memory.allocator_limited_reserved``). ASSUMED 0.5 until there are three cache-limited
#: traced cases to fit it: Llama-3.1-8B LoRA with checkpointing keeps 0.54 working sets at 4 x 1,024
#: tokens on an RTX 4090 (traced) and 0.31 at 4 x 8,192 tokens on an H100 (traced; measured 0.32,
#: ``results/validation``); Phi-3 mini QLoRA at 8 x 512 tokens on an RTX 4090, whose replay released
#: 0.4 GiB where the estimate expects no release, keeps 2.59.
CACHED_AFTER_RELEASE = 0.5

#: Time model: the fraction of datasheet peak FLOP/s that a training step of Hugging Face
#: transformers reaches on large matmuls. Data-center parts: ASSUMED 0.45 (typical MFU reported for
#: eager-mode HF training, e.g. torchtitan's H100 table reaches 0.4-0.5 with compile); calibrate.py
#: fits 0.41 on the 6 data-center fsdp_qlora rows but with a leave-one-out |error| median of 38 %
#: (RTX 6000 Ada rows at 0.22, A100 rows at 0.47-0.58): one efficiency does not describe them, so
#: the constant is not replaced by that fit. Consumer (GeForce) parts: FITTED 0.6231 by
#: ``python scripts/calibrate.py`` on the 19 compute-dominated published fsdp_qlora rows (RTX 3090 at
#: 280 W and RTX 4090, Llama-2 7B / Mistral 7B / Yi 34B / Llama-2 70B, context 2,048 and 24,576) once
#: ``comm.py`` overlaps the collectives with compute, leave-one-out |error| of tokens/s median 9.4 %,
#: worst 205 % (R004, batch 1, where loading dominates the wall time; was ASSUMED 0.55, then 0.6544
#: fitted on 14 rows without the overlap). Those rows' times include loading the model, so the fit
#: is an underestimate of the training-loop efficiency.
MATMUL_EFFICIENCY = {"datacenter": 0.45, "consumer": 0.6231}
#: fraction of datasheet memory bandwidth reached by streaming kernels. ASSUMED 0.8 (typical
#: STREAM-like results; the device tool measured ~3.0 TB/s of 3.35 on an H100, i.e. 0.9).
BANDWIDTH_EFFICIENCY = 0.8
#: fraction of the host link's datasheet bandwidth reached by pinned copies. ASSUMED 0.8.
HOST_LINK_EFFICIENCY = 0.8
#: fixed cost per optimizer step and per micro-batch (kernel launches, Python). ASSUMED.
STEP_OVERHEAD_S = 0.010
MICRO_BATCH_OVERHEAD_S = 0.005
#: host RAM per parameter a CPU optimizer step handles per second. ASSUMED: 1e9 params/s
#: (DeepSpeed's CPU Adam reports ~1e9 params/s on a many-core host).
CPU_ADAM_PARAMS_PER_S = 1.0e9
