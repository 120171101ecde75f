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

#: The CUDA context (driver state, loaded kernels) that nvidia-smi counts but PyTorch's allocator
#: does not. ASSUMED: 500 MiB, the middle of the 300-600 MiB seen with lazy module loading
#: (default since CUDA 11.7 / PyTorch 1.13); replace by the median of measured
#: ``device_used - peak_reserved``.
CUDA_CONTEXT_BYTES = 500 * MIB

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

#: Time model (``time.py``): each kind of kernel at its own rate, the host's dispatch, their overlap.
#: FITTED together by ``python scripts/calibrate.py`` to the 48 step times of the H100 measurements
#: (``results/validation/measured/``, one GPU, no offload; soft-L1 loss on the log ratio, best of four
#: starting points), leave-one-out |error| of the step time median 9.0 %, signed -0.8 %, worst 75.6 %
#: (Llama 3.2 1B LoRA, pure bf16, 58 ms measured: a host-bound step the model dispatches too slowly),
#: 5 of 48 beyond 25 %; the
#: roofline it replaces (max of summed compute and memory time + fixed overheads) was 41 % median,
#: too fast in 47 of 49 cases. Those step times are medians of 5 timed steps whose spread reaches 50 %.
#: Fraction of the datasheet peak FLOP/s of the compute dtype that large GEMMs reach. Data-center
#: parts: the fit above (0.6098); consumer (GeForce) parts: 0.9187, the median of the efficiencies that
#: reproduce each of the 21 published fsdp_qlora tokens/s (RTX 3090 / 4090, FSDP on 2 GPUs) whose
#: estimated GEMM and attention time is at least 60 % of the step, leave-one-out |error| of tokens/s
#: median 10.7 % (was 0.6231 and 9.4 % with the old roofline); 11 of them need the cap of 1.0, i.e. the
#: model's memory-bound and launch time is too long for those GeForce rows (their wall times also
#: include loading, which makes them lower bounds of the loop's rate).
MATMUL_EFFICIENCY = {"datacenter": 0.6098, "consumer": 0.9187}
#: fraction of the peak that the fused attention kernels (FlashAttention-2 / memory-efficient SDPA)
#: reach, counting the FLOPs they execute (causal half, the backward's recomputation included)
ATTENTION_EFFICIENCY = 0.4221
#: fraction of the datasheet memory bandwidth that the memory-bound kernels reach: 1.081, above the
#: ~0.9 of a streaming copy because a kernel often reads what the previous one just wrote, from the
#: L2 cache (50 MB on an H100)
BANDWIDTH_EFFICIENCY = 1.081
#: device seconds per kernel launch beyond its work (launch latency, ramp-up and tail of small grids)
KERNEL_DEVICE_S = 8.539e-6
#: host seconds per kernel launched (Python to ATen, the dispatcher and cudaLaunchKernel), per
#: Python-level call around them (``work.py``: module calls, peft's wrapper, bitsandbytes' autograd
#: Function, Python optimizer loops), and more per kernel launched under ``torch.autocast``. Measured
#: on the H100 machine's host CPU (a virtual Xeon), so a faster desktop CPU dispatches faster
#: (TaxBreak, arXiv 2603.12465: CPU single-thread speed is first-order for host-bound steps).
HOST_S_PER_KERNEL = 1.104e-5
HOST_S_PER_CALL = 2.019e-5
HOST_S_PER_AUTOCAST_KERNEL = 2.495e-5
#: fraction of the host link's datasheet bandwidth reached by pinned copies. ASSUMED 0.8.
HOST_LINK_EFFICIENCY = 0.8
#: parameters a host optimizer step (offload) updates per second. ASSUMED: 1e9 params/s (DeepSpeed's
#: CPU Adam reports ~1e9 params/s on a many-core host). Our one measured offload step (Llama 3.2 1B, full
#: bf16-mixed, torchao CPUOffloadOptimizer with its fused CPU AdamW, the H100 machine's 16 vCPUs) ran
#: 0.45 s for 1.24e9 parameters, i.e. about 3.4e9 params/s once its 0.07 s on the GPU is taken out; one
#: case is too few to fit (calibrate.py needs parameters + 2), so the assumption stays, 3.1 times slow there.
CPU_ADAM_PARAMS_PER_S = 1.0e9
