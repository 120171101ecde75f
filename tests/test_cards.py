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
    a formula, tree or catalog change moves its inputs hash and fails here until ``reportgen cards``
    is rerun, so the GPU pages never publish stale card counts. The answers of three cards (a 12 GB
    and a 24 GB consumer card, a data-centre one: every method needs one card on some and several
    on others) are recomputed whole, so a file whose hash is current but whose answers are not (an
    edit by hand, a writer that records the hash of other code) fails too; recomputing all 18 cards
    took 15 s of the suite."""
    from pathlib import Path

    stored = json.loads(Path("data/cards_needed.json").read_text())
    assert stored["inputs_hash"] == CN.cards_inputs_hash(stored["seq"]), "stale: run `reportgen cards`"
    for key in ("rtx-3060", "rtx-4090", "h100-sxm"):
        now = json.loads(json.dumps(CN.gpu_cards_needed(key, stored["seq"])))
        assert stored["gpus"][key] == now, f"{key}: stale: run `reportgen cards`"


def test_stored_answers_cover_the_catalog():
    """data/cards_needed.json (``reportgen cards``) has every catalog GPU, model and method."""
    from pathlib import Path

    data = json.loads(Path("data/cards_needed.json").read_text())
    assert set(data["gpus"]) == set(catalog.gpu_names())
    for per_model in data["gpus"].values():
        assert set(per_model) == set(catalog.model_names())
        assert all(set(v) == set(CN.METHODS) for v in per_model.values())


def test_a_count_past_one_machine_says_how_many_and_on_consumer_cards_that_it_is_impractical():
    """Issue 19: the table suggested 32 RTX 3060s without saying that this is no realistic setup."""
    fit = {"gpus": 32, "sharding": "fsdp", "offload": "none", "tokens_per_s": 7000.0, "device_total_gib": 11.0,
           "host_ram_gib": 0.0, "setup": "x"}
    data = {"seq": 2048, "counts": [1, 2, 4, 8, 16, 32, 64], "gpus": {
        key: {"llama-3.1-8b": {"full": {"method": "full", "fit": fit, "offload_fit": None},
                               "lora": {"method": "lora", "fit": {**fit, "gpus": 8}, "offload_fit": None},
                               "qlora": {"method": "qlora", "fit": None, "offload_fit": None}}}
        for key in ("rtx-3060", "h100-sxm")}}
    full, lora, qlora = cards_view(data, "rtx-3060")["rows"][0]["cells"]
    assert full.startswith("32 cards, fsdp") and "4 machines of 8 over a network: impractical for consumer cards" in full
    assert "machines" not in lora and qlora == "not within 64 cards"
    h100 = cards_view(data, "h100-sxm")["rows"][0]["cells"][0]
    assert "4 machines of 8 over a network" in h100 and "impractical" not in h100


def test_one_card_here_is_one_card_in_the_walk():
    """The table's recipe is the decision tree's Step 1 (checkpointing, fused loss, micro-batch 1; for
    QLoRA also double quantization and paged 8-bit AdamW): Llama 3.1 8B QLoRA fits one RTX 3060 in both,
    where the table once said two cards and the guide one (issue 19)."""
    from reportgen.advise.walk import walk

    c = CN.cards_needed(L8, catalog.load_gpu("rtx-3060"), "qlora")
    w = walk(L8, catalog.load_gpu("rtx-3060"), 2048)
    assert c.fit.gpus == 1 and w["recommended"]["setup"]["method"] == "qlora"
    assert CN.method_setups("qlora", 2048)[0].loss.value == "fused" and len(CN.method_setups("qlora", 2048)) == 3


def test_gpu_pages_warn_when_the_cards_table_was_computed_by_other_code(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from reportgen.fingerprint import estimator_hash
    from reportgen.report.pages import _load_cards

    stored = json.loads(Path("data/cards_needed.json").read_text())
    assert stored["estimator_hash"] == estimator_hash()  # the committed file is this code's: no warning
    assert stored["inputs_hash"] == CN.cards_inputs_hash(stored["seq"])
    path = tmp_path / "cards.json"
    path.write_text(json.dumps(stored))
    assert _load_cards(path) == stored and capsys.readouterr().err == ""
    path.write_text(json.dumps({**stored, "inputs_hash": "0" * 16}))
    assert _load_cards(path)["gpus"] == stored["gpus"]
    assert "run `reportgen cards`" in capsys.readouterr().err
    # a catalog entry edited since the table was written makes it stale too, not only the estimator's code
    path.write_text(json.dumps(stored))
    entry = catalog.gpu_entry
    monkeypatch.setattr(catalog, "gpu_entry", lambda key: {**entry(key), "memory_gib": 1} if key == "rtx-4090"
                        else entry(key))
    _load_cards(path)
    assert "run `reportgen cards`" in capsys.readouterr().err
    # a merge conflict in the committed file: a warning, and the pages go without the table (no traceback)
    path.write_text("<<<<<<< HEAD\n" + json.dumps(stored))
    assert _load_cards(path) is None
    err = capsys.readouterr().err
    assert f"warning: {path}: not valid JSON at line 1" in err and "the site goes without the GPU pages' 'How many cards' tables" in err


def test_stored_answers_obey_the_physics_of_each_method():
    """The numbers in data/cards_needed.json judged from outside the estimator (its currency is the
    test above):

    * every answer fits its card: the device total it names is within the card's memory;
    * no answer beats the parameter side: full fine-tuning with mixed-precision AdamW keeps 16 bytes a
      parameter (fp32 weights, gradients, two states; ZeRO's paper, section 3), LoRA the 16-bit base
      (2 bytes), QLoRA the packed 4-bit base (0.5 byte), each divided at best over the cards;
    * LoRA never needs more cards than full fine-tuning; QLoRA no more than LoRA where LoRA fits one
      machine (beyond it the 4-bit quantization state, which FSDP does not shard, is on every card);
      MoE models excepted (peft's k-bit preparation upcasts their 16-bit experts to fp32);
    * a card with more memory (of the same precision) never needs more cards."""
    import math
    from pathlib import Path

    from reportgen.estimate.search import default_precision

    data = json.loads(Path("data/cards_needed.json").read_text())
    gib, per_param = 2**30, {"full": 16, "lora": 2, "qlora": 0.5}

    def count(gpu, model, method):
        fit = data["gpus"][gpu][model][method]["fit"]
        return fit["gpus"] if fit else math.inf

    for gpu, per_model in data["gpus"].items():
        card = catalog.load_gpu(gpu)
        for model, answers in per_model.items():
            spec = catalog.load_model(model)
            for method, answer in answers.items():
                fit = answer["fit"]
                if fit is None:
                    continue
                assert fit["gpus"] in data["counts"]
                assert fit["device_total_gib"] * gib <= card.memory_bytes * 1.0001, (gpu, model, method)
                floor = per_param[method] * spec.total_params / fit["gpus"]
                assert fit["device_total_gib"] * gib >= floor, (gpu, model, method, fit)
            assert count(gpu, model, "lora") <= count(gpu, model, "full"), (gpu, model)
            if not spec.num_experts and count(gpu, model, "lora") <= 8:
                assert count(gpu, model, "qlora") <= count(gpu, model, "lora"), (gpu, model)
    gpus = list(data["gpus"])
    for a in gpus:
        for b in gpus:
            small, large = catalog.load_gpu(a), catalog.load_gpu(b)
            if default_precision(small) != default_precision(large) or small.memory_bytes > large.memory_bytes:
                continue
            for model in data["gpus"][a]:
                for method in per_param:
                    assert count(b, model, method) <= count(a, model, method), (a, b, model, method)
