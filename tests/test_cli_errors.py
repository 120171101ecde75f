"""Bad input is a message and exit status 2, never a traceback: malformed config.json files, out-of-
range flags, files that are not what a command reads, and `reportgen measure` without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen.cli import main

GOOD = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 1000, "intermediate_size": 512, "max_position_embeddings": 2048}

#: (name, config.json content as written, words the message must contain)
BAD_CONFIGS = [
    ("list", [GOOD], "JSON object"),
    ("string", "llama", "JSON object"),
    ("unknown-type", {**GOOD, "model_type": "gpt9"}, "'gpt9' is not supported"),
    ("no-type", {k: v for k, v in GOOD.items() if k != "model_type"}, "model_type None is not supported"),
    ("missing-key", {k: v for k, v in GOOD.items() if k != "vocab_size"}, "lacks the key 'vocab_size'"),
    ("null-size", {**GOOD, "hidden_size": None}, "hidden_size is null; it must be a positive integer"),
    ("zero-size", {**GOOD, "num_hidden_layers": 0}, "num_hidden_layers is 0; it must be a positive integer"),
    ("negative-size", {**GOOD, "intermediate_size": -512}, "intermediate_size is -512"),
    ("string-size", {**GOOD, "vocab_size": "32k"}, "vocab_size is \"32k\""),
    ("float-size", {**GOOD, "hidden_size": 256.5}, "hidden_size is 256.5"),
    ("bool-size", {**GOOD, "num_attention_heads": True}, "num_attention_heads is true"),
    ("heads-do-not-divide", {**GOOD, "num_attention_heads": 3, "num_key_value_heads": 3},
     "a divisor of hidden_size (256)"),
    ("kv-do-not-divide", {**GOOD, "num_key_value_heads": 3}, "a divisor of num_attention_heads (4)"),
    ("bool-as-string", {**GOOD, "tie_word_embeddings": "false"}, "tie_word_embeddings is \"false\"; it must be true or false"),
    ("negative-window", {**GOOD, "sliding_window": -1}, "sliding_window is -1"),
    ("experts-per-token", {**GOOD, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 5},
     "num_experts_per_tok is 5; it must be between 1 and the number of experts (4)"),
    # issue 20: values no model has, and names transformers does not know
    ("huge-vocab", {**GOOD, "vocab_size": 10**12}, "vocab_size is 1000000000000; it must be at most 4,194,304"),
    ("huge-depth", {**GOOD, "num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000; it must be at most"),
    ("infinite-softcap", {**GOOD, "final_logit_softcapping": float("inf")},
     "final_logit_softcapping is Infinity; it must be null or a positive, finite number"),
    ("nan-theta", {**GOOD, "rope_theta": float("nan")}, "rope_theta is NaN"),
    ("zero-context", {**GOOD, "max_position_embeddings": 0}, "max_position_embeddings is 0; it must be a positive"),
    ("unknown-activation", {**GOOD, "hidden_act": "banana"}, "hidden_act is \"banana\"; it must be an activation"),
    ("unknown-rope", {**GOOD, "rope_scaling": {"rope_type": "weird", "factor": 2.0}},
     "rope_scaling.rope_type is \"weird\"; it must be a RoPE type"),
    ("rope-not-object", {**GOOD, "rope_scaling": "linear"}, "rope_scaling is \"linear\""),
    ("rotary-factor", {**GOOD, "partial_rotary_factor": 0}, "partial_rotary_factor is 0"),
    ("mixtral-no-experts", {**GOOD, "model_type": "mixtral", "num_local_experts": 0}, "a mixture of experts"),
    # was "Qwen3-MoE with dense layers (mlp_only_layers=[], decoder_sparse_step=1)": both values were right
    ("qwen3-moe-no-experts", {**GOOD, "model_type": "qwen3_moe", "num_experts": 0, "moe_intermediate_size": 64},
     "num_experts is 0; a Qwen3-MoE model has experts"),
    ("deep", {**GOOD, "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
     "nested more than 32 levels deep"),
]


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())  # rich wraps long lines


@pytest.mark.parametrize("name, content, words", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_malformed_config_is_a_message(tmp_path, capsys, name, content, words):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(content))
    for command in ("estimate", "advise"):
        code, out = run(capsys, command, "--model", str(path), "--gpu", "rtx-4090")
        assert code == 2, (command, out)
        assert "Traceback" not in out and f"{path}" in out and words in out


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"{\"model_type\": \"llama\",", b"",
                                     b"[" * 100_000 + b"]" * 100_000, b"[1" + b"0" * 5000 + b"]"])
def test_unreadable_config_file_is_a_message(tmp_path, capsys, content):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    for command in ("estimate", "advise", "measure"):  # measure checks the config before it starts a worker
        code, out = run(capsys, command, "--model", str(path), "--gpu", "t4")
        assert code == 2 and "error:" in out and "Traceback" not in out, (command, out)


def test_trace_refuses_a_config_that_is_a_list(tmp_path, capsys):
    """Was an AttributeError: ``reportgen trace`` reads configs of any family itself."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps([GOOD]))
    code, out = run(capsys, "trace", "--model", str(path), "--gpu", "t4")
    assert code == 2 and "this one holds a list" in out and "Traceback" not in out


def test_a_mixtral_config_without_expert_counts_takes_mixtrals_defaults(tmp_path):
    """MixtralConfig has 8 experts, 2 per token, by default: a config that leaves them out is no dense model."""
    from reportgen import catalog

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOD, "model_type": "mixtral"}))
    spec = catalog.load_model(str(path))
    assert (spec.num_experts, spec.experts_per_token) == (8, 2)
    assert spec.active_params < spec.total_params


def test_config_directory_without_config_json(tmp_path, capsys):
    code, out = run(capsys, "estimate", "--model", str(tmp_path), "--gpu", "t4")
    assert code == 2 and "no such file" in out


BAD_FLAGS = [
    ("--batch", "0"), ("--batch", "-3"), ("--seq", "4"), ("--accum", "0"), ("--gpus", "0"), ("--lora-rank", "0"),
    ("--lora-alpha", "0"), ("--lora-dropout", "1.5"), ("--lora-dropout", "-0.1"), ("--train-tokens", "nan"),
    ("--train-tokens", "-5"), ("--train-tokens", "1.5"), ("--train-tokens", "lots"), ("--method", "lorra"),
    ("--precision", "fp8"), ("--batch", "two"), ("--gpu", "rtx4090"), ("--model", "llama-9b"),
]


@pytest.mark.parametrize("flag, value", BAD_FLAGS, ids=[f"{f}={v}" for f, v in BAD_FLAGS])
def test_out_of_range_flags_exit_2(capsys, flag, value):
    argv = {"--model": "llama-3.2-1b", "--gpu": "rtx-4090"}
    argv[flag] = value
    try:
        code, out = run(capsys, "estimate", *[x for kv in argv.items() for x in kv])
    except SystemExit as exc:  # argparse rejects a choice or a type itself, with status 2
        code, out = exc.code, capsys.readouterr().err
    assert code == 2 and "Traceback" not in out
    assert flag in out or value in out


@pytest.mark.parametrize("flags, words", [
    (["--method", "full", "--lora-rank", "64"], "--lora-rank: applies only to --method lora or --method qlora"),
    (["--method", "full", "--lora-targets", "qv"], "--lora-targets: applies only to"),
    (["--method", "full", "--lora-dropout", "0.1"], "--lora-dropout: applies only to"),
    (["--method", "lora", "--quant", "fp4", "--double-quant"], "--quant: applies only to --method qlora"),
    (["--method", "lora", "--double-quant"], "--double-quant: applies only to --method qlora"),
    (["--method", "full", "--quant", "nf4"], "with --method full it changes nothing"),
    (["--method", "lora", "--lora-alpha", "100000000000000000000"], "--lora-alpha: must be <= 65536"),
    (["--seq", "100000000"], "--seq: must be <= 1048576 (got 100000000)"),
    (["--gpus", "9", "--sharding", "hybrid-shard"], "--gpus: 9 GPUs for hybrid-shard"),  # nodes of 8: was accepted
    (["--gpu-memory", "0GiB"], "GPU memory '0GiB': must be more than zero"),
    (["--gpu-memory", "5TiB"], "more than 4 TiB"),
])
def test_flags_that_do_nothing_or_no_card_has_are_refused(capsys, flags, words):
    """Issue 20: accepted without a word before (or refused with a misleading message)."""
    for command in ("estimate", "measure", "trace"):
        code, out = run(capsys, command, "--model", "llama-3.2-1b", "--gpu", "rtx-4090", *flags)
        assert code == 2 and words in out and "Traceback" not in out, (command, out)


@pytest.mark.parametrize("argv, words", [
    (["cards", "--seq", "2000000"], "--seq: must be <= 1048576 (got 2000000)"),
    (["cards", "--seq", "4"], "--seq: must be >= 8 (got 4)"),
    (["advise", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "3000000"], "--seq: must be <= 1048576"),
])
def test_every_command_bounds_the_sequence_as_the_setup_does(tmp_path, capsys, argv, words):
    """``cards --seq 2000000`` was a traceback: it checked only the lower bound, the setup the upper."""
    code, out = run(capsys, *argv, *(["--out", str(tmp_path / "c.json")] if argv[0] == "cards" else []))
    assert code == 2 and words in out and "Traceback" not in out
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("command", [["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090"],
                                     ["advise", "--model", "llama-3.2-1b", "--gpu", "rtx-4090"]])
def test_train_tokens_are_bounded_as_in_a_sweep_file(capsys, command):
    """``--train-tokens 1e30`` priced hours for 10^30 tokens; a sweep file refused more than 1e15."""
    with pytest.raises(SystemExit) as exc:
        main([*command, "--train-tokens", "1e30"])
    assert exc.value.code == 2 and "at most 1e15 tokens" in capsys.readouterr().err
    assert main([*command, "--train-tokens", "1e15", "--format", "json"]) == 0


def test_flags_of_the_chosen_method_are_accepted(capsys):
    code, out = run(capsys, "estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "qlora",
                    "--quant", "fp4", "--double-quant", "--lora-rank", "8", "--lora-targets", "qv")
    assert code == 0, out


def test_inconsistent_setup_names_the_flags(capsys):
    code, out = run(capsys, "estimate", "--model", "llama-3.2-1b", "--gpu", "t4", "--gpus", "2")
    assert code == 2 and "needs sharding" in out


@pytest.mark.parametrize("argv, words", [
    (["render", "--results", "NO-SUCH-DIR"], "not a directory"),
    (["show", "nope", "--results", "NO-SUCH-DIR"], "unknown case id"),
    (["sweep", "NO-SUCH.yaml"], "no such sweep file"),
    (["compare-published", "--csv", "NO-SUCH.csv"], "no such file"),
])
def test_missing_inputs(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    code, out = run(capsys, *argv)
    assert code == 2 and words in out


def test_compare_published_rejects_a_csv_that_is_not_one(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,source\nR1,x\n")
    code, out = run(capsys, "compare-published", "--csv", str(bad), "--out", str(tmp_path / "o.json"))
    assert code == 2 and "missing columns" in out and not (tmp_path / "o.json").exists()


def test_measure_without_torch_names_the_extra(tmp_path):
    """A subprocess where ``import torch`` fails (as on a machine without the measure extra)."""
    code = ("import sys; sys.modules['torch'] = None; from reportgen.cli import main; "
            "sys.exit(main(['measure', '--model', 'llama-3.2-1b', '--gpu', 't4', '--device', 'cpu']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "not installed: torch" in err and '.[measure]' in err and "Traceback" not in err


def test_an_output_path_that_cannot_be_written_is_named(capsys):
    """``--out`` where nothing can be written: the path the user gave and why, exit 2, no traceback."""
    assert main(["compare-published", "--out", "/proc/reportgen-test/out.json"]) == 2
    err = capsys.readouterr().err
    assert "error: cannot use /proc/reportgen-test/out.json" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["estimat"], "did you mean 'estimate'?"),
    (["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "lor"], "did you mean 'lora' or 'qlora'?"),
    (["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--modeling", "torchtun"], "did you mean 'torchtune'?"),
])
def test_a_misspelled_choice_gets_the_closest_ones(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["estimate", "--mod", "llama-3.2-1b", "--gpu", "rtx-4090"], "unrecognized arguments: --mod llama-3.2-1b; did "
                                                                  "you mean --model?"),
    (["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq-me", "400"], "--seq-me 400"),
    (["sweep", "sweeps/consumer.yaml", "--resluts", "r"], "did you mean --results?"),
    (["cards", "--model", "x"], "unrecognized arguments: --model x"),
])
def test_an_option_is_spelled_whole_and_a_misspelling_gets_the_closest(capsys, argv, says):
    """argparse took ``--seq-me 400`` as ``--seq-mean`` (abbreviations) and said only "ambiguous option"
    for ``--mod``; an unknown option is now named by its subcommand with the closest one."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and says in err and f"reportgen {argv[0]}: error" in err
    assert "--help?" not in err


@pytest.mark.parametrize("argv, says", [
    (["advise", "--mermaid", "--model", "llama-3.2-1b"], "--model: not read with --mermaid"),
    (["advise", "--store", "sweeps/consumer.yaml", "--gpu", "t4"], "--gpu: not read with --store"),
    (["advise", "--model", "llama-3.2-1b", "--gpu", "t4", "--force"], "--force: applies only with --store"),
    (["advise", "--store", "sweeps/consumer.yaml", "--format", "json"], "--format json: --store prints no table"),
    (["trace", "--model", "llama-3.2-1b", "--gpu", "t4", "--seq", "64", "--seed", "5"], "--seed: draws the batches"),
])
def test_advise_refuses_a_flag_its_mode_does_not_read(capsys, argv, says):
    """``advise --store s.yaml --gpu t4`` stored every card's walks, as if --gpu were not there."""
    code, out = run(capsys, *argv)
    assert code == 2 and says in out


@pytest.mark.parametrize("argv", [["advise", "--mermaid"], ["estimate", "--model", "llama-3.2-1b", "--gpu", "t4"]])
def test_output_cut_short_by_a_pipe_is_no_error(argv):
    """``reportgen advise --mermaid | head -1`` printed "error: cannot use: Broken pipe", and a table's
    print (rich) exited 1 where a plain print exits 141: both end quietly with 141 now."""
    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\nfrom reportgen.cli import main\n"
            f"sys.stderr.write('rc=' + str(main({json.dumps(argv)})))\n")
    proc = subprocess.run([sys.executable, "-u", "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)  # -u: the write itself meets the closed pipe
    assert proc.stderr == "rc=141"


def test_reportgen_alone_lists_its_commands(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "estimate" in err and "sweep" in err and "advise" in err and "required" not in err


def test_a_choice_like_none_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--method", "xyzzy"])
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("content, line, char", [(b"\x00", 1, "U+0000"), (b"a: 1\n\x01b: 2\n", 2, "U+0001")])
@pytest.mark.parametrize("command", [["estimate", "--gpu", "rtx-4090", "--from"], ["sweep", "--no-render"]])
def test_a_control_character_in_a_yaml_file_is_a_message(tmp_path, capsys, content, line, char, command):
    """PyYAML refuses control characters before it parses (``yaml.reader.ReaderError`` when the loader is made):
    found by tests/test_properties.py's launch-file property; was a traceback for every YAML file read."""
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"c.yaml:{line}: not valid YAML (the character {char} is not allowed in YAML)" in err


@pytest.mark.parametrize("command", [["validation"], ["show", "llama-3.2-1b.h100-sxm.lora.72a461a877c7"],
                                     ["render", "--docs", "DOCS"]])
def test_results_naming_one_sweeps_folder_says_to_pass_its_parent(tmp_path, capsys, command):
    """--results results/validation read measured/ and _advice/ as sweeps: 'no estimate stored', an empty
    site, or 'no measurement counts'."""
    sweep = tmp_path / "results" / "validation"
    (sweep / "measured").mkdir(parents=True)
    (sweep / "_advice").mkdir()
    (sweep / "x.json").write_text("{}")
    argv = [a.replace("DOCS", str(tmp_path / "docs")) for a in command]
    code, out = run(capsys, *argv, "--results", str(sweep))
    assert code == 2 and "so it is one sweep's folder" in out and f"--results {tmp_path / 'results'}" in out


def test_validation_skips_a_measurement_of_an_unknown_model_naming_it(tmp_path, capsys):
    """One measured file naming a model this checkout cannot load stopped `reportgen validation` with
    'unknown model' and no file named."""
    import shutil

    folder = tmp_path / "results" / "validation" / "measured"
    shutil.copytree(Path("results/validation/measured"), folder)
    first = sorted(folder.glob("*.json"))[0]
    doc = json.loads(first.read_text())
    doc["case"]["model"] = "nosuch-model"
    first.write_text(json.dumps(doc))
    code, out = run(capsys, "validation", "--results", str(tmp_path / "results"))
    assert code == 0 and "unknown model 'nosuch-model'; skipped" in out and "peak allocated" in out


@pytest.mark.parametrize("flag", ["--model", "--gpu", "--host-cpu"])
def test_an_empty_name_is_refused_as_empty(capsys, flag):
    """--model '' was looked for as config.json, --host-cpu '' taken as the default desktop CPU."""
    argv = {"--model": "llama-3.2-1b", "--gpu": "rtx-4090", flag: " "}
    with pytest.raises(SystemExit) as exc:
        main(["estimate", *[x for kv in argv.items() for x in kv]])
    assert exc.value.code == 2 and f"argument {flag}: empty: give a name" in capsys.readouterr().err


def test_docs_beside_no_render_is_refused(tmp_path, capsys):
    """sweep --no-render --docs DIR wrote nothing to DIR without a word."""
    code, out = run(capsys, "sweep", "sweeps/consumer.yaml", "--no-render", "--docs", str(tmp_path / "d"),
                    "--results", str(tmp_path / "r"))
    assert code == 2 and "--no-render renders no pages" in out and not (tmp_path / "r").exists()
