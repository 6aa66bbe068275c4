"""--transformer-impl local with --sequence-parallel at TP > 1 and RMSNorm: Megatron-LM cannot build
the model (advisor.options.local_spec), so advisor-launch refuses the launch and advisor estimate
--from-command the command, each in one line with exit status 2, and the missing-Transformer-Engine
line's suggestion of --transformer-impl local says that sequence parallelism must then go.

The rule is tied to the real code: a tiny GPTModel is built with megatron-core's own local layer
spec at TP 2 over two gloo processes, under the GPU test double, in both checkouts; torch's norm
asserts exactly where the rule says."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from launch_support import CPU_TEST_JOB, launcher
from megatron_real import CUDA_ON_CPU, NO_TRANSFORMER_ENGINE, SHARED
from megatron_real import checkout as real_checkout

from advisor.cli import cli
from advisor.options.local_spec import (NO_PERSIST_FLAG, PERSIST_ASSERTION, TORCH_NORM_ASSERTION,
                                        local_persist_layer_norm_problem, torch_norm_refuses_sequence_parallel)
from launch.preflight import transformer_engine_import_problem

REFUSAL = ("--transformer-impl local with --sequence-parallel at TP 2: megatron-core's local layer spec builds "
           "RMSNorm as torch's norm (WrappedTorchNorm), which asserts 'sequence parallel not supported by torch "
           "LayerNorm' on every rank when the model is built (transformer/torch_norm.py); ")
DENSE_ADVICE = ("plan it without sequence parallelism (advisor sweep or estimate --no-sequence-parallel; a command "
                "of your own: drop --sequence-parallel) or at TP 1, or install Transformer Engine and drop "
                "--transformer-impl local")
MOE_ADVICE = ("a mixture of experts needs sequence parallelism at TP > 1 (megatron-core's MoELayer raises without "
              "it), so plan it at TP 1 (advisor sweep --tp 1), or install Transformer Engine and drop "
              "--transformer-impl local")


@pytest.fixture
def started(monkeypatch):
    calls = []
    monkeypatch.setattr("launch.process.run_process_group", lambda *args, **kwargs: calls.append(args) or 0)
    return calls


def _estimate(advisor, path, *args):
    advisor("estimate", "--gpu", "h100-80gb", *args, "--format", "json", "-o", path)
    return path


def _errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Error: ")]


def test_every_launching_command_refuses_a_local_row_with_sequence_parallelism(advisor, tmp_path, started,
                                                                              monkeypatch):
    """A TP 2 row carries --sequence-parallel (the advisor's default): torchrun, sbatch and check
    refuse it under --transformer-impl local, before anything starts; args, which launches
    nothing, warns as it does of the other local-implementation problems; the same row planned
    with --no-sequence-parallel passes."""
    core15 = real_checkout("core_v0.15.2").path
    row = _estimate(advisor, tmp_path / "tp2.json", "--gpus", "8", "--tp", "2", "--pp", "1", "--mbs", "1")
    assert "--sequence-parallel" in json.loads(row.read_text())["megatron_args"]
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    for command in ("torchrun", "sbatch", "check"):
        result = launcher()(command, "--from", row, "--megatron-lm", core15, "--mock-data",
                            *(["-o", tmp_path / "job.sh"] if command == "sbatch" else []), "--", *CPU_TEST_JOB,
                            expect=2)
        assert _errors(result) == [f"Error: {REFUSAL}{DENSE_ADVICE}"], (command, result.stderr)
        assert "Traceback" not in result.output and result.stdout == ""
    assert started == [] and not (tmp_path / "job.sh").exists()
    printed = launcher()("args", "--from", row, "--", "--transformer-impl", "local")
    assert f"warning: {REFUSAL}{DENSE_ADVICE}" in printed.stderr.splitlines()
    without = _estimate(advisor, tmp_path / "no-sp.json", "--gpus", "8", "--tp", "2", "--pp", "1", "--mbs", "1",
                        "--no-sequence-parallel")
    ok = launcher()("check", "--from", without, "--megatron-lm", core15, "--mock-data", "--", *CPU_TEST_JOB)
    assert "sequence" not in ok.stderr and ok.stdout.startswith("advisor-launch check: ok:")


def test_a_local_moe_row_at_tp_2_is_told_to_plan_at_tp_1(advisor, tmp_path):
    """A mixture of experts cannot drop sequence parallelism at TP > 1 (moe_layer.py raises without
    it, and the advisor does not price it): the line says TP 1 instead."""
    row = _estimate(advisor, tmp_path / "moe.json", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2",
                    "--pp", "4", "--ep", "8", "--mbs", "1", "--gbs", "256", "--seq-len", "4096")
    result = launcher()("args", "--from", row, "--", "--transformer-impl", "local")
    assert f"warning: {REFUSAL}{MOE_ADVICE}" in result.stderr.splitlines(), result.stderr


_COMMAND = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
            "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 "
            "--max-position-embeddings 8192 --swiglu --disable-bias-linear --normalization {norm} "
            "--position-embedding-type rope --untie-embeddings-and-output-weights --attention-dropout 0 "
            "--hidden-dropout 0 --bf16 --tensor-model-parallel-size {tp} --sequence-parallel "
            "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --vocab-size 128256 "
            "--transformer-impl local")
_MOE = (" --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --expert-model-parallel-size 4"
        " --moe-token-dispatcher-type alltoall")


def _from_command(command: str):
    return CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--format", "json"],
                              input=command + "\n")


def test_estimate_from_command_refuses_what_megatron_cannot_build():
    """Nothing to price: one line, exit 2, dense and MoE (whose advice is TP 1). At TP 1
    validate_args switches sequence parallelism off, so the same command is priced; a LayerNorm
    model (Megatron's default), whose local spec takes Apex's FusedLayerNorm where Apex is
    installed, is priced with the condition named."""
    for command, advice in ((_COMMAND.format(norm="RMSNorm", tp=2), DENSE_ADVICE),
                            (_COMMAND.format(norm="RMSNorm", tp=2) + _MOE, MOE_ADVICE)):
        result = _from_command(command)
        assert result.exit_code == 2 and result.output == f"Error: --from-command stdin: {REFUSAL}{advice}\n", \
            result.output
    assert _from_command(_COMMAND.format(norm="RMSNorm", tp=1)).exit_code == 0
    layer_norm = _from_command(_COMMAND.format(norm="LayerNorm", tp=2))
    assert layer_norm.exit_code == 0, layer_norm.output
    assert any("Apex's FusedLayerNorm where Apex is installed on the ranks' nodes" in entry
               for entry in json.loads(layer_norm.stdout)["unpriced"])


def test_the_missing_transformer_engine_line_says_local_needs_sequence_parallelism_off():
    """Its suggestion of --transformer-impl local holds only with sequence parallelism off where
    the run has it at TP > 1 with RMSNorm; it stays as it was otherwise."""
    base = ["--normalization", "RMSNorm", "--tensor-model-parallel-size", "2"]
    with_sp = transformer_engine_import_problem([*base, "--sequence-parallel"])
    assert with_sp.endswith("fused MoE kernels; at TP 2 it also needs this run's --sequence-parallel off (torch's "
                            "RMSNorm asserts it when the model is built): plan without it (advisor sweep "
                            "--no-sequence-parallel) or at TP 1)")
    moe = transformer_engine_import_problem([*base, "--sequence-parallel", "--num-experts", "8"])
    assert moe.endswith("(torch's RMSNorm asserts it when the model is built), which a mixture of experts needs at "
                        "TP > 1: plan it at TP 1)")
    for args in (base, ["--normalization", "RMSNorm", "--tensor-model-parallel-size", "1", "--sequence-parallel"]):
        assert transformer_engine_import_problem(args).endswith("TP overlap or fused MoE kernels)")


# --- the real megatron-core -----------------------------------------------------------------

PROBE = textwrap.dedent("""
    import importlib.util, json, os, sys
    from unittest import mock
    if importlib.util.find_spec("triton") is None:  # core_v0.19.0's MoE paged-stash kernels need it; a dense model, no
        sys.modules["megatron.core.transformer.moe.ops.paged_stash"] = mock.MagicMock()
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def stand_in_for_te_and_apex():
        # a machine with Transformer Engine and Apex (NGC's containers), for one without: at import,
        # models/backends.py binds the module global LNImpl to Apex's FusedLayerNorm (LayerNorm only;
        # it takes sequence parallelism and the persistent kernel), and transformer/transformer_block.py
        # the block's final norm (LayerNormImpl) to TE's TENorm, whatever --transformer-impl says
        import torch
        from megatron.core.models import backends
        from megatron.core.transformer import transformer_block

        class FusedLayerNormStandIn(torch.nn.LayerNorm):
            def __init__(self, config, hidden_size, eps=1e-5, **kwargs):
                assert config.normalization == "LayerNorm", "FusedLayerNorm takes LayerNorm only"
                super().__init__(hidden_size, eps=eps)

        class TENormStandIn:
            def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
                norm = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
                return norm(hidden_size, eps=eps)

        backends.LNImpl, transformer_block.LayerNormImpl = FusedLayerNormStandIn, TENormStandIn

    def build(rank, port, cases, out, apex):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from megatron.core import parallel_state
        parallel_state.initialize_model_parallel(2, 1)
        if apex == "stand-in":
            stand_in_for_te_and_apex()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig
        results = []
        for normalization, sequence_parallel, persist_layer_norm in cases:
            config = TransformerConfig(
                num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, tensor_model_parallel_size=2,
                sequence_parallel=sequence_parallel, normalization=normalization, use_cpu_initialization=True,
                gated_linear_unit=True, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
                bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=persist_layer_norm,
                gradient_accumulation_fusion=False, apply_rope_fusion=False)
            try:  # pretrain_gpt's local spec (gpt_builders.py: get_gpt_layer_local_spec(..., normalization=...))
                GPTModel(config, get_gpt_layer_local_spec(normalization=normalization), vocab_size=64,
                         max_sequence_length=8, position_embedding_type="rope")
                results.append(None)
            except AssertionError as error:
                results.append(str(error))
        if rank == 0:
            with open(out, "w") as handle:
                json.dump({"results": results,
                           "apex": apex == "stand-in" or importlib.util.find_spec("apex") is not None}, handle)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(build, args=(sys.argv[2], json.loads(sys.argv[1]), sys.argv[3], sys.argv[4]), nprocs=2, join=True)
""")
_TINY_LOCAL = ("pretrain_gpt.py --num-layers 1 --hidden-size 16 --ffn-hidden-size 32 --num-attention-heads 2 "
               "--seq-length 8 --max-position-embeddings 8 --swiglu --disable-bias-linear --normalization RMSNorm "
               "--position-embedding-type rope --untie-embeddings-and-output-weights --bf16 "
               "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 2 --vocab-size 64 "
               "--transformer-impl local")


def _persist_layer_norm_as_megatron_derives(tag: str, tmp_path) -> tuple[bool, bool]:
    """TransformerConfig.persist_layer_norm as the release's own parse_args, validate_args and
    core_transformer_config_from_args derive it (launch.megatron_check) for the arguments that
    advisor-launch writes from a local row (advisor estimate --from-command of a --transformer-impl
    local command): (as the advisor writes them, without --no-persist-layer-norm)."""
    from launch.inputs import read_input
    from launch.megatron_versions import named
    from megatron_real import priced_input, validate

    release = real_checkout(tag)  # skips without the checkout or its Python
    estimate = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--gpus", "2",
                                        "--format", "json"], input=_TINY_LOCAL + "\n")
    assert estimate.exit_code == 0, estimate.output
    row = tmp_path / "local.json"
    row.write_text(estimate.stdout)
    # a machine without Transformer Engine's fusions, less the flag, which must come from the row
    extras = [arg for arg in NO_TRANSFORMER_ENGINE if arg != NO_PERSIST_FLAG]
    item = priced_input(read_input(row), named(tag), label="local row", options=None, num_microbatches=2,
                        extras=[*extras, "--distributed-backend", "gloo", "--train-iters", "2", "--lr", "1e-4"])
    assert item.args.count(NO_PERSIST_FLAG) == 1
    without = {**item.case(), "args": [arg for arg in item.args if arg != NO_PERSIST_FLAG]}
    emitted, dropped = validate(release, [item.case(), without])
    assert emitted["ok"] and dropped["ok"], (emitted.get("error"), dropped.get("error"))
    return emitted["derived"]["persist_layer_norm"], dropped["derived"]["persist_layer_norm"]


@pytest.mark.parametrize("apex", ["as installed", "stand-in"])
@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_cores_local_spec_asserts_where_the_rule_says(tag, apex, tmp_path):
    """TP 2 on two gloo processes: the local spec's RMSNorm (WrappedTorchNorm) asserts with
    sequence parallelism and builds without; LayerNorm takes torch's norm too where Apex is absent
    (as here), which the rule leaves to the ranks' nodes (Apex's FusedLayerNorm takes it). One line
    before, torch's norm asserts persist_layer_norm off, which Megatron-LM turns on unless the
    arguments carry --no-persist-layer-norm, as the advisor's local rows now do. Run as this machine
    has Apex (here: not), and with Apex and Transformer Engine stood in, as on a machine that has
    them (the rule is the same: RMSNorm's layer norms are torch's either way)."""
    path = SHARED / tag
    if not (path / "megatron" / "core").is_dir():
        pytest.skip(f"no Megatron-LM checkout {tag} at {path} (set MEGATRON_LM_CHECKOUTS)")
    python = os.environ.get("MEGATRON_LM_PYTHON312") if tag == "core_v0.19.0" else None
    from megatron_hooks.stage_emulation import free_port

    emitted, dropped = _persist_layer_norm_as_megatron_derives(tag, tmp_path)
    assert (emitted, dropped) == (False, True)  # Megatron's default is the persistent kernel
    # LayerNorm's cases first, in this one process: LocalSpecProvider.layer_norm(rms_norm=True)
    # rebinds the module-global LNImpl to WrappedTorchNorm (models/backends.py, both releases), so
    # after an RMSNorm case a LayerNorm case would get torch's norm where Apex is installed too,
    # and assert for that reason, not the one the rule is about
    cases = [(normalization, sequence_parallel, persist)
             for normalization in ("LayerNorm", "RMSNorm") for sequence_parallel, persist in
             ((True, emitted), (False, emitted), (False, dropped))]
    script, out = tmp_path / "probe.py", tmp_path / "out.json"
    script.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=f"{CUDA_ON_CPU}{os.pathsep}{path}", CUDA_ON_CPU="1")
    result = subprocess.run([python or sys.executable, str(script), json.dumps(cases), str(free_port()), str(out),
                             apex], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(out.read_text())
    for (normalization, sequence_parallel, persist), error in zip(cases, built["results"]):
        refused = torch_norm_refuses_sequence_parallel(sequence_parallel=sequence_parallel, tp=2,
                                                       normalization=normalization)
        persist_refused = local_persist_layer_norm_problem(transformer_impl="local", normalization=normalization,
                                                           no_persist_layer_norm=not persist) is not None
        torch_norm = normalization == "RMSNorm" or not built["apex"]  # backends.py: LNImpl without Apex
        # torch_norm.py asserts persist_layer_norm one line before sequence_parallel
        expected = (PERSIST_ASSERTION if persist else TORCH_NORM_ASSERTION if sequence_parallel else None) \
            if torch_norm else None
        case = (normalization, sequence_parallel, persist)
        assert (error is None) == (expected is None), (case, error)
        assert error is None or error.startswith(expected), (case, error)
        assert refused == (expected == TORCH_NORM_ASSERTION and normalization == "RMSNorm"), case
        assert persist_refused == (expected == PERSIST_ASSERTION and normalization == "RMSNorm"), case


# --- the persistent layer-norm kernel ---------------------------------------------------------

PERSIST_REFUSAL = ("--transformer-impl local with RMSNorm without --no-persist-layer-norm: megatron-core's local layer "
                   "spec builds RMSNorm as torch's norm (WrappedTorchNorm), which asserts 'persist_layer_norm not "
                   "supported by torch LayerNorm' on every rank when the model is built (transformer/torch_norm.py), "
                   "and Megatron-LM turns the persistent kernel on unless told otherwise: add --no-persist-layer-norm "
                   "after --")


def test_every_launching_command_refuses_a_local_rmsnorm_launch_without_no_persist_layer_norm(
        advisor, tmp_path, started, monkeypatch):
    """At any TP (here 1, no sequence parallelism): torchrun, sbatch and check refuse the user's
    --transformer-impl local after -- for an RMSNorm row without --no-persist-layer-norm, in one
    line, before anything starts; args warns; with the flag the same launch passes."""
    core15 = real_checkout("core_v0.15.2").path
    row = _estimate(advisor, tmp_path / "tp1.json", "--gpus", "8", "--tp", "1", "--pp", "1", "--mbs", "1")
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    without = [arg for arg in CPU_TEST_JOB if arg != NO_PERSIST_FLAG]
    for command in ("torchrun", "sbatch", "check"):
        result = launcher()(command, "--from", row, "--megatron-lm", core15, "--mock-data",
                            *(["-o", tmp_path / "job.sh"] if command == "sbatch" else []), "--", *without, expect=2)
        assert _errors(result) == [f"Error: {PERSIST_REFUSAL}"], (command, result.stderr)
        assert "Traceback" not in result.output and result.stdout == ""
    assert started == [] and not (tmp_path / "job.sh").exists()
    printed = launcher()("args", "--from", row, "--", "--transformer-impl", "local")
    assert f"warning: {PERSIST_REFUSAL}" in printed.stderr.splitlines()
    ok = launcher()("check", "--from", row, "--megatron-lm", core15, "--mock-data", "--", *CPU_TEST_JOB)
    assert "persist" not in ok.stderr and ok.stdout.startswith("advisor-launch check: ok:")


def test_the_rule_is_rmsnorm_under_local_only():
    """A LayerNorm model gets Apex's FusedLayerNorm where Apex is installed (which takes the
    persistent kernel); Transformer Engine's norms never read the field."""
    for impl, normalization, given in (("local", "LayerNorm", False), ("transformer_engine", "RMSNorm", False),
                                       ("local", "RMSNorm", True)):
        assert local_persist_layer_norm_problem(transformer_impl=impl, normalization=normalization,
                                                no_persist_layer_norm=given) is None
    assert local_persist_layer_norm_problem(transformer_impl="local", normalization="RMSNorm",
                                            no_persist_layer_norm=False) == PERSIST_REFUSAL


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_local_row_writes_no_persist_layer_norm_and_reads_it_back_the_same(tmp_path, started):
    """advisor estimate --from-command of a --transformer-impl local command: its megatron_args
    carry --no-persist-layer-norm beside --transformer-impl local (so that advisor-launch starts
    a model Megatron-LM can build), and reading those arguments back, or the command with the flag
    given, prices the same numbers with the same unpriced list: the flag is known, not 'not known
    to the advisor'. advisor-launch's check passes the row without the flag after --, and the user
    may restate it there (no conflict)."""
    command = _COMMAND.format(norm="RMSNorm", tp=1)
    row = _json(_from_command(command))
    args = row["megatron_args"]
    at = args.index("--transformer-impl")
    assert args[at:at + 3] == ["--transformer-impl", "local", NO_PERSIST_FLAG]
    again = _json(_from_command(" ".join(["torchrun --nproc-per-node 8 pretrain_gpt.py", *args,
                                          "--vocab-size", "128256"])))
    given = _json(_from_command(f"{command} {NO_PERSIST_FLAG}"))
    for other in (again, given):
        assert {key for key in row if row[key] != other.get(key)} <= {"model", "read_from"}, other
        assert other["model"] == {**row["model"], "name": other["model"]["name"]}
    assert not any("persist" in entry for entry in given["unpriced"])
    path = tmp_path / "local.json"
    path.write_text(json.dumps(row))
    core15 = real_checkout("core_v0.15.2").path
    job = [arg for arg in CPU_TEST_JOB if arg not in ("--transformer-impl", "local", NO_PERSIST_FLAG)]
    ok = launcher()("check", "--from", path, "--launch-as-priced", "--megatron-lm", core15, "--mock-data", "--", *job)
    assert ok.stdout.startswith("advisor-launch check: ok:"), ok.stderr
    restated = launcher()("args", "--from", path, "--launch-as-priced", "--", NO_PERSIST_FLAG)
    assert "conflicts" not in restated.stderr and restated.stdout.split()[-1] == NO_PERSIST_FLAG


def test_estimate_from_command_says_the_command_as_written_does_not_build_and_what_its_row_adds():
    """A command of an RMSNorm model under --transformer-impl local without --no-persist-layer-norm
    dies at model build (test_megatron_cores_local_spec_asserts_where_the_rule_says); the estimate
    prices it, its arguments carry the flag, and it says so: on stderr with a JSON row (whose
    megatron_args hold the flag once), in the table's caption on a terminal, and not at all where
    the command gives the flag or the model is LayerNorm."""
    said = (PERSIST_REFUSAL.removesuffix(f"add {NO_PERSIST_FLAG} after --")
            + f"the command as written stops there; the estimate's arguments add {NO_PERSIST_FLAG}")
    command = _COMMAND.format(norm="RMSNorm", tp=1)
    row = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb", "--format", "json"],
                             input=command + "\n")
    assert row.exit_code == 0, row.output
    assert f"advisor estimate: {said}" in row.stderr.splitlines()
    assert json.loads(row.stdout)["megatron_args"].count(NO_PERSIST_FLAG) == 1
    table = CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--gpu", "h100-80gb"], input=command + "\n")
    assert table.exit_code == 0 and "persist" not in table.stderr
    assert said in " ".join(table.stdout.split())  # the caption, wrapped to the terminal
    for quiet in (f"{command} {NO_PERSIST_FLAG}", _COMMAND.format(norm="LayerNorm", tp=1)):
        result = _from_command(quiet)
        assert result.exit_code == 0 and "persist" not in result.stderr, result.stderr
