"""Any model by its Hugging Face Hub id (issue 28): ``--model ORG/NAME[@REVISION]`` everywhere a model
is named, resolved through huggingface_hub's cache (``hub.py``).

Every test but the last runs without network: a fixture Hugging Face cache in the real layout
(``models--ORG--NAME/refs/main`` holding a commit, ``snapshots/<commit>/config.json``) under
``HF_HUB_CACHE``, with ``HF_HUB_OFFLINE=1``, as a user's machine has it after one download.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen import catalog, hub
from reportgen.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"

#: Qwen/Qwen3-14B's shape as its model card states it (40 layers, 40 query and 8 key/value heads,
#: hidden size 5120, 14.8B parameters of which 13.2B are not embeddings), with Qwen3-8B's published
#: vocabulary and the MLP width those counts imply (17,408). Not a copy of the published file, which
#: this machine cannot fetch: it stands for it in the cache, and its counts are checked against the card.
QWEN3_14B = {**json.loads((ROOT / "reportgen/catalog/models/qwen3-8b.json").read_text()),
             "_name_or_path": "Qwen/Qwen3-14B", "hidden_size": 5120, "intermediate_size": 17408,
             "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8, "max_window_layers": 40}


def put_in_cache(cache: Path, repo: str, config: dict, commit: str = COMMIT, ref: str = "main") -> None:
    """What ``hf_hub_download(repo, "config.json")`` leaves in ``HF_HUB_CACHE``."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (folder / "snapshots" / commit / "config.json").write_text(json.dumps(config))


@pytest.fixture
def cache(tmp_path) -> Path:
    root = tmp_path / "hub"
    put_in_cache(root, "Qwen/Qwen3-14B", QWEN3_14B)
    put_in_cache(root, "acme/custom-lm", {"model_type": "acme_lm", "auto_map": {"AutoConfig": "x.AcmeConfig"},
                                          "hidden_size": 64})
    put_in_cache(root, "google-bert/bert-base-uncased", {"model_type": "bert", "hidden_size": 768,
                                                         "architectures": ["BertForMaskedLM"]})
    return root


def run(args: list[str], cache: Path, cwd: Path | None = None, offline: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)  # tests/conftest.py sets it for the whole suite
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "reportgen", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)


def test_a_hub_id_estimates_from_the_cache_offline_with_the_publishers_count(cache):
    proc = run(["estimate", "--model", "Qwen/Qwen3-14B", "--gpu", "rtx-4090", "--method", "qlora",
                "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    total = out["params"]["total"]
    embeddings = 2 * QWEN3_14B["vocab_size"] * QWEN3_14B["hidden_size"]  # untied head
    assert round(total / 1e9, 1) == 14.8 and round((total - embeddings) / 1e9, 1) == 13.2  # the model card's
    assert out["model"] == "Qwen/Qwen3-14B"
    assert out["model_source"] == {"hub": "Qwen/Qwen3-14B", "revision": COMMIT}
    assert "fetching" not in proc.stderr  # from the cache: no network asked


def test_a_multimodal_checkpoint_estimates_its_text_tower_and_says_so(cache):
    """Issue 28: a Gemma 3 checkpoint with its vision tower (the shape of google/gemma-3-4b-it's
    config: the 1B's language model here, tests/test_vision.py pins the tower) by its Hub id."""
    from tests.test_vision import multimodal

    put_in_cache(cache, "acme/gemma-3-vision", multimodal(layers=26))
    proc = run(["estimate", "--model", "acme/gemma-3-vision", "--gpu", "rtx-4090", "--method", "qlora",
                "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert any("acme/gemma-3-vision is multimodal" in n and "do not run" in n for n in out["notes"])
    text = run(["estimate", "--model", "gemma-3-1b", "--gpu", "rtx-4090", "--method", "qlora", "--format", "json"],
               cache)
    assert out["params"]["total"] > json.loads(text.stdout)["params"]["total"]


def test_the_table_names_the_commit_and_a_revision_can_be_given(cache):
    proc = run(["estimate", "--model", f"Qwen/Qwen3-14B@{COMMIT}", "--gpu", "rtx-4090", "--method", "qlora"], cache)
    assert proc.returncode == 0, proc.stderr
    assert f"config.json of Qwen/Qwen3-14B at commit {COMMIT}" in proc.stdout


@pytest.mark.parametrize("model, words", [
    ("Qwen/Qwen3-15B", "HF_HUB_OFFLINE is set and its config.json is not in the Hugging Face cache"),
    ("Qwen/Qwen3-14B@no-such-branch", "not in the Hugging Face cache"),
    ("acme/custom-lm", "reportgen never runs code from a repository"),
    ("google-bert/bert-base-uncased", "model_type 'bert' has no analytic formulas"),
    ("Qwen3-14B", "Any model on the Hugging Face Hub: --model ORG/NAME"),
])
def test_each_failure_exits_2_with_what_to_do(cache, model, words):
    proc = run(["estimate", "--model", model, "--gpu", "rtx-4090"], cache)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert "hint:" in proc.stderr and "fetching" not in proc.stderr  # offline: nothing is fetched


def test_a_family_without_formulas_points_to_trace(cache):
    proc = run(["estimate", "--model", "google-bert/bert-base-uncased", "--gpu", "rtx-4090"], cache)
    assert "reportgen trace --model google-bert/bert-base-uncased" in proc.stderr


def test_trace_takes_a_hub_id_of_a_family_without_formulas(cache):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    put_in_cache(cache, "tiny/gpt2", {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 128,
                                      "n_positions": 256})
    proc = run(["trace", "--model", "tiny/gpt2", "--gpu", "rtx-4090", "--method", "full", "--seq", "32",
                "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "traced" and out["model"] == "tiny/gpt2"
    assert out["params"]["total"] == 2 * (4 * 64 * 64 + 4 * 64 + 2 * 4 * 64 * 64 + 64 + 4 * 64 + 4 * 64) \
        + 128 * 64 + 256 * 64 + 2 * 64  # GPT-2's blocks, token and position embeddings, final LayerNorm


def test_a_catalog_models_own_hub_id_is_the_catalog_model_without_network(cache):
    proc = run(["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "rtx-4090", "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "llama-3.1-8b"


def test_a_trl_config_and_a_sweep_take_a_hub_id(cache, tmp_path):
    trl = tmp_path / "sft.yaml"
    trl.write_text("model_name_or_path: Qwen/Qwen3-14B\nper_device_train_batch_size: 1\nmax_length: 1024\n"
                   "use_peft: true\nload_in_4bit: true\ngradient_checkpointing: true\nbf16: true\n")
    proc = run(["estimate", "--from", str(trl), "--gpu", "rtx-4090", "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "Qwen/Qwen3-14B" and out["setup"]["method"] == "qlora"
    assert out["model_source"]["revision"] == COMMIT

    sweep = tmp_path / "hub.yaml"
    sweep.write_text("name: hub\ngrids:\n  - model: Qwen/Qwen3-14B\n    gpu: rtx-4090\n    method: qlora\n"
                     "    grad_ckpt: true\n    seq: 1024\n")
    results = tmp_path / "results"
    proc = run(["sweep", str(sweep), "--no-render", "--results", str(results)], cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [doc] = [json.loads(p.read_text()) for p in (results / "hub").glob("*.json")]
    assert doc["status"] == "ok" and doc["case"]["model"] == "Qwen/Qwen3-14B"
    assert doc["model_source"] == {"hub": "Qwen/Qwen3-14B", "revision": COMMIT}
    assert doc["id"].startswith("Qwen3-14B.rtx-4090.qlora.")


def test_a_config_naming_an_uncached_hub_id_is_an_error_at_its_line(cache, tmp_path):
    trl = tmp_path / "sft.yaml"
    trl.write_text("per_device_train_batch_size: 1\nmodel_name_or_path: acme/not-cached-model\n")
    proc = run(["estimate", "--from", str(trl), "--gpu", "rtx-4090"], cache)
    assert proc.returncode == 2 and f"{trl}:2" in proc.stderr and "not in the Hugging Face cache" in proc.stderr


@pytest.mark.parametrize("text, parsed", [
    ("Qwen/Qwen3-14B", ("Qwen/Qwen3-14B", None)),
    ("Qwen/Qwen3-14B@v1.0", ("Qwen/Qwen3-14B", "v1.0")),
    ("org/name@refs/pr/3", ("org/name", "refs/pr/3")),
    ("llama-3.1-8b", None),
    ("configs/model.json", None),
    ("../x/y", None),
    ("a/b/c", None),
    ("org/na me", None),
])
def test_what_reads_as_a_hub_id(text, parsed):
    assert hub.parse(text) == parsed


@pytest.mark.parametrize("text, canonical", [
    ("https://huggingface.co/Qwen/Qwen3-14B", "Qwen/Qwen3-14B"),
    ("huggingface.co/Qwen/Qwen3-14B/", "Qwen/Qwen3-14B"),
    ("https://huggingface.co/Qwen/Qwen3-14B/blob/main/config.json", "Qwen/Qwen3-14B"),
    ("https://hf.co/Qwen/Qwen3-14B/resolve/0123abc/config.json", "Qwen/Qwen3-14B@0123abc"),
    ("https://huggingface.co/org/name/tree/refs%2Fpr%2F3", "org/name@refs/pr/3"),
    ("https://huggingface.co/Qwen/Qwen3-14B?library=transformers", "Qwen/Qwen3-14B"),
    ("hf://Qwen/Qwen3-14B@0123abc", "Qwen/Qwen3-14B@0123abc"),  # HubConfig.source, as results store it
    ("https://huggingface.co/datasets/org/name", "https://huggingface.co/datasets/org/name"),  # not a model
    ("https://example.com/org/name", "https://example.com/org/name"),
    ("Qwen/Qwen3-14B", "Qwen/Qwen3-14B"),
])
def test_a_hub_address_from_the_browser_is_its_id(text, canonical):
    assert hub.canonical(text) == canonical


def test_a_pasted_hub_address_estimates_as_its_id_and_a_path_too_long_is_named(cache):
    proc = run(["estimate", "--model", "https://huggingface.co/Qwen/Qwen3-14B", "--gpu", "rtx-4090", "--method",
                "qlora", "--format", "json"], cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "Qwen/Qwen3-14B"
    proc = run(["estimate", "--model", "Qwen/Qwen3-14B/config", "--gpu", "rtx-4090"], cache)
    assert proc.returncode == 2 and "a Hub id is ORG/NAME: did you mean Qwen/Qwen3-14B?" in proc.stderr


def _http_error(cls, status: int):
    httpx = pytest.importorskip("httpx2")
    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x/y/resolve/main/config.json"))
    return cls("refused", response=response)


@pytest.mark.parametrize("error, words", [
    ("GatedRepoError", "gated repository"),
    ("RepositoryNotFoundError", "no such repository on the Hugging Face Hub"),
    ("RevisionNotFoundError", "has no revision"),
])
def test_the_hubs_refusals_are_answers(monkeypatch, error, words):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub import errors

    def refuse(*args, **kwargs):
        raise _http_error(getattr(errors, error), 401 if error == "GatedRepoError" else 404)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    with pytest.raises(UserError) as caught:
        hub.fetch_config("meta-llama/Llama-3.1-8b", "v2" if error == "RevisionNotFoundError" else None,
                         catalog.catalog_ids())
    assert words in caught.value.message and caught.value.hint
    if error == "RepositoryNotFoundError":  # a near miss of a catalog id is named
        assert "meta-llama/Llama-3.1-8B" in caught.value.hint


def _online() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _online(), reason="needs network to huggingface.co")
def test_a_hub_id_is_fetched_from_the_hub(tmp_path):
    proc = run(["estimate", "--model", "Qwen/Qwen3-0.6B", "--gpu", "rtx-4090", "--format", "json"], tmp_path / "hub",
               offline=False)
    assert proc.returncode == 0, proc.stderr
    assert round(json.loads(proc.stdout)["params"]["total"] / 1e9, 1) == 0.6  # the model card's 0.6B
