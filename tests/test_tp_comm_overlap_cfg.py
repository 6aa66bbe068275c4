"""--tp-comm-overlap-cfg FILE (Megatron-LM's YAML of per-buffer userbuffers settings, passed to
Transformer Engine's initialize_ub as ub_cfgs): read, refused where TE refuses it, priced buffer by
buffer, emitted as given and read back from a command.

Hand numbers: tests/test_tp_comm_overlap.py's Llama 3.1 8B at TP 8, one 8192-token microbatch on
an H100 (132 SMs): GEMMs QKV 0.08739, projection 0.06286, FC1 0.35724, FC2 0.18552 ms; one TP
collective 0.27099 ms."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor import memory_terms
from advisor.errors import AdvisorError
from advisor.hardware import get_gpu
from advisor.models import PRESETS
from advisor.options import TrainingOptions, parse_training_args, training_args
from advisor.options.ub_config import DEFAULT_METHODS, TE_DEFAULTS, load_userbuffers, parse_userbuffers
from advisor.throughput import TimeModel

from test_tp_comm_overlap import hand_rates

H100 = get_gpu("h100-80gb")
NO_MARGINS = """\
proj_fprop: {method: pipeline, num_sm: 24, set_sm_margin: 0}
fc2_fprop: {method: pipeline, num_sm: 20, set_sm_margin: 0}
qkv_dgrad: {method: bulk, num_sm: 4, cga_size: 2, set_sm_margin: 0}
qkv_wgrad: {method: bulk, num_sm: 8, cga_size: 2, set_sm_margin: 0}
fc1_dgrad: {method: bulk, num_sm: 2, cga_size: 2, set_sm_margin: 0}
fc1_wgrad: {method: bulk, num_sm: 4, cga_size: 2, set_sm_margin: 0}
"""


def _file(tmp_path, text: str, name: str = "ub.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _layer(path: str | None, tp: int = 8):
    """(exposed TP time, GEMM time) of one 8B layer and microbatch with the overlap and ``path``'s
    settings (None: TE's defaults)."""
    options = TrainingOptions().with_(tp_comm_overlap=True, tp_comm_overlap_cfg=path).time_options()
    out = TimeModel(PRESETS["llama3.1-8b"], H100, 8192, 64, options=options).layer(tp, 1, 1)
    return float(out[3]), float(out[2])


def _gemms():
    flops, latency, bandwidth, hop = hand_rates()
    qkv, proj, fc1, fc2 = (2 * 8192 * k * n / flops + latency for k, n in
                           ((4096, 768), (512, 4096), (4096, 3584), (1792, 4096)))
    return qkv, proj, fc1, fc2, 7 / 8 * 2 * 8192 * 4096 / bandwidth + 7 * hop


def test_a_file_without_sm_margins_leaves_every_gemm_its_sms(tmp_path):
    """NeMo's GPT-3 175B style: pipeline and bulk on their own SMs but no margin. Forward: QKV ring
    0.27099 - 7/8 x 0.08739 = 0.19452; projection pipeline 0.27099 - 3/4 x 0.06286 = 0.22384; FC1
    hidden; FC2 pipeline max(0.27099/4, 0.27099 - 3/4 x 0.18552) = 0.13185: 0.55021 ms. Backward:
    projection ring 0.21598, FC2 ring 0.10866, QKV wgrad bulk 0.27099 - 0.08739 = 0.18359, FC1
    hidden: 0.50823 ms. No GEMM slowed (TE's defaults slow them by 0.15692 ms)."""
    qkv, proj, fc1, fc2, one = _gemms()
    forward = (one - 7 / 8 * qkv) + (one - 3 / 4 * proj) + max(one / 4, one - 3 / 4 * fc2)
    backward = (one - 7 / 8 * proj) + (one - 7 / 8 * fc2) + (one - qkv)
    assert (forward, backward) == pytest.approx((0.55021e-3, 0.50823e-3), rel=1e-4)
    exposed, gemm = _layer(_file(tmp_path, NO_MARGINS))
    default_exposed, default_gemm = _layer(None)
    assert exposed == pytest.approx(forward + backward, rel=1e-12)
    assert default_gemm - gemm == pytest.approx(0.03426e-3 + 0.12266e-3, rel=1e-3)


def test_splits_sms_and_methods_are_each_buffers_own(tmp_path):
    """proj_fprop pipelined in 2 on 24 SMs with the margin: its GEMM 0.06286 x 132/108 = 0.07683,
    exposed max(0.27099/2, 0.27099 - 1/2 x 0.07683) = 0.23257 ms (0.21734 at TE's 4 splits on 16).
    fc2_fprop by ring exchange (NeMo launcher's GPT-3 175B file) on 1 SM with the margin: its GEMM
    0.18552 x 132/131 = 0.18694, exposed 0.27099 - 7/8 x 0.18694 = 0.10742 ms (0.11266 pipelined).
    GEMMs slowed forward: 24/108 x 0.06286 + 1/131 x 0.18552 = 0.01539 ms."""
    qkv, proj, fc1, fc2, one = _gemms()
    text = ("proj_fprop: {method: pipeline, num_sm: 24, num_splits: 2, set_sm_margin: 1}\n"
            "fc2_fprop: {method: ring_exchange, num_sm: 1, set_sm_margin: 1}\n")
    proj_exposed = max(one / 2, one - proj * 132 / 108 / 2)
    fc2_exposed = one - 7 / 8 * fc2 * 132 / 131
    assert (proj_exposed, fc2_exposed) == pytest.approx((0.23257e-3, 0.10742e-3), rel=1e-4)
    exposed, gemm = _layer(_file(tmp_path, text))
    default_exposed, default_gemm = _layer(None)
    default_proj = one - 3 / 4 * proj * 132 / 116
    default_fc2 = max(one / 4, one - 3 / 4 * fc2 * 132 / 116)
    assert exposed - default_exposed == pytest.approx(proj_exposed + fc2_exposed - default_proj - default_fc2, rel=1e-9)
    slowed = 24 / 108 * proj + 1 / 131 * fc2
    assert slowed == pytest.approx(0.01539e-3, rel=1e-3)
    assert gemm - default_gemm == pytest.approx(slowed - 16 / 116 * (proj + fc2), rel=1e-9)


def test_a_reduce_scatter_given_bulk_runs_pipelined_in_its_splits(tmp_path):
    """TE 2.9's row-parallel projection asks proj_fprop for a non-bulk reduce-scatter
    (``linear.py``: ``ub_type = CommOverlapType.RS``, no ``bulk_overlap``), and ``gemm.cpp`` runs
    ``split_overlap_rs`` on the CommOverlap that method bulk makes: pipelined, in the file's 2
    splits, 16 SMs with the margin (``get_default_config`` of TE's pipeline default). Exposed:
    max(0.27099/2, 0.27099 - 1/2 x 0.06286 x 132/116) = 0.23522 ms, where TE's 4 splits leave
    0.27099 - 3/4 x 0.07153 = 0.21734; priced as bulk, 0.27099 - 0.07153 = 0.19945 ms."""
    qkv, proj, fc1, fc2, one = _gemms()
    pipelined = max(one / 2, one - 1 / 2 * proj * 132 / 116)
    assert pipelined == pytest.approx(0.23522e-3, rel=1e-4)
    exposed, gemm = _layer(_file(tmp_path, "proj_fprop: {method: bulk, num_splits: 2}\n"))
    default_exposed, default_gemm = _layer(None)
    default_proj = one - 3 / 4 * proj * 132 / 116
    assert default_proj == pytest.approx(0.21734e-3, rel=1e-4)
    assert exposed - default_exposed == pytest.approx(pipelined - default_proj, rel=1e-9)
    assert gemm == default_gemm  # the same 16 SMs with the margin
    # method bulk at TE's 4 splits prices as the default pipeline, byte for byte
    assert _layer(_file(tmp_path, "proj_fprop: {method: bulk}\n", "b.yaml")) == (default_exposed, default_gemm)


def test_a_wgrad_given_pipeline_runs_bulk_whatever_its_splits(tmp_path):
    """QKV's layer asks qkv_wgrad for ``bulk_overlap`` (``layernorm_linear.py``: ``ub_bulk_wgrad``),
    and ``gemm.cpp`` runs ``bulk_overlap`` on the CommOverlap that method pipeline makes: the
    dgrad's whole reduce-scatter beside the wgrad GEMM, num_splits unused: 0.27099 - 0.08739 x
    132/116 = 0.17154 ms, as by default; priced pipelined in 2 it was max(0.27099/2, 0.27099 -
    1/2 x 0.09945) = 0.22126 ms."""
    qkv, proj, fc1, fc2, one = _gemms()
    assert one - qkv * 132 / 116 == pytest.approx(0.17154e-3, rel=1e-4)
    assert _layer(_file(tmp_path, "qkv_wgrad: {method: pipeline, num_splits: 2}\n")) == _layer(None)


def test_a_non_bulk_dgrad_still_runs_bulk_and_keeps_its_wgrad(tmp_path):
    """Megatron-LM leaves --tp-comm-overlap-rs-dgrad off, so TE 2.9's QKV layer still asks
    qkv_dgrad for the input's bulk re-gather and qkv_wgrad for dgrad's bulk reduce-scatter
    (``layernorm_linear.py``, ``ub_overlap_rs_dgrad`` False): qkv_dgrad by pipeline (16 SMs, margin)
    prices as the default, 0.17154 ms beside wgrad, not its reduce-scatter pipelined beside dgrad
    (0.27099 - 3/4 x 0.09945 = 0.19640 ms). By ring exchange the bulk overlap fails in TE
    (``CommOverlapP2PBase::bulk_overlap``, "Operation not supported"): refused."""
    assert _layer(_file(tmp_path, "qkv_dgrad: {method: pipeline}\n")) == _layer(None)
    with pytest.raises(AdvisorError, match="qkv_dgrad: ring_exchange does not run here"):
        load_userbuffers(_file(tmp_path, "qkv_dgrad: {method: ring_exchange}\n", "ring.yaml"))


def test_the_kernel_follows_the_layer_and_the_method_only_picks_ring_exchange():
    """``UserbuffersConfig.kernel``: TE's defaults run their own methods; any non-ring method runs
    what the layer asks (pipelined reduce-scatter, bulk); ring exchange runs where TE has it."""
    assert {name: TE_DEFAULTS.kernel(name) for name in DEFAULT_METHODS} == DEFAULT_METHODS
    config = parse_userbuffers("cfg", {"proj_fprop": {"method": "bulk"}, "fc2_fprop": {"method": "ring_exchange"},
                                       "qkv_wgrad": {"method": "pipeline"}, "fc1_dgrad": {"method": "pipeline"}})
    assert [config.kernel(name) for name in ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")] == [
        "pipeline", "ring_exchange", "bulk", "bulk", "bulk"]


def test_te_defaults_written_out_price_as_no_file(tmp_path):
    text = "".join(f"{name}: {{method: {method}}}\n" for name, method in (
        ("qkv_fprop", "ring_exchange"), ("proj_fprop", "pipeline"), ("qkv_wgrad", "bulk"), ("proj_wgrad", "external")))
    assert _layer(_file(tmp_path, text)) == _layer(None)
    assert _layer(_file(tmp_path, "", "empty.yaml")) == _layer(None)  # initialize_ub takes None as no settings


@pytest.mark.parametrize("text, words", [
    ("proj_fprop: {method: ring}\n", "proj_fprop: method must be one of ring_exchange, pipeline, bulk, external, "
                                     "got 'ring'"),
    ("proj_fprop: {num_sm: 0}\n", "proj_fprop: num_sm must be a whole number >= 1, got 0"),
    ("proj_fprop: {num_sm: -4}\n", "proj_fprop: num_sm must be a whole number >= 1, got -4"),
    ("fc2_fprop: {num_splits: 0}\n", "fc2_fprop: num_splits must be a whole number >= 1, got 0"),
    ("fc2_fprop: {set_sm_margin: maybe}\n", "fc2_fprop: set_sm_margin must be true, false, 0 or 1, got 'maybe'"),
    ("qkv_fprop: {method: pipeline}\n", "qkv_fprop: pipeline is not supported for an all-gather"),
    ("qkv_fprop: {method: bulk}\n", "qkv_fprop: bulk does not run for an all-gather beside its GEMM"),
    ("proj_dgrad: {method: bulk}\n", "proj_dgrad: bulk does not run for an all-gather beside its GEMM"),
    ("qkv_wgrad: {method: ring_exchange}\n", "qkv_wgrad: ring_exchange does not run here"),
    ("fc1_dgrad: {method: ring_exchange}\n", "fc1_dgrad: ring_exchange does not run here"),
    # external on another buffer passes add_ub (TE 2.9 base.py asserts only proj_wgrad/fc2_wgrad, 403-411);
    # it makes the non-ring object, which refuses fc1_fprop's all-gather beside its GEMM
    ("fc1_fprop: {method: external}\n", "fc1_fprop: external does not run for an all-gather beside its GEMM"),
    ("proj_wgrad: {method: bulk}\n", "proj_wgrad: method must be external (Transformer Engine asserts it for proj_wgrad"),
    ("proj_dgrad: {method: pipeline, is_reduce_scatter: true}\n",
     "proj_dgrad: pipeline does not run for an all-gather beside its GEMM"),
    ("qkv_wgrad: {method: pipeline, is_reduce_scatter: false}\n",
     "qkv_wgrad: pipeline is not supported for an all-gather (Transformer Engine refuses it: is_reduce_scatter is "
     "false)"),
    ("qkv_fprop: {is_reduce_scatter: true}\n", "qkv_fprop: is_reduce_scatter: true makes a reduce-scatter "
                                               "ring-exchange buffer, but the layer all-gathers there"),
    ("fc2_fprop: {method: ring_exchange, is_reduce_scatter: false}\n",
     "fc2_fprop: is_reduce_scatter: false makes an all-gather ring-exchange buffer, but the layer reduce-scatters"),
    ("fc2_fprop: {is_reduce_scatter: perhaps}\n", "fc2_fprop: is_reduce_scatter must be true, false, 0 or 1"),
    ("fc1_fprop: {num_sms: 4}\n", "fc1_fprop: unknown setting 'num_sms'"),
    ("qkv: {method: bulk}\n", "qkv: not a userbuffers buffer"),
    ("qkv_dgrad: {method: pipeline}\nqkv_wgrad: {method: bulk}\n", "qkv_wgrad: set beside a non-bulk qkv_dgrad"),
    ("- proj_fprop\n", "expected a mapping of buffer names, got list"),
    ("proj_fprop: [1, 2\n", "not YAML"),
])
def test_a_bad_file_is_one_error_line_exit_2(tmp_path, text, words):
    path = _file(tmp_path, text)
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8",
                                      "--gpu", "h100-80gb", "--tp-comm-overlap", "--tp-comm-overlap-cfg", path])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: --tp-comm-overlap-cfg {path}: "), result.stderr
    assert words in lines[0]


def test_a_file_that_is_not_text_is_one_error_line(tmp_path):
    """A binary or Latin-1 file was a UnicodeDecodeError traceback, exit 1 (audit)."""
    latin1 = "proj_fprop: {method: caf\xe9}\n".encode("latin-1")
    for name, data in (("binary.yaml", b"\xff\xfe\x00"), ("latin1.yaml", latin1)):
        path = tmp_path / name
        path.write_bytes(data)
        result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--gpu",
                                          "h100-80gb", "--tp-comm-overlap", "--tp-comm-overlap-cfg", str(path)])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (f"Error: --tp-comm-overlap-cfg {path}: not a UTF-8 text file (a YAML of "
                                         "userbuffers settings)")


def test_a_missing_file_and_a_file_without_the_overlap_are_refused(tmp_path):
    base = ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--gpu", "h100-80gb"]
    missing = CliRunner().invoke(cli, [*base, "--tp-comm-overlap", "--tp-comm-overlap-cfg", str(tmp_path / "no.yaml")])
    assert missing.exit_code == 2 and missing.stderr.startswith(f"Error: --tp-comm-overlap-cfg {tmp_path / 'no.yaml'}: "
                                                                "cannot read it")
    alone = CliRunner().invoke(cli, [*base, "--tp-comm-overlap-cfg", _file(tmp_path, NO_MARGINS)])
    assert alone.exit_code == 2 and alone.stderr.strip() == "Error: --tp-comm-overlap-cfg needs --tp-comm-overlap"
    with pytest.raises(AdvisorError, match="leaves no SMs"):
        _layer(_file(tmp_path, "proj_fprop: {num_sm: 132}\n", "all.yaml"))


def test_a_file_edited_between_two_loads_is_read_anew(tmp_path, monkeypatch):
    """One process, one path: the file rewritten (same size, so neither size nor a coarse mtime
    tells it apart) gives its new settings; the same relative path from another working directory
    is that directory's file."""
    path = _file(tmp_path, "proj_fprop: {num_sm: 24}\n")
    assert load_userbuffers(path).buffer("proj_fprop").num_sm == 24
    _file(tmp_path, "proj_fprop: {num_sm: 12}\n")
    assert load_userbuffers(path).buffer("proj_fprop").num_sm == 12
    for where, sms in (("a", 3), ("b", 5)):
        (tmp_path / where).mkdir()
        _file(tmp_path / where, f"fc2_fprop: {{num_sm: {sms}}}\n")
    monkeypatch.chdir(tmp_path / "a")
    assert load_userbuffers("ub.yaml").buffer("fc2_fprop").num_sm == 3
    monkeypatch.chdir(tmp_path / "b")
    assert load_userbuffers("ub.yaml").buffer("fc2_fprop").num_sm == 5


def test_the_file_is_emitted_as_given_and_read_back_priced(tmp_path):
    """The launch arguments carry the path as given; a torchrun line with it reads back to the same
    options and the same step time, which the file changes."""
    path = _file(tmp_path, NO_MARGINS)
    base = ["estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--gpu", "h100-80gb", "--gbs", "64",
            "--tp-comm-overlap", "--format", "json"]
    given = json.loads(CliRunner().invoke(cli, [*base, "--tp-comm-overlap-cfg", path]).stdout)
    plain = json.loads(CliRunner().invoke(cli, base).stdout)
    args = given["megatron_args"]
    assert args[args.index("--tp-comm-overlap-cfg") + 1] == path
    assert given["step_time_s"] < plain["step_time_s"]  # no margins: every GEMM on all 132 SMs
    options = TrainingOptions().with_(tp_comm_overlap=True, tp_comm_overlap_cfg=path)
    emitted = training_args(options, tp=8)
    assert emitted[emitted.index("--tp-comm-overlap-cfg") + 1] == path
    assert parse_training_args([*emitted, "--tensor-model-parallel-size", "8"])[0] == options.at_tp(8)
    line = shlex.join(["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", *args, "--vocab-size", "128256"])
    read = json.loads(CliRunner().invoke(cli, ["estimate", "--gpu", "h100-80gb", "--format", "json",
                                               "--from-command", "-"], input=line).stdout)
    assert read["options"]["tp_comm_overlap_cfg"] == path
    assert read["step_time_s"] == pytest.approx(given["step_time_s"], rel=1e-12)
    assert "--tp-comm-overlap-cfg" not in " ".join(read.get("unpriced", []))


def test_the_file_beside_from_command_is_named_as_the_commands(tmp_path):
    """Given beside --from-command it said '--tp-comm-overlap-cfg needs --tp-comm-overlap', though
    the command sets the overlap (audit): the command decides the file, as every other option."""
    command = tmp_path / "train.sh"
    command.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                       "--ffn-hidden-size 14336 --num-attention-heads 32 --seq-length 8192 --micro-batch-size 1 "
                       "--global-batch-size 64 --tensor-model-parallel-size 8 --sequence-parallel --tp-comm-overlap\n")
    result = CliRunner().invoke(cli, ["estimate", "--from-command", str(command), "--gpu", "h100-80gb", "--vocab-size",
                                      "128256", "--tp-comm-overlap-cfg", _file(tmp_path, NO_MARGINS)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("Error: --tp-comm-overlap-cfg comes from the command with --from-command (edit "
                                     "the command instead)")


def test_te_29_accepts_is_reduce_scatter_and_external_beyond_the_wgrads(tmp_path):
    """TE 2.9's add_ub takes is_reduce_scatter (base.py 354; get_default_config's, 330/335, which
    the file's mapping updates, 478), and asserts external only on proj_wgrad/fc2_wgrad (403-411):
    another buffer made external gets the non-ring object (428-441) and runs what its layer asks.
    A qkv_wgrad external runs bulk, as bulk does; a proj_fprop external the pipelined
    reduce-scatter; a pipelined qkv_wgrad said to be a reduce-scatter, as TE says it is, passes."""
    config = parse_userbuffers("cfg", {"qkv_wgrad": {"method": "external"}, "proj_fprop": {"method": "external"},
                                       "fc1_dgrad": {"method": "external"},
                                       "fc2_fprop": {"is_reduce_scatter": True},
                                       "qkv_fprop": {"is_reduce_scatter": False},
                                       "fc1_fprop": {"method": "ring_exchange", "is_reduce_scatter": 0}})
    assert [config.kernel(name) for name in ("qkv_wgrad", "proj_fprop", "fc1_dgrad", "fc2_fprop", "qkv_fprop")] == [
        "bulk", "pipeline", "bulk", "pipeline", "ring_exchange"]
    # a non-ring buffer's is_reduce_scatter reaches only add_ub's pipeline check: TE's defaults otherwise
    assert [config.reduce_scatter(name) for name in ("proj_fprop", "fc2_fprop", "qkv_fprop", "fc1_fprop")] == [
        True, True, False, False]
    # fc1_dgrad external moves to TE's reduce-scatter list (455-468): 16 SMs with a margin, as TE's non-ring default
    assert config.reduce_scatter("fc1_dgrad") and config.buffer("fc1_dgrad").num_sm == 16
    # priced as what runs: the time and the buffers (one whole BF16 s b h buffer, as bulk's) of TE's defaults
    assert _layer(_file(tmp_path, "qkv_wgrad: {method: external}\n")) == _layer(None)
    external = parse_userbuffers("cfg", {"qkv_wgrad": {"method": "external"}})
    assert [float(memory_terms.userbuffers_bytes(c, PRESETS["llama3.1-8b"], 8192, 1, 8, 1, False))
            for c in (external, TE_DEFAULTS)] == [12 * 8192 * 4096 * 2.0] * 2
    assert parse_userbuffers("cfg", {"qkv_wgrad": {"method": "pipeline", "is_reduce_scatter": True}}).kernel(
        "qkv_wgrad") == "bulk"
