"""The inverse of advisor.megatron_args: layout and model flags read back as Megatron builds them
(hand-derived from get_num_layers_to_build and validate_args, not from our writer's output)."""

from __future__ import annotations

import pytest

from advisor.errors import AdvisorError
from advisor.megatron_layout import read_layout
from advisor.megatron_readback import model_spec, split_arguments, vocabulary
from advisor.shell_command import read_command


@pytest.mark.parametrize("flags, layers, expected", [
    # 32 layers, PP 4, Megatron's even split
    ({"pipeline-model-parallel-size": "4"}, 32, ((8, 8, 8, 8), 1)),
    # first 6 and last 6: the middle two stages share the other 20 -> 10 each
    ({"pipeline-model-parallel-size": "4", "decoder-first-pipeline-num-layers": "6",
      "decoder-last-pipeline-num-layers": "6"}, 32, ((6, 10, 10, 6), 1)),
    # the embedding and the loss counted as layers: (30 + 2) / 4 = 8, minus one at each end
    ({"pipeline-model-parallel-size": "4", "account-for-embedding-in-pipeline-split": True,
      "account-for-loss-in-pipeline-split": True}, 30, ((7, 8, 8, 7), 1)),
    # 4 stages x 2 chunks: segment k*PP + i is chunk k of rank i -> rank 0 holds 1 + 2, rank 3 holds 2 + 1
    ({"pipeline-model-parallel-size": "4", "pipeline-model-parallel-layout": "Et|tt|tt|tt|tt|tt|tt|t,L"}, 14,
     ((3, 4, 4, 3), 2)),
    # Megatron's own unrolling: (tt|)*2 -> tt|tt|, t*3 -> ttt
    ({"pipeline-model-parallel-size": "3", "pipeline-model-parallel-layout": "E(tt|)*2t*3,L"}, 7, ((2, 2, 3), 1)),
    # 80 layers, PP 4, 4 layers per virtual stage -> 20 per rank, 5 chunks
    ({"pipeline-model-parallel-size": "4", "num-layers-per-virtual-pipeline-stage": "4"}, 80, ((20,) * 4, 5)),
    ({"pipeline-model-parallel-size": "2", "num-virtual-stages-per-pipeline-rank": "3"}, 12, ((6, 6), 3)),
])
def test_layouts_read_as_megatron_builds_them(flags, layers, expected):
    layout = read_layout(flags, layers)
    assert (layout.layers_per_stage, layout.vpp) == expected


@pytest.mark.parametrize("flags, layers, error", [
    ({"pipeline-model-parallel-size": "3"}, 32, "not divisible by --pipeline-model-parallel-size 3"),
    ({"pipeline-model-parallel-size": "4", "decoder-first-pipeline-num-layers": "6"}, 32,  # 26 over 3 stages
     "number of layers at middle stage: 26 must be divisible by the middle pipeline model parallel size 3"),
    ({"pipeline-model-parallel-size": "2", "pipeline-model-parallel-layout": "Et|tx,L"}, 2, "only E, L, t and m"),
    # an MTP layer (m) without --mtp-num-layers: Megatron requires the counts equal
    ({"pipeline-model-parallel-size": "2", "pipeline-model-parallel-layout": "Et|tm,L"}, 2, "1 MTP layers"),
    ({"pipeline-model-parallel-size": "2", "pipeline-model-parallel-layout": "Et|t,L"}, 3, "--num-layers 3"),
])
def test_layouts_megatron_refuses_are_refused_in_one_line(flags, layers, error):
    with pytest.raises(AdvisorError, match=error):
        read_layout(flags, layers)


def test_model_defaults_are_validate_args():
    # validate_args: SwiGLU h_ffn = int(4h * 2/3 / 64) * 64 = int(10922.67 / 64) * 64 = 170 * 64 = 10880
    spec = model_spec({"num-layers": "2", "hidden-size": "4096", "num-attention-heads": "32", "swiglu": True},
                      name="x", vocab_size=1000)
    assert (spec.ffn_hidden_size, spec.num_query_groups, spec.tie_embeddings, spec.kv_channels) == (10880, 32, True, None)
    # --kv-channels equal to h / a is the default head size, stored as None
    spec = model_spec({"num-layers": "2", "hidden-size": "5120", "num-attention-heads": "32", "kv-channels": "128",
                       "group-query-attention": True, "num-query-groups": "8"}, name="x", vocab_size=1000)
    assert (spec.kv_channels, spec.num_query_groups, spec.ffn_hidden_size) == (128, 8, 4 * 5120)


@pytest.mark.parametrize("release, rows", [("0.15", 4096), ("core_v0.15.2", 4096), ("0.19", 4095), (None, 4095)])
def test_vocabulary_of_the_null_tokenizer_is_its_releases(release, rows):
    """core_v0.15.2's NullTokenizer adds an end-of-document row, core_v0.19.0's has --vocab-size rows;
    None reads the newest release, as --megatron-version's default does."""
    assert vocabulary({"vocab-size": "4095", "tokenizer-type": "NullTokenizer"}, release)[0] == rows
    assert vocabulary({"vocab-size": "128256", "tokenizer-type": "HuggingFaceTokenizer"}, release)[0] == 128256


def test_the_launchers_null_tokenizer_reads_back_to_its_rows_on_every_release():
    """The --vocab-size the launcher writes for a release (``null_tokenizer_vocab_flag``) reads back,
    on that release, to the model's own vocabulary: Qwen3's 151936 is not priced as 151937 on core 0.19."""
    from advisor.releases import RELEASES

    for release in RELEASES:
        flag = release.null_tokenizer_vocab_flag(151936)
        model = {"vocab-size": str(flag), "tokenizer-type": "NullTokenizer"}
        rows, source = vocabulary(model, release.checked)
        assert rows == 151936 and release.name in source


def test_arguments_sort_into_model_layout_harmless_and_the_rest():
    parsed = split_arguments(["--num-layers=4", "--seed", "7", "--data-path", "0.5", "a", "0.5", "b",
                              "--tensor-model-parallel-size", "2", "--overlap-grad-reduce", "--lr", "-1e-4"])
    assert parsed.model == {"num-layers": "4"} and parsed.layout == {"tensor-model-parallel-size": "2"}
    # as written: a blend's weights and prefixes, a negative value
    assert parsed.skipped == ["--seed 7", "--data-path 0.5 a 0.5 b", "--lr -1e-4"]
    assert parsed.rest == ["--overlap-grad-reduce"]


def test_the_tokenizer_is_read_for_the_vocabulary_and_named_as_not_launched():
    """A row's megatron_args size the vocabulary with --make-vocab-size-divisible-by and give no
    tokenizer, so the command's --tokenizer-type and --vocab-size are read for the model and named
    with the flags a launch leaves out, in the command's order (--tokenizer-model among them)."""
    parsed = split_arguments(["--tokenizer-type", "NullTokenizer", "--lr", "1e-4", "--vocab-size=32000",
                              "--tokenizer-model", "m"])
    assert parsed.model == {"tokenizer-type": "NullTokenizer", "vocab-size": "32000"}
    assert parsed.skipped == ["--tokenizer-type NullTokenizer", "--lr 1e-4", "--vocab-size 32000", "--tokenizer-model m"]


def test_shell_words_split_as_bash_splits_them():
    text = ("A='x y'\nB=\"$A z\"\nC=(--one \"$A\" '$A')\nD=${UNSET:-d}\n"
            "torchrun --nproc_per_node=4 --nnodes 2:3 pretrain_gpt.py $B \"${C[@]}\" ${D} # done\n")
    launch = read_command(text)
    # $B unquoted: split into x, y, z; "${C[@]}": one word each; '$A' stays literal
    assert launch.arguments == ("x", "y", "z", "--one", "x y", "$A", "d")
    assert launch.world_size == 12  # 4 per node x the elastic maximum of 3 nodes


@pytest.mark.parametrize("arguments, error", [
    (["--moe-grouped-gemm", "false"], "--moe-grouped-gemm is a switch and takes no value, got 'false'"),
    (["--use-distributed-optimizer", "1"], "--use-distributed-optimizer is a switch and takes no value, got '1'"),
    (["--swiglu=true"], "--swiglu is a switch and takes no value, got 'true'"),
    (["--mock-data", "yes"], "--mock-data is a switch and takes no value, got 'yes'"),
    # switches the read-back names as not priced (options.flags.UNPRICED) are switches too: the stray
    # word was taken as their value (megatron_flag_table: '--no-overlap-p2p-communication=0', a switch)
    (["--no-overlap-p2p-communication", "true"], "--no-overlap-p2p-communication is a switch and takes no value"),
    (["--use-cpu-initialization=1"], "--use-cpu-initialization is a switch and takes no value, got '1'"),
])
def test_a_value_after_a_switch_is_refused_as_megatron_refuses_it(arguments, error):
    """Megatron's argparse stops at the stray word ('unrecognized arguments'); it was dropped."""
    with pytest.raises(AdvisorError, match=error):
        split_arguments(["--num-layers", "4", *arguments, "--seed", "1"])


def test_switches_and_valued_harmless_flags_read_as_megatron_declares_them():
    parsed = split_arguments(["--moe-grouped-gemm", "--swiglu", "--save-retain-interval", "1000", "--seed", "-1"])
    assert parsed.rest == ["--moe-grouped-gemm"] and parsed.model == {"swiglu": True}
    assert parsed.skipped == ["--save-retain-interval 1000", "--seed -1"]  # --save-retain-interval takes an int


@pytest.mark.parametrize("text, shown", [
    ("EP=$UNSET_EP\n", "$UNSET_EP, a shell variable the script does not set"),
    ("EP=$(nproc)\n", "$(nproc), a command substitution the advisor does not run"),
    ("EP=`nproc`\n", "`nproc`, a command substitution the advisor does not run"),
    ("EP=$((N*2))\n", "$((N*2)), shell arithmetic the advisor does not evaluate"),
    ('EP="$(nproc --all)"\n', "$(...), a command substitution the advisor does not run"),
    ('EP="x${UNSET_EP}"\n', "x$UNSET_EP ($UNSET_EP is a shell variable the script does not set)"),
])
def test_what_the_script_does_not_expand_is_named_as_written(text, shown):
    """'\\x00EP\\x00' was shown: the marker of an unexpanded value never reaches a message."""
    from advisor.megatron_readback import read_run
    from advisor.shell_command import as_written, unexpanded

    launch = read_command(text + 'python pretrain_gpt.py --expert-model-parallel-size "$EP" --num-experts 8\n')
    (value,) = launch.arguments[1:2]
    assert unexpanded(value) == shown and "\x00" not in as_written(value)
    with pytest.raises(AdvisorError) as error:
        read_run([*launch.arguments, "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                  "--seq-length", "64", "--vocab-size", "1000"])
    assert str(error.value) == f"--expert-model-parallel-size is {shown}: write its value in the command"


def test_unexpanded_values_in_notes_and_launchers_are_shown_as_written():
    from advisor.megatron_readback import read_run

    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
             "--vocab-size", "1000", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
             "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", "1"]
    run = read_run([*read_command("python pretrain_gpt.py --normalization $NORM\n").arguments, *model])
    assert run.unpriced == ("--normalization $NORM (priced as RMSNorm)",)
    assert read_run(model).unpriced == (
        "--normalization LayerNorm (Megatron's default: the command sets none; priced as RMSNorm)",)
    with pytest.raises(AdvisorError, match=r"^cannot read '\$LAUNCHER' as a launcher"):
        read_command("$LAUNCHER pretrain_gpt.py --num-layers 2\n")
    with pytest.raises(AdvisorError, match=r"^\$\(get_args\), a command substitution the advisor does not run, "
                                           "stands where Megatron's arguments are"):
        read_run([*model, *read_command("python pretrain_gpt.py $(get_args)\n").arguments])


def test_a_variable_the_script_leaves_unset_where_flags_stand_is_read_as_empty_and_named():
    """bash expands an unset ${DTYPE_ARGS[@]} to no word (Megatron's Llama 3 BF16 example has one
    after --overlap-param-gather): neither a flag's value nor an error, but named."""
    from advisor.megatron_readback import read_run

    launch = read_command("python pretrain_gpt.py --num-layers 2 --overlap-grad-reduce ${DTYPE_ARGS[@]} $MORE "
                          "--hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 1000 "
                          "--micro-batch-size 1\n")
    parsed = split_arguments(launch.arguments)
    assert parsed.rest == ["--overlap-grad-reduce"] and parsed.unset == ["$DTYPE_ARGS", "$MORE"]
    assert read_run(launch.arguments).unpriced[-2:] == tuple(
        f"{name} (a variable the script does not set: read as empty, as bash does; flags it may hold are not "
        "priced)" for name in ("$DTYPE_ARGS", "$MORE"))


def test_megatron_cores_own_attention_is_named_with_its_measured_time():
    """--transformer-impl local: megatron-core's DotProductAttention with PyTorch's softmax, which one
    H200 timed at several times the unfused price (benchmarks/gpu/time_unfused_attention.py); the
    note quotes the committed measurement's range at 4096 and 8192 tokens."""
    import json

    from advisor import megatron_readback as mr
    from conftest import ROOT

    cases = json.loads((ROOT / "benchmarks/gpu/data/h200_unfused_attention.json").read_text())["cases"]
    ratios = [c["forward_backward_over_priced"] for name, c in cases.items() if not name.startswith("s2048")]
    assert len(ratios) == 8 and f"{min(ratios):.1f}-{max(ratios):.1f}x" == mr.UNFUSED_LOCAL_MEASURED
    from advisor.options import TrainingOptions
    from advisor.options.flags import parse_training_args

    local, _ = parse_training_args(["--transformer-impl", "local"])
    (note,) = mr._local_attention_note(local)
    assert mr.UNFUSED_LOCAL_MEASURED in note and "h200_unfused_attention.json" in note
    assert mr._local_attention_note(parse_training_args(["--transformer-impl", "transformer_engine"])[0]) == []
    assert mr._local_attention_note(TrainingOptions()) == []


def test_the_rank_order_and_the_batch_ramp_up_are_read_into_the_layout():
    """--use-tp-pp-dp-mapping orders ranks tp-cp-ep-pp-dp (megatron/training/initialize.py); a ramp-up's
    three values are read (its calculator asserts three: num_microbatches_calculator.py)."""
    from advisor.megatron_readback import read_run

    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--vocab-size", "100", "--micro-batch-size", "1",
             "--global-batch-size", "64"]
    default = read_run(model)
    assert default.layout.rank_order == "tp-cp-ep-dp-pp" and default.layout.rampup_batch_size is None
    run = read_run([*model, "--use-tp-pp-dp-mapping", "--rampup-batch-size", "16", "16", "1000"])
    assert run.layout.rank_order == "tp-cp-ep-pp-dp" and run.layout.rampup_batch_size == (16, 16, 1000)
    # the time model places groups in the default order: named, no longer 'not known to the advisor'
    assert [note for note in run.unpriced if note.startswith("--use-tp-pp-dp-mapping")] == [
        "--use-tp-pp-dp-mapping (ranks ordered tp-cp-ep-pp-dp: the time model places the data-parallel and pipeline "
        "groups on nodes in Megatron's default order, tp-cp-ep-dp-pp)"]
    assert "--rampup-batch-size 16 16 1000" in run.skipped
    with pytest.raises(AdvisorError, match=r"--rampup-batch-size takes three integers .*, got 16 16$"):
        read_run([*model, "--rampup-batch-size", "16", "16"])
