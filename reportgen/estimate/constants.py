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

#: Reserved but not allocated at the step's peak (``memory.cached_free_bytes``): the caching
#: allocator keeps every freed block cached, reuses one only for a request it can hold (best fit;
#: large-pool blocks are split only when more than 1 MiB is left), and saved tensors allocated
#: between a layer's temporaries pin parts of the segments those temporaries were cut from. So
#: the segments made for earlier working sets (a layer's forward and backward temporaries, the
#: dequantized 4-bit weight) and for the loss's fp32 logits stay reserved while the peak is
#: reached elsewhere. Reserved - allocated - segments = CACHED_WORKING_SETS x the step's largest
#: working set (the ``transient`` term) + CACHED_LOGITS_SHARE x the ``logits`` term.
#: Fitted to the allocator simulation (``trace/allocator.py``, PyTorch's CUDACachingAllocator
#: rules) of the committed traced cases of ``sweeps/traced.yaml`` by ``python scripts/calibrate.py``:
#: 2.226 and 0.150 from 120 cases (every catalog model at batch 1 and 2,048 tokens with
#: checkpointing, plus batches 1-10 at 512-2,048 tokens with and without checkpointing, pure bf16
#: and bf16-mixed, full, LoRA and QLoRA), held-out |error| of reserved median 1.3 %, worst 13.6 %.
#: They replace FRAGMENTATION_OF_TRANSIENT = 0.10 (an assumption: reserved = allocated + 0.10 x (peak -
#: weights - states)), which the same simulation found 4-16 % low on checkpointed PEFT steps and up
#: to 16 % high without checkpointing. Above the card, ``memory.allocator_limited_reserved`` applies.
CACHED_WORKING_SETS = 2.226
CACHED_LOGITS_SHARE = 0.150
#: Reserved beyond the cached free blocks: one 20 MiB large-pool segment (``CUDACachingAllocator.cpp``
#: ``kLargeBuffer``) and one 2 MiB small-pool segment per stream.
ALLOCATOR_SEGMENTS_BYTES = 2 * (20 * MIB + 2 * MIB)

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
