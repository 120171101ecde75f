"""'How many of these cards do I need' (reportgen/advise/cards.py) and its GPU-page table."""

import json

from reportgen import catalog
from reportgen.advise import cards as CN
from reportgen.estimate import estimate
from reportgen.report.pages import cards_view

L8 = catalog.load_model("llama-3.1-8b")
H100 = catalog.load_gpu("h100-sxm")


def test_smallest_count_fits_and_half_of_it_does_not():
    """Full fine-tuning of Llama 3.1 8B (bf16-mixed AdamW, 16 bytes per parameter, 128 GB) does not
    fit one 80 GB H100; two do with a sharding, and it is the fastest that fits on two."""
    c = CN.cards_needed(L8, H100, "full")
    assert c.fit.gpus == 2 and c.fit.sharding in ("fsdp", "zero3", "zero2", "shard-grad-op")
    assert c.fit.offload == "none"
    one = estimate(L8, H100, CN.base_setup("full", 2048), reverse=False)
    assert one.verdict != "fits"
    for cand in CN._candidates("full", 2048, 2, "none"):
        e = estimate(L8, H100, cand, reverse=False)
        if e.verdict == "fits":
            assert e.time.tokens_per_s <= c.fit.tokens_per_s + 0.1
    # parameter offload to host RAM gets it onto one card, much slower
    assert c.offload_fit.gpus == 1 and c.offload_fit.tokens_per_s < c.fit.tokens_per_s / 10


def test_qlora_of_an_8b_model_needs_one_card_and_no_offload_answer():
    c = CN.cards_needed(L8, H100, "qlora")
    assert (c.fit.gpus, c.fit.sharding, c.offload_fit) == (1, "none", None)


def test_gpu_page_view_of_the_stored_answers():
    data = {"seq": 2048, "counts": [1, 2, 4], "gpus": {"h100-sxm": {"llama-3.1-8b": {
        "full": CN.cards_needed(L8, H100, "full").as_dict(),
        "lora": {"method": "lora", "fit": None, "offload_fit": None},
        "qlora": CN.cards_needed(L8, H100, "qlora").as_dict()}}}}
    data = json.loads(json.dumps(data))  # as read back from data/cards_needed.json
    view = cards_view(data, "h100-sxm")
    full, lora, qlora = view["rows"][0]["cells"]
    assert full.startswith("2 cards, ") and "<br>or one card + parameter offload" in full
    assert lora == "not within 4 cards" and qlora.startswith("one card · ")
    assert cards_view(data, "rtx-4090") is None and cards_view(None, "h100-sxm") is None


def test_stored_answers_are_what_the_estimator_says_now():
    """data/cards_needed.json (``reportgen cards``) is what the current estimator and catalogs give:
    a formula or catalog change that moves an answer fails here until ``reportgen cards`` is rerun,
    so the GPU pages never publish stale card counts."""
    from pathlib import Path

    stored = json.loads(Path("data/cards_needed.json").read_text())
    assert stored == json.loads(json.dumps(CN.all_cards_needed())), "stale: run `reportgen cards`"


def test_stored_answers_cover_the_catalog():
    """data/cards_needed.json (``reportgen cards``) has every catalog GPU, model and method."""
    from pathlib import Path

    data = json.loads(Path("data/cards_needed.json").read_text())
    assert set(data["gpus"]) == set(catalog.gpu_names())
    for per_model in data["gpus"].values():
        assert set(per_model) == set(catalog.model_names())
        assert all(set(v) == set(CN.METHODS) for v in per_model.values())
