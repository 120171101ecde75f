"""Speed claims in prose come from the tables' numbers and cite measurements where they exist
(issue 19, item 4): ``reportgen/measured.py`` pairs measured LoRA and QLoRA cases that differ only in
the base weights, through the provenance rule, and the walk's QLoRA claim is
``estimate.slowdown.qlora_slowdown``'s ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.advise.walk import walk
from reportgen.cli import main
from reportgen.estimate.slowdown import qlora_slowdown
from reportgen.measured import cases_from_files, cases_from_results, qlora_pairs, ratio_text, with_estimates
from reportgen.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
LORA = TrainingSetup(method="lora").model_dump(mode="json")
QLORA = TrainingSetup(method="qlora").model_dump(mode="json")
QLORA_DQ = TrainingSetup(method="qlora", double_quant=True).model_dump(mode="json")
QLORA_B4 = TrainingSetup(method="qlora", batch=4).model_dump(mode="json")


def _case(cid, setup, measured, estimated=None, model="llama-3.1-8b", gpu="h100-sxm"):
    return {"id": cid, "model": model, "gpu": gpu, "setup": setup, "measured_tokens_per_s": measured,
            "estimated_tokens_per_s": estimated}


def test_pairs_differ_only_in_the_base_weights():
    pairs = qlora_pairs([_case("l", LORA, 1000.0, 1100.0), _case("q", QLORA, 800.0, 1000.0),
                         _case("dq", QLORA_DQ, 750.0, None), _case("b4", QLORA_B4, 900.0, 1000.0),
                         _case("other-card", QLORA, 500.0, gpu="a100-80gb"), _case("unmeasured", QLORA, None)])
    assert [(p["qlora"], p["lora"]) for p in pairs] == [("dq", "l"), ("q", "l")]  # b4 and the other card: no partner
    q = next(p for p in pairs if p["qlora"] == "q")
    assert q["measured"] == pytest.approx(1.25) and q["estimated"] == pytest.approx(1.1)
    assert next(p for p in pairs if p["qlora"] == "dq")["estimated"] is None
    text = ratio_text(pairs, "llama-3.1-8b")
    assert text.startswith("Measured on the NVIDIA H100 SXM5 80GB: QLoRA took 1.25x to 1.33x LoRA's time")
    assert "2 pairs of llama-3.1-8b" in text and "the estimate for the same pairs: 1.10x" in text
    assert ratio_text([], "llama-3.1-8b") is None


def _result(cid, setup, tps, device_gpu="h100-sxm", emulated=None, gpu="h100-sxm"):
    cap = {"applied": True, "emulated_gpu": emulated} if emulated else {"applied": False}
    return {"id": cid, "case": {"model": "llama-3.1-8b", "gpu": gpu, "setup": setup},
            "estimate": {"time": {"tokens_per_s": 100.0}},
            "measurement": {"status": "ok", "measurement": {"tokens_per_s": tps}, "cap": cap,
                            "environment": {"device": "cuda", "gpu_catalog_key": device_gpu}}}


def test_a_capped_runs_speed_is_not_the_emulated_cards():
    """The provenance rule: an H100 capped to a 4090's memory measures the 4090's memory, never its speed."""
    capped = cases_from_results([_result("l", LORA, 1000.0, emulated="rtx-4090", gpu="rtx-4090"),
                                 _result("q", QLORA, 800.0, emulated="rtx-4090", gpu="rtx-4090")])
    assert all(c["measured_tokens_per_s"] is None for c in capped) and qlora_pairs(capped) == []
    own = cases_from_results([_result("l", LORA, 1000.0), _result("q", QLORA, 800.0)])
    assert [p["measured"] for p in qlora_pairs(own)] == [pytest.approx(1.25)]


def test_the_committed_h100_pairs_and_their_estimates():
    """The H100 runs under results/validation/measured/: Llama 3.1 8B QLoRA takes 1.16x to 1.64x LoRA's
    time for the same tokens; the estimate for the same pairs is ``qlora_slowdown``'s ratio."""
    pairs = with_estimates(qlora_pairs(cases_from_files(ROOT / "results")))
    mine = [p for p in pairs if p["model"] == "llama-3.1-8b"]
    assert len(mine) >= 3 and min(p["measured"] for p in mine) > 1.1
    for p in mine:
        sd = qlora_slowdown(catalog.load_model(p["model"]), catalog.load_gpu(p["gpu"]), TrainingSetup(**p["qlora_setup"]))
        assert p["estimated"] == pytest.approx(sd.ratio)


def test_advise_cites_the_measured_ratio_beside_its_estimate(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["advise", "--model", "llama-3.1-8b", "--gpu", "rtx-4090"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    expected = ratio_text(with_estimates(qlora_pairs(cases_from_files(ROOT / "results"))), "llama-3.1-8b")
    assert expected and " ".join(expected.split()) in out


def test_the_walks_quantization_claim_is_qlora_slowdowns_ratio():
    doc = walk("llama-3.1-8b", "rtx-4090", 2048)
    rec = TrainingSetup(**doc["recommended"]["setup"])
    sd = qlora_slowdown(catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090"), rec)
    assert doc["quantization"]["tokens_per_s_rel"] == pytest.approx(1 / sd.ratio - 1)
    assert f"{100 * (1 / sd.ratio - 1):+.0f} %" in doc["verdict"]["text"]
    json.dumps(doc)  # stored as JSON
