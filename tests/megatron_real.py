"""The real Megatron-LM checkouts the tests run against (read-only; see shared/megatron-lm/README.md).

Where they are: ``$MEGATRON_LM_CHECKOUTS`` (``.ci/run`` sets it to ``../shared/megatron-lm``
beside the repository), else ``../shared/megatron-lm`` if it exists. Without them, the tests that
need them skip with the reason. core_v0.19.0 needs Python >= 3.12 with torch: the interpreter is
``$MEGATRON_LM_PYTHON312`` (``.ci/run`` builds ``.venv312`` for it); without it, its tests skip.

A test that trains copies the checkout into a temporary directory first (Megatron builds its
dataset helpers inside the checkout) and runs it under the GPU test double
``tests/fixtures/cuda_on_cpu`` (what it fakes is in its docstring).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

SHARED = Path(os.environ.get("MEGATRON_LM_CHECKOUTS") or ROOT.parent / "shared" / "megatron-lm")
CUDA_ON_CPU = ROOT / "tests" / "fixtures" / "cuda_on_cpu"

# What a machine without Transformer Engine and Apex passes to Megatron-LM (the GPU facts of the
# project's H100 probe), plus gloo for the CPU; the user's arguments after '--' in these tests. Not
# --no-bias-swiglu-fusion: the fused SwiGLU is torch code under jit_fuser, which runs without them
# (test_launch_run launches it), and the flag is the row's to write (launch.arguments.MEMORY_FLAGS:
# a row priced fused refuses it after '--'), so the launches that run the eager SwiGLU price it
# (UNFUSED_SWIGLU on their estimate; in Python, TrainingOptions().with_(bias_swiglu_fusion=False)).
NO_TRANSFORMER_ENGINE = ["--transformer-impl", "local", "--no-rope-fusion", "--no-persist-layer-norm",
                         "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion"]
UNFUSED_SWIGLU = "--no-bias-swiglu-fusion"
TINY_MODEL_ARGS = ["--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "512", "--num-attention-heads",
                   "4", "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "1",
                   "--global-batch-size", "8", "--tensor-model-parallel-size", "1", "--mock-data", "--tokenizer-type",
                   "NullTokenizer", "--vocab-size", "4096", "--no-rope-fusion", "--no-gradient-accumulation-fusion"]
"""A two-layer model on 8 ranks (TP 1, DP 8) that validate_args takes without Transformer Engine:
what a training option's own flags are checked beside (tests/test_fsdp_main_grads.py, test_fsdp_dtypes.py)."""
# A rank waiting for a peer that never answers fails after 3 minutes instead of Megatron's 10,
# and a launch is given 5 (one takes 7-31 s here): a hang costs CI minutes, not its whole budget.
LAUNCH_TIMEOUT_S = 300
CPU_TRAINING = [*NO_TRANSFORMER_ENGINE, "--distributed-backend", "gloo", "--train-iters", "2", "--lr", "1e-4",
                "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
                "--distributed-timeout-minutes", "3"]


@dataclass(frozen=True)
class Checkout:
    tag: str
    path: Path
    python: str
    """An interpreter with torch that this release runs on."""

    @property
    def bin(self) -> Path:
        """The interpreter's environment's scripts (advisor-launch, torchrun)."""
        return Path(self.python).parent


def checkout(tag: str) -> Checkout:
    """The checkout ``tag`` and an interpreter for it; pytest.skip with the reason if either is missing."""
    path = SHARED / tag
    if not (path / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout {tag} at {path} (set MEGATRON_LM_CHECKOUTS; .ci/run points it at "
                    "../shared/megatron-lm)")
    if tag == "core_v0.19.0":
        python = os.environ.get("MEGATRON_LM_PYTHON312")
        if not python or not Path(python).is_file():
            pytest.skip("core_v0.19.0 needs Python >= 3.12 with torch: set MEGATRON_LM_PYTHON312 to its interpreter "
                        "(.ci/run builds .venv312)")
        return Checkout(tag, path, python)
    return Checkout(tag, path, sys.executable)


def writable_copy(source: Checkout, directory: Path) -> Checkout:
    """A copy of the checkout in ``directory`` with its dataset helpers built for its Python (what a
    user does once: ``make -C megatron/core/datasets``)."""
    target = directory / source.tag
    shutil.copytree(source.path, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    suffix = subprocess.run([source.python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, PATH=f"{source.bin}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["make", "-C", str(target / "megatron" / "core" / "datasets"), f"LIBEXT={suffix}"],
                   check=True, capture_output=True, env=env)
    return Checkout(source.tag, target, source.python)


_COPIES: dict[str, Checkout] = {}


def session_copy(tag: str, tmp_path_factory) -> Checkout:
    """One writable copy of the checkout ``tag`` for the whole session, shared by the modules that
    launch it (a copy and its build take about 15 s of CPU; the launches only read it, and write
    no bytecode: launch_env). Under pytest-xdist the workers share it too: it lies in the run's
    common temporary directory, built by the first worker that asks while the others wait."""
    if tag not in _COPIES:
        source = checkout(tag)
        base = tmp_path_factory.getbasetemp()
        root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        directory, done = root / f"megatron-{tag}", root / f"megatron-{tag}.built"
        with open(root / f"megatron-{tag}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(directory, ignore_errors=True)  # a build that failed half-way
                directory.mkdir()
                writable_copy(source, directory)
                done.touch()
        _COPIES[tag] = Checkout(tag, directory / tag, source.python)
    return _COPIES[tag]


def launch_env(release: Checkout, **extra: str) -> dict[str, str]:
    """The environment of a launch on the CPU: the GPU double, this repository importable, one
    thread per rank, the release's scripts first on PATH."""
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    env.update(CUDA_ON_CPU="1", OMP_NUM_THREADS="1", NO_VCS_VERSION="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(CUDA_ON_CPU), str(ROOT)]),
               PATH=f"{release.bin}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra)
    return env


_STACKS = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\n(?:  .*\n)*", re.M)


def failure_report(output: str, tail: int = 3000) -> str:
    """A failed launch's output for an assertion message: the stacks of the ranks torchrun ended
    (faulthandler's, tests/fixtures/cuda_on_cpu), which the waiting rank's timeout at the tail
    does not show, then the tail."""
    stacks = "".join(_STACKS.findall(output[:-tail] if len(output) > tail else ""))
    return (f"stacks of the ended ranks:\n{stacks}\n...\n" if stacks else "") + output[-tail:]


_LOGGED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([0-9.E+-]+) \|")


def logged_losses(output: str) -> dict[int, float]:
    """The loss Megatron logs per iteration (``--log-interval 1``), e.g. 'lm loss: 8.334742E+00'."""
    return {int(iteration): float(loss) for iteration, loss in _LOGGED.findall(output)}


# --- what the advisor priced against what Megatron derives (launch.megatron_check) -------------


@dataclass(frozen=True)
class Priced:
    """What the advisor priced for one argument list, in the terms Megatron derives."""

    label: str
    args: list[str]
    env: dict[str, str]
    world_size: int
    spec: object
    """advisor.models.LlamaSpec"""
    tp: int
    cp: int
    pp: int
    dp: int
    vpp: int
    mbs: int
    gbs: int
    num_microbatches: int
    layers_per_stage: list[int]
    options: object
    """advisor.options.TrainingOptions"""

    @property
    def params_dtype(self) -> str:
        return self.options.precision.params_dtype

    def case(self) -> dict:
        return {"args": self.args, "world_size": self.world_size, "env": self.env}


def priced_input(config, rules, *, label: str, options, extras: list[str], num_microbatches: int) -> Priced:
    """A launch input (launch.inputs.LaunchInput) as advisor-launch would start it with --mock-data
    and ``extras`` after '--', in the environment the launcher gives its ranks. A vocabulary that
    core_v0.15.2's mock data cannot feed (which the launcher refuses) gets the same NullTokenizer
    from the user's arguments instead, without data: parsing and validation never read the data
    (validate_args requires at most one data source, not one)."""
    from launch.arguments import compose, model_rows
    from launch.megatron_versions import LaunchShape, environment

    mock_data = True
    limit = rules.mock_data_max_token_id
    if limit is not None and model_rows(config.model, config.megatron_args) <= limit:
        mock_data, extras = False, [*extras, "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                    str(rules.null_tokenizer_vocab_flag(config.model.vocab_size))]
    line = compose(config.source, config.megatron_args, rules=rules, model=config.model, mock_data=mock_data,
                   extras=extras)
    env = environment(rules, LaunchShape.of(config.tp, config.cp, line.args), exported={}).settings
    return Priced(label=label, args=line.args, env=env, world_size=config.world_size, spec=config.model,
                  tp=config.tp, cp=config.cp, pp=config.pp, dp=config.dp, vpp=config.vpp, mbs=config.micro_batch_size,
                  gbs=config.global_batch_size, num_microbatches=num_microbatches,
                  layers_per_stage=list(config.layers_per_stage), options=options)


def mismatches(priced: Priced, derived: dict) -> list[str]:
    """Each quantity where what Megatron derived differs from what the advisor priced."""
    from advisor.equations import padded_vocab_size

    spec, training = priced.spec, priced.options.at_tp(priced.tp)
    options = training.memory_options()
    expected = {
        "tp": priced.tp, "cp": priced.cp, "pp": priced.pp, "dp": priced.dp, "vpp": priced.vpp,
        "micro_batch_size": priced.mbs, "global_batch_size": priced.gbs, "num_microbatches": priced.num_microbatches,
        "layers_per_stage": priced.layers_per_stage,
        "padded_vocab_size": padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, priced.tp),
        "num_layers": spec.num_layers, "hidden_size": spec.hidden_size, "ffn_hidden_size": spec.ffn_hidden_size,
        "num_attention_heads": spec.num_attention_heads, "num_query_groups": spec.num_query_groups,
        "kv_channels": spec.head_dim, "add_qkv_bias": spec.add_qkv_bias, "add_bias_linear": False,
        "qk_layernorm": spec.qk_layernorm,
        "attention_dropout": 0.0, "hidden_dropout": 0.0,
        "gated_linear_unit": True, "normalization": "RMSNorm", "layernorm_epsilon": spec.norm_epsilon,
        "position_embedding_type": "rope", "rotary_base": spec.rotary_base,
        "use_rope_scaling": spec.rope_scaling_factor is not None, "rope_scaling_factor": spec.rope_scaling_factor,
        "tie_embeddings": spec.tie_embeddings, "params_dtype": priced.params_dtype,
        "sequence_parallel": options.sequence_parallel and priced.tp > 1,
        "use_distributed_optimizer": training.data_parallel.distributed_optimizer,
        # What Megatron derives from the flags (torch FSDP2 then reduces in BF16 regardless).
        "grad_reduce_in_fp32": training.precision.grad_reduce_dtype == "fp32" and priced.params_dtype != "float32",
        "recompute_granularity": None if options.recompute == "none" else options.recompute,
        "recompute_method": options.recompute_method if options.recompute == "full" else None,
        "recompute_num_layers": options.recompute_num_layers if options.recompute == "full" else None,
        # TransformerConfig's default ['core_attn'] whatever the granularity, else the modules written
        "recompute_modules": list(training.recomputation.recompute_modules or ("core_attn",)),
        "attention_backend": "auto" if options.flash_attention else "unfused",
        **lever_fields(training, priced.tp),
    }
    return [f"{key}: Megatron {derived.get(key)!r}, advisor {value!r}" for key, value in expected.items()
            if derived.get(key) != value]


def lever_fields(training, tp: int) -> dict:
    """What Megatron should derive for the training options' levers (advisor.options)."""
    p, dp, o = training.precision, training.data_parallel, training.offload
    fields = {
        "overlap_grad_reduce": dp.overlap_grad_reduce, "overlap_param_gather": dp.overlap_param_gather,
        "use_megatron_fsdp": dp.fsdp_strategy is not None, "tp_comm_overlap": training.tensor_parallel.tp_comm_overlap,
        "tp_comm_overlap_cfg": training.tensor_parallel.tp_comm_overlap_cfg,
        # the sub-options as the TransformerConfig holds them (TE then drops bulk with rs_dgrad)
        **{name: getattr(training.tensor_parallel, name) for name in (
            "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad", "tp_comm_bulk_dgrad",
            "tp_comm_bulk_wgrad")},
        "fp8": p.fp8_format, "fp8_param_gather": p.fp8_param_gather,
        "optimizer_cpu_offload": o.optimizer_cpu_offload,
        "create_attention_mask_in_dataloader": training.attention.dataloader_mask != "off",
        "cross_entropy_loss_fusion": training.loss.cross_entropy_fusion != "none",
        "cross_entropy_fusion_impl": "native" if training.loss.cross_entropy_fusion == "none"
        else training.loss.cross_entropy_fusion,
        # --no-bias-swiglu-fusion, as core_transformer_config_from_args hands it to the MLP (--swiglu)
        "bias_activation_fusion": training.fusions.bias_swiglu_fusion,
    }
    dtypes = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "uint8"}  # uint8: Megatron's fp8
    # Megatron-FSDP's main gradients, as its buffer takes them (launch.megatron_check), are the priced ones
    fields.update(fsdp_main_grads_dtype=dtypes[p.grad_reduce_dtype] if dp.fsdp_strategy is not None else None)
    # and its main weights ('None': none, auto) and what its reduction moves ('auto': the main gradients')
    comm = p.grad_reduce_dtype if dp.fsdp_grad_comm_dtype == "auto" else dp.fsdp_grad_comm_dtype
    fields.update(fsdp_main_params_dtype={**dtypes, "auto": "None"}[dp.fsdp_main_params_dtype]
                  if dp.fsdp_strategy is not None else None,
                  fsdp_grad_comm_dtype=dtypes[comm] if dp.fsdp_strategy is not None else None)
    if dp.fsdp_strategy is not None:
        fields.update(data_parallel_sharding_strategy=dp.fsdp_strategy, ckpt_format="fsdp_dtensor")
    if dp.torch_fsdp2:
        fields.update(use_torch_fsdp2=True, gradient_accumulation_fusion=False, ckpt_format="torch_dist")
    if p.fp8_format is not None:
        fields.update(fp8_recipe=p.fp8_recipe, fp8_amax_history_len=p.fp8_amax_history_len)
    elif training.precision_aware_optimizer:  # the recipe still decides who keeps the masters
        fields.update(fp8_recipe=p.fp8_recipe)
    if o.optimizer_cpu_offload:
        fields.update(optimizer_offload_fraction=o.optimizer_offload_fraction)
    states = training.optimizer_states
    fields.update(use_precision_aware_optimizer=training.precision_aware_optimizer, main_grads_dtype="float32",
                  main_params_dtype=dtypes[states.main_params_dtype], exp_avg_dtype=dtypes[states.exp_avg_dtype],
                  exp_avg_sq_dtype=dtypes[states.exp_avg_sq_dtype],
                  # built as the training loop builds it: without TE (never installed here) the
                  # precision-aware optimizer's FusedAdam is missing, which it says once past its
                  # other checks; offloaded, it runs without (the check's TE version stands in)
                  optimizer_config_error=PRECISION_AWARE_WITHOUT_TE if states.precision_aware_optimizer else None)
    return fields


PRECISION_AWARE_WITHOUT_TE = "--use-precision-aware-optimizer requires FusedAdam from TransformerEngine, but not found."
"""megatron-core OptimizerConfig.__post_init__'s line where Transformer Engine is missing (both releases)."""


_VALIDATORS: dict[tuple[str, str], object] = {}


def validate(release: Checkout, cases: list[dict]) -> list[dict]:
    """Each case through the release's parse_args + validate_args (launch.megatron_check), in one
    validator process per release for the whole session (launch.megatron_check.Validator):
    importing torch and Megatron once, not once per test."""
    import atexit

    from launch.megatron_check import Validator

    key = (str(release.path), release.python)
    if key not in _VALIDATORS:
        _VALIDATORS[key] = Validator(release.path, python=release.python)
        atexit.register(_VALIDATORS[key].close)
    try:  # hundreds of cases through the real parser take minutes on a loaded CI machine
        return _VALIDATORS[key](cases, timeout=1800)
    except RuntimeError:
        del _VALIDATORS[key]  # it has exited (and said why): the next test starts a fresh one
        raise


def launched_args(row: dict, tag: str) -> list[str]:
    """A sweep row's or an estimate's flags as advisor-launch runs them on the release ``tag``:
    those its fields make (``launch.inputs.read_input``, held to its own megatron_args), in that
    release's words (``advisor.options.flags.release_spelling``), whichever release it was priced for."""
    import json
    import tempfile

    from advisor.options.flags import release_spelling
    from launch.inputs import read_input
    from launch.megatron_versions import named

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "row.json"
        path.write_text(json.dumps(row))
        return release_spelling(named(tag), read_input(path).megatron_args)


def mock_data_case(row: dict, tag: str, vocab_size: int, env: dict | None = None, extras=()) -> dict:
    """A ``validate`` case: the row launched on ``tag`` (``launched_args``) with ``extras``, without
    Transformer Engine, on mock data of a NullTokenizer of ``vocab_size``, ten iterations."""
    return {"args": [*launched_args(row, tag), *extras, *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type",
                     "NullTokenizer", "--vocab-size", str(vocab_size), "--train-iters", "10"],
            "world_size": row["gpus"], "env": {} if env is None else env}


def assert_built_as_priced(release: Checkout, inputs: list[Priced]) -> None:
    """Every input through the release's parse_args + validate_args (launch.megatron_check): none
    refused, and what Megatron derives is what the advisor priced."""
    results = validate(release, [item.case() for item in inputs])
    refused = [f"{item.label}: {result['error']}" for item, result in zip(inputs, results) if not result["ok"]]
    assert not refused, f"{len(refused)} of {len(inputs)} refused:\n" + "\n".join(refused[:20])
    wrong = [f"{item.label}: {'; '.join(problems)}" for item, result in zip(inputs, results)
             if (problems := mismatches(item, result["derived"]))]
    assert not wrong, f"{len(wrong)} of {len(inputs)} differ:\n" + "\n".join(wrong[:20])
