"""``advisor estimate --from-command``: command lines that Megatron-LM refuses at start-up are
refused in one line (exit 2), naming Megatron's rule, where they were priced silently (audit:
a Qwen3-235B script with uneven first/last stages and 4 virtual stages, a Mixtral-like one with
3 virtual stages over 8 layers per rank); the same command made valid is priced; and the real
core_v0.15.2 (core_v0.19.0 where its interpreter is set) refuses and accepts the same lines
(``launch.megatron_check``: parse_args, validate_args, TransformerConfig, get_num_layers_to_build)."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner
from megatron_real import NO_TRANSFORMER_ENGINE, checkout, validate

from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.megatron_layout import read_layout
from advisor.shell_command import read_command

pytestmark = pytest.mark.xdist_group("megatron-validator")

_DENSE = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers {layers} --hidden-size 1024 "
          "--num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 --swiglu --normalization RMSNorm "
          "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights "
          "--attention-dropout 0 --hidden-dropout 0 --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data "
          "--micro-batch-size 1 --global-batch-size 64 --bf16 --pipeline-model-parallel-size {pp} {split}")

# (command, Megatron's refusal, as the real checkout words it in part; None: accepted, with the
# layers per pipeline rank and VPP derived by hand)
LAYOUTS = {
    # q235.sh's layout: 94 layers, PP 8, first 10 and last 12, 4 virtual stages: 10 % 4 != 0
    "first-not-divisible": (_DENSE.format(layers=94, pp=8, split="--num-virtual-stages-per-pipeline-rank 4 "
                                          "--decoder-first-pipeline-num-layers 10 --decoder-last-pipeline-num-layers 12"),
                            "number of layers at first stage: 10"),
    # the same with 2 virtual stages: 10, 12 and the middle's 72 / 6 = 12 are all even
    "first-divisible": (_DENSE.format(layers=94, pp=8, split="--num-virtual-stages-per-pipeline-rank 2 "
                                      "--decoder-first-pipeline-num-layers 10 --decoder-last-pipeline-num-layers 12"),
                        ((10, 12, 12, 12, 12, 12, 12, 12), 2)),
    "last-not-divisible": (_DENSE.format(layers=96, pp=8, split="--num-virtual-stages-per-pipeline-rank 4 "
                                         "--decoder-first-pipeline-num-layers 12 --decoder-last-pipeline-num-layers 10"),
                           "number of layers at last stage: 10"),
    # 30 - 8 - 8 = 14 over 2 middle stages: 7 each, odd
    "middle-not-divisible": (_DENSE.format(layers=30, pp=4, split="--num-virtual-stages-per-pipeline-rank 2 "
                                           "--decoder-first-pipeline-num-layers 8 --decoder-last-pipeline-num-layers 8"),
                             "on each middle pipeline rank"),
    # vpp3.sh's layout: 32 layers, PP 4 -> 8 per rank, 3 virtual stages
    "even-not-divisible": (_DENSE.format(layers=32, pp=4, split="--num-virtual-stages-per-pipeline-rank 3"),
                           "should be divisible by vp_size 3"),
    "even-divisible": (_DENSE.format(layers=32, pp=4, split="--num-virtual-stages-per-pipeline-rank 4"),
                       ((8, 8, 8, 8), 4)),
    # validate_args: an interleaved schedule without p2p overlap needs PP > 2 (both releases), however
    # the virtual stages are given; at PP 4 (and at PP 2 with the overlap on) it is accepted
    "no-p2p-overlap-pp2": (_DENSE.format(layers=32, pp=2, split="--num-virtual-stages-per-pipeline-rank 2 "
                                         "--no-overlap-p2p-communication"),
                           "pipeline-model-parallel size should be greater than 2"),
    "no-p2p-overlap-pp2-chunks": (_DENSE.format(layers=32, pp=2, split="--num-layers-per-virtual-pipeline-stage 4 "
                                                "--no-overlap-p2p-communication"),
                                  "pipeline-model-parallel size should be greater than 2"),
    "no-p2p-overlap-pp4": (_DENSE.format(layers=32, pp=4, split="--num-virtual-stages-per-pipeline-rank 2 "
                                         "--no-overlap-p2p-communication"), ((8, 8, 8, 8), 2)),
    "p2p-overlap-pp2": (_DENSE.format(layers=32, pp=2, split="--num-virtual-stages-per-pipeline-rank 2"),
                        ((16, 16), 2)),
    # without virtual stages Megatron turns the overlap off itself: nothing to refuse
    "no-p2p-overlap-pp2-no-vpp": (_DENSE.format(layers=32, pp=2, split="--no-overlap-p2p-communication"),
                                  ((16, 16), 1)),
}


def estimate(text: str, version: str | None = None):
    release = ["--megatron-version", version] if version else []
    return CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--format", "json",
                                    *release], input=text + "\n")


@pytest.mark.parametrize("name", LAYOUTS)
def test_virtual_stages_megatron_refuses_are_refused_and_the_valid_ones_priced(name):
    text, expected = LAYOUTS[name]
    result = estimate(text)
    if isinstance(expected, str):
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert result.stderr.startswith("Error: ") and expected in result.stderr
        assert "Megatron-LM refuses the command" in result.stderr
    else:
        assert result.exit_code == 0, result.output
        row = json.loads(result.stdout)
        assert (tuple(row["layers_per_stage"]), row["vpp"]) == expected


REFUSED_FLAGS = [
    # validate_args: no more than one of the three ways of giving virtual stages
    ({"pipeline-model-parallel-size": "2", "num-virtual-stages-per-pipeline-rank": "2",
      "pipeline-model-parallel-layout": "Et*2|t*2|t*2|t*2,L"}, 8, "No more than one"),
    # validate_args: uneven first/last stages take their VPP from --num-virtual-stages-per-pipeline-rank only
    ({"pipeline-model-parallel-size": "4", "num-layers-per-virtual-pipeline-stage": "2",
      "decoder-first-pipeline-num-layers": "8"}, 32, "please use --num-virtual-stages-per-pipeline-rank"),
    # validate_args: an interleaved schedule needs PP > 1 (PP 1 was read as VPP 1); 32 / 16 = 2 chunks
    ({"num-virtual-stages-per-pipeline-rank": "2"}, 32, "should be greater than 1"),
    ({"num-layers-per-virtual-pipeline-stage": "16"}, 32, "should be greater than 1"),
    # (30 + 2) / 4 = 8 layers per rank, the embedding and the loss counted: 3 chunks do not divide them
    ({"pipeline-model-parallel-size": "4", "num-virtual-stages-per-pipeline-rank": "3",
      "account-for-embedding-in-pipeline-split": True, "account-for-loss-in-pipeline-split": True}, 30,
     "must be divisible by"),
    # TransformerConfig: a first (last) stage of no layers
    ({"pipeline-model-parallel-size": "2", "decoder-first-pipeline-num-layers": "0"}, 32, "must be larger than 0"),
]
ACCEPTED_FLAGS = [
    # validate_args counts the embedding and the loss in a rank's layers before dividing by the chunk's:
    # (30 + 2) / 4 = 8 per rank, 2 per chunk -> 4 chunks (the read-back divided 30 // 4 = 7 and refused it)
    ({"pipeline-model-parallel-size": "4", "num-layers-per-virtual-pipeline-stage": "2",
      "account-for-embedding-in-pipeline-split": True, "account-for-loss-in-pipeline-split": True}, 30,
     ((7, 8, 8, 7), 4)),
    # one chunk of all 32 layers at PP 1: Megatron's VPP 1 (None), no interleaving
    ({"num-layers-per-virtual-pipeline-stage": "32"}, 32, ((32,), 1)),
]


@pytest.mark.parametrize("flags, layers, error", REFUSED_FLAGS)
def test_the_rest_of_megatrons_virtual_stage_rules(flags, layers, error):
    with pytest.raises(AdvisorError, match=error):
        read_layout(flags, layers)


@pytest.mark.parametrize("flags, layers, expected", ACCEPTED_FLAGS)
def test_virtual_stages_megatron_accepts_are_read(flags, layers, expected):
    layout = read_layout(flags, layers)
    assert (layout.layers_per_stage, layout.vpp) == expected


def _command(flags: dict, layers: int) -> str:
    """The dense command with these layout flags (PP 1 where they give none)."""
    split = " ".join(f"--{name}" + ("" if value is True else f" {shlex.quote(value)}")
                     for name, value in flags.items() if name != "pipeline-model-parallel-size")
    return _DENSE.format(layers=layers, pp=flags.get("pipeline-model-parallel-size", "1"), split=split)


def _case(text: str) -> dict:
    """The command's arguments as the real checkout runs them on this machine (no Transformer
    Engine: ``NO_TRANSFORMER_ENGINE``), in the launcher's environment."""
    command = read_command(text)
    return {"args": [*command.arguments, *NO_TRANSFORMER_ENGINE, "--train-iters", "10", "--lr", "1e-4"],
            "world_size": command.world_size, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_refuses_and_accepts_the_same_layouts(tag):
    release = checkout(tag)  # skips without it
    cases = [*LAYOUTS.items(), *((f"refused {flags}", (_command(flags, layers), error))
                                 for flags, layers, error in REFUSED_FLAGS),
             *((f"accepted {flags}", (_command(flags, layers), expected)) for flags, layers, expected in ACCEPTED_FLAGS)]
    results = validate(release, [_case(text) for _, (text, _) in cases])
    for (name, (_, expected)), result in zip(cases, results):
        if isinstance(expected, str):
            # Megatron's messages run words together ('10must be divisible'): compared without spaces
            assert not result["ok"] and expected.replace(" ", "") in result["error"].replace(" ", ""), (name, result)
        else:
            assert result["ok"], (name, result)
            assert (tuple(result["derived"]["layers_per_stage"]), result["derived"]["vpp"]) == expected, name


# Uneven first/last stages whose middle stages and middle layers do not both exist: core_v0.19.0's
# TransformerConfig raises 'Mismatch: R middle layers remaining but S middle PP stages available'
# (R = --num-layers minus the ends, S = PP minus the ends given); core_v0.15.2 has no such check and
# get_num_layers_to_build gives each end its count and each middle stage R / S (0 where S is 0: the
# rest is built nowhere; at PP 1 the one rank is the first and the last, the last count winning).
# (command, layers per pipeline rank on core_v0.15.2, R, S)
MISMATCH = {
    # ends taking every layer, leaving stages empty
    "both-ends": (_DENSE.format(layers=32, pp=4, split="--decoder-first-pipeline-num-layers 16 "
                                "--decoder-last-pipeline-num-layers 16"), (16, 0, 0, 16), 0, 2),
    "first-only": (_DENSE.format(layers=32, pp=2, split="--decoder-first-pipeline-num-layers 32"), (32, 0), 0, 1),
    # no stage between the ends: 32 - 10 - 10 = 12 layers built nowhere, core_v0.15.2 builds 10 + 10 = 20
    "short": (_DENSE.format(layers=32, pp=2, split="--decoder-first-pipeline-num-layers 10 "
                            "--decoder-last-pipeline-num-layers 10"), (10, 10), 12, 0),
    # 32 - 20 - 20 = -8: core_v0.15.2 builds 20 + 20 = 40
    "over": (_DENSE.format(layers=32, pp=2, split="--decoder-first-pipeline-num-layers 20 "
                           "--decoder-last-pipeline-num-layers 20"), (20, 20), -8, 0),
    # PP 1, first 10 of 32: the one rank builds 10, 32 - 10 = 22 nowhere
    "pp1": (_DENSE.format(layers=32, pp=1, split="--decoder-first-pipeline-num-layers 10"), (10,), 22, 0),
}


def _mismatch(rest: int, stages: int) -> str:
    return f"Mismatch: {rest} middle layers remaining but {stages} middle PP stages available"


@pytest.mark.parametrize("name", MISMATCH)
def test_uneven_ends_megatron_0_19_finds_mismatched_are_refused_or_priced_as_each_release_builds_them(name):
    text, layers, rest, stages = MISMATCH[name]
    for version in ("0.19", None):  # None: the newest release
        result = estimate(text, version)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert result.stderr.startswith("Error: --from-command stdin: --decoder-first-pipeline-num-layers")
        assert "Megatron-LM core 0.19 refuses the command" in result.stderr
        assert f"'{_mismatch(rest, stages)}'" in result.stderr
    accepted = estimate(text, "0.15")
    assert accepted.exit_code == 0, accepted.output
    row = json.loads(accepted.stdout)
    # priced as the model core_v0.15.2 builds: sum(layers) decoder layers, whatever --num-layers (32) says
    assert tuple(row["layers_per_stage"]) == layers and row["model"]["num_layers"] == sum(layers)
    note = f"--num-layers 32 (the pipeline ranks build {'/'.join(map(str, layers))}: priced as the {sum(layers)} " \
           "layers built)"
    assert (note in row["unpriced"]) == (sum(layers) != 32), row["unpriced"]


def test_the_twenty_layers_core_v0_15_builds_are_priced_as_a_twenty_layer_model():
    # PP 2, first 10 and last 10 of --num-layers 32 build 10 + 10 = 20 layers: the same network, stage
    # for stage, as --num-layers 20 over PP 2 (Megatron's even split, 20 / 2 = 10 per rank)
    built = json.loads(estimate(MISMATCH["short"][0], "0.15").stdout)
    even = json.loads(estimate(_DENSE.format(layers=20, pp=2, split=""), "0.15").stdout)
    assert built["stages"] == even["stages"] and built["total_gib"] == even["total_gib"]
    assert built["step_time_s"] == even["step_time_s"]


# PP 4, first 20 and last 20 of 32: each of the 2 middle stages gets (32 - 40) / 2 = -4 layers. Both
# releases accept it at start-up (-8 % 2 == 0; R and S both non-zero) and build nothing there
NEGATIVE_MIDDLE = _DENSE.format(layers=32, pp=4, split="--decoder-first-pipeline-num-layers 20 "
                                "--decoder-last-pipeline-num-layers 20")


@pytest.mark.parametrize("version", ["0.15", "0.19"])
def test_uneven_ends_taking_more_than_the_model_with_stages_between_are_not_priced(version):
    result = estimate(NEGATIVE_MIDDLE, version)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "take 8 layers more than --num-layers 32, so each of the other 2 stages gets -4" in result.stderr


def test_uneven_ends_building_another_number_of_layers_are_not_priced_for_a_mixture_of_experts():
    # 8 layers, PP 2, first 3 and last 3: core_v0.15.2 builds 6 (which of --moe-layer-freq's layers is not read)
    text = _MOE.replace("--pipeline-model-parallel-size 1", "--pipeline-model-parallel-size 2 "
                        "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 3") \
        .replace("--expert-model-parallel-size 8", "--expert-model-parallel-size 4")
    result = estimate(text, "0.15")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "build 6 layers (3/3 over PP 2): not priced for a mixture of experts" in result.stderr


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_refuses_or_builds_mismatched_uneven_ends_as_the_advisor_reads_them(tag):
    release = checkout(tag)  # skips without it
    results = validate(release, [*(_case(text) for text, *_ in MISMATCH.values()), _case(NEGATIVE_MIDDLE)])
    for (name, (_, layers, rest, stages)), result in zip(MISMATCH.items(), results):
        if tag == "core_v0.19.0":
            assert not result["ok"] and _mismatch(rest, stages) in result["error"], (name, result)
        else:
            assert result["ok"], (name, result)
            assert tuple(result["derived"]["layers_per_stage"]) == layers, name
    # accepted by both, with -4 layers on each middle rank: what the advisor does not price
    assert results[-1]["ok"] and tuple(results[-1]["derived"]["layers_per_stage"]) == (20, -4, -4, 20), results[-1]


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_refuses_a_value_after_the_no_p2p_overlap_switch(tag):
    # argparse's store_false: the stray word is an unrecognized argument (test_from_command: the read-back
    # refuses it in one line, dense and MoE alike)
    release = checkout(tag)  # skips without it
    plain, stray = validate(release, [_case(_DENSE.format(layers=32, pp=4, split=extra)) for extra in
                                      ("--no-overlap-p2p-communication", "--no-overlap-p2p-communication true")])
    assert plain["ok"], plain
    assert not stray["ok"] and "unrecognized arguments: true" in stray["error"], stray


# GPT2BPETokenizer sizes its vocabulary from --vocab-file (core_v0.15.2 tokenizer.py, build_tokenizer:
# _GPT2BPETokenizer(args.vocab_file, args.merge_file); core_v0.19.0 likewise) and ignores --vocab-size
_GPT2 = _DENSE.format(layers=4, pp=1, split="").replace(
    "--tokenizer-type NullTokenizer --vocab-size 32000", "--tokenizer-type GPT2BPETokenizer --vocab-file {vocab} "
    "--merge-file {merges}{size}")


def _gpt2_files(directory) -> dict:
    """A three-token GPT-2 vocabulary and an empty merge list."""
    (directory / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "<|endoftext|>": 2}))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    return {"vocab": directory / "vocab.json", "merges": directory / "merges.txt"}


def test_a_gpt2_bpe_command_without_vocab_size_asks_for_it_in_one_line(tmp_path):
    result = estimate(_GPT2.format(**_gpt2_files(tmp_path), size=""))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith("Error: --from-command stdin: the command does not give its vocabulary (its "
                                    "tokenizer is read from files): give --vocab-size N (the tokenizer's size)")


def test_a_gpt2_bpe_commands_vocab_size_is_priced_and_said_to_be_ignored_by_megatron(tmp_path):
    result = estimate(_GPT2.format(**_gpt2_files(tmp_path), size=" --vocab-size 50257"))
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert row["model"]["vocab_size"] == 50257
    assert row["read_from"].endswith("vocabulary --vocab-size 50257 (taken as the size of GPT2BPETokenizer's files: "
                                     "Megatron builds that tokenizer's vocabulary from them and ignores --vocab-size)")


def test_the_real_megatron_sizes_gpt2_bpe_by_its_file_not_by_vocab_size(tmp_path):
    # core_v0.19.0 builds GPT2BPETokenizer through transformers' AutoTokenizer, not installed here
    release = checkout("core_v0.15.2")  # skips without it
    (result,) = validate(release, [_case(_GPT2.format(**_gpt2_files(tmp_path), size=" --vocab-size 32000"))])
    # 3 tokens padded to --make-vocab-size-divisible-by 128 x TP 1 = 128, not 32000
    assert result["ok"] and result["derived"]["padded_vocab_size"] == 128, result


# Multi-token prediction in a dense model: megatron-core builds it from the decoder's own layer spec
# (gpt_builders.py: get_gpt_mtp_block_spec(config, transformer_layer_spec, ...), MoE or not;
# validate_args asks RoPE or no position embedding). The advisor prices MTP for MoE models only
# (advisor.moe.mtp): a dense command's is named, with why; its layout's m layers are checked
# against the command's own --mtp-num-layers (they were against 0)
DENSE_MTP = {
    "flag": _DENSE.format(layers=32, pp=2, split="--mtp-num-layers 1"),
    # 16 decoder layers a stage, the MTP layer (m) on the last, before the loss (L)
    "layout": _DENSE.format(layers=32, pp=2, split="--pipeline-model-parallel-layout 'Et*16|t*16,mL' "
                                                   "--mtp-num-layers 1"),
}


@pytest.mark.parametrize("name", DENSE_MTP)
def test_a_dense_models_mtp_layers_are_read_and_named_as_not_priced_with_why(name):
    result = estimate(DENSE_MTP[name])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert tuple(row["layers_per_stage"]) == (16, 16)
    note = next(entry for entry in row["unpriced"] if entry.startswith("--mtp-num-layers"))
    assert note.startswith("--mtp-num-layers 1 (multi-token prediction: megatron-core builds it for a dense GPT")
    assert "the advisor prices it for MoE models only" in note


def test_a_dense_layouts_mtp_layers_must_be_the_commands():
    # two m layers, --mtp-num-layers 1: validate_layer_layout requires them equal
    text = DENSE_MTP["layout"].replace("t*16,mL", "t*16,mmL")
    result = estimate(text)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "has 2 MTP layers (m); --mtp-num-layers gives 1 (Megatron requires them equal)" in result.stderr
    negative = estimate(DENSE_MTP["flag"].replace("--mtp-num-layers 1", "--mtp-num-layers -1"))
    assert negative.exit_code == 2 and "--mtp-num-layers must be positive, got -1" in negative.stderr


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_accepts_mtp_in_a_dense_model(tag):
    release = checkout(tag)  # skips without it
    for name, result in zip(DENSE_MTP, validate(release, [_case(text) for text in DENSE_MTP.values()])):
        assert result["ok"] and tuple(result["derived"]["layers_per_stage"]) == (16, 16), (name, result)


# noggemm.sh's essentials: a Mixtral-like MoE recomputing its experts' activation (moe_act)
# without --moe-grouped-gemm (sequential experts)
_MOE = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 --ffn-hidden-size 3584 "
        "--num-attention-heads 8 --group-query-attention --num-query-groups 2 --seq-length 1024 "
        "--max-position-embeddings 1024 --swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 "
        "--tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --micro-batch-size 1 --global-batch-size 64 "
        "--bf16 --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 --moe-router-dtype fp32 "
        "--pipeline-model-parallel-size 1 --recompute-granularity selective --recompute-modules moe_act")
MOE_ACT = {"without-grouped-gemm": (_MOE, "moe_act in recompute_modules is only supported with moe_grouped_gemm"),
           "with-grouped-gemm": (f"{_MOE} --moe-grouped-gemm", None)}


@pytest.mark.parametrize("version", ["0.15", "0.19"])
def test_moe_act_without_grouped_gemm_is_refused_as_both_releases_refuse_it(version):
    # TransformerConfig.__post_init__ raises it in core_v0.15.2 and core_v0.19.0 alike
    command = ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--megatron-version", version,
               "--format", "json"]
    refused = CliRunner().invoke(cli, command, input=MOE_ACT["without-grouped-gemm"][0] + "\n")
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert refused.stderr.startswith("Error: --recompute-modules moe_act without --moe-grouped-gemm")
    accepted = CliRunner().invoke(cli, command, input=MOE_ACT["with-grouped-gemm"][0] + "\n")
    assert accepted.exit_code == 0, accepted.output
    row = json.loads(accepted.stdout)
    assert (row["recompute"], row["recompute_modules"], row["ep"]) == ("selective", ["moe_act"], 8)


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_real_megatron_refuses_moe_act_without_grouped_gemm(tag):
    release = checkout(tag)  # skips without it
    results = validate(release, [_case(text) for text, _ in MOE_ACT.values()])
    for (name, (_, error)), result in zip(MOE_ACT.items(), results):
        if error is None:
            assert result["ok"], (name, result)
            assert result["derived"]["recompute_modules"] == ["moe_act"] and result["derived"]["moe_grouped_gemm"]
        else:
            assert not result["ok"] and error in result["error"], (name, result)
