"""Megatron's precision flags where a Megatron user types them: --bf16 is what the advisor prices
anyway (BF16 weights and compute), --accumulate-allreduce-grads-in-fp32 is Megatron's name for
--grad-dtype fp32 (its default with --bf16, megatron/training/arguments.py), and --fp16 is refused
with where FP16 is priced. Each was 'No such option' with a close-name hint of --ep."""

import pytest

SWEEP = ("sweep", "--gpus", "8", "--gpu", "h100-80gb", "--top", "3")


def test_bf16_prices_what_the_default_prices(advisor):
    assert advisor.json(*SWEEP, "--bf16") == advisor.json(*SWEEP)


def test_accumulate_in_fp32_is_grad_dtype_fp32(advisor):
    fp32 = advisor.json(*SWEEP, "--accumulate-allreduce-grads-in-fp32")
    assert fp32 == advisor.json(*SWEEP, "--grad-dtype", "fp32")
    assert fp32 != advisor.json(*SWEEP, "--grad-dtype", "bf16")  # the flag decides something


@pytest.mark.parametrize("other, named", [(("--grad-dtype", "bf16"), "--grad-dtype bf16"),
                                          (("--grad-reduce-in-bf16",), "--grad-reduce-in-bf16")])
def test_accumulate_in_fp32_contradicting_bf16_gradients_is_refused(advisor, other, named):
    line = advisor.error(*SWEEP, "--accumulate-allreduce-grads-in-fp32", *other)
    assert line == f"Error: --accumulate-allreduce-grads-in-fp32 contradicts {named}"


@pytest.mark.parametrize("command", ["sweep", "estimate"])
def test_fp16_says_where_fp16_is_priced(advisor, command):
    line = advisor.error(command, "--gpus", "8", "--gpu", "h100-80gb", "--fp16")
    assert "Megatron's --fp16" in line and "advisor estimate --from-command" in line
