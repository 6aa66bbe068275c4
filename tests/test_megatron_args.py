"""Megatron-LM flags from a model, a layout and the estimator's options."""

import pytest

from advisor.megatron_args import chunk_layers, megatron_args, pipeline_layout, split_args
from advisor.options import TrainingOptions, training_args
from advisor.models import PRESETS
from conftest import ROOT

FLAGS = set((ROOT / "tables" / "data" / "megatron_lm_core_v0.15.2_flags.txt").read_text().split())


def flag_values(args: list[str]) -> dict[str, str | None]:
    values, key = {}, None
    for arg in args:
        if arg.startswith("--"):
            key = arg
            values[key] = None
        else:
            values[key] = arg
    return values


def test_the_papers_setup():
    args = flag_values(megatron_args(PRESETS["llama3.1-8b"], 8192, tp=2, cp=1, layers_per_stage=(16, 16),
                                     micro_batch_size=1, global_batch_size=1024))
    assert args["--tensor-model-parallel-size"] == "2" and args["--pipeline-model-parallel-size"] == "2"
    assert args["--num-query-groups"] == "8" and "--group-query-attention" in args
    assert args["--normalization"] == "RMSNorm" and "--swiglu" in args and "--disable-bias-linear" in args
    assert "--untie-embeddings-and-output-weights" in args
    # seed 004's assumptions: BF16, FP32 gradients, distributed optimizer, SP with TP, no vocab padding
    for flag in ("--bf16", "--accumulate-allreduce-grads-in-fp32", "--use-distributed-optimizer", "--sequence-parallel"):
        assert flag in args
    assert args["--make-vocab-size-divisible-by"] == "1"
    assert "--recompute-granularity" not in args and "--attention-backend" not in args


@pytest.mark.parametrize(
    "options,present,absent",
    [
        (dict(distributed_optimizer=False, overlap_param_gather=False), {"--overlap-grad-reduce": None},
         {"--use-distributed-optimizer", "--overlap-param-gather"}),
        (dict(grad_reduce_dtype="bf16"), {"--grad-reduce-in-bf16": None}, {"--accumulate-allreduce-grads-in-fp32"}),
        (dict(sequence_parallel=False), {}, {"--sequence-parallel"}),
        (dict(recompute="selective"), {"--recompute-granularity": "selective"}, {"--recompute-method"}),
        (dict(recompute="full", recompute_method="block", recompute_num_layers=3),
         {"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "3"}, set()),
        (dict(flash_attention=False, dataloader_mask="cached"), {"--attention-backend": "unfused"},
         {"--no-create-attention-mask-in-dataloader"}),
        (dict(vocab_divisible_by=128), {"--make-vocab-size-divisible-by": "128"}, set()),
    ],
)
def test_each_extension_has_its_flag(options, present, absent):
    args = flag_values(training_args(TrainingOptions().with_(**options), tp=2))
    for flag, value in present.items():
        assert args.get(flag, "missing") == value, flag
    assert not absent & args.keys()
    assert set(args) <= FLAGS


def test_fp32_runs_have_no_precision_flags():
    args = training_args(TrainingOptions().with_(params_dtype="float32"), tp=1)
    assert not {"--bf16", "--fp16", "--accumulate-allreduce-grads-in-fp32"} & set(args)


def test_every_generated_flag_exists_in_megatron_lm():
    for spec in PRESETS.values():
        for layers in ((spec.num_layers,), (1, spec.num_layers - 1), (2, spec.num_layers - 5, 3)):
            for options in (TrainingOptions(), TrainingOptions().with_(
                    recompute="full", flash_attention=False, dataloader_mask="cached", grad_reduce_dtype="bf16")):
                args = megatron_args(spec, 4096, tp=2, cp=2, layers_per_stage=layers, micro_batch_size=1,
                                     global_batch_size=64, options=options)
                assert {arg for arg in args if arg.startswith("--")} <= FLAGS


def test_uneven_splits():
    assert split_args((8, 8)) == []
    assert split_args((2, 8, 8, 6)) == ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "6"]


@pytest.mark.parametrize("counts,layout", [((32, 0), "E,t*32|L"), ((0, 32), "E|t*32,L"),
                                           ((0, 8, 8, 8), "E|t*8|t*8|t*8,L"), ((8, 8, 8, 0), "E,t*8|t*8|t*8|L"),
                                           ((4, 0, 4), "E,t*4||t*4,L")])
def test_an_empty_stage_is_a_layout(counts, layout):
    """Megatron refuses --decoder-first/last-pipeline-num-layers 0 (transformer_config.py: 'must be
    larger than 0'); its layout builds an empty stage."""
    assert split_args(counts) == ["--pipeline-model-parallel-layout", layout]


def test_virtual_pipeline_stages():
    spec = PRESETS["llama3.1-8b"]  # 32 layers
    args = flag_values(megatron_args(spec, 8192, tp=1, cp=1, layers_per_stage=(8, 8, 8, 8), micro_batch_size=1,
                                     global_batch_size=64, virtual_stages=2))
    # 32 layers / (PP 4 x VPP 2) = 4 layers per model chunk
    assert args["--num-layers-per-virtual-pipeline-stage"] == "4" and args["--pipeline-model-parallel-size"] == "4"
    assert "--num-layers-per-virtual-pipeline-stage" not in megatron_args(
        spec, 8192, tp=1, cp=1, layers_per_stage=(8, 8, 8, 8), micro_batch_size=1, global_batch_size=64)
    # Uneven chunks go through the layout, one segment per chunk in model order (chunk k of rank i
    # is segment k x PP + i), each rank's remainder on its last chunk: 9 = 4 + 5, 7 = 3 + 4.
    assert split_args((9, 7, 8, 8), 2) == ["--pipeline-model-parallel-layout", "E,t*4|t*3|t*4|t*4|t*5|t*4|t*4|t*4,L"]
    # chunks 2, 2, 2, 2 then 3 x 8: the runs between the first and the last written once, as
    # Megatron unrolls '(...)*n' (parse_str_to_list), where shorter: 'E,t*2|' + 3 x 't*2|' + 7 x 't*3|' + 't*3,L'
    assert split_args((8, 8, 8, 8), 3) == ["--pipeline-model-parallel-layout", "E,t*2|(t*2|)*3(t*3|)*7t*3,L"]
    # Llama 3.1 405B's 126 layers on PP 32, VPP 3, ranks of 3, 4 x 30 and 2 layers: chunks 1, 1, 1;
    # 1, 1, 2 (x 30); 0, 1, 1, in model order [1] x 31, 0, [1] x 32, 1, [2] x 30, 1: 96 segments,
    # the middle 94 as four runs (the empty one alone: '(|)*1' is longer than '|')
    assert pipeline_layout((3,) + (4,) * 30 + (2,), 3) == "E,t|(t|)*30|(t|)*33(t*2|)*30t,L"
    # ranks of 1, 1, 2: model order [1] x 8, [2] x 4; the middle ten: 7 x 't|' and 3 x 't*2|'
    assert pipeline_layout((4, 4, 4, 4), 3) == "E,t|(t|)*7(t*2|)*3t*2,L"


@pytest.mark.parametrize("counts,vpp", [((9, 7, 8, 8), 2), ((8, 8, 8, 8), 3), ((7,) + (8,) * 14 + (7,), 2),
                                        ((5, 9, 9, 9), 4), ((1, 3, 1), 1), ((0, 4, 4), 1), ((32, 0), 1),
                                        ((0, 32), 1), ((8, 8, 8, 0), 1), ((4, 0, 4), 1),
                                        ((3,) + (4,) * 30 + (2,), 3), ((4, 4, 4, 4), 3), ((0, 0, 0, 8), 1)])
def test_layouts_build_in_megatron_core_as_priced(counts, vpp):
    """megatron-core's own parser builds, per pipeline rank and model chunk, the layers we price."""
    layout_module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    layout = layout_module.PipelineParallelLayerLayout(pipeline_layout(counts, vpp), len(counts))
    layout.validate_layer_layout(num_layers=sum(counts), mtp_num_layers=None)
    assert layout.virtual_pipeline_model_parallel_size == vpp
    built = [[[kind.name for kind in chunk].count("decoder") for chunk in rank] for rank in layout.layout]
    assert [sum(rank) for rank in built] == list(counts)
    expected = chunk_layers(counts, vpp)
    assert built == [[expected[k * len(counts) + i] for k in range(vpp)] for i in range(len(counts))]
    assert "embedding" in [kind.name for kind in layout.layout[0][0]]
    assert "loss" in [kind.name for kind in layout.layout[-1][-1]]


def test_the_model_defining_flags_in_full():
    """Issue 24: removing --attention-dropout 0 --hidden-dropout 0 passed every test that runs
    without the real checkouts. Llama-3.1-8B's config.json, flag by flag: no dropout (Megatron's
    defaults are 0.1), RMSNorm with its epsilon, SwiGLU, RoPE base 500000 with Llama 3.1's
    scaling (factor 8), GQA 8 groups, no biases, untied embeddings."""
    from advisor.megatron_args import model_args

    assert model_args(PRESETS["llama3.1-8b"], 8192) == [
        "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
        "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
        "--max-position-embeddings", "8192", "--normalization", "RMSNorm", "--norm-epsilon", "1e-05", "--swiglu",
        "--position-embedding-type", "rope", "--rotary-base", "500000", "--use-rope-scaling",
        "--rope-scaling-factor", "8", "--attention-dropout", "0", "--hidden-dropout", "0", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights"]
    # a tied model (Llama-3.2-1B) has no untie flag, and multi-head attention no GQA flags
    tied = flag_values(model_args(PRESETS["llama3.2-1b"], 2048))
    assert "--untie-embeddings-and-output-weights" not in tied and tied["--attention-dropout"] == "0"
    assert "--group-query-attention" not in flag_values(model_args(PRESETS["llama2-7b"], 4096))
