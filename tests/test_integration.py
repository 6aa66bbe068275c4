"""The Megatron-LM integration in this process, on the stand-in checkout of
tests/fixtures/megatron_lm_standin (why a stand-in here, and only here: its README). The real
checkouts, both releases and both pretrain signatures, are hooked in test_launch_run.py."""

import runpy
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402

from advisor.profiles import load_run  # noqa: E402
from conftest import ROOT  # noqa: E402
from megatron_hooks import integration  # noqa: E402
from megatron_support import TINY, OutOfMemoryAt, tiny_model  # noqa: E402

STANDIN = ROOT / "tests" / "fixtures" / "megatron_lm_standin"
ARGV = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
        "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32", "--max-position-embeddings", "32",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "2", "--vocab-size", "256",
        "--untie-embeddings-and-output-weights", "--use-flash-attn", "--lr-decay-style", "cosine"]


@pytest.fixture
def pretrain_gpt(megatron_world, monkeypatch):
    """Runs the stand-in's pretrain_gpt.py in this process, as the launch wrapper will."""
    monkeypatch.syspath_prepend(str(STANDIN))

    def run(*argv: str) -> list[float]:
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
        runpy.run_path(str(STANDIN / "pretrain_gpt.py"), run_name="__main__")
        from megatron.training.training import LOSSES

        return list(LOSSES)

    yield run
    for name in [name for name in sys.modules if name.startswith("megatron.training")]:
        del sys.modules[name]


def test_install_profiles_an_unmodified_pretrain_gpt(pretrain_gpt, tmp_path):
    plain = pretrain_gpt(*ARGV)
    import megatron.training
    import megatron.training.training as training

    originals = (megatron.training.pretrain, training.pretrain, training.setup_model_and_optimizer,
                 training.train_step)
    session = integration.install(tmp_path, run_id="standin")
    try:
        assert training.train_step is not originals[3] and training.setup_model_and_optimizer is not originals[2]
        profiled = pretrain_gpt(*ARGV)
    finally:
        session.uninstall()
    assert (megatron.training.pretrain, training.pretrain, training.setup_model_and_optimizer,
            training.train_step) == originals
    assert profiled == plain  # bit for bit
    run = load_run(tmp_path)
    assert run.status == "ok" and len(run.ranks) == 1
    rank = run.ranks[0]
    header = rank.header
    assert header.run_id == "standin" and not header.emulated and header.layer_spec == "local"
    assert (header.model.num_layers, header.model.hidden_size, header.model.ffn_hidden_size) == (2, 64, 128)
    assert (header.model.num_attention_heads, header.model.num_query_groups, header.model.vocab_size) == (4, 2, 256)
    assert not header.model.tie_embeddings
    assert (header.parallel.tp, header.parallel.pp, header.parallel.dp, header.parallel.mbs) == (1, 1, 1, 2)
    assert (header.seq_len, header.global_batch_size, header.num_microbatches) == (32, 4, 2)
    assert header.layers_per_stage == (2,) and header.stage_layers == (1, 2) and header.in_flight_microbatches == 1
    assert [it.loss for it in rank.iterations] == plain
    assert [layer.name for layer in rank.layers_of(2)] == ["embedding", "decoder.layers.0", "decoder.layers.1", "output"]


def test_an_oom_inside_megatron_is_recorded(pretrain_gpt, tmp_path, capsys):
    backend = OutOfMemoryAt("iteration 2, microbatch 2, backward, decoder.layers.0 (layer 1)")
    session = integration.install(tmp_path, backend=backend)
    backend.position = lambda: session.hooks.where
    try:
        with pytest.raises(torch.OutOfMemoryError):
            pretrain_gpt(*ARGV)
    finally:
        session.uninstall()
    rank = load_run(tmp_path).ranks[0]
    assert rank.status == "oom" and len(rank.iterations) == 1
    assert rank.where == backend.target
    # the peak of the iteration that completed is still printed for compare-log
    peak = rank.iterations[0].peak_allocated_bytes / 2**20
    assert f"megatron_hooks: [Rank 0] peak over 1 iterations: {peak:.2f} MB allocated" in capsys.readouterr().out


def test_megatrons_sys_exit_still_ends_the_profile(tmp_path):
    """--exit-interval, --exit-duration-in-mins and SIGTERM leave Megatron's train() by sys.exit
    (core_v0.15.2 training.py, train): the wrapped pretrain still finishes the session."""
    session = integration.Session(tmp_path)
    finished = []
    session.finish = lambda: finished.append(True)

    def pretrain(*args, **kwargs):
        sys.exit(0)

    with pytest.raises(SystemExit):
        session._wrap_pretrain(pretrain)()
    assert finished == [True]


def test_wrap_model_provider_hooks_every_chunk(megatron_world, tmp_path):
    """Megatron calls the provider once per virtual pipeline chunk; the hooks cover them all."""
    def provider(pre_process=True, post_process=True, vp_stage=None):
        layers = (1, 2) if vp_stage == 0 else (3, 4)
        return tiny_model(layers=layers, pre_process=pre_process, post_process=post_process)

    wrapped = integration.wrap_model_provider(provider, tmp_path)
    try:
        chunks = [wrapped(pre_process=True, post_process=False, vp_stage=0),
                  wrapped(pre_process=False, post_process=True, vp_stage=1)]
        hooks = integration._ACTIVE.hooks
        assert hooks.models == chunks and hooks.stage_layers == (1, 2, 3, 4)
        assert [r.name for r in hooks.regions] == ["embedding", "decoder.layers.0", "decoder.layers.1",
                                                   "decoder.layers.2", "decoder.layers.3", "output"]
    finally:
        integration._ACTIVE.uninstall()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for chunk in chunks for m in chunk.modules())
    with pytest.raises(ValueError, match="needs an output_dir"):
        integration.wrap_model_provider(provider)


@pytest.mark.parametrize("pipeline,expected", [
    (dict(pipeline_model_parallel_size=4), (2, 2, 2, 2)),
    (dict(pipeline_model_parallel_size=3, num_layers_in_first_pipeline_stage=2,
          num_layers_in_last_pipeline_stage=2), (2, 4, 2)),
    (dict(pipeline_model_parallel_size=3, pipeline_model_parallel_layout="Et*3|t*3|t*2L"), (3, 3, 2)),
    (dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2), (4, 4)),
])
def test_layers_per_stage_as_megatron_splits_them(megatron_world, pipeline, expected):
    from megatron_hooks.model import transformer_config

    config = transformer_config(TINY, num_layers=8, pipeline_dtype=torch.float32, **pipeline)
    vpp = pipeline.get("virtual_pipeline_model_parallel_size")
    assert integration.layers_per_stage(config, pipeline["pipeline_model_parallel_size"], vpp) == expected


def test_the_iterations_asked_are_megatrons_train_loop_bound():
    """train() runs ``while iteration < args.train_iters`` from ``args.iteration`` (0, or the
    checkpoint's; core_v0.15.2 training.py). With --train-samples, get_optimizer_param_scheduler's
    update_train_iters sets args.train_iters before the first iteration; where it is still None,
    the count is unknown."""
    from types import SimpleNamespace

    assert integration.asked_iterations(SimpleNamespace(train_iters=2, iteration=0)) == 2
    assert integration.asked_iterations(SimpleNamespace(train_iters=10, iteration=4)) == 6  # resumed at 4
    assert integration.asked_iterations(SimpleNamespace(train_iters=None, train_samples=64, iteration=0)) is None
    assert integration.asked_iterations(SimpleNamespace(train_iters=3)) == 3  # no iteration attribute: a fresh run
