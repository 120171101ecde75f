"""Liger-Kernel's layer kernels (``kernels: liger``, ``estimate/liger.py``): what they save, what they move,
which configs turn them on, and what is refused. The numbers are read from Liger-Kernel 0.6.4's code
(``ops/rms_norm.py``, ``ops/rope.py``, ``ops/swiglu.py``); the kernels are Triton and need a GPU, so these
CPU tests pin the worked examples of the docstrings rather than run the kernels."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.configs import setup_from, translate_file
from reportgen.configs.reverse import axolotl_keys, llamafactory_keys, trl_keys
from reportgen.errors import UserError
from reportgen.estimate import activations as act
from reportgen.estimate import estimate, liger
from reportgen.estimate import work as W
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import backward_working_bytes
from reportgen.setup import Attention, SetupError, TrainingSetup

LLAMA_1B = catalog.load_model("llama-3.2-1b")  # hidden 2048, intermediate 8192


def _setup(**kw) -> TrainingSetup:
    return TrainingSetup(**{"method": "full", "precision": "bf16", "batch": 2, "seq": 2048, "padding": "packed", **kw})


def test_liger_norm_saves_its_input_and_rstd_where_transformers_saves_an_fp32_copy_and_the_normalised_tensor():
    # pure bf16 full fine-tuning, one norm over 2048 features: 2 x 2048 + 4 against 4 x 2048 + 4 + 2 x 2048
    assert liger.rms_norm_saved(2048, 2, 1, True) == 4100
    assert act.ops.rms_norm(2048, 2, 1, dtypes_for(_setup()), True, False) == 12292
    assert liger.rms_norm_saved(2048, 2, 1, False) == 0  # no gradient wanted: no graph, nothing saved


def test_a_llama_layer_saves_two_norms_and_one_swiglu_tensor_less():
    """Per token of one Llama 3.2 1B layer, pure bf16: each of the two norms saves 12292 - 4100 = 8192 bytes
    less, and SwiGLU drops silu(gate), 2 x 8192 bytes."""
    dt = dtypes_for(_setup())
    eager = act.layer_activations(LLAMA_1B, _setup(), dt).per_token
    fused = act.layer_activations(LLAMA_1B, _setup(kernels="liger"), dt).per_token
    assert eager - fused == 2 * 8192 + 2 * 8192


def test_liger_swiglu_backward_holds_one_intermediate_gradient_instead_of_three():
    s_e, s_l = _setup(), _setup(kernels="liger")
    t, i = 2 * 2048, LLAMA_1B.intermediate_size
    diff = (backward_working_bytes(LLAMA_1B, s_e, dtypes_for(s_e), Attention.sdpa)
            - backward_working_bytes(LLAMA_1B, s_l, dtypes_for(s_l), Attention.sdpa))
    assert diff == 2 * t * i * 2


def test_liger_rms_norm_moves_one_read_and_one_write_a_feature():
    fwd, bwd = W.liger_rms_norm(4096, 2048, 2, 1, 2)
    assert (fwd.kernels, fwd.bytes) == (1, 4096 * (2048 * 4 + 4)) == (1, 33_570_816)
    assert bwd.kernels == 3 and bwd.bytes == 4096 * (2048 * 6 + 4)  # kernel, _dW.sum, cast to the bf16 weight
    assert W.liger_rms_norm(4096, 2048, 4, 1, 4)[1].kernels == 2  # an fp32 weight: no cast
    eager_f, eager_b = W.rms_norm(4096, 2048, 2, True, False)
    assert eager_f.kernels == 8 and eager_f.bytes > 8 * fwd.bytes and eager_b.bytes > 10 * bwd.bytes


def test_liger_makes_a_memory_bound_step_faster_and_smaller_and_changes_no_flops():
    m, g = catalog.load_model("tinyllama-1.1b"), catalog.load_gpu("rtx-3090")
    e, f = (estimate(m, g, _setup(batch=4, kernels=k), reverse=False) for k in ("eager", "liger"))
    assert f.time.compute_s == e.time.compute_s and f.time.memory_s < 0.5 * e.time.memory_s
    assert 0.8 < f.time.step_s / e.time.step_s < 0.95
    assert f.memory.terms["activations"] < e.memory.terms["activations"]
    assert liger.NOTE in f.notes and liger.NOTE not in e.notes


@pytest.mark.parametrize("model", ["gemma-2b", "mixtral-8x7b", "phi-3-mini", "olmo-2-7b"])
def test_families_liger_patches_with_kernels_not_modelled_are_refused_with_what_to_do(model):
    with pytest.raises(UserError, match="modelled for model types llama, mistral, qwen2, qwen3") as e:
        estimate(catalog.load_model(model), catalog.load_gpu("h100-sxm"), _setup(kernels="liger"), reverse=False)
    assert "--kernels eager" in e.value.hint


def test_a_model_type_liger_has_no_kernels_for_runs_transformers_modules_and_says_so():
    m, g = catalog.load_model("phi-2"), catalog.load_gpu("h100-sxm")
    e, f = (estimate(m, g, _setup(kernels=k), reverse=False) for k in ("eager", "liger"))
    assert (f.memory.peak_allocated, f.time.step_s) == (e.memory.peak_allocated, e.time.step_s)
    assert any("no kernels for model type 'phi'" in n for n in f.notes)


def test_qwen3_q_k_norms_stay_transformers_as_the_instance_patch_leaves_them():
    """Liger's instance patch replaces the model's, input and post-attention norms of each Qwen3 layer, not
    q_norm/k_norm: per token of a layer, only the two layer norms' and SwiGLU's savings."""
    q = catalog.load_model("qwen3-8b")
    dt = dtypes_for(_setup())
    eager = act.layer_activations(q, _setup(), dt).per_token
    fused = act.layer_activations(q, _setup(kernels="liger"), dt).per_token
    h, i = q.hidden_size, q.intermediate_size
    assert eager - fused == 2 * (4 * h + 4 + 2 * h - (2 * h + 4)) + 2 * i
    assert liger.QWEN3_NOTE in liger.note(q)


def test_liger_rope_keeps_q_and_k_in_their_dtype_for_attention():
    """bf16-mixed full fine-tuning: the RoPE table is fp32 (the stream's), so transformers' rotation returns
    fp32 q and k that are cast back for SDPA; Liger rotates them in place in bf16: no casts."""
    s = TrainingSetup(method="full", precision="bf16-mixed", batch=2, seq=2048)
    e = W.layer_work(LLAMA_1B, s, dtypes_for(s), Attention.sdpa, 2, 2048)[0]
    f = W.layer_work(LLAMA_1B, s.model_copy(update={"kernels": "liger"}), dtypes_for(s), Attention.sdpa, 2, 2048)[0]
    rope_e = W.rope(4096, LLAMA_1B.q_dim, 2, 4)[0] + W.rope(4096, LLAMA_1B.kv_dim, 2, 4)[0]
    norm_e = W.rms_norm(4096, LLAMA_1B.hidden_size, 4, True, False)[0]  # the fp32 stream: no casts, 6 kernels
    # two norms, RoPE (q and k in one kernel), SwiGLU (act and product in one), and the casts of q and k for SDPA
    assert e.kernels - f.kernels == 2 * (norm_e.kernels - 1) + (rope_e.kernels - 1) + (2 - 1) + 2 == 22


def test_the_case_label_says_liger():
    assert "fused-ce liger b2 s2048" in _setup(kernels="liger", loss="fused").short()
    assert "liger" not in _setup().short()


def test_liger_with_torchtunes_model_is_a_setup_error():
    with pytest.raises(SetupError, match="kernels"):
        TrainingSetup(kernels="liger", modeling="torchtune")


def test_the_trace_refuses_liger_and_the_harness_needs_cuda():
    from reportgen.measure.harness import check_supported
    from reportgen.measure.optimizers import SetupNotSupported
    from reportgen.trace.runner import check_recipe_traced

    with pytest.raises(UserError, match="kernels=liger runs Liger-Kernel's Triton kernels"):
        check_recipe_traced(_setup(kernels="liger"))
    with pytest.raises(SetupNotSupported, match="kernels='liger' uses Liger-Kernel's Triton kernels, which need a CUDA"):
        check_supported(_setup(kernels="liger"), "cpu")


class _Module:
    """A stand-in module: ``forward``'s ``__module__`` says who wrote it, as a bound method's does."""

    def __init__(self, owner: str):
        def forward():
            return None
        forward.__module__ = owner
        self.forward = forward


class _Model:
    def __init__(self, owners: list[str]):
        self.config = type("C", (), {"model_type": "llama"})()
        self._modules = [_Module(o) for o in owners]

    def modules(self):
        return iter(self._modules)


def _fake_liger(monkeypatch, patch_to: str):
    """A liger_kernel whose instance patch rewrites every module's forward to ``patch_to``'s, recording its kwargs."""
    import sys
    import types

    seen = {}

    def apply(model, **kw):
        seen.update(kw)
        for m in model.modules():
            m.forward.__module__ = patch_to
    pkg, sub = types.ModuleType("liger_kernel"), types.ModuleType("liger_kernel.transformers")
    sub._apply_liger_kernel_to_instance = apply
    monkeypatch.setitem(sys.modules, "liger_kernel", pkg)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", sub)
    return seen


def test_the_harness_patches_the_layer_kernels_only_and_refuses_a_model_liger_left_alone(monkeypatch):
    from reportgen.measure.liger import apply_layer_kernels
    from reportgen.measure.optimizers import SetupNotSupported

    seen, notes = _fake_liger(monkeypatch, "liger_kernel.transformers.rms_norm"), []
    apply_layer_kernels(_Model(["transformers.models.llama.modeling_llama"] * 3), notes)
    assert seen["rms_norm"] and seen["rope"] and seen["swiglu"] and not seen["fused_linear_cross_entropy"]
    assert notes == ["Liger-Kernel's RMSNorm, RoPE and SwiGLU kernels (3 modules patched)"]
    _fake_liger(monkeypatch, "transformers.models.phi.modeling_phi")  # Liger logs and patches nothing
    with pytest.raises(SetupNotSupported, match="patched no module"):
        apply_layer_kernels(_Model(["transformers.models.phi.modeling_phi"]), [])


def test_the_harness_names_the_package_when_liger_is_not_installed(monkeypatch):
    import sys

    from reportgen.measure.liger import apply_layer_kernels
    from reportgen.measure.optimizers import SetupNotSupported

    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    with pytest.raises(SetupNotSupported, match="pip install liger-kernel"):
        apply_layer_kernels(_Model([]), [])


def _translated(tmp_path, name: str, text: str) -> TrainingSetup:
    path = tmp_path / name
    path.write_text(text)
    return setup_from(translate_file(path))


def test_trl_use_liger_kernel_turns_on_the_layer_kernels_and_keeps_trls_loss(tmp_path):
    s = _translated(tmp_path, "trl.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_liger_kernel: true\n")
    assert (s.kernels.value, s.loss.value, s.recipe.value) == ("liger", "standard", "trl-sft")


@pytest.mark.parametrize("keys, plugin, kernels, approx", [
    ({"liger_rms_norm": True, "liger_rope": True, "liger_glu_activation": True}, True, "liger", None),
    ({"liger_rms_norm": True, "liger_rope": True, "liger_swiglu": True}, True, "liger", None),  # the old name
    ({"liger_rms_norm": True}, True, "eager", "only liger_rms_norm"),  # one of three: an upper bound
    ({"liger_rms_norm": True, "liger_rope": True, "liger_glu_activation": True}, False, "eager", "act only with"),
    ({}, True, "eager", None),
])
def test_axolotl_turns_on_liger_with_its_plugin_and_all_three_layer_keys(tmp_path, keys, plugin, kernels, approx):
    text = "base_model: meta-llama/Llama-3.2-1B\n"
    text += "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n" if plugin else ""
    text += "".join(f"{k}: {str(v).lower()}\n" for k, v in keys.items())
    path = tmp_path / "ax.yml"
    path.write_text(text)
    t = translate_file(path)
    assert setup_from(t).kernels.value == kernels
    notes = [note for _, note in t.approximated]
    assert any(approx in n for n in notes) if approx else not any("Liger" in n for n in notes)


@pytest.mark.parametrize("plugin, loss", [(True, "fused"), (False, "standard")])
def test_axolotl_fused_loss_key_needs_the_liger_plugin_too(tmp_path, plugin, loss):
    path = tmp_path / "ax.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nliger_fused_linear_cross_entropy: true\n"
                    + ("plugins:\n  - axolotl.integrations.liger.LigerPlugin\n" if plugin else ""))
    assert setup_from(translate_file(path)).loss.value == loss


def test_axolotl_refuses_both_names_of_the_glu_key(tmp_path):
    from reportgen.configs import ConfigError

    path = tmp_path / "ax.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nliger_swiglu: true\nliger_glu_activation: true\n")
    with pytest.raises(ConfigError, match="liger_swiglu: is the deprecated name of liger_glu_activation"):
        translate_file(path)


@pytest.mark.parametrize("extra, kernels", [("", "liger"), ("liger_kernel_config: {rope: false}\n", "eager"),
                                            ("liger_kernel_config: {cross_entropy: false}\n", "liger")])
def test_trl_liger_kernel_config_turning_a_layer_kernel_off_is_eager(tmp_path, extra, kernels):
    s = _translated(tmp_path, "trl.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_liger_kernel: true\n"
                    + extra)
    assert s.kernels.value == kernels


def test_the_written_configs_turn_liger_on():
    s = TrainingSetup(method="lora", kernels="liger", loss="fused")
    assert trl_keys("llama-3.2-1b", s).keys["use_liger_kernel"] is True
    ax = axolotl_keys("llama-3.2-1b", s).keys
    assert ax["liger_rms_norm"] and ax["liger_rope"] and ax["liger_glu_activation"]
    assert ax["liger_fused_linear_cross_entropy"]
    lf = llamafactory_keys("llama-3.2-1b", TrainingSetup(method="lora", kernels="liger"))
    assert lf.keys["enable_liger_kernel"] is True
    assert any("no key for kernels liger with loss standard" in n for n in lf.notes)
