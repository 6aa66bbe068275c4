"""Megatron-LM flags that make a command Megatron-LM refuses on every rank at start-up, found by
fuzzing: after '--' beside the input's own arguments (advisor-launch), or beside --swiglu in a
command advisor estimate --from-command reads. Each is one Error line and exit 2, not a launch
(or a dry run, an `args` line, an estimate) that passes them through.

- --step-batch-size-schedule: its last batch is the run's global batch, and core_v0.19.0's
  validate_args raises 'Cannot specify both --step-batch-size-schedule and --global-batch-size'
  (megatron/training/arguments.py), which every input's arguments give.
- --quick-geglu and --squared-relu: megatron-core builds them with 'assert not args.swiglu'
  (core_transformer_config_from_args: megatron/training/arguments.py in core_v0.15.2,
  argument_utils.py in core_v0.19.0), and every input's model is SwiGLU."""

import pytest
from launch_support import launcher, sweep_file


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from conftest import Invoker

    return sweep_file(Invoker(), tmp_path_factory.mktemp("passthrough") / "sweep.json",
                      "--gpus", "8", "--mem", "80", "--gbs", "64")


@pytest.mark.parametrize("extra, line", [
    (["--step-batch-size-schedule", "0:8"],
     "--step-batch-size-schedule 0:8 (after --) conflicts with --micro-batch-size 1, --global-batch-size 64 from "
     "the sweep row (rank 1 of "),
    (["--quick-geglu"], "--quick-geglu (after --) conflicts with --swiglu from the sweep row (rank 1 of "),
    (["--squared-relu"], "--squared-relu (after --) conflicts with --swiglu from the sweep row (rank 1 of "),
])
@pytest.mark.parametrize("command", [["args"], ["torchrun", "--megatron-version", "0.19", "--dry-run", "--mock-data"]])
def test_a_flag_megatron_refuses_beside_the_inputs_is_refused(sweep, monkeypatch, command, extra, line):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    message = launcher().error(command[0], "--from", sweep, *command[1:], "--", *extra)
    assert message.startswith(f"Error: {line}")
    assert message.endswith("(the input decides these; change the input instead)")


def test_squared_relu_beside_swiglu_in_a_command_is_refused(advisor, tmp_path):
    """The same assert in advisor estimate --from-command: the command was priced as SwiGLU with
    '--squared-relu (not known to the advisor)' among its unpriced flags, exit 0."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
                      "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
                      "--global-batch-size 8 --vocab-size 1000 --swiglu --squared-relu\n")
    assert advisor.error("estimate", "--from-command", script, "--gpu", "h100-80gb") == (
        "Error: --from-command train.sh: --squared-relu with --swiglu: Megatron-LM refuses the command (building its "
        "TransformerConfig: 'assert not args.swiglu'); keep one of them")
    script.write_text(script.read_text().replace(" --swiglu", ""))
    assert advisor("estimate", "--from-command", script, "--gpu", "h100-80gb").exit_code == 0
