"""Megatron-LM command-line arguments for a model, a layout and a setup: the one place that
writes them, for CAPTURE's campaigns and plans and for ``launch`` (flags that both Megatron-LM
releases ``launch.megatron_versions`` knows accept; tests run them through each one's parser).

Uneven stages are written the oldest way Megatron understands them:

- every stage equal: no flag (Megatron's default split, which needs L divisible by PP);
- equal middle stages, different first and/or last stage, none empty:
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (core >= 0.9;
  Megatron requires the middle layers to divide evenly over the middle stages, and refuses 0 for
  either: transformer_config.py ``__post_init__``, 'num_layers_in_last_pipeline_stage must be
  larger than 0');
- anything else, an empty stage included: ``--pipeline-model-parallel-layout`` (core >= 0.13),
  for example ``"E,t*3|t*3|t*2,L"`` for 3, 3 and 2 layers, ``"E,t*32|L"`` for 32 and 0: stages
  separated by ``|``, ``E`` the embedding, ``t`` a decoder layer, ``t*n`` n of them, ``L`` the
  loss; commas are cosmetic (megatron/core/transformer/pipeline_parallel_layer_layout.py,
  ``parse_str_to_list``).

Interleaved virtual stages: ``--num-layers-per-virtual-pipeline-stage L / (PP x VPP)`` when every
chunk holds the same layers, otherwise the layout with PP x VPP segments in model order (chunk k
of rank i is segment k x PP + i), each rank's remainder on its last chunks (``chunk_layers``).

Stock Megatron gives every pipeline stage the same TP, CP and DP; the world size is
TP x CP x PP x DP and is the launcher's (torchrun ``--nproc-per-node`` x nodes), not a flag.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Literal

from advisor.memory import MemoryOptions
from advisor.models import LlamaSpec
from advisor.moe.spec import is_moe
from advisor.options import (Attention, DataParallel, Fusions, Precision, TensorParallel, TrainingOptions,
                             training_args)


@dataclass(frozen=True, kw_only=True, slots=True)
class MegatronSetup:
    """Training choices that profiles and target must share."""

    params_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    distributed_optimizer: bool = True
    """Megatron's --use-distributed-optimizer: Adam states sharded over DP x CP (seed 004)."""
    sequence_parallel: bool = True
    """--sequence-parallel whenever TP > 1 (seed 004 assumes it)."""
    bias_swiglu_fusion: bool = True
    """Megatron-LM's fused SwiGLU (its default); False: --no-bias-swiglu-fusion, the eager SwiGLU,
    which keeps one more h_ffn-wide tensor per layer (``options.Fusions.bias_swiglu_fusion``)."""
    transformer_impl: Literal["transformer_engine", "local"] = "transformer_engine"
    """Megatron-LM's --transformer-impl (``options.Attention.transformer_impl``): local where the
    profiles a plan is made from ran megatron-core's own modules (``observations.launched_transformer_impl``)."""

    def to_dict(self) -> dict:
        """The fields; ``bias_swiglu_fusion`` only when off and ``transformer_impl`` only when local,
        as the flags state them (absent: Megatron-LM's defaults, what every file written before them
        planned), so the default's files are as before."""
        return {"params_dtype": self.params_dtype, "distributed_optimizer": self.distributed_optimizer,
                "sequence_parallel": self.sequence_parallel,
                **({} if self.bias_swiglu_fusion else {"bias_swiglu_fusion": False}),
                **({} if self.transformer_impl == "transformer_engine" else {"transformer_impl": self.transformer_impl})}

    def memory_options(self) -> MemoryOptions:
        """The estimator's view, from the same options the runs' flags are written from
        (``training_options``): what is priced is what is launched."""
        return self.training_options().memory_options()

    def training_options(self) -> TrainingOptions:
        """The options a profiling run is launched with: Megatron's defaults for what the setup
        does not decide (no DP overlap, the data loader's mask kept), which change no memory."""
        return TrainingOptions(
            precision=Precision(params_dtype=self.params_dtype),
            data_parallel=DataParallel(distributed_optimizer=self.distributed_optimizer, overlap_grad_reduce=False,
                                       overlap_param_gather=False),
            tensor_parallel=TensorParallel(sequence_parallel=self.sequence_parallel),
            attention=Attention(dataloader_mask="cached", transformer_impl=self.transformer_impl),
            fusions=Fusions(bias_swiglu_fusion=self.bias_swiglu_fusion))


def _run_length(count: int) -> str:
    return "" if count == 0 else "t" if count == 1 else f"t*{count}"


def chunk_layers(layers_per_stage: list[int] | tuple[int, ...], virtual_stages: int = 1) -> list[int]:
    """Decoder layers of each virtual stage, in model order (virtual stage k x PP + i is chunk k
    of pipeline rank i, as Megatron's layout and interleaved schedule number them). A rank's layers
    are split as evenly as possible over its chunks, the remainder on its last chunks, where the
    estimator prices it (``advisor.schedule``: this keeps the warm-up peak the rank's highest)."""
    if virtual_stages == 1:
        return list(layers_per_stage)
    ranks = [divmod(layers, virtual_stages) for layers in layers_per_stage]
    return [base + (chunk >= virtual_stages - extra) for chunk in range(virtual_stages) for base, extra in ranks]


def pipeline_layout(layers_per_stage: list[int] | tuple[int, ...], virtual_stages: int = 1) -> str:
    """[3, 3, 2] -> 'E,t*3|t*3|t*2,L'; with virtual stages, one segment per chunk in model order.
    A run of equal segments between the first and the last is written once, ``(t*2|)*29``, where
    that is shorter: Megatron unrolls ``(...)*n`` before it splits the stages
    (``PipelineParallelLayerLayout.parse_str_to_list``, both releases), as Megatron-Bridge's
    recipes write theirs ('Et|(tt|)*30mL'): a 405B row's 96 chunks (PP 32, VPP 3) read as the first,
    four runs (one of them a single empty chunk, left as it is) and the last."""
    stages = [_run_length(count) for count in chunk_layers(layers_per_stage, virtual_stages)]
    first = "E," + stages[0] if stages[0] else "E"
    last = stages[-1] + ",L" if stages[-1] else "L"
    if len(stages) == 1:
        return first + last.removeprefix(stages[0])
    middle = "".join(_repeated(segment + "|", len(list(run)))
                     for segment, run in itertools.groupby(stages[1:-1]))
    return f"{first}|{middle}{last}"


def _repeated(text: str, count: int) -> str:
    """``text`` ``count`` times, as Megatron's ``(text)*count`` where that is shorter."""
    compressed = f"({text})*{count}"
    return compressed if len(compressed) < len(text) * count else text * count


def split_args(layers_per_stage: list[int] | tuple[int, ...], virtual_stages: int = 1) -> list[str]:
    """The flags that make Megatron build exactly ``layers_per_stage`` (and its chunks)."""
    counts = list(layers_per_stage)
    if virtual_stages > 1:
        chunks = chunk_layers(counts, virtual_stages)
        if len(set(chunks)) == 1:  # Megatron's even interleaved split
            return ["--num-layers-per-virtual-pipeline-stage", str(chunks[0])]
        return ["--pipeline-model-parallel-layout", pipeline_layout(counts, virtual_stages)]
    if len(set(counts)) <= 1:
        return []
    if min(counts) == 0:  # Megatron takes an empty stage only in a layout (module docstring)
        return ["--pipeline-model-parallel-layout", pipeline_layout(counts)]
    if len(counts) == 2:
        return ["--decoder-first-pipeline-num-layers", str(counts[0]),
                "--decoder-last-pipeline-num-layers", str(counts[1])]
    middle = counts[1:-1]
    if len(set(middle)) == 1:
        args = []
        if counts[0] != middle[0]:
            args += ["--decoder-first-pipeline-num-layers", str(counts[0])]
        if counts[-1] != middle[0]:
            args += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
        return args
    return ["--pipeline-model-parallel-layout", pipeline_layout(counts)]


@functools.lru_cache(maxsize=64)
def _model_args(spec: LlamaSpec, seq_len: int) -> tuple[str, ...]:
    return tuple(model_args(spec, seq_len))


@functools.lru_cache(maxsize=256)
def _training_args(tp_above_one: bool, options: TrainingOptions, release) -> tuple[str, ...]:
    return tuple(training_args(options, tp=2 if tp_above_one else 1, release=release))


def _number(value: float) -> str:
    """500000.0 -> '500000', 1e-05 -> '1e-05': what argparse reads back as the same float."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def model_args(spec: LlamaSpec, seq_len: int) -> list[str]:
    """The Llama architecture in full (RMSNorm with its epsilon, SwiGLU, RoPE with its base and
    scaling, GQA, the head size, no dropout, QKV biases, no other biases, tied or untied embeddings), so that
    pretrain_gpt.py builds the network the user named. The vocabulary comes from the user's
    tokenizer (or --mock-data's), so it is not a flag here."""
    args = [
        "--num-layers", str(spec.num_layers),
        "--hidden-size", str(spec.hidden_size),
        "--ffn-hidden-size", str(spec.ffn_hidden_size),
        "--num-attention-heads", str(spec.num_attention_heads),
    ]
    if spec.num_query_groups != spec.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(spec.num_query_groups)]
    if spec.kv_channels is not None:
        args += ["--kv-channels", str(spec.kv_channels)]
    # the spec's context where a user's command gave one (with RoPE it prices nothing); never below the
    # sequence, which validate_args refuses (a spec priced at a longer sequence than its command's)
    args += [
        "--seq-length", str(seq_len),
        "--max-position-embeddings", str(max(seq_len, spec.max_position_embeddings or 0)),
        "--normalization", "RMSNorm", "--norm-epsilon", _number(spec.norm_epsilon), "--swiglu",
        "--position-embedding-type", "rope", "--rotary-base", _number(spec.rotary_base),
    ]
    if spec.rope_scaling_factor is not None:
        args += ["--use-rope-scaling", "--rope-scaling-factor", _number(spec.rope_scaling_factor)]
    # Llama trains without dropout, and seed 004's activation terms keep no dropout masks; Megatron's
    # defaults are 0.1 for both.
    args += ["--attention-dropout", "0", "--hidden-dropout", "0", "--disable-bias-linear"]
    if spec.add_qkv_bias:
        args.append("--add-qkv-bias")
    if spec.qk_layernorm and not is_moe(spec):  # an MoE spec's comes with its flags (advisor.moe.flags)
        args.append("--qk-layernorm")
    if not spec.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def parallel_args(
    *, tp: int, cp: int, layers_per_stage: list[int] | tuple[int, ...], micro_batch_size: int,
    global_batch_size: int, virtual_stages: int = 1,
) -> list[str]:
    """TP, CP, PP, the split (and VPP) and the batch."""
    return [*_sizes_args(tp, cp, len(layers_per_stage)), *split_args(layers_per_stage, virtual_stages),
            *_batch_args(micro_batch_size, global_batch_size)]


def _sizes_args(tp: int, cp: int, pp: int) -> list[str]:
    return ["--tensor-model-parallel-size", str(tp), "--context-parallel-size", str(cp),
            "--pipeline-model-parallel-size", str(pp)]


def _batch_args(micro_batch_size: int, global_batch_size: int) -> list[str]:
    return ["--micro-batch-size", str(micro_batch_size), "--global-batch-size", str(global_batch_size)]


def megatron_args(
    spec: LlamaSpec, seq_len: int, *, tp: int, cp: int, layers_per_stage: list[int] | tuple[int, ...],
    micro_batch_size: int, global_batch_size: int, options: TrainingOptions = TrainingOptions(),
    virtual_stages: int = 1, release=None,
) -> list[str]:
    """Everything Megatron-LM needs to build and batch this layout, and every training option
    the price assumed (``advisor.options``); the launcher adds data, tokenizer and iterations."""
    # A sweep writes these for thousands of rows: the model's and the options' flags repeat (TP
    # enters the options' flags only through TP > 1).
    return [
        *_model_args(spec, seq_len),
        *parallel_args(tp=tp, cp=cp, layers_per_stage=layers_per_stage, micro_batch_size=micro_batch_size,
                       global_batch_size=global_batch_size, virtual_stages=virtual_stages),
        *_training_args(tp > 1, options, release),
    ]


def rows_arg_parts(spec: LlamaSpec, seq_len: int, global_batch_size: int, rows, release=None) -> tuple[list, list]:
    """``megatron_args`` of many sweep rows (``advisor.sweep.SweepRow``), each as its parts (the
    model's flags, the sizes', the split's, the batch's, the training options'), concatenated in
    that order; and each row's options at its TP (``TrainingOptions.at_tp``). Each row is its own
    layout, but the rows share few of each part: each is made once per distinct key and shared
    (the same tuple object), so that a writer encodes it once too (``render.rows_to_json``). The
    options are told apart by identity first (the rows share a handful of objects): hashing the
    nested frozen options per row cost more than writing the flags."""
    model = _model_args(spec, seq_len)
    sizes: dict = {}
    splits: dict = {}
    batches: dict = {}
    trainings: dict = {}  # (id of a row's options, TP > 1) -> (those options, their flags, at TP)
    parts, options = [], []
    for row in rows:
        p = row.parallel
        layers = tuple(row.layers_per_stage)
        held = trainings.get((id(row.training), p.tp > 1))
        if held is None or held[0] is not row.training:
            at_tp = row.training.at_tp(p.tp)  # depends on TP > 1 only
            held = trainings[id(row.training), p.tp > 1] = (row.training, _training_args(p.tp > 1, at_tp, release),
                                                           at_tp)
        parts.append((model, _once(sizes, (p.tp, p.cp, len(layers)), _sizes_args),
                      _once(splits, (layers, p.vpp), split_args),
                      _once(batches, (p.mbs, global_batch_size), _batch_args), held[1]))
        options.append(held[2])
    return parts, options


def _once(made: dict, key: tuple, make) -> tuple[str, ...]:
    """``make(*key)`` as a tuple, made once per key in ``made``."""
    value = made.get(key)
    if value is None:
        value = made[key] = tuple(make(*key))
    return value
