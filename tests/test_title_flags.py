"""A sweep's title names the training options it was given as the Megatron flags they change
(``advisor.options.flags.changed_args``), not as the advisor's field names, and in the fewest
words: the flag by which a Megatron user makes each change, not the defaults and requirements that
come with it ('--fp8-format hybrid', not also '--fp8-recipe delayed, --fp8-amax-history-len 1';
'--grad-reduce-in-bf16', not also 'no --accumulate-allreduce-grads-in-fp32'). Every flag it names
is one the rows launch (``training_args``), or one they drop."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from table_text import read_table

from advisor.cli import cli
from advisor.options import TrainingOptions
from advisor.options.flags import changed_args, training_args

UB_FILE = str(Path(__file__).resolve().parents[1] / "tables" / "published" / "userbuffers" / "dgxc-gpt3-175b.yaml")
CHANGES = [
    ({}, ""),
    # with --bf16 Megatron reduces in FP32 unless told otherwise: the flag that changes it is all
    ({"grad_reduce_dtype": "bf16"}, "--grad-reduce-in-bf16"),
    ({"params_dtype": "float16", "grad_reduce_dtype": "fp16"}, "--fp16"),
    ({"params_dtype": "float16"}, "--fp16, --accumulate-allreduce-grads-in-fp32"),
    ({"params_dtype": "float32"}, "no --bf16"),
    ({"fp8_format": "hybrid"}, "--fp8-format hybrid"),  # Megatron's recipe and amax history go unsaid
    ({"fp8_format": "e4m3", "fp8_recipe": "tensorwise", "fp8_amax_history_len": 1024, "fp8_param_gather": True},
     "--fp8-format e4m3, --fp8-recipe tensorwise, --fp8-amax-history-len 1024, --fp8-param-gather"),
    ({"tp_comm_overlap": True}, "--tp-comm-overlap"),
    ({"tp_comm_overlap": True, "tp_comm_overlap_cfg": UB_FILE}, f"--tp-comm-overlap, --tp-comm-overlap-cfg {UB_FILE}"),
    # the overlap's sub-options, each by Megatron's flag (only off its defaults: no flag states one)
    ({"tp_comm_overlap": True, "tp_comm_overlap_ag": False, "tp_comm_overlap_rs": False},
     "--tp-comm-overlap, --disable-tp-comm-overlap-ag, --disable-tp-comm-overlap-rs"),
    ({"tp_comm_overlap": True, "tp_comm_bulk_dgrad": False, "tp_comm_bulk_wgrad": False},
     "--tp-comm-overlap, --disable-tp-comm-bulk-dgrad, --disable-tp-comm-bulk-wgrad"),
    ({"tp_comm_overlap": True, "tp_comm_overlap_rs_dgrad": True}, "--tp-comm-overlap, --tp-comm-overlap-rs-dgrad"),
    # with it Transformer Engine runs neither bulk overlap: the bulk switches go unsaid (one description)
    ({"tp_comm_overlap": True, "tp_comm_overlap_rs_dgrad": True, "tp_comm_bulk_wgrad": False},
     "--tp-comm-overlap, --tp-comm-overlap-rs-dgrad"),
    ({"sequence_parallel": False}, "no --sequence-parallel"),
    # the parameter gather needs the distributed optimizer: it goes with it, unsaid
    ({"distributed_optimizer": False, "overlap_param_gather": False}, "no --use-distributed-optimizer"),
    ({"overlap_grad_reduce": False, "overlap_param_gather": False}, "no --overlap-grad-reduce"),
    ({"overlap_param_gather": False}, "no --overlap-param-gather"),
    # the checkpoint format Megatron-FSDP needs comes with it; the strategy is said (releases differ)
    ({"fsdp_strategy": "optim_grads"}, "--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads"),
    # core 0.19's own Megatron-FSDP dtypes, by their flags where off Megatron's defaults
    ({"fsdp_strategy": "optim_grads", "fsdp_main_params_dtype": "auto", "fsdp_grad_comm_dtype": "bf16"},
     "--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads, --megatron-fsdp-main-params-dtype auto, "
     "--megatron-fsdp-grad-comm-dtype bf16"),
    ({"torch_fsdp2": True, "distributed_optimizer": False, "overlap_param_gather": False}, "--use-torch-fsdp2"),
    ({"optimizer_cpu_offload": True}, "--optimizer-cpu-offload"),  # with the precision-aware optimizer it needs
    ({"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5},
     "--optimizer-cpu-offload, --optimizer-offload-fraction 0.5"),
    ({"precision_aware_optimizer": True}, "--use-precision-aware-optimizer"),
    ({"precision_aware_optimizer": True, "main_params_dtype": "fp16", "exp_avg_dtype": "bf16",
      "exp_avg_sq_dtype": "fp8"},
     "--use-precision-aware-optimizer, --main-params-dtype fp16, --exp-avg-dtype bf16, --exp-avg-sq-dtype fp8"),
    # offloaded, the precision-aware optimizer comes with it: one description, unsaid
    ({"optimizer_cpu_offload": True, "precision_aware_optimizer": True}, "--optimizer-cpu-offload"),
    ({"recompute": "selective"}, "--recompute-granularity selective"),
    # a dense model's modules, in the order given; exactly core_attn is Megatron's default, unsaid
    ({"recompute": "selective", "recompute_modules": ("core_attn", "mlp")},
     "--recompute-granularity selective, --recompute-modules core_attn mlp"),
    ({"recompute": "selective", "recompute_modules": ("core_attn",)}, "--recompute-granularity selective"),
    ({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 4},
     "--recompute-granularity full, --recompute-method block, --recompute-num-layers 4"),
    # unfused attention needs the data loader's mask: it comes with it
    ({"flash_attention": False, "dataloader_mask": "cached"}, "--attention-backend unfused"),
    ({"flash_attention": False, "dataloader_mask": "rebuilt"}, "--attention-backend unfused, --eod-mask-loss"),
    # megatron-core's own modules (read from a command): their attention is unfused, said by the flag
    ({"transformer_impl": "local", "flash_attention": False, "dataloader_mask": "cached"}, "--transformer-impl local"),
    ({"dataloader_mask": "cached"}, "--dataloader-mask cached"),
    ({"dataloader_mask": "rebuilt"}, "--eod-mask-loss"),
    ({"cross_entropy_fusion": "native"}, "--cross-entropy-loss-fusion"),
    ({"cross_entropy_fusion": "te"}, "--cross-entropy-loss-fusion, --cross-entropy-fusion-impl te"),
    ({"bias_swiglu_fusion": False}, "--no-bias-swiglu-fusion"),
    ({"vocab_divisible_by": 128}, "--make-vocab-size-divisible-by 128"),
    ({"vocab_divisible_by": 1}, ""),  # the advisor's default, said another way
    ({"grad_reduce_dtype": "bf16", "fp8_format": "hybrid", "overlap_grad_reduce": False, "overlap_param_gather": False},
     "--grad-reduce-in-bf16, --fp8-format hybrid, no --overlap-grad-reduce"),
]


@pytest.mark.parametrize("changes, words", CHANGES, ids=[w or "defaults" for _, w in CHANGES])
def test_changed_options_read_as_the_flags_that_change_them(changes, words):
    assert changed_args(TrainingOptions().with_(**changes)) == words


def test_every_option_has_its_words():
    """An option added to TrainingOptions without words in the title would go unsaid."""
    changed = {name for changes, _ in CHANGES for name in changes}
    assert set(TrainingOptions().flat()) <= changed


@pytest.mark.parametrize("changes", [c for c, _ in CHANGES if c], ids=[w for c, w in CHANGES if c])
def test_the_words_are_flags_the_rows_launch_or_drop(changes):
    """Each word is a flag (with its value) that the rows' Megatron arguments hold, or, as 'no
    --X', one that the defaults' arguments hold and these do not; the one exception, the data
    loader's mask kept with flash attention, is the advisor's --dataloader-mask (Megatron has only
    the flag that turns it off)."""
    options = TrainingOptions().with_(**changes)
    launched, default = training_args(options, tp=2), training_args(TrainingOptions(), tp=2)
    for word in filter(None, changed_args(options).split(", ")):
        if word == "--dataloader-mask cached":
            assert "--no-create-attention-mask-in-dataloader" in set(default) - set(launched)
        elif word.startswith("no "):
            assert word[3:] in default and word[3:] not in launched, word
        else:
            flag, *value = word.split(" ")
            at = launched.index(flag)
            assert launched[at + 1:at + 1 + len(value)] == value, word


def _title(*args: str) -> str:
    result = CliRunner().invoke(cli, ["sweep", "--gpus", "8", "--gpu", "h100-80gb", "--top", "1", *args],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[0]


def test_the_sweep_title_says_the_flags_not_the_fields():
    title = _title("--grad-dtype", "bf16", "--tp-comm-overlap")
    assert title.endswith("ranked by throughput; --grad-reduce-in-bf16, --tp-comm-overlap")
    assert "grad_reduce_dtype" not in title


@pytest.mark.parametrize("args, words", [
    (("--fp8-format", "hybrid"), "--fp8-format hybrid"),
    (("--fp8-format", "hybrid", "--fp8-recipe", "delayed"), "--fp8-format hybrid"),
    (("--grad-reduce-in-bf16",), "--grad-reduce-in-bf16"),
    (("--no-distributed-optimizer",), "no --use-distributed-optimizer"),
    (("--no-overlap-grad-reduce",), "no --overlap-grad-reduce"),
    (("--no-flash-attn",), "--attention-backend unfused"),
    (("--use-megatron-fsdp", "--megatron-version", "0.15"),
     "--use-megatron-fsdp, --data-parallel-sharding-strategy no_shard"),
    (("--optimizer-cpu-offload", "--sharding", "fixed"), "--optimizer-cpu-offload"),
])
def test_the_title_names_what_the_user_changed(args, words):
    assert _title(*args).endswith(f"ranked by throughput; {words}")


def test_the_estimate_title_names_the_options_it_priced():
    """The sweep's title listed them; the estimate's said nothing of FSDP, FP8 or recomputation."""
    from tests.conftest import Invoker

    text = Invoker()("estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb", "--use-megatron-fsdp",
                     "--recompute", "full", "--fp8-format", "hybrid").stdout
    title = read_table(text).title
    for flag in ("--fp8-format hybrid", "--use-megatron-fsdp", "--recompute-granularity full",
                 "--recompute-method uniform", "--recompute-num-layers 1"):
        assert flag in title, (flag, title)
    plain = read_table(Invoker()("estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb").stdout).title
    assert ";" not in plain  # the defaults add nothing
