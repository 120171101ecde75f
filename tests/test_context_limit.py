"""Reverse searches stay within the model's context length (issue: TinyLlama's longest sequence on a
24 GB card was printed as 43,008 tokens while it was trained on 2,048)."""

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate.search import context_limit, fits, max_seq
from reportgen.setup import TrainingSetup


def test_longest_sequence_never_passes_max_position_embeddings():
    tiny = catalog.load_model("tinyllama-1.1b")
    assert tiny.max_position_embeddings == 2048 and context_limit(tiny) == 2048
    setup = TrainingSetup(method="lora", batch=1)
    assert max_seq(tiny, setup, catalog.load_gpu("rtx-4090")) == 2048  # memory alone would allow ~43k
    assert max_seq(tiny, setup, catalog.load_gpu("t4")) == 2048


def test_memory_still_limits_below_the_context():
    llama = catalog.load_model("llama-3.1-8b")
    assert llama.max_position_embeddings == 131072  # rope_scaling llama3, factor 8 over 8,192
    setup, gpu = TrainingSetup(method="qlora", grad_ckpt=True), catalog.load_gpu("rtx-4090")
    got = max_seq(llama, setup, gpu)
    # memory stops it, not the context: the next multiple of 128 does not fit
    assert got % 128 == 0 and got + 128 <= 131072
    assert fits(llama, setup.model_copy(update={"seq": got}), gpu)
    assert not fits(llama, setup.model_copy(update={"seq": got + 128}), gpu)


def test_a_sequence_past_the_context_is_estimated_and_says_so():
    est = estimate(catalog.load_model("tinyllama-1.1b"), catalog.load_gpu("h100-sxm"),
                   TrainingSetup(method="lora", seq=4096), reverse=True)
    assert est.context_limit == 2048 and est.max_seq == 2048
    note = next(n for n in est.notes if "max_position_embeddings" in n)
    assert "seq 4,096 is past" in note and "extrapolation" in note
    est = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_gpu("h100-sxm"),
                   TrainingSetup(method="lora", seq=262144), reverse=False)
    assert "rope_scaling 'llama3'" in next(n for n in est.notes if "max_position_embeddings" in n)


def test_advise_past_the_context_warns_before_the_walk():
    """`reportgen advise --seq` past the model's context says so at the top (terminal) and in the walk's
    JSON, where the guide pages show it as a warning; within the context it says nothing."""
    import io

    from rich.console import Console

    from reportgen.advise.cli import print_walk
    from reportgen.advise.walk import walk

    doc = walk("tinyllama-1.1b", "rtx-4090", seq=100_000)
    assert "seq 100,000 is past tinyllama-1.1b's max_position_embeddings 2,048" in doc["context_note"]
    out = io.StringIO()
    print_walk(doc, Console(file=out, width=200))
    head = out.getvalue().splitlines()[:4]
    assert any(line.startswith("warning: seq 100,000 is past") for line in head)
    assert walk("tinyllama-1.1b", "rtx-4090", seq=2048)["context_note"] is None
