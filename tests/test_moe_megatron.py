"""MoE sweep rows and their flags through the real parse_args + validate_args of both Megatron-LM
checkouts (launch.megatron_check), and the TransformerConfig Megatron builds from them checked
against the spec. The one stand-in beyond the dense checks: --moe-grouped-gemm makes
validate_args call torch.cuda.get_device_capability(); with no GPU here it answers Hopper's
(9, 0) (launch.megatron_check, as for get_device_arch_version)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.models import load_model
from advisor.moe.spec import spec_from_dict
from launch.megatron_versions import named
from megatron_real import NO_TRANSFORMER_ENGINE, checkout, launched_args, validate

DATA = Path(__file__).parent / "data" / "moe"

# One worker under pytest-xdist for the tests of the session's validator processes (megatron_real.validate):
# each worker would start its own (torch and Megatron imported again, 10-13 s of CPU per release).
pytestmark = pytest.mark.xdist_group("megatron-validator")


def _rows(model, gpus, *extra):
    result = CliRunner().invoke(cli, ["sweep", "--model", model, "--gpus", str(gpus), "--gpu", "h100-80gb",
                                      "--seq-len", "4096", "--gbs", "1024", "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_sweep_rows_carry_ep_etp_time_and_stage_memory():
    rows = _rows("mixtral-8x7b", 64, "--top", "20")
    assert rows and all({"ep", "etp", "step_time_s", "total_gib", "peak_stage"} <= row.keys() for row in rows)
    assert any(row["ep"] > 1 for row in rows)
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))


def _expected(spec, row) -> dict:
    mla = spec.mla
    return {"num_moe_experts": spec.num_experts, "moe_router_topk": spec.moe_router_topk,
            "moe_ffn_hidden_size": spec.moe_ffn_hidden_size,
            "moe_shared_expert_intermediate_size": spec.shared_expert_size or None,
            "expert_model_parallel_size": row["ep"], "expert_tensor_parallel_size": row["etp"],
            "moe_expert_capacity_factor": row["capacity_factor"],
            "moe_pad_expert_input_to_capacity": row["capacity_factor"] is not None and row["pad_to_capacity"],
            "moe_token_dispatcher_type": row["dispatcher"], "moe_grouped_gemm": True,
            "moe_router_score_function": spec.score_function, "moe_router_enable_expert_bias": spec.expert_bias,
            # softmax before the top-k: a config's norm_topk_prob false, and top-1 (Megatron asks for it)
            "moe_router_pre_softmax": spec.router_pre_softmax or (spec.score_function == "softmax"
                                                                  and spec.moe_router_topk == 1),
            "moe_router_num_groups": spec.router_num_groups, "moe_router_group_topk": spec.router_group_topk,
            "moe_router_topk_scaling_factor": spec.router_topk_scaling_factor, "qk_layernorm": spec.qk_layernorm,
            "multi_latent_attention": mla is not None,
            **({"q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank, "qk_head_dim": mla.qk_head_dim,
                "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim, "v_head_dim": mla.v_head_dim} if mla else {}),
            "layers_per_stage": row["layers_per_stage"], "tp": row["tp"], "pp": row["pp"], "dp": row["dp"],
            "vpp": row["vpp"], "mtp_num_layers": spec.mtp_num_layers or None,
            "fp8": row["options"].get("fp8_format"), "overlap_grad_reduce": True, "use_distributed_optimizer": True,
            # the balancing the rows are priced with (balanced routing): an aux-loss router with the
            # model's own weight (Megatron's default 0 would not balance), or the expert bias
            **_balancing(spec),
            "moe_enable_deepep": row["dispatcher"] == "flex" and (row.get("flex_backend") or "deepep") == "deepep",
            "moe_router_dtype": "fp32",
            # --moe-shared-expert-overlap as the row carries it (advisor.moe.flags.layout_flags)
            "moe_shared_expert_overlap": bool(row.get("shared_expert_overlap"))}


def _balancing(spec) -> dict:
    """The balancing a command gave (MoESpec.load_balancing, lists where several), else the one the
    rows are priced with (balanced routing): an aux-loss router with the model's own weight
    (Megatron's default 0 would not balance), or the expert bias."""
    if spec.load_balancing is not None:
        several = len(spec.load_balancing) > 1
        return {"moe_router_load_balancing_type": list(spec.load_balancing) if several else spec.load_balancing[0],
                "moe_aux_loss_coeff": list(spec.aux_loss_coeff) if several else spec.aux_loss_coeff}
    return {"moe_aux_loss_coeff": 0.0 if spec.expert_bias else spec.aux_loss_coeff,
            "moe_router_load_balancing_type": "none" if spec.expert_bias else "aux_loss"}


def _one(key: str, value):
    """The balancing flags Megatron reads as lists (nargs='+', one value per loss type) as their
    one value."""
    listed = key in ("moe_aux_loss_coeff", "moe_router_load_balancing_type")
    return value[0] if listed and isinstance(value, list) and len(value) == 1 else value


def _rows_of_every_kind(tag: str, tmp_path) -> list[tuple[str, dict]]:
    """(model, sweep row) for each kind of MoE row the advisor writes: the top rows of three models,
    each recomputation, capacity routing padded and not, VPP, FP8 with MTP, the EP overlap, the
    flex dispatcher (HybridEP on core_v0.19.0), TE's fusions, Megatron's own defaults, and two
    config.json variants (top-1 tied, Qwen3-MoE unnormalised)."""
    # top-1 routing (written with --moe-router-pre-softmax, which Megatron asks for) and tied embeddings
    top_one = json.loads((DATA / "mixtral-8x7b.json").read_text()) | {"num_experts_per_tok": 1,
                                                                      "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(top_one))
    # Qwen3-MoE as Transformers defaults it, norm_topk_prob false: top-8 of the softmax over all, not renormalised
    unnormalised = json.loads((DATA / "qwen3-30b-a3b.json").read_text()) | {"norm_topk_prob": False}
    (tmp_path / "qwen3.json").write_text(json.dumps(unnormalised))
    rows = [(name, row) for name, gpus, top in (("mixtral-8x7b", 64, 3), ("deepseek-v3", 1024, 3),
                                                ("qwen3-30b-a3b", 64, 2))
            for row in _rows(name, gpus, "--top", str(top))]
    # and a row of each recomputation (--recompute-modules)
    rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 8, "--all", "--recompute", kind, "--top", "1")[0])
             for kind in ("selective", "full")]
    rows += [("mixtral-8x7b", _rows("mixtral-8x7b", 64, "--top", "1", "--moe-routing", "capacity",
                                    "--moe-expert-capacity-factor", "1.5", "--moe-token-dispatcher-type", "allgather")[0])]
    # token dropping padded (--moe-pad-expert-input-to-capacity) and not, with the alltoall dispatcher
    rows += [("mixtral-8x7b", _rows("mixtral-8x7b", 64, "--top", "1", "--moe-routing", "capacity",
                                    "--moe-expert-capacity-factor", "1.0", *pad)[0])
             for pad in ((), ("--no-moe-pad-expert-input-to-capacity",))]
    # interleaved (VPP), FP8 and DeepSeek-V3's MTP module (its layer in the pipeline layout, 'm')
    rows += [("mixtral-8x7b", next(row for row in _rows("mixtral-8x7b", 64, "--all") if row["vpp"] > 1))]
    rows += [("deepseek-v3", row) for row in _rows("deepseek-v3", 1024, "--top", "2", "--fp8-format", "hybrid",
                                                   "--mtp-num-layers", "1")]
    # the EP all-to-all overlap (combined 1F1B; --delay-wgrad-compute needs Transformer Engine's
    # implementation, which these CPU checks replace by the local one, so it is left out here)
    rows += [("qwen3-30b-a3b", row) for row in _rows("qwen3-30b-a3b", 64, "--top", "2",
                                                     "--overlap-moe-expert-parallel-comm")]
    rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 16, "--all", "--recompute", "selective",
                                     "--overlap-moe-expert-parallel-comm", "--top", "1")[0])]
    # the shared experts beside the dispatch (--moe-shared-expert-overlap): DeepSeek-V3's, alltoall
    rows += [("deepseek-v3", _rows("deepseek-v3", 1024, "--top", "1", "--moe-shared-expert-overlap")[0])]
    assert rows[-1][1]["shared_expert_overlap"] and "--moe-shared-expert-overlap" in rows[-1][1]["megatron_args"]
    # the flex dispatcher (DeepEP: core_v0.15.2's asserts --moe-enable-deepep when it builds one),
    # with DeepEP's default SMs and with 32 (--moe-deepep-num-sms, overlapped)
    rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 16, "--top", "1", "--moe-token-dispatcher-type", "flex")[0])]
    rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 16, "--top", "1", "--moe-token-dispatcher-type", "flex",
                                     "--moe-deepep-num-sms", "32", "--overlap-moe-expert-parallel-comm")[0])]
    assert [row.get("dispatcher_sms") for _, row in rows[-2:]] == [None, 32]
    if tag == "core_v0.19.0":  # HybridEP, launched as read (core_v0.15.2 has DeepEP alone: releases.py, lacks)
        rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 16, "--top", "1", "--moe-token-dispatcher-type", "flex",
                                         "--moe-flex-dispatcher-backend", "hybridep", "--moe-deepep-num-sms", "32")[0])]
        assert {"--moe-flex-dispatcher-backend", "--moe-flex-dispatcher-num-sms"} <= set(rows[-1][1]["megatron_args"])
        # core_v0.19.0 runs the shared experts' overlap with the flex dispatcher too
        rows += [("deepseek-v3", _rows("deepseek-v3", 1024, "--top", "1", "--moe-token-dispatcher-type", "flex",
                                       "--moe-shared-expert-overlap")[0])]
    # Transformer Engine's fused permutation and router (--moe-permute-fusion: TransformerConfig asks
    # for TE's kernels, which the check stands in for here, launch.megatron_check)
    rows += [("qwen3-30b-a3b", _rows("qwen3-30b-a3b", 16, "--top", "1", "--moe-permute-fusion",
                                     "--moe-router-fusion")[0])]
    assert {"--moe-permute-fusion", "--moe-router-fusion"} <= set(rows[-1][1]["megatron_args"])
    # Megatron's own defaults its MoE scripts keep: the vocabulary padded to 128 x TP, the mask built
    rows += [("mixtral-8x7b", _rows("mixtral-8x7b", 64, "--top", "1", "--vocab-divisible-by", "128",
                                    "--dataloader-mask", "cached")[0])]
    rows += [(str(tmp_path / "config.json"), _rows(str(tmp_path / "config.json"), 64, "--top", "1")[0])]
    assert "--moe-router-pre-softmax" in rows[-1][1]["megatron_args"]
    assert "--untie-embeddings-and-output-weights" not in rows[-1][1]["megatron_args"]
    rows += [(str(tmp_path / "qwen3.json"), _rows(str(tmp_path / "qwen3.json"), 16, "--top", "1")[0])]
    assert "--moe-router-pre-softmax" in rows[-1][1]["megatron_args"]
    assert {row["vpp"] > 1 for _, row in rows} == {True, False}
    return rows


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_megatron_accepts_and_builds_moe_rows(tag, tmp_path):
    release = checkout(tag)
    rows = _rows_of_every_kind(tag, tmp_path)
    # as advisor-launch writes them for this release (core_v0.19.0: DeepEP's deprecated flags renamed)
    cases = [{"args": [*launched_args(row, tag), *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type",
                       "NullTokenizer", "--vocab-size", str(load_model(name).vocab_size), "--train-iters", "10"],
              "world_size": row["gpus"], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for name, row in rows]
    results = validate(release, cases)
    refused = [(name, row["tp"], row["pp"], row["ep"], result.get("error")) for (name, row), result in
               zip(rows, results) if not result["ok"]]
    assert not refused, refused
    for (name, row), result in zip(rows, results):
        expected = _expected(spec_from_dict(row["model"]), row)
        if tag == "core_v0.19.0":  # launched as --moe-flex-dispatcher-backend deepep (launched_args), checked below
            expected["moe_enable_deepep"] = False
        wrong = {key: (result["derived"].get(key), value) for key, value in expected.items()
                 if _one(key, result["derived"].get(key)) != value}
        assert not wrong, (name, wrong)
        assert (result["derived"]["moe_permute_fusion"], result["derived"]["moe_router_fusion"]) == (
            bool(row.get("permute_fusion")), bool(row.get("router_fusion"))), name
        # the SMs the flex dispatcher gets: core_v0.15.2's moe_deepep_num_sms (default 20), core_v0.19.0's
        # moe_flex_dispatcher_num_sms, which __post_init__ routes the deprecated flag to (unset: None, 20 in DeepEP)
        sms = row.get("dispatcher_sms")
        if tag == "core_v0.15.2":
            assert result["derived"]["moe_deepep_num_sms"] == (20 if sms is None else sms), name
        else:
            assert result["derived"]["moe_flex_dispatcher_num_sms"] == sms, name
            assert result["derived"]["moe_flex_dispatcher_backend"] == (row.get("flex_backend") or "deepep"), name


def test_megatron_accepts_moe_campaign_runs_and_a_given_split():
    """An MoE profiling campaign's runs (advisor profile plan --ep 4) and an MoE estimate with its own
    split (--layers-per-stage 7,9,9,7: --decoder-first/last-pipeline-num-layers) through core_v0.15.2's
    parse_args + validate_args: Megatron builds the runs' EP, ETP and layers per stage."""
    release = checkout("core_v0.15.2")
    runner = CliRunner()
    campaign = json.loads(runner.invoke(cli, ["profile", "plan", "--model", "mixtral-8x7b", "--gpus", "8",
                                              "--gpus-per-node", "8", "--mode", "reduced", "--seq-len", "4096",
                                              "--mbs", "2", "--gbs", "16", "--ep", "4", "--format", "json"]).stdout)
    runs = [(run["megatron_args"], run["world_size"], run) for run in campaign["runs"][::4]]
    estimate = json.loads(runner.invoke(cli, ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--pp", "4",
                                              "--ep", "8", "--gbs", "256", "--seq-len", "4096",
                                              "--layers-per-stage", "7,9,9,7", "--format", "json"]).stdout)
    runs.append((estimate["megatron_args"], 64, estimate))
    # a command's two balancing losses with their weights (nargs='+'), launched as read
    command = ("pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
               "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 "
               "--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear "
               "--untie-embeddings-and-output-weights --vocab-size 32000 --micro-batch-size 1 --global-batch-size 256 "
               "--bf16 --tensor-model-parallel-size 2 --sequence-parallel --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm "
               "--expert-model-parallel-size 4 --moe-router-load-balancing-type seq_aux_loss global_aux_loss "
               "--moe-aux-loss-coeff 1e-3 1e-4")
    read = json.loads(runner.invoke(cli, ["estimate", "--from-command", "-", "--gpus", "8", "--format", "json"],
                                    input=command).stdout)
    runs.append((read["megatron_args"], 8, read))
    cases = [{"args": [*args, *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type", "NullTokenizer",
                       "--vocab-size", "32000", "--train-iters", "10"],
              "world_size": world, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for args, world, _ in runs]
    results = validate(release, cases)
    assert all(result["ok"] for result in results), [result.get("error") for result in results]
    for (_, _, row), result in zip(runs, results):
        derived = result["derived"]
        assert (derived["expert_model_parallel_size"], derived["expert_tensor_parallel_size"]) == (row["ep"], row["etp"])
        assert derived["layers_per_stage"] == row["layers_per_stage"]
    assert (derived["moe_router_load_balancing_type"], derived["moe_aux_loss_coeff"]) == (
        ["seq_aux_loss", "global_aux_loss"], [1e-3, 1e-4])


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_shared_expert_overlap_runs_with_the_dispatchers_advisor_releases_names(tag):
    """advisor.releases' shared_expert_overlap_dispatchers (which the advisor's refusal reads,
    advisor.moe.overlap.shared_expert_overlap_problem) against each release's own TransformerConfig:
    DeepSeek-V3 (shared experts) with --moe-shared-expert-overlap after each dispatcher's row."""
    release, rules = checkout(tag), named(tag)
    rows = [(dispatcher, _rows("deepseek-v3", 1024, "--top", "1", "--moe-token-dispatcher-type", dispatcher)[0])
            for dispatcher in ("alltoall", "flex")]
    cases = [{"args": [*launched_args(row, tag), "--moe-shared-expert-overlap",
                       *NO_TRANSFORMER_ENGINE, "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                       str(load_model("deepseek-v3").vocab_size), "--train-iters", "10"],
              "world_size": row["gpus"], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}} for _, row in rows]
    for (dispatcher, _), result in zip(rows, validate(release, cases)):
        assert result["ok"] == (dispatcher in rules.shared_expert_overlap_dispatchers), (dispatcher, result)
        if not result["ok"]:
            assert "moe_shared_expert_overlap only works with" in result["error"]
