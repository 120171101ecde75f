"""Recipe ``grpo`` (``setup.recipe``): the harness's built model handed to TRL 1.16.0's real
``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``), whose own code then generates, scores and computes the
loss of each micro-batch; ``trace/grpo.py`` runs its step on the meta device.

What the trainer is given, and why:

* the model the harness builds (``build.py``: LoRA adapters already added, checkpointing already on),
  never moved (``hf_device_map`` on one device, as ``sft.py`` does), with ``use_cache`` back on as a
  checkpoint's config has it, so ``generate`` keeps transformers' ``DynamicCache``;
* ``GRPOConfig`` with the setup's ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
  ``num_generations``, ``max_completion_length``, ``generation_batch_size`` and ``beta``; ``use_vllm``
  off (generation ``hf``: transformers' ``generate``); no logging, no saving;
* a word-level tokenizer whose prompt is ``prompt_length`` copies of one word, so every prompt is exactly
  ``prompt_length`` tokens (no padding), and a reward function that returns 0.0 for every completion
  (``zero_reward``: the rewards are host-side floats; TRL turns them into one fp32 per completion);
* with ``beta > 0`` and full fine-tuning, the reference model TRL loads with
  ``create_model_from_path(model id, dtype=policy dtype)`` (``grpo_trainer.py`` 992-1003) is the
  harness's build of the same model without checkpointing (``ref_model``), as no weights are downloaded.
  With LoRA and ``beta > 0`` TRL copies the adapter into a frozen ``ref`` adapter when it is handed a
  ``PeftModel`` (485-506), as here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from reportgen.setup import TrainingSetup

#: the tokenizer's words: padding, end of sequence, and the one word every prompt and completion is made of
VOCAB = {"<pad>": 0, "<eos>": 1, "a": 2}
WORD = "a"


def zero_reward(completions, **kwargs) -> list[float]:
    """A reward of 0.0 for every completion: rewards run on the host and cost the GPU one fp32 each."""
    return [0.0] * len(completions)


@dataclass
class GrpoRecipe:
    trainer: object
    model: object
    ref_model: object | None

    def generation_batch(self, setup: TrainingSetup) -> list[dict]:
        """What TRL's dataloader hands ``training_step``: ``generation_batch`` rows, each prompt repeated
        ``num_generations`` times (``RepeatSampler``, ``grpo_trainer.py`` 1280-1316)."""
        prompt = " ".join([WORD] * setup.prompt_length)
        return [{"prompt": prompt} for _ in range(setup.generation_batch)]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


@contextlib.contextmanager
def _reference_from(ref_model):
    """TRL's ``create_model_from_path`` returns ``ref_model`` (no download) while the trainer is made."""
    import trl.trainer.grpo_trainer as G

    saved = G.create_model_from_path
    G.create_model_from_path = lambda model_id, *a, **kw: ref_model
    try:
        yield
    finally:
        G.create_model_from_path = saved


def make_grpo_trainer(model, setup: TrainingSetup, device: str, output_dir: str, ref_model=None) -> GrpoRecipe:
    """The real ``GRPOTrainer`` around the built model (see the module docstring)."""
    import warnings

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from reportgen.measure.sft import OPTIM

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # a checkpoint's config.json asks for the KV cache (Qwen3's and Llama's "use_cache": true); build.py turns it
    # off for the SFT step. generate reads it from the generation config; TRL's fused forward passes
    # use_cache=False itself (trl/trainer/utils.py add_fused_lm_head), so scoring and the policy step keep none
    base.config.use_cache = base.generation_config.use_cache = True
    if device == "meta":
        base.hf_device_map = {"": "meta"}  # the trainer leaves the policy where it is (as sft.py)
        if ref_model is not None:  # accelerate's prepare_model moves a model whose device map has fewer than two
            # entries to its device (accelerator.py verify_device_map): a no-op on CUDA, impossible from meta
            ref_model.hf_device_map = {"model": "meta", "lm_head": "meta"}
    args = GRPOConfig(output_dir=output_dir, use_cpu=device != "cuda", bf16=setup.precision.value == "bf16-mixed",
                      fp16=setup.precision.value == "fp16-mixed", gradient_checkpointing=False,
                      per_device_train_batch_size=setup.batch, gradient_accumulation_steps=setup.accum,
                      num_generations=setup.num_generations, max_completion_length=setup.max_completion_length,
                      generation_batch_size=setup.generation_batch, beta=setup.beta, use_vllm=False,
                      optim=OPTIM.get(setup.optimizer, "adamw_torch_fused"), report_to=[], save_strategy="no",
                      logging_strategy="no")
    rows = Dataset.from_dict({"prompt": [WORD] * max(1, setup.generation_batch // setup.num_generations)})
    with warnings.catch_warnings(), _reference_from(ref_model):
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=args, train_dataset=rows,
                              processing_class=_tokenizer())
    trainer.model.train()
    return GrpoRecipe(trainer=trainer, model=trainer.model, ref_model=trainer.ref_model)
