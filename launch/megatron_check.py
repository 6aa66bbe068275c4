"""Run argument lists through a real Megatron-LM checkout's own argument parser and validator,
and report what Megatron derives from them: the harness that checks every argument list the
advisor writes (``tests/test_megatron_real.py``; issue 14's new row kinds use it too).

    python -m launch.megatron_check --megatron-lm DIR < cases.json > results.json

Input: a JSON array of cases, each ``{"args": [...], "world_size": N, "env": {NAME: value or
null}}`` (``env``: the environment the launcher gives the ranks, applied over this process's;
null unsets). Output: a JSON array, one result per case: ``{"ok": true, "derived": {...}}``, or
``{"ok": false, "error": "..."}`` where Megatron refused the arguments (an argparse error or an
assertion of ``validate_args``, with its message).

Per case, as rank 0 of ``world_size`` ranks, what ``pretrain_gpt.py`` does before it builds a
model: ``parse_args`` (with the script's ``args_defaults``), ``validate_args``, the tokenizer of
``megatron.training.global_vars`` (which pads the vocabulary), Megatron's microbatch calculator,
``core_transformer_config_from_args``, and megatron-core's split of the layers over pipeline
ranks (``get_num_layers_to_build``, or the pipeline layout). ``derived`` holds the sizes, the
split, the padded vocabulary and every architectural field of the resulting TransformerConfig.

The stand-ins: ``validate_args`` asks the GPU for its architecture
(``get_device_arch_version``, and ``torch.cuda.get_device_capability`` for --moe-grouped-gemm);
this machine has none, so both answer ``--device-arch`` (9, Hopper, by default; 10 is Blackwell).
MoE with FP8 asks Transformer Engine's version, absent here: ``TE_STAND_IN`` answers.
Everything else is the checkout's own code. Only ``--mock-data``
with ``--tokenizer-type NullTokenizer`` is supported (a real tokenizer needs its files).

``validate(checkout, cases, python=...)`` runs this module in a subprocess of the given Python
(core_v0.19.0 needs 3.12) and returns the results; ``Validator`` keeps one such process
(``--serve``: a JSON array of cases per input line, its results on one output line) for many
batches.

``--flags`` instead prints, as a JSON object, every flag of the checkout's own parser with how many
values it takes (``"counts"``: ``value_counts``) and, where argparse converts them with int or
float, that type (``"types"``: ``value_types``); ``launch.megatron_flags`` keeps them, to refuse a
``--lr`` left without its value, or given ``abc``, before anything starts. ``parser_flags(checkout,
python=...)`` runs it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# pretrain_gpt.py's own defaults (its call to pretrain / parse_and_validate_args), in both versions.
ARGS_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}


def validate(checkout: str | os.PathLike, cases: Sequence[dict], *, python: str | None = None,
             device_arch: int = 9, timeout: float = 600) -> list[dict]:
    """Each case through the checkout's parse_args and validate_args, in a subprocess of ``python``
    (default: this interpreter) with this repository importable; one result per case."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               NO_VCS_VERSION="1")
    completed = subprocess.run(
        [python or sys.executable, "-m", "launch.megatron_check", "--megatron-lm", str(checkout),
         "--device-arch", str(device_arch)],
        input=json.dumps(list(cases)), capture_output=True, text=True, env=env, timeout=timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"launch.megatron_check failed ({completed.returncode}): {completed.stderr[-3000:]}")
    return json.loads(completed.stdout)


@dataclass(frozen=True, slots=True)
class ParserFlags:
    """What ``--flags`` reads from one checkout's parser."""

    counts: dict[str, tuple[int, int | None]]
    """Every flag with the least and the most values it takes (``value_counts``)."""
    types: dict[str, str]
    """The flags whose values argparse converts with int or float: 'int' or 'float' (``value_types``)."""


def parser_flags(checkout: str | os.PathLike, *, python: str | None = None, timeout: float = 600) -> ParserFlags:
    """``--flags`` in a subprocess of ``python``: each flag of the checkout's parser with the least
    and the most values it takes, and the int and float flags' types."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               NO_VCS_VERSION="1")
    completed = subprocess.run(
        [python or sys.executable, "-m", "launch.megatron_check", "--megatron-lm", str(checkout), "--flags"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"launch.megatron_check --flags failed ({completed.returncode}): {completed.stderr[-3000:]}")
    read = json.loads(completed.stdout)
    return ParserFlags(counts={flag: tuple(counts) for flag, counts in read["counts"].items()}, types=read["types"])


class Validator:
    """One validator process kept for many batches of cases (``--serve``): what ``validate`` does,
    without importing torch and the checkout again for every batch (about 10 s of CPU each here).
    The cases of all batches run in the one process, as the cases of one batch always have."""

    def __init__(self, checkout: str | os.PathLike, *, python: str | None = None, device_arch: int = 9) -> None:
        import tempfile

        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
                   NO_VCS_VERSION="1")
        # Megatron prints as it parses; a file, not a pipe nobody reads, takes it (a full pipe blocks).
        self._log = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [python or sys.executable, "-m", "launch.megatron_check", "--megatron-lm", str(checkout),
             "--device-arch", str(device_arch), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)

    def __call__(self, cases: Sequence[dict], *, timeout: float = 600) -> list[dict]:
        """One result per case, as ``validate`` returns them."""
        import select

        self._process.stdin.write(json.dumps(list(cases)) + "\n")
        self._process.stdin.flush()
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            self._log.seek(0)
            log = self._log.read()[-3000:]  # before close() closes it
            self.close()
            raise RuntimeError(f"launch.megatron_check --serve: no answer ({'timed out' if not ready else 'exited'}): "
                               f"{log}")
        return json.loads(line)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


# --- inside the checkout's Python ------------------------------------------------------------


def _transformer_config(args):
    module = __import__(_RULES.transformer_config_module, fromlist=["core_transformer_config_from_args"])
    return module.core_transformer_config_from_args(args)


def _microbatches(args) -> int:
    from megatron.core import num_microbatches_calculator as calculator

    calculator.init_num_microbatches_calculator(0, args.rampup_batch_size, args.global_batch_size,
                                                args.micro_batch_size, args.data_parallel_size,
                                                args.decrease_batch_size_if_needed)
    try:
        return calculator.get_num_microbatches()
    finally:
        calculator.destroy_num_microbatches_calculator()


def _stand_in_fused_permutation() -> None:
    """--moe-permute-fusion: TransformerConfig refuses it where Transformer Engine's permutation
    kernels are missing (``moe_utils.fused_permute`` and four others are None without TE, both
    releases); as for TE's version, stand-ins answer here, and they refuse to run."""
    from megatron.core.transformer.moe import moe_utils

    def missing(*args, **kwargs):
        raise RuntimeError("Transformer Engine's fused permutation stands in for the argument check only")

    for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        if getattr(moe_utils, name, None) is None:  # core_v0.15.2 leaves them undefined, 0.19.0 None
            setattr(moe_utils, name, missing)


TE_STAND_IN = "2.8.0"
"""The Transformer Engine version the check answers where TE is absent (one that both releases
support; only MoE FP8 asks it in what the advisor emits)."""


def _derive(args) -> dict:
    from megatron.training import global_vars

    from megatron_hooks.integration import layers_per_stage  # megatron-core's split, as the hooks read it

    global_vars.build_tokenizer(args)  # what set_global_variables does: sets args.padded_vocab_size
    config = _transformer_config(args)
    vpp = args.virtual_pipeline_model_parallel_size
    dtype = str(config.params_dtype).removeprefix("torch.")
    return {
        "tp": args.tensor_model_parallel_size, "cp": args.context_parallel_size,
        "pp": args.pipeline_model_parallel_size, "dp": args.data_parallel_size, "vpp": vpp or 1,
        "micro_batch_size": args.micro_batch_size, "global_batch_size": args.global_batch_size,
        "num_microbatches": _microbatches(args), "seq_length": args.seq_length,
        "layers_per_stage": list(layers_per_stage(config, args.pipeline_model_parallel_size, vpp)),
        "padded_vocab_size": args.padded_vocab_size,
        "num_layers": config.num_layers, "hidden_size": config.hidden_size,
        "ffn_hidden_size": config.ffn_hidden_size, "num_attention_heads": config.num_attention_heads,
        "num_query_groups": config.num_query_groups, "kv_channels": config.kv_channels,
        "add_qkv_bias": bool(config.add_qkv_bias), "add_bias_linear": bool(config.add_bias_linear),
        "attention_dropout": config.attention_dropout, "hidden_dropout": config.hidden_dropout,
        "gated_linear_unit": bool(config.gated_linear_unit), "normalization": config.normalization,
        "layernorm_epsilon": config.layernorm_epsilon, "position_embedding_type": args.position_embedding_type,
        "rotary_base": args.rotary_base, "use_rope_scaling": bool(args.use_rope_scaling),
        "rope_scaling_factor": args.rope_scaling_factor if args.use_rope_scaling else None,
        "tie_embeddings": not args.untie_embeddings_and_output_weights,
        "params_dtype": dtype, "sequence_parallel": bool(config.sequence_parallel),
        # torch's norm (--transformer-impl local) asserts it off (advisor.options.local_spec)
        "persist_layer_norm": bool(config.persist_layer_norm),
        "use_distributed_optimizer": bool(args.use_distributed_optimizer),
        "grad_reduce_in_fp32": bool(args.accumulate_allreduce_grads_in_fp32),
        **_fsdp_dtypes(args, config.params_dtype),
        "recompute_granularity": config.recompute_granularity, "recompute_method": config.recompute_method,
        "recompute_num_layers": config.recompute_num_layers,
        "attention_backend": str(args.attention_backend).rpartition(".")[2],
        # --no-bias-swiglu-fusion, as core_transformer_config_from_args hands it to the MLP with --swiglu
        "bias_activation_fusion": bool(config.bias_activation_fusion),
        # the training options' levers (advisor.options), as validate_args leaves them
        **{name: getattr(args, name, None) for name in (
            "overlap_grad_reduce", "overlap_param_gather", "use_megatron_fsdp", "data_parallel_sharding_strategy",
            "tp_comm_overlap", "tp_comm_overlap_cfg", "fp8", "fp8_recipe", "fp8_param_gather", "fp8_amax_history_len",
            "optimizer_cpu_offload", "optimizer_offload_fraction", "use_precision_aware_optimizer",
            "create_attention_mask_in_dataloader", "ckpt_format", "use_torch_fsdp2", "gradient_accumulation_fusion",
            "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
            # evaluation's defaults, which the launcher's report reads (advisor.releases)
            "eval_iters", "eval_interval")},
        # the overlap's sub-options as the TransformerConfig hands them to Transformer Engine's layers
        **{name: getattr(config, name, None) for name in (
            "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad", "tp_comm_bulk_dgrad",
            "tp_comm_bulk_wgrad")},
        **{name: str(getattr(args, name, None)).removeprefix("torch.") for name in (
            "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")},
        "optimizer_config_error": _optimizer_config_error(args),
        **{key: getattr(config, key, None) for key in MOE_FIELDS},
    }


def _fsdp_dtypes(args, params_dtype) -> dict:
    """Megatron-FSDP's dtypes for the model's (BF16, FP16 or FP32) weights, each None without
    Megatron-FSDP: ``fsdp_main_grads_dtype``, its main gradient buffer's; ``fsdp_main_params_dtype``,
    its main weight buffer's ('None': no such buffer, the optimizer steps the weights' own);
    ``fsdp_grad_comm_dtype``, what its gradient reduction moves. core_v0.19.0: its own code, the
    DDP config that ``get_megatron_ddp_config`` builds from the arguments, through
    ``MixedPrecisionPolicy`` (as ``mcore_fsdp_adapter.py`` builds it) to
    ``ParamAndGradBuffer._resolve_group_grad_dtype`` for the gradients, the policy's
    main_params_dtype for the main weights (``_init_each_parameter_group_buffers``), and its
    grad_comm_dtype or, None, the gradient buffer's own dtype (``DataParallelBuffer.fetch_bucket``).
    core_v0.15.2 has none of the three flags: its ``_init_each_parameter_group_buffers``
    allocates ``dtype=torch.float32 if grad_reduce_in_fp32 else grad_dtype`` (the weights' dtype),
    with grad_reduce_in_fp32 from --accumulate-allreduce-grads-in-fp32 (training.py, get_model),
    reduces in that dtype, and keeps FP32 main weights (``preserve_fp32_weights``, default True)."""
    import types

    import torch

    if not args.use_megatron_fsdp:
        return {"fsdp_main_grads_dtype": None, "fsdp_main_params_dtype": None, "fsdp_grad_comm_dtype": None}
    try:
        from megatron.training.training import get_megatron_ddp_config
    except ImportError:  # core_v0.15.2
        grads = torch.float32 if args.accumulate_allreduce_grads_in_fp32 else params_dtype
        main, comm = torch.float32, grads
    else:
        from megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision import MixedPrecisionPolicy
        from megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer import ParamAndGradBuffer

        ddp = get_megatron_ddp_config(args)
        policy = MixedPrecisionPolicy(
            main_params_dtype=ddp.megatron_fsdp_main_params_dtype, main_grads_dtype=ddp.megatron_fsdp_main_grads_dtype,
            grad_comm_dtype=ddp.megatron_fsdp_grad_comm_dtype)
        buffer = types.SimpleNamespace(mp_policy=policy)
        grads = ParamAndGradBuffer._resolve_group_grad_dtype(buffer, types.SimpleNamespace(dtype=params_dtype), {})
        main, comm = policy.main_params_dtype, policy.grad_comm_dtype or grads
    return {f"fsdp_{name}_dtype": str(dtype).removeprefix("torch.")
            for name, dtype in (("main_grads", grads), ("main_params", main), ("grad_comm", comm))}


def _optimizer_config_error(args) -> str | None:
    """The first line of what megatron-core's OptimizerConfig refuses in these arguments, built as
    the training loop builds it (``training.py``: every field from args), or None."""
    import dataclasses

    from megatron.core.optimizer import OptimizerConfig

    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(OptimizerConfig) if hasattr(args, f.name)}
    try:
        OptimizerConfig(**kwargs)
    except (AssertionError, RuntimeError, ValueError, TypeError) as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


MOE_FIELDS = ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "moe_layer_freq", "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_expert_capacity_factor",
              "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_router_score_function",
              "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
              "moe_router_topk_scaling_factor", "qk_layernorm", "multi_latent_attention", "q_lora_rank",
              "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "recompute_modules", "mtp_num_layers",
              "moe_pad_expert_input_to_capacity", "moe_aux_loss_coeff", "moe_router_load_balancing_type", "moe_router_dtype",
              "moe_enable_deepep", "moe_deepep_num_sms", "moe_flex_dispatcher_num_sms", "moe_permute_fusion",
              "moe_router_fusion", "moe_flex_dispatcher_backend", "moe_router_pre_softmax",
              "moe_shared_expert_overlap")
"""The TransformerConfig fields of mixtures of experts and multi-latent attention (advisor.moe
checks them against its spec); None where the release's config lacks one."""


def _run_case(case: dict) -> dict:
    from megatron.training import arguments

    saved_env = dict(os.environ)
    os.environ.update({"WORLD_SIZE": str(case["world_size"]), "RANK": "0", "LOCAL_RANK": "0"})
    for name, value in (case.get("env") or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    sys.argv = ["pretrain_gpt.py", *case["args"]]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(errors):
            args = arguments.parse_args()
            arguments.validate_args(args, dict(ARGS_DEFAULTS))
            return {"ok": True, "derived": _derive(args)}
    except SystemExit:  # argparse: "pretrain_gpt.py: error: unrecognized arguments: --foo"
        lines = [line for line in errors.getvalue().splitlines() if "error:" in line]
        return {"ok": False, "error": lines[-1] if lines else errors.getvalue()[-500:]}
    except AssertionError as exc:
        return {"ok": False, "error": f"validate_args: {exc}"}
    except ValueError as exc:  # TransformerConfig.__post_init__ refusing a combination
        return {"ok": False, "error": f"TransformerConfig: {exc}"}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def _parser():
    """The parser ``parse_args`` builds (megatron/training/arguments.py: ``add_megatron_arguments``
    on an ``ArgumentParser(allow_abbrev=False)``), with the flags of pretrain_gpt.py's
    ``extra_args_provider`` (both releases: ``megatron.post_training.arguments.add_modelopt_args``,
    which parse_args adds after its own; pretrain_gpt.py passes it where nvidia-modelopt imports),
    so that a ModelOpt flag after '--' is never called unknown (``launch.arguments.unknown_flags``)."""
    import argparse

    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    try:  # plain argparse calls, no ModelOpt import (megatron/post_training/arguments.py)
        from megatron.post_training.arguments import add_modelopt_args
    except ImportError:  # a checkout without it: its pretrain_gpt.py adds nothing
        add_modelopt_args = None
    if add_modelopt_args is not None:
        parser = add_modelopt_args(parser)
    return parser


def value_counts(parser) -> dict[str, tuple[int, int | None]]:
    """Every option string of ``parser`` (``_parser``) with the least and the most values its action
    takes (None: no most): a single value (nargs None) 1 and 1, nargs=N N and N, '+' 1 and none,
    '?' 0 and 1, '*' 0 and none, a switch (store_true, store_false, BooleanOptionalAction,
    store_const: nargs 0) 0 and 0."""
    arity = {None: (1, 1), "+": (1, None), "?": (0, 1), "*": (0, None)}
    counts = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        taken = (action.nargs, action.nargs) if isinstance(action.nargs, int) else arity.get(action.nargs)
        if taken is None:  # argparse.REMAINDER or PARSER: none in Megatron's parser
            continue
        counts.update((flag, taken) for flag in action.option_strings if flag.startswith("--"))
    return dict(sorted(counts.items()))


def value_types(parser) -> dict[str, str]:
    """The option strings of ``parser`` whose action's ``type`` is exactly int or float ('int',
    'float'): argparse calls it on each value (``ArgumentParser._get_value``) and refuses the
    command where it raises ("argument --lr: invalid float value: 'abc'"). Megatron's own
    converters (moe_freq_type, tuple_type, the enum handlers of core_v0.19.0's dataclass flags),
    bool and str are left out: their refusals are theirs to say."""
    return dict(sorted((flag, action.type.__name__) for action in parser._actions
                       if (action.type is int or action.type is float) and action.nargs != 0
                       for flag in action.option_strings if flag.startswith("--")))


def _remember_field_docstrings() -> None:
    """core_v0.19.0's parse_args builds its argument groups from dataclasses and reads each
    field's help text from the class's source (ArgumentGroupFactory._get_field_docstrings:
    inspect.getsource and ast.parse, about 0.7 s of every parse here). The text depends on the
    class alone, so one reading per class serves every case; the parsing itself is untouched.
    Releases without the factory (core_v0.15.2) are left as they are."""
    try:
        from megatron.training.argument_utils import ArgumentGroupFactory
    except ImportError:
        return
    read, seen = ArgumentGroupFactory._get_field_docstrings, {}

    def remembered(self, cls):
        if cls not in seen:
            seen[cls] = read(self, cls)
        return dict(seen[cls])

    ArgumentGroupFactory._get_field_docstrings = remembered


_RULES = None


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m launch.megatron_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", required=True, help="The Megatron-LM checkout.")
    parser.add_argument("--device-arch", type=int, default=9, help="The GPU architecture validate_args sees.")
    parser.add_argument("--serve", action="store_true",
                        help="Read one JSON array of cases per line and answer each with one line of results.")
    parser.add_argument("--flags", action="store_true",
                        help="Print every flag's count of values and int/float type (a JSON object) and exit.")
    options = parser.parse_args(argv)
    global _RULES
    from launch.megatron_versions import of_checkout

    checkout = Path(options.megatron_lm)
    _RULES = of_checkout(checkout)
    cases = None if options.serve or options.flags else json.load(sys.stdin)
    sys.path.insert(0, str(checkout.resolve()))
    if options.flags:
        with contextlib.redirect_stdout(sys.stderr):  # Megatron prints as it imports
            parser = _parser()
        json.dump({"counts": value_counts(parser), "types": value_types(parser)}, sys.stdout)
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        from megatron.training import arguments, utils

        arguments.get_device_arch_version = utils.get_device_arch_version = lambda: options.device_arch
        # --moe-grouped-gemm: validate_args asks torch.cuda.get_device_capability() (>= 8 for the
        # grouped GEMM kernels); the same stand-in answers for --device-arch's GPU.
        import torch

        torch.cuda.get_device_capability = lambda device=None: (options.device_arch, 0)
        # MoE with --fp8-format: TransformerConfig asks Transformer Engine's version
        # (is_te_min_version("1.7.0.dev0"), "1.11.0" with grouped GEMMs); TE needs CUDA and is not
        # installed here, so, where it is absent, the version answers TE_STAND_IN.
        from megatron.core import utils as core_utils

        from packaging.version import Version

        if core_utils.get_te_version() in (None, Version("0.0.0")):  # 0.15.2: None; 0.19.0: 0.0.0
            core_utils._te_version = Version(TE_STAND_IN)
            _stand_in_fused_permutation()
    _remember_field_docstrings()
    if cases is not None:
        json.dump([_run_case(case) for case in cases], sys.stdout)
        return 0
    for line in sys.stdin:
        sys.stdout.write(json.dumps([_run_case(case) for case in json.loads(line)]) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
