"""Recipes ``trainer`` and ``trl-sft`` (``setup.recipe``): the harness's built model handed to the
real ``transformers.Trainer`` / ``trl.SFTTrainer`` (TRL 1.16.0, the dev and measure extras), whose
own code then prepares the model, builds the optimizer and computes the loss of each micro-batch;
the harness's step (``step.py``) still drives forward, backward and ``optimizer.step()`` so the
marks, timing and memory reads are the same as the loop's.

What the trainer's ``__init__`` does to the model (``trl/trainer/sft_trainer.py``): on a 4-bit
model (``is_loaded_in_4bit``, which ``from_pretrained`` sets and the harness's QLoRA build,
``build.py``, sets too) the trainable parameters but DoRA's magnitudes are cast to bf16 (904-911); with PEFT and
checkpointing ``enable_input_require_grads`` (899-900); ``add_fused_lm_head`` (1143-1147). Its
``compute_loss`` is called on the batch the TRL collator makes for unpadded samples: ``input_ids``,
an all-ones ``attention_mask`` and ``labels`` equal to the ids. Its optimizer is
``Trainer.create_optimizer`` (a weight-decay and a no-decay group) for the optimizers the
``optim`` names below select; the others keep the harness's (``optimizers.py``).

The model is never moved by the trainer: ``place_model_on_device`` is off for a model with an
``hf_device_map`` on one device other than the trainer's (``trainer.py``), which the trace on the
meta device relies on; on CUDA the model already is on its device.
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.setup import Optimizer, Recipe, TrainingSetup

#: ``TrainingArguments.optim`` for the setup's optimizer, where Trainer builds the same one
OPTIM = {Optimizer.adamw: "adamw_torch_fused", Optimizer.sgd: "sgd"}


@dataclass
class TrainerRecipe:
    trainer: object
    model: object

    def forward(self, ids, mask, labels):
        """One micro-batch's loss through the trainer's ``compute_loss`` (the outputs stay inside it)."""
        import torch

        inputs = {"input_ids": ids, "attention_mask": mask if mask is not None else torch.ones_like(ids),
                  "labels": labels}
        return self.trainer.compute_loss(self.model, inputs), None


def _tokenizer():
    """A two-token tokenizer (no download): SFTTrainer needs a processing class for its pad token."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                   pad_token="<pad>", eos_token="<eos>")


def make_trainer(model, setup: TrainingSetup, device: str, output_dir: str) -> TrainerRecipe:
    """The real trainer of ``setup.recipe`` around the built model (see the module docstring)."""
    import warnings

    from datasets import Dataset

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if device == "meta":
        base.hf_device_map = {"": "meta"}  # the trainer leaves the model where it is (module docstring)
    common = dict(output_dir=output_dir, use_cpu=device != "cuda", bf16=setup.precision.value == "bf16-mixed",
                  fp16=setup.precision.value == "fp16-mixed", gradient_checkpointing=False,
                  per_device_train_batch_size=setup.batch, gradient_accumulation_steps=setup.accum,
                  optim=OPTIM.get(setup.optimizer, "adamw_torch_fused"), report_to=[], save_strategy="no",
                  logging_strategy="no")
    # checkpointing is already on (build.py enables it as Trainer does: non-reentrant) and so are PEFT's
    # input gradients (build.py, as sft_trainer.py 899-900 does with gradient_checkpointing)
    rows = Dataset.from_dict({"input_ids": [[1] * min(setup.seq, 8)]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if setup.recipe == Recipe.trl_sft:
            from trl import SFTConfig, SFTTrainer

            args = SFTConfig(**common, max_length=setup.seq, dataset_kwargs={"skip_prepare_dataset": True})
            trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=_tokenizer())
        else:
            from transformers import Trainer, TrainingArguments

            trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=rows)
    trainer.model.train()
    return TrainerRecipe(trainer=trainer, model=trainer.model)


def trainer_optimizer(recipe: TrainerRecipe, setup: TrainingSetup):
    """``Trainer.create_optimizer`` where the setup's optimizer has an ``optim`` name, else None."""
    if setup.optimizer not in OPTIM:
        return None
    return recipe.trainer.create_optimizer()
