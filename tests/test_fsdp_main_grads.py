"""Megatron-FSDP's main gradients on each release: priced as launched, read back as Megatron runs them.

core_v0.15.2's Megatron-FSDP keeps its main gradient buffer in FP32 where
--accumulate-allreduce-grads-in-fp32 is set (megatron_fsdp/param_and_grad_buffer.py,
``dtype=torch.float32 if grad_reduce_in_fp32 else grad_dtype``), and has no other flag for it.
core_v0.19.0's ignores that flag: its ``_resolve_group_grad_dtype`` returns
--megatron-fsdp-main-grads-dtype (fp32, bf16, fp16 or auto, the default: the weights' dtype).
The advisor prices FP32 gradients unless --grad-dtype bf16, on both releases; a launch on
core_v0.19.0 writes the flag with the priced dtype (``advisor.options.flags.release_spelling``), and a
command read back on core_v0.19.0 without the flag is priced with the weights' dtype.

Hand count, Llama 3.1 70B, TP 4, PP 4, DP 8, stage 0 (tests/test_option_states_70b_by_hand.py):
N = 4,541,186,048 parameters on a GPU, one layer 213,925,888. Under 'optim' the gradient buffer
is not sharded: 4 N bytes in FP32 = 16.92 GiB, 2 N in BF16 = 8.46 GiB. Under 'optim_grads' it
is the shard 4 N / 8 plus the unsharded buckets at the reduce-scatter queue's peak
(``memory_levers.fsdp_optim_grads_peak``), each element in the gradient dtype. The buckets (>= 4e7
elements, max(40M, 1M x 8), cut in named order) are two a layer: A = input norm + proj + QKV + MLP
norm + FC1 = 8,192 + 16,777,216 + 20,971,520 + 8,192 + 117,440,512 = 155,205,632 and F = FC2 =
58,720,256 (A + F = layer). Backward completes F then A; the queue, trimmed to <= 10^9 before each
append, grows a layer a layer to 4 layers (855,703,552) after layers 19-16; layer 15 appends F and
A (5 layers, 1,069,629,440: no pop, 914,423,808 <= 10^9 before A's append), and FC2_14 allocates
F_14: 5 layers + F = 1,128,349,696, the layers' peak (its completion pops F_19 and A_19, and each
later layer repeats it). Stage 0 also holds the embedding, 8,192 x 128,256 / 4 = 262,668,288 (>= 4e7:
a bucket alone, first in named order), whose gradient comes last: after A_0's completion the queue
holds 5 layers again (1,069,629,440), and the embedding's bucket opens on them: 1,332,297,728, the
peak (memory_levers.stage_ends). 4 N / 8 + 4 x 1,332,297,728 = 7.08 GiB in FP32, half of it, 3.54 GiB,
in BF16 (the layers alone: 6.32 GiB; 10^9 + a layer before: 6.64 GiB).
"""

from __future__ import annotations

import json
import shlex

import pytest
from launch_support import launcher

from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.options.flags import release_spelling
from advisor.releases import FSDP_MAIN_GRADS, NEWEST, RELEASES
from launch.megatron_versions import named

GIB = 2**30
N = 4_541_186_048
LAYER = 213_925_888
EMBEDDING = 262_668_288  # 128,256 x 8,192 / 4
LAYOUT = ["--model", "llama3.1-70b", "--tp", "4", "--pp", "4", "--dp", "8", "--mbs", "1", "--gbs", "512",
          "--gpu", "h100-80gb", "--format", "json"]


def _gradient_bytes(strategy: str, element: int) -> float:
    """Stage 0's gradient bytes by hand (the module docstring)."""
    return {"optim": element * N, "optim_grads": element * N / 8 + element * (5 * LAYER + EMBEDDING)}[strategy]


def _fsdp_estimate(advisor, strategy: str, release: str) -> dict:
    """The estimate of Megatron-FSDP ``strategy`` (FP32 gradients: the advisor's) for ``release``."""
    return json.loads(advisor("estimate", *LAYOUT, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                              strategy, "--megatron-version", release).stdout)


def _unflagged(advisor, strategy: str) -> list[str]:
    """The estimate's megatron_args in core_v0.15.2's words: without the gradient dtype flag."""
    return _fsdp_estimate(advisor, strategy, "0.15")["megatron_args"]


def _invoke(advisor, args: list[str], release: str, expect: int = 0):
    """``advisor estimate --from-command`` of ``args`` on 128 GPUs on ``release``."""
    result = advisor.runner.invoke(advisor.command, [
        "estimate", "--from-command", "-", "--gpus", "128", "--gpu", "h100-80gb", "--format", "json", "--vocab-size",
        "128256", "--megatron-version", release], input=shlex.join(args))
    assert result.exit_code == expect, result.output
    return result


def test_the_hand_count_matches_the_audit_numbers():
    """The numbers quoted in the docstring, from the hand count."""
    assert [round(_gradient_bytes(s, e) / GIB, 2) for s in ("optim", "optim_grads") for e in (4, 2)] == \
        [16.92, 8.46, 7.08, 3.54]


@pytest.mark.parametrize("strategy", ["optim", "optim_grads"])
@pytest.mark.parametrize("release, flag, element", [
    ("0.15", None, 4),  # --accumulate-allreduce-grads-in-fp32, which the row states: FP32
    ("0.19", None, 2),  # the flag's default auto: the BF16 weights' dtype, whatever the row states
    ("0.19", "auto", 2),
    ("0.19", "bf16", 2),
    ("0.19", "fp32", 4),
])
def test_a_command_read_back_prices_the_gradients_its_release_keeps(advisor, strategy, release, flag, element):
    """A command in core_v0.15.2's words (no gradient dtype flag), with the flag where given."""
    args = _unflagged(advisor, strategy)
    assert "--accumulate-allreduce-grads-in-fp32" in args and FSDP_MAIN_GRADS not in args
    read = json.loads(_invoke(advisor, args + ([FSDP_MAIN_GRADS, flag] if flag else []), release).stdout)
    [stage, *_] = read["stages"]
    assert stage["parameters"] == N
    assert stage["gradients_gib"] * GIB == pytest.approx(_gradient_bytes(strategy, element), rel=1e-12)
    assert read["unpriced"] == []
    assert read["options"].get("grad_reduce_dtype", "fp32") == {4: "fp32", 2: "bf16"}[element]


@pytest.mark.parametrize("strategy", ["optim", "optim_grads"])
@pytest.mark.parametrize("release, checked", [("0.15", "core_v0.15.2"), ("0.19", "core_v0.19.0")])
def test_an_estimates_own_args_read_back_as_priced_on_its_release(advisor, strategy, release, checked):
    """The estimate's megatron_args are in the words of the release it priced (its 'megatron_version'):
    on core_v0.19.0 with the gradient dtype flag, so that the list, run or read back there, keeps
    the FP32 gradients priced (without it, core_v0.19.0 keeps BF16 ones: the test above)."""
    estimate = _fsdp_estimate(advisor, strategy, release)
    args = estimate["megatron_args"]
    assert estimate["megatron_version"] == checked
    assert args[-2:] == [FSDP_MAIN_GRADS, "fp32"] if release == "0.19" else FSDP_MAIN_GRADS not in args
    read = json.loads(_invoke(advisor, args, release).stdout)
    for stage, priced in zip(read["stages"], estimate["stages"], strict=True):
        assert stage == priced
    assert estimate["stages"][0]["gradients_gib"] * GIB == pytest.approx(_gradient_bytes(strategy, 4), rel=1e-12)
    assert (read["step_time_s"], read["unpriced"]) == (estimate["step_time_s"], [])


@pytest.mark.parametrize("strategy", ["optim", "optim_grads"])
def test_the_estimate_prices_fp32_gradients_and_bf16_with_grad_dtype_bf16_on_both_releases(advisor, strategy):
    """The options are the advisor's (FP32 gradients unless --grad-dtype bf16), on every release:
    a launch on core_v0.19.0 states them (below)."""
    for release in ("0.15", "0.19"):
        for grad, element in (("fp32", 4), ("bf16", 2)):
            estimate = json.loads(advisor("estimate", *LAYOUT, "--use-megatron-fsdp",
                                          "--data-parallel-sharding-strategy", strategy, "--grad-dtype", grad,
                                          "--megatron-version", release).stdout)
            assert estimate["stages"][0]["gradients_gib"] * GIB == pytest.approx(_gradient_bytes(strategy, element),
                                                                                 rel=1e-12)


@pytest.mark.parametrize("grad, params", [("fp32", "bfloat16"), ("bf16", "bfloat16"), ("fp32", "float16"),
                                          ("fp16", "float16"), ("fp32", "float32")])
def test_each_release_spells_the_priced_dtype_and_reads_it_back(grad, params):
    """core_v0.19.0's launch adds the flag with the priced dtype; core_v0.15.2's adds nothing (it
    has no such flag, and reads --accumulate-allreduce-grads-in-fp32). Either reads back as priced."""
    options = TrainingOptions().with_(params_dtype=params, grad_reduce_dtype=grad, fsdp_strategy="optim_grads")
    written = training_args(options, tp=4)
    for release in RELEASES:
        launched = release_spelling(release, written)
        added = [FSDP_MAIN_GRADS, grad] if release.release == (0, 19) else []
        assert launched == [*written, *added]
        assert parse_training_args([*launched, "--tensor-model-parallel-size", "4"], release) == (options, [])


def test_the_flag_is_added_only_to_megatron_fsdp_and_never_twice():
    plain = training_args(TrainingOptions(), tp=4)
    assert release_spelling(NEWEST, plain) == plain
    given = [*training_args(TrainingOptions().with_(fsdp_strategy="optim"), tp=4), f"{FSDP_MAIN_GRADS}=bf16"]
    assert release_spelling(NEWEST, given) == given


def test_core_0_15_lacks_the_flag_and_0_19_has_it():
    """``lacks`` against each release's own parser (advisor.megatron_flag_table, generated from them)."""
    from advisor.megatron_flag_table import FLAGS

    for release in RELEASES:
        spelled = {word.split("=")[0].split(":")[0] for word in FLAGS[release.release].split()}
        assert (FSDP_MAIN_GRADS in spelled) == release.fsdp_main_grads_own_flag
        assert not (release.lacks & spelled)


def test_a_bad_value_is_one_line_and_exit_2(advisor):
    args = [*_unflagged(advisor, "optim"), FSDP_MAIN_GRADS, "fp64"]
    result = _invoke(advisor, args, "0.19", expect=2)
    assert result.stderr == (f"Error: --from-command stdin: {FSDP_MAIN_GRADS} must be one of fp32, bf16, fp16, auto, "
                             "got 'fp64'\n")


def test_core_0_15_refuses_the_flag_in_one_line(advisor):
    result = _invoke(advisor, [*_unflagged(advisor, "optim"), FSDP_MAIN_GRADS, "fp32"], "0.15", expect=2)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")
    assert f"{FSDP_MAIN_GRADS}: Megatron-LM core 0.15 has no such flag" in result.stderr


def test_a_dtype_neither_fp32_nor_the_weights_is_refused_in_one_line(advisor):
    """FP16 main gradients of BF16 weights: Megatron runs them, the advisor has no price for them."""
    result = _invoke(advisor, [*_unflagged(advisor, "optim"), FSDP_MAIN_GRADS, "fp16"], "0.19", expect=2)
    assert result.stderr == (f"Error: --from-command stdin: {FSDP_MAIN_GRADS} fp16 with BF16 (--bf16) weights is not "
                             "priced (the advisor prices Megatron-FSDP gradients in FP32 or in the weights' dtype)\n")


def test_without_megatron_fsdp_the_flag_is_named_as_ignored(advisor):
    args = [*json.loads(advisor("estimate", *LAYOUT).stdout)["megatron_args"], FSDP_MAIN_GRADS, "bf16"]
    read = json.loads(_invoke(advisor, args, "0.19").stdout)
    assert read["unpriced"] == [f"{FSDP_MAIN_GRADS} without --use-megatron-fsdp (Megatron ignores it; priced without)"]
    assert read["stages"][0]["gradients_gib"] * GIB == pytest.approx(4 * N, rel=1e-12)  # DDP: FP32, as written


def test_advisor_launch_writes_the_flag_on_0_19_only_and_refuses_another_after_the_dashes(advisor, tmp_path):
    estimate = tmp_path / "fsdp.json"
    advisor("estimate", *LAYOUT, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim", "-o", estimate)
    on_19 = launcher()("args", "--from", estimate, "--megatron-version", "0.19").stdout.split()
    on_15 = launcher()("args", "--from", estimate, "--megatron-version", "0.15").stdout.split()
    assert on_19[on_19.index(FSDP_MAIN_GRADS) + 1] == "fp32" and FSDP_MAIN_GRADS not in on_15
    launcher()("args", "--from", estimate, "--megatron-version", "0.19", "--", FSDP_MAIN_GRADS, "fp32")  # restated
    line = launcher().error("args", "--from", estimate, "--megatron-version", "0.19", "--", FSDP_MAIN_GRADS, "bf16")
    assert f"{FSDP_MAIN_GRADS} bf16 (after --) conflicts with {FSDP_MAIN_GRADS} fp32" in line


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_keeps_the_priced_gradient_dtype_in_the_launched_args(tag):
    """The real parse_args/validate_args, and on core_v0.19.0 its DDP config and FSDP buffer's
    dtype rule (launch.megatron_check): the launched list derives the priced dtype; on
    core_v0.19.0 the list without the flag (a row copied by hand) derives BF16."""
    from megatron_real import TINY_MODEL_ARGS as base, checkout, validate

    release = checkout(tag)  # skips without it
    rules = named(tag)
    cases, expected = [], []
    for grad, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        written = training_args(TrainingOptions().with_(fsdp_strategy="optim_grads", grad_reduce_dtype=grad), tp=1)
        cases += [release_spelling(rules, written), written]
        expected += [dtype, dtype if rules.release == (0, 15) else "bfloat16"]
    results = validate(release, [{"args": [*base, *args], "world_size": 8, "env": {}} for args in cases])
    assert [result.get("error") for result in results] == [None] * 4
    assert [result["derived"]["fsdp_main_grads_dtype"] for result in results] == expected
