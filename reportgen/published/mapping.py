"""Map rows of ``data/published_measurements.csv`` to (model, GPU, setup, measure).

Each source's defaults come from its own code or documentation, cited per mapper:

* AnswerDotAI/fsdp_qlora ``benchmarks_03_2024.md`` ran ``train.py`` with its defaults: pure bf16
  (``precision="bf16"``, no FSDP mixed precision), LoRA rank 64 / alpha 16 / dropout 0.1 on q, k, v,
  gate, up, down (not o_proj), NF4 with double quantization (``replace_linear(..., Linear4bit,
  quant_type='nf4', quant_storage=torch_dtype)`` passes no ``compress_statistics``, whose bitsandbytes
  default is True), AdamW, FSDP activation checkpointing (reentrant), SDPA, in March 2024, when its
  README asked for bitsandbytes >= 0.43.0 (0.43.0 was current) and transformers 4.38/4.39 returned
  fp32 logits. The loop keeps ``output`` until after ``optimizer.step()`` (``keep_outputs='step'``).
  "DDP-mode" is ``--sharding_strategy ddp``, which train.py maps to FSDP ``NO_SHARD``, not PyTorch DDP.
  The figure is peak *reserved* memory per GPU in GiB.
* Lightning-AI/litgpt ``config_hub/finetune/README.md``: ``bf16-true`` (pure bf16), no activation
  checkpointing, max length 512 (Alpaca-2k samples are shorter: the peak comes from the longest
  batch). LoRA rank, dropout and targets, and the micro and global batch (so the accumulation of
  full fine-tuning) come from the row's own config file (``LITGPT_CONFIGS``, ``LITGPT_FULL``), read
  where the CSV left them blank. The table's figures come from litgpt's April 2024 benchmarks (PR
  #1337), when litgpt 0.2.0 pinned ``bitsandbytes==0.42.0``. Its loop (``finetune/lora.py``,
  ``full.py``) keeps the previous step's ``logits`` until the next forward returns
  (``keep_outputs='next-step'``), and Lightning Fabric hands back fp32 outputs
  (``Libraries(lightning=...)``): the LM head runs in 128-token chunks but every chunk is upcast, so
  the loss holds full fp32 logits like transformers' (``loss='standard'``). With ``--quantize
  bnb.nf4`` Fabric's ``BitsandbytesPrecision`` trains with ``bnb.optim.PagedAdamW`` (32-bit,
  ``optimizer='paged-adamw'``) and also quantizes the LM head (``quant_head``). LoRA and full
  fine-tuning use ``torch.optim.AdamW``. litgpt's own model never ties the head to the embedding
  (``litgpt_spec``). The figure is ``max_memory_allocated / 1e9``, never reset.
* apple/ml-cross-entropy README: memory of the loss op alone (8,192 tokens, vocabulary 256,000,
  bf16 classifier, Gemma 2 2B with its final logit soft-capping); mapped to the logits term only.
  Its ``op_mem_mb`` divides bytes by 2**20 (MiB): 24,000.0 and 28,000.0 are exactly 12 and 14 bytes
  per logit of 8,192 x 256,000, where MB would give 11.44 and 13.35; the CSV's "/1000" read them
  as MB.

A row that cannot be mapped gets a reason instead (unsupported architecture, GPU not in the
catalog, no memory figure, a technique we do not model).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from reportgen import catalog, userfile
from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

CONFIGS = Path(__file__).parent / "configs"

MODELS = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "Llama-2 70B": "llama-2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama-3.1-8b",  # same architecture as 3.1 (RoPE scaling aside)
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "microsoft/Phi-3-mini-4k-instruct": "phi-3-mini",
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "tinyllama-1.1b",
    "google/gemma-2-9b": "gemma-2-9b",
    "mistralai/Mistral-7B-v0.1": str(CONFIGS / "mistral-7b-v0.1.json"),
    "Mistral 7B v0.2 Base": str(CONFIGS / "mistral-7b-v0.2.json"),
}
YI = str(CONFIGS / "yi-34b.json")
GEMMA2_2B = str(CONFIGS / "gemma-2-2b.json")

GPUS = [("RTX 3090", "rtx-3090"), ("RTX 4090", "rtx-4090"), ("A10G", "a10g"), ("A100-SXM4 80GB", "a100-80gb"),
        ("A6000 Ada", "rtx-6000-ada"), ("A5000", "rtx-a5000"), ("A100 40GB SXM", "a100-40gb"), ("H100 80GB SXM", "h100-sxm")]


@dataclass(frozen=True)
class Mapped:
    row_id: str
    source: str
    model: str  # catalog name or config path
    gpu: str
    setup: TrainingSetup
    measure: str  # reserved | allocated | loss-forward | loss-forward-backward
    unit: str  # GiB | GB | MB
    published: float
    assumptions: list[str] = field(default_factory=list)
    libs: Libraries = CURRENT  # the library versions the source ran

    @property
    def spec(self) -> ModelSpec:
        spec = catalog.load_model(self.model)
        return litgpt_spec(spec) if "litgpt" in self.source else spec


def litgpt_spec(spec: ModelSpec) -> ModelSpec:
    """The model as litgpt builds it: its ``GPT`` (``litgpt/model.py``) makes ``lm_head`` an
    ``nn.Linear`` and ``transformer.wte`` an ``nn.Embedding`` of its own and never ties them;
    ``convert_hf_checkpoint`` copies the embedding into ``lm_head.weight`` for a checkpoint that
    ties them (Gemma, Llama 3.2 1B/3B). So a tied model trains with a separate head: V x h more
    weights, a head that ``--quantize bnb.nf4`` quantizes like every other linear (``quant_head``),
    and, in full fine-tuning, its own gradient and optimizer states."""
    return replace(spec, tie_word_embeddings=False) if spec.tie_word_embeddings else spec


@dataclass(frozen=True)
class Unmapped:
    row_id: str
    source: str
    reason: str


#: columns of data/published_measurements.csv this module reads
COLUMNS = ("id", "source", "model", "technique", "lora_rank", "lora_targets", "batch", "seq_len", "gpus", "gpu_type",
           "sharding", "offload", "peak_mem_gb", "notes")


#: the largest CSV read (the committed one is about 50 KB)
MAX_CSV_BYTES = 10_000_000


def read_rows(path: Path, columns: tuple[str, ...] = COLUMNS, noun: str = "published-measurements CSV",
              example: str = "data/published_measurements.csv") -> list[dict]:
    """The CSV's rows; a file that is not such a CSV (``columns`` among its header) is a ``UserError`` naming
    what is missing. ``noun`` and ``example`` name the kind of file in the errors (``consumer.read_csv``
    reads ``consumer_speed.csv`` here too)."""
    from reportgen.errors import UserError

    try:
        text = userfile.read_bytes(path, MAX_CSV_BYTES).decode("utf-8")
        # strict: a quote left open is an error at its line, not a cell holding the rest of the file
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        rows = list(reader)
        header = reader.fieldnames or []
    except userfile.TooLarge as exc:
        raise UserError(f"{path}: {exc.amount()}; a {noun} is read up to {MAX_CSV_BYTES:,} bytes",
                        hint=f"{example} is well under that") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except csv.Error as exc:
        raise UserError(f"{path}:{reader.reader.line_num}: cannot be read as CSV ({exc})",
                        hint="a cell holding a comma, a quote or a line break is quoted, its quotes doubled") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read as CSV ({exc})") from None
    missing = [c for c in columns if c not in header]
    if missing:
        raise UserError(f"{path}: not a {noun}; missing columns: {', '.join(missing)}",
                        hint=f"see {example} and {example.removesuffix('.csv')}.README.md")
    return rows


def _number(text: str) -> float | None:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*", text or "")
    return float(m.group(1)) if m else None


def _int(text: str) -> int | None:
    m = re.match(r"\s*([0-9]+)", text or "")
    return int(m.group(1)) if m else None


#: cells that hold a count (a leading whole number, words may follow: ``2 (global 16)``) and a figure (a
#: positive number alone); blank means not stated
COUNT_COLUMNS = ("batch", "seq_len", "gpus", "lora_rank", "grad_accum")
FIGURE_COLUMNS = ("params_b", "peak_mem_gb", "tokens_per_s", "step_time_s", "samples_per_s", "mfu")


def _unreadable(row: dict, keys: tuple[str, ...]) -> str | None:
    """Why a row's count cells cannot be read: a cell with text but no leading whole number above 0 (a
    blank cell takes the recipe's default, which the mapping names; ``12x`` reads 12 as before)."""
    bad = [f"{k} {row[k]!r}" for k in keys if (row.get(k) or "").strip() and not _int(row[k])]
    return f"not a whole number of 1 or more: {', '.join(bad)}" if bad else None


def row_problem(row: dict) -> str | None:
    """Why a CSV row cannot be compared at all, or None: fewer or more cells than the header (a cell
    holding a comma needs quotes), a count that is not a whole number of 1 or more, a figure that is not
    a positive number (``-4.98``, ``nan``, ``about 5``). Every comparison checks it first, so a damaged
    row is named with its reason instead of stopping ``compare-published``."""
    if None in row or any(v is None for v in row.values()):
        return (f"has {sum(1 for v in row.values() if v is not None)} of the header's {len(row)} cells"
                if None not in row else "has more cells than the header") + " (a cell holding a comma needs quotes)"
    bad = [f"{k} {row[k]!r}" for k in FIGURE_COLUMNS if (row.get(k) or "").strip() and not (_number(row[k]) or 0) > 0]
    if bad:
        return f"not a positive number: {', '.join(bad)}"
    return _unreadable(row, COUNT_COLUMNS)


def _gpu(text: str) -> str | None:
    return next((key for needle, key in GPUS if needle in text), None)


def map_row(row: dict) -> Mapped | Unmapped:
    rid, src = row.get("id") or "?", row.get("source") or ""
    if problem := row_problem(row):
        return Unmapped(rid, src, problem)
    if "fsdp_qlora" in src:
        return _fsdp_qlora(row)
    if "litgpt" in src:
        return _litgpt(row)
    if "ml-cross-entropy" in src:
        return _cce(row)
    if "transformers" in src:
        return Unmapped(rid, src, "bert-large is an encoder (BertForMaskedLM), not a supported decoder family")
    if "torchtitan" in src:
        return Unmapped(rid, src, "pretraining with selective activation checkpointing, torch.compile/Float8/"
                                  "TP/CP on H100 96GB (HBM2e): techniques and GPU not modelled")
    return Unmapped(rid, src, "unknown source")


def _fsdp_qlora(row: dict) -> Mapped | Unmapped:
    rid, src = row["id"], row["source"]
    value = _number(row["peak_mem_gb"])
    if value is None:
        return Unmapped(rid, src, "no memory figure in the table (time/cost only)")
    got = fsdp_qlora_setup(row)
    if isinstance(got, Unmapped):
        return got
    model, gpu, setup, notes = got
    return Mapped(rid, src, model, gpu, setup, "reserved", "GiB", value, notes, FSDP_QLORA_LIBS)


def fsdp_qlora_setup(row: dict) -> tuple[str, str, TrainingSetup, list[str]] | Unmapped:
    """(model, GPU, setup, assumptions) of an fsdp_qlora row, from train.py's defaults (above); shared
    by the memory comparison and the speed comparison (``speed.py``)."""
    rid, src = row["id"], row["source"]  # its count cells checked by row_problem (map_row, map_speed_row)
    gpu = _gpu(row["gpu_type"])
    if gpu is None:
        return Unmapped(rid, src, f"GPU not in the catalog: {row['gpu_type']}")
    model = YI if row["model"].startswith("Yi") else MODELS.get(row["model"])
    if model is None:
        return Unmapped(rid, src, f"model not mapped: {row['model']}")
    technique = row["technique"]
    method = "qlora" if "QLoRA" in technique else "lora"
    ddp = "DDP" in technique or "DDP" in row["sharding"]
    offload = "params" if row["offload"].lower().startswith(("yes", "cpu")) else "none"
    setup = TrainingSetup(act_offload="activation" in row["offload"].lower(),
                          method=method, precision="bf16", lora_rank=64, lora_alpha=16,
                          lora_targets="q,k,v,gate,up,down",
                          lora_dropout=0.1, quant="nf4", double_quant=True, grad_ckpt=True, attn="sdpa",
                          batch=_int(row["batch"]) or 1, seq=_int(row["seq_len"]) or 2048, gpus=_int(row["gpus"]) or 2,
                          sharding="no-shard" if ddp else "fsdp", offload=offload, keep_outputs="step")
    notes = ["LoRA on q, k, v, gate, up, down (fsdp_qlora's 'all' leaves out o_proj)",
             "bitsandbytes 0.43.0, transformers 4.38 (March 2024): fp32 logits kept until the optimizer step",
             "'DDP-mode' is FSDP NO_SHARD in train.py",
             "reserved memory also keeps what loading and FSDP wrapping cached (not modelled)"]
    return model, gpu, setup, notes


_PROSE_ALLOCATED = re.compile(r"peak allocated memory is [^0-9]*?([0-9]+\.[0-9]+) GiB")


def prose_allocated(row: dict, mapped: Mapped) -> Mapped | None:
    """fsdp_qlora's text also states peak *allocated* memory for two runs (kept in the row's notes):
    a second comparison of the same run against ``peak_allocated``, id suffixed with ``a``."""
    m = _PROSE_ALLOCATED.search(row.get("notes", ""))
    if not m:
        return None
    return Mapped(mapped.row_id + "a", mapped.source, mapped.model, mapped.gpu, mapped.setup, "allocated", "GiB",
                  float(m.group(1)), mapped.assumptions[:2] + ["figure quoted in the benchmark's text"], mapped.libs)


#: Fields of litgpt's ``config_hub/finetune/<config>`` files (rank, alpha, dropout, LoRA targets):
#: read at the commits named, which agree on these fields with the other stored versions.
LITGPT_CONFIGS = {
    "llama-2-7b/lora.yaml": (32, 16, 0.05, "q,v", "56ac240"),
    "llama-2-7b/qlora.yaml": (32, 16, 0.05, "q,v", "089fc5c"),
    "llama-3-8b/lora.yaml": (32, 16, 0.05, "q,v", "3352a7a"),
    "llama-3-8b/qlora.yaml": (32, 16, 0.05, "q,v", "f203eb3"),
    "llama-3.1-8b/lora.yaml": (32, 16, 0.05, "q,v", "8140a07"),
    "llama-3.1-8b/qlora.yaml": (32, 16, 0.05, "q,v", "4705387"),
    "mistral-7b/lora.yaml": (32, 16, 0.05, "q,v", "0d20770"),
    "mistral-7b/qlora.yaml": (32, 16, 0.05, "q,v", "3ba6da4"),
    "phi-3/lora.yaml": (8, 16, 0.05, "q,k,v,proj,mlp,head", "a44b83d"),
    "phi-3/qlora.yaml": (8, 16, 0.05, "q,k,v,proj,mlp,head", "c00df57"),
    "tiny-llama/lora.yaml": (32, 16, 0.05, "q,k,v,proj,mlp,head", "089fc5c"),
    "tiny-llama/qlora.yaml": (32, 16, 0.05, "q,k,v,proj,mlp,head", "56ac240"),
    "gemma2-9b/qlora.yaml": (16, 16, 0.1, "q,k,v,proj,mlp,head", "8b030ec"),
}
#: litgpt full fine-tuning configs: (micro batch, global batch, commit read, whether the published figure
#: can hold the recipe's own weights, gradients and AdamW states). phi-3/full.yaml: torch AdamW, bf16-true,
#: one GPU, micro 4, global 8: 3.82e9 x 8 bytes = 30.6 GB of parameter state alone, above the 17.01 GB
#: published (and the A10G's 24 GB), so that figure cannot be this recipe's.
LITGPT_FULL = {
    "tiny-llama/full.yaml": (4, 32, "CSV notes: micro_batch 4, global batch 32", True),
    "phi-3/full.yaml": (4, 8, "0fe99f8", False),
}
#: litgpt 0.2.0 pinned bitsandbytes==0.42.0 for its 'all' extra; Lightning Fabric returns fp32 outputs
LITGPT_LIBS = Libraries(bitsandbytes="0.42.0", lightning="2.2.1")
#: fsdp_qlora's March 2024 benchmarks: bitsandbytes >= 0.43.0, then the newest release
FSDP_QLORA_LIBS = Libraries(bitsandbytes="0.43.0", transformers="4.38.2")


def catalog_name(repo: str) -> str | None:
    """The catalog model whose Hugging Face repo is ``repo`` (case-insensitive), else None."""
    from reportgen import catalog

    for name in catalog.model_names():
        hf = catalog.load_model(name).hf_repo or ""
        if hf.lower() == repo.strip().lower():
            return name
    return None


def _litgpt(row: dict) -> Mapped | Unmapped:
    rid, src = row["id"], row["source"]
    value = _number(row["peak_mem_gb"])
    if value is None:
        return Unmapped(rid, src, "no memory figure")
    model = MODELS.get(row["model"])
    config = src.rsplit(" row ", 1)[-1].strip()
    if model is None:
        known = catalog_name(row["model"])
        if known:
            return Unmapped(rid, src, f"{row['model']} is the catalog's {known}, but litgpt's {config} recipe (LoRA "
                                      "settings, micro and global batch) has not been read and mapped yet: not compared")
        return Unmapped(rid, src, f"architecture not supported by reportgen: {row['model']}")
    gpu = _gpu(row["gpu_type"])
    if gpu is None:
        return Unmapped(rid, src, f"GPU not in the catalog: {row['gpu_type']}")
    technique = row["technique"]
    method = "qlora" if "QLoRA" in technique else "lora" if "LoRA" in technique else "full"
    gpus = _int(row["gpus"]) or 1
    notes = ["litgpt's own model code; Fabric returns fp32 logits (loss=standard); the loop keeps them into "
             "the next step (keep_outputs=next-step)",
             "sequence 512 is the maximum; Alpaca-2k samples are shorter",
             "bitsandbytes 0.42.0 (litgpt 0.2.0's pin)"]
    rank, alpha, dropout, targets_text = _int(row["lora_rank"]), 16, 0.0, row["lora_targets"]
    if config in LITGPT_CONFIGS:
        rank, alpha, dropout, targets_text, commit = LITGPT_CONFIGS[config]
        notes.append(f"LoRA r{rank}, dropout {dropout}, on {targets_text}: litgpt {config} at {commit}")
    elif method != "full" and rank is None:
        rank = 8
        notes.append("LoRA rank not stated: litgpt default r=8 assumed")
    # litgpt's lora_query/key/value/projection/mlp/head flags, as the config lists them
    targets = ",".join({"proj": "o", "head": "lm_head"}.get(t.strip(), t.strip())
                       for t in targets_text.split(",") if t.strip()) or "all-linear"
    accum = 1
    if method == "full":
        if config not in LITGPT_FULL:
            return Unmapped(rid, src, f"litgpt full fine-tuning config {config!r}: micro and global batch not read")
        micro, global_, commit, physical = LITGPT_FULL[config]
        if not physical:
            return Unmapped(rid, src, f"the published figure is below what the config's recipe needs for its weights, "
                                      f"gradients and AdamW states alone ({config} at {commit}: torch.optim.AdamW, "
                                      "bf16-true, one GPU: 8 bytes per parameter): not comparable")
        accum = max(1, global_ // (micro * gpus))
        notes.append(f"micro-batch {micro}, global batch {global_}: accumulation {accum} ({config} at {commit})")
    if method == "qlora":
        notes.append("PagedAdamW (32-bit) under Fabric's BitsandbytesPrecision")
        notes.append("litgpt also quantizes lm_head (quant_head); litgpt issue #1112 reports its QLoRA "
                     "using more memory than LoRA at the time")
    # a table run with --precision bf16-mixed: Fabric's FSDPPrecision gathers fp32 under autocast (sharding.py)
    mixed = "bf16-mixed" in technique
    if mixed and method != "full" and gpus > 1:
        return Unmapped(rid, src, "LoRA under Lightning's FSDP bf16-mixed gathers the frozen weights in fp32 too: "
                                  "not modelled (fsdp_param_dtype fp32 is modelled for full fine-tuning)")
    if mixed and gpus > 1:
        notes.append("bf16-mixed under FSDP: Lightning's FSDPPrecision gathers fp32 weights under autocast, whose "
                     "cache holds a bf16 copy of them (fsdp_param_dtype=fp32)")
    setup = TrainingSetup(method=method, precision="bf16-mixed" if mixed else "bf16", lora_rank=rank or 8,
                          fsdp_param_dtype="fp32" if mixed and gpus > 1 else "compute", lora_alpha=alpha, lora_targets=targets,
                          lora_dropout=dropout if method != "full" else 0.0, quant="nf4", attn="sdpa", loss="standard",
                          optimizer="paged-adamw" if method == "qlora" else "adamw", accum=accum,
                          quant_head=method == "qlora",
                          batch=_int(row["batch"]) or 1, seq=512, gpus=gpus, sharding="fsdp" if gpus > 1 else "none",
                          keep_outputs="next-step")
    return Mapped(rid, src, model, gpu, setup, "allocated", "GB", value, notes, LITGPT_LIBS)


def _cce(row: dict) -> Mapped | Unmapped:
    rid, src = row["id"], row["source"]
    technique = row["technique"]
    if "baseline" not in technique:
        return Unmapped(rid, src, "Cut Cross-Entropy's kernels, and its torch_compile variant, which compiles the "
                                  "classifier matmul and soft-capping with the loss (cut_cross_entropy/torch_compile.py), "
                                  "are not modelled (loss chunked-compiled is torchtune's compiled cross-entropy of "
                                  "given logits; loss fused models Liger's chunking)")
    value = _number(row["peak_mem_gb"])
    if value is None:
        return Unmapped(rid, src, "no memory figure")
    measure = "loss-forward-backward" if "fw-bw" in technique else "loss-forward"
    setup = TrainingSetup(method="lora", precision="bf16", batch=1, seq=8192)
    notes = ["loss op only: logits term of the estimator, with Gemma 2's final soft-capping",
             "op_mem_mb is MiB (bytes / 2**20): the CSV's figure x 1000"]
    return Mapped(rid, src, GEMMA2_2B, "a100-80gb", setup, measure, "MiB", value * 1000, notes)
