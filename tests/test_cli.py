"""The ``advisor`` commands, run in-process through click on real inputs."""

import csv
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from table_text import read_table

from advisor.models import preset
from advisor.parallel import Workload
from advisor.paper_rule import ranking_key
from advisor.sweep import sweep

ROW_KEYS = {"tp", "cp", "pp", "mbs", "dp", "gpus", "total_gib", "model_states_gib", "activations_gib",
            "verdict", "rank"}


def test_sweep_json_rows_follow_the_interface(advisor):
    rows = advisor.json("sweep", "--gpus", 64, "--mem", 40)
    assert rows and all(ROW_KEYS <= row.keys() for row in rows)
    assert all(row["verdict"] in ("fits", "tight") for row in rows)
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
    for row in rows:
        assert row["tp"] * row["cp"] * row["pp"] * row["dp"] == row["gpus"] == 64
        assert row["total_gib"] == pytest.approx(row["model_states_gib"] + row["activations_gib"])
        assert (row["verdict"] == "fits") == (row["total_gib"] <= 0.8 * 40)


def test_sweep_ranking_is_the_documented_order(advisor):
    rows = advisor.json("sweep", "--gpus", 64, "--mem", 40)
    keys = [
        (r["verdict"] != "fits", r["recompute"] != "none", r["tp"] * r["cp"] * r["pp"], -r["mbs"], r["tp"], r["pp"],
         r["recompute_num_layers"] or 0, r["total_gib"], r["cp"], r["vpp"])
        for r in rows
    ]
    assert keys == sorted(keys)
    # The library's own rows, put in order by its key, are the CLI's rows in the CLI's order.
    swept = sweep(preset("llama3.1-8b"), Workload(), 64, 40).rows
    library = sorted((row for row in swept if row.rank), key=ranking_key)
    assert [(r.parallel.tp, r.parallel.cp, r.parallel.pp, r.parallel.mbs) for r in library] == \
        [(r["tp"], r["cp"], r["pp"], r["mbs"]) for r in rows]
    # The paper's finding on 64 A100s (Table 3): the smallest TP x CP x PP that fits comes first.
    fits = [r for r in rows if r["verdict"] == "fits" and r["recompute"] == "none"]
    assert rows[0]["tp"] * rows[0]["cp"] * rows[0]["pp"] == min(r["tp"] * r["cp"] * r["pp"] for r in fits)


def test_sweep_all_adds_unranked_oom_rows(advisor):
    survivors = advisor.json("sweep", "--gpus", 8, "--mem", 40)
    everything = advisor.json("sweep", "--gpus", 8, "--mem", 40, "--all")
    oom = [row for row in everything if row["verdict"] == "oom"]
    assert oom and all(row["rank"] is None for row in oom)
    assert len(everything) == len(survivors) + len(oom)
    assert everything[: len(survivors)] == survivors


def test_sweep_enumerates_the_documented_space(advisor):
    rows = advisor.json("sweep", "--gpus", 16, "--mem", 80, "--all", "--gpus-per-node", 4)
    for row in rows:
        assert row["tp"] in (1, 2, 4)  # powers of 2 up to --gpus-per-node, dividing 32 and 8
        assert 8192 % (2 * row["cp"]) == 0 and row["cp"] & (row["cp"] - 1) == 0
        assert 32 % row["pp"] == 0
        assert 1024 % (row["mbs"] * row["dp"]) == 0 and row["mbs"] & (row["mbs"] - 1) == 0
    layouts = {(r["tp"], r["cp"], r["pp"], r["mbs"]) for r in rows}
    assert len(layouts) == len(rows)
    assert (4, 1, 4, 256) in layouts and (1, 16, 1, 1) in layouts


def test_sweep_csv_and_table(advisor):
    rows = list(csv.DictReader(io.StringIO(advisor("sweep", "--gpus", 8, "--mem", 40, "--format", "csv").stdout)))
    assert rows and ROW_KEYS <= rows[0].keys()
    # The README's CSV columns: the model by name and the options in use (one JSON cell).
    assert rows[0]["model"] == "llama3.1-8b" and json.loads(rows[0]["options"]) == {}
    changed = list(csv.DictReader(io.StringIO(advisor("sweep", "--gpus", 8, "--mem", 40, "--format", "csv",
                                                       "--recompute", "full").stdout)))
    assert json.loads(changed[0]["options"])["recompute"] == "full"
    table = advisor("sweep", "--gpus", 8, "--mem", 40, "--top", 3).stdout
    assert "llama3.1-8b, seq 8192, gbs 1024, 8 GPUs x 40 GiB" in table
    body = read_table(table).body_lines
    assert len(body) == 3 and all(("fits" in line) or ("tight" in line) for line in body)
    assert "(--all shows oom)" in table and "best 3 of" in table


def test_sweep_without_flash_attention_keeps_to_cp_1(advisor):
    """--no-flash-attn on more than one GPU failed outright (CP > 1 needs fused attention);
    it now sweeps the layouts that can run without it."""
    rows = advisor.json("sweep", "--gpus", 8, "--mem", 80, "--no-flash-attn", "--all")
    flash = advisor.json("sweep", "--gpus", 8, "--mem", 80, "--all")
    assert rows and {row["cp"] for row in rows} == {1} and {row["cp"] for row in flash} > {1}
    assert len(rows) == sum(row["cp"] == 1 for row in flash)


def test_sweep_with_nothing_fitting_says_so(advisor):
    """No empty table and exit 0: one line with the least any layout needs, hints the user has not
    already given, and exit status 1 (no result; bad input is 2)."""
    result = advisor("sweep", "--gpus", 8, "--mem", 4, "--model", "llama3.1-70b", expect=1)
    least = min(row["total_gib"] for row in advisor.json("sweep", "--gpus", 8, "--mem", 4, "--model", "llama3.1-70b",
                                                          "--all"))
    assert result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("advisor sweep: nothing fits: 0 fits, 0 tight, ")
    # priced without recomputation, which cannot bring the states under the memory (said so)
    assert f"; the least any layout needs without recomputation is {least:.1f} GiB per GPU against 4 GiB" \
        in result.stderr
    # 70B's weights, gradients and optimizer states alone (about 148 GiB at TP 8, DP 1) exceed 4 GiB: no
    # --seq-len or recomputation helps, and recomputation was searched already
    assert "Try more GPUs or a GPU with more memory (--all shows the rows)" in result.stderr
    narrow = advisor("sweep", "--gpus", 8, "--mem", 4, "--model", "llama3.1-70b", "--recompute", "none",
                     "--split", "even", "--format", "json", expect=1)
    assert narrow.stdout == "[]\n" and "Try more GPUs, --split auto or a GPU with more memory" in narrow.stderr


def test_nothing_fitting_with_calibrated_verdicts_quotes_the_memory_they_judged(advisor):
    """With --gpu the calibrated model judges the rows, so 'the least any layout needs' is its
    usage, not Eq. 18's total (which quoted 10.9 GiB against 186 for a row judged at 1,081)."""
    common = ("sweep", "--gpus", 8, "--gpu", "h100-80gb", "--seq-len", 524288, "--gbs", 8, "--sharding", "fixed")
    result = advisor(*common, expect=1)
    rows = advisor.json(*common, "--all")
    least = min(rows, key=lambda row: row["usage_gib"])
    assert all(row["verdict"] == "oom" for row in rows)
    assert round(least["usage_gib"], 1) != round(min(row["total_gib"] for row in rows), 1)
    layout = f"(TP {least['tp']}, CP {least['cp']}, PP {least['pp']}, MBS {least['mbs']})"
    assert f"; the least any layout needs is {least['usage_gib']:.1f} GiB per GPU against 80 GiB {layout}" \
        in result.stderr


@pytest.mark.parametrize("model", ["llama3.1-70b", "qwen3-30b-a3b"])
def test_nothing_fitting_writes_the_empty_document(advisor, tmp_path, model):
    """Exit 1 with JSON or CSV: the empty document (JSON []; CSV, its header line alone, the
    columns of the rows --all shows: an empty file is no CSV to pandas), the same for a mixture
    of experts as for a dense model (which printed nothing before)."""
    common = ("sweep", "--gpus", 8, "--mem", 5, "--model", model, "--gpu", "h100-80gb")
    assert advisor(*common, "--format", "json", expect=1).stdout == "[]\n"
    target = tmp_path / "rows.csv"
    advisor(*common, "--format", "csv", "-o", target, expect=1)
    every = advisor(*common, "--all", "--format", "csv").stdout  # the oom rows, shown
    header = every.partition("\n")[0]
    assert len(every.splitlines()) > 1 and target.read_text() == header + "\n"
    with target.open(newline="") as rows:
        reader = csv.DictReader(rows)
        assert list(reader) == [] and reader.fieldnames == next(csv.reader([header]))


def test_output_is_written_atomically(advisor, tmp_path):
    target = tmp_path / "sweep.json"
    result = advisor("sweep", "--gpus", 8, "--mem", 40, "--format", "json", "-o", target)
    assert result.stdout == "" and "wrote" in result.stderr
    assert json.loads(target.read_text())[0]["rank"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.json"]


def test_estimate_json_is_a_sweep_row_with_stages(advisor):
    est = advisor.json("estimate", "--tp", 2, "--pp", 4, "--mbs", 1, "--gpus", 64, "--mem", 40)
    assert ROW_KEYS <= est.keys()
    assert [stage["position"] for stage in est["stages"]] == ["first", "middle", "middle", "last"]
    assert est["total_gib"] == max(stage["total_gib"] for stage in est["stages"])
    assert [stage["in_flight_microbatches"] for stage in est["stages"]] == [4, 3, 2, 1]
    for sweep_row in advisor.json("sweep", "--gpus", 64, "--mem", 40, "--all"):
        if (sweep_row["tp"], sweep_row["cp"], sweep_row["pp"]) not in ((2, 1, 4), (1, 1, 8), (4, 2, 2)):
            continue
        # the row's own split, interleaving and recomputation, priced by estimate
        recompute = ["--recompute", sweep_row["recompute"]]
        if sweep_row["recompute"] == "full":
            recompute += ["--recompute-method", sweep_row["recompute_method"], "--recompute-num-layers",
                          sweep_row["recompute_num_layers"]]
        same = advisor.json("estimate", "--tp", sweep_row["tp"], "--cp", sweep_row["cp"], "--pp", sweep_row["pp"],
                            "--mbs", sweep_row["mbs"], "--gpus", 64, "--mem", 40, "--vpp", sweep_row["vpp"],
                            "--layers-per-stage", ",".join(map(str, sweep_row["layers_per_stage"])), *recompute)
        for key in ROW_KEYS - {"rank"} | {"layers_per_stage", "vpp", "recompute", "num_microbatches"}:
            assert same[key] == sweep_row[key], key


def test_estimate_table_shows_every_stage(advisor):
    out = advisor("estimate", "--tp", 2, "--pp", 2, "--dp", 2, "--mem", 40).stdout
    assert "first" in out and "last" in out and "-> " in out


def test_estimate_extensions_reach_the_estimator(advisor):
    """Each option changes the estimate by what its equation says, by hand for Llama-3.1-8B on TP 2,
    DP 2 (L 32, a 32, s 8192, b 1, h 4096, v 128256)."""
    base = advisor.json("estimate", "--tp", 2, "--gpus", 4)["stages"][0]
    gib = 2**30

    def stage(*flags):
        row = advisor.json("estimate", "--tp", 2, "--gpus", 4, *flags)
        assert row["options"], flags
        return row["stages"][0]

    # Eq. 10: Adam's 12 bytes per parameter no longer sharded over DP 2
    assert stage("--no-distributed-optimizer")["optimizer_gib"] == pytest.approx(2 * base["optimizer_gib"])
    assert stage("--grad-dtype", "bf16")["gradients_gib"] == pytest.approx(base["gradients_gib"] / 2)
    # v padded to a multiple of 100 x TP: 128400, 144 more rows in the embedding and the LM head
    assert stage("--vocab-divisible-by", 100)["weights_gib"] - base["weights_gib"] == pytest.approx(
        2 * 144 * 4096 / 2 * 2 / gib)
    # without FlashAttention the softmax output, 2 a s^2 b bytes per layer, and K and V expanded from
    # k = 8 to a = 32 heads of d = 128, 4 s b (a - k) d more than Eq. 11's (equations.expanded_kv_bytes),
    # split over TP: 64 + 1.5 GiB
    assert stage("--no-flash-attn")["activations_gib"] - base["activations_gib"] == pytest.approx(
        32 * (2 * 32 * 8192**2 + 4 * 8192 * (32 - 8) * 128) / 2 / gib) == 65.5
    # without SP the 8 s b h bytes per layer (norm inputs, dropout masks, ...) stay whole per TP rank
    assert stage("--no-sequence-parallel")["layer_activations_gib"] - base["layer_activations_gib"] == pytest.approx(
        32 * 8 * 8192 * 4096 * (1 - 1 / 2) / gib)
    full = stage("--recompute", "full")
    assert full["model_states_gib"] == base["model_states_gib"] and full["activations_gib"] < base["activations_gib"]


def test_models_lists_the_presets(advisor):
    names = {row["name"] for row in advisor.json("models")}
    assert {"llama2-7b", "llama3.1-405b", "llama3.2-1b"} <= names


def test_hf_config_through_the_cli(advisor, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
        "num_hidden_layers": 16, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True,
    }))
    from_file = advisor.json("estimate", "--gpus", 8, "--model", config)
    from_preset = advisor.json("estimate", "--gpus", 8, "--model", "llama3.2-1b")
    assert from_file["total_gib"] == from_preset["total_gib"]


def test_overrides_change_the_model(advisor):
    est = advisor.json("estimate", "--gpus", 8, "--num-layers", 16)
    assert est["model"]["num_layers"] == 16 and est["model"]["name"] == "llama3.1-8b[num_layers=16]"
    # Tables name it whole: rich took '[num_layers=16]' for markup and printed 'llama3.1-8b'.
    table = advisor("sweep", "--gpus", 8, "--mem", 40, "--num-layers", 16).stdout
    assert table.lstrip().startswith("llama3.1-8b[num_layers=16], seq 8192")
    assert "llama3.1-8b[num_layers=16]" in advisor("estimate", "--gpus", 8, "--num-layers", 16).stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["sweep", "--gpus", 64, "--mem", 40, "--model", "llama5-8b"], "unknown model 'llama5-8b'"),
        # a Hugging Face id with no preset of its own: the line says how to price it from its config.json
        (["sweep", "--gpus", 8, "--mem", 80, "--model", "meta-llama/Llama-3.1-8B-Instruct"],
         "unknown model 'meta-llama/Llama-3.1-8B-Instruct'; did you mean llama3.1-8b, llama3.1-70b, llama3-8b? "
         "(a Hugging Face model: huggingface-cli download meta-llama/Llama-3.1-8B-Instruct config.json "
         "--local-dir DIR, then --model DIR"),
        (["sweep", "--gpus", 0, "--mem", 40], "'--gpus': must be at least 1, got 0"),
        (["sweep", "--gpus", 8, "--mem", 0], "'--mem'"),
        (["sweep", "--gpus", 8, "--mem", 40, "--seq-len", -1], "'--seq-len'"),
        (["sweep", "--gpus", 8, "--mem", 40, "--num-layers", 0], "'--num-layers'"),
        (["sweep", "--gpus", 3, "--mem", 40, "--split", "even"], "no valid (TP, CP, PP, MBS) for 3 GPUs"),
        (["sweep", "--gpus", 8], "give --mem GIB or --gpu NAME"),
        (["sweep", "--gpus", 8, "--mem", 40, "--vpp", "two"], "--vpp must be auto or a positive integer, got 'two'"),
        (["sweep", "--gpus", 8, "--mem", 40, "--vpp", "0"], "--vpp must be auto or a positive integer, got '0'"),
        (["sweep", "--gpus", 8, "--mem", 40, "--recompute-num-layers", 2], "need --recompute full"),
        (["sweep", "--gpus", 1, "--mem", 80, "--vpp", 2], "VPP 2 needs PP > 1"),
        (["sweep", "--gpus", 8, "--gpu", "h100"], "unknown GPU 'h100'; did you mean"),
        (["sweep", "--gpus", 8, "--mem", 40, "--tokens", "15T"], "--tokens needs --gpu NAME"),
        (["sweep", "--gpus", 8, "--mem", 40, "--rank-by", "throughput"], "--rank-by throughput needs --gpu"),
        (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "lots"], "is not a token count"),
        # a count without its unit (15 for 15T): less than one step's 1024 x 8192 = 8,388,608 tokens
        (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "15"],
         "--tokens 15 is less than one step's 8,388,608 tokens (--gbs 1024 x --seq-len 8192): a budget counts tokens"),
        # 256 x 4096 = 1,048,576 tokens a step; 1M = 1,000,000 is less
        (["estimate", "--tp", 2, "--gpus", 8, "--gpu", "h100-80gb", "--gbs", 256, "--seq-len", 4096, "--tokens", "1M"],
         "--tokens 1,000,000 is less than one step's 1,048,576 tokens (--gbs 256 x --seq-len 4096)"),
        (["sweep", "--gpus", 64, "--gpu", "h100-80gb", "--model", "mixtral-8x7b", "--tokens", "300"],
         "--tokens 300 is less than one step's 8,388,608 tokens"),
        (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--tokens", "-3T"], "must be a positive"),
        (["sweep", "--gpus", 8, "--gpu", "h100-80gb", "--mem", 0], "'--mem'"),
        (["estimate", "--tp", 2, "--gpus", 8, "--gpu", "a100"], "unknown GPU 'a100'"),
        (["estimate", "--tp", 2, "--gpus", 7], "--gpus 7 is not divisible by TP x CP x PP = 2 x 1 x 1 = 2"),
        (["estimate", "--tp", 2], "give --gpus or --dp"),
        (["estimate", "--tp", 2, "--gpus", 8, "--dp", 2], "--dp 2 disagrees"),
        (["estimate", "--pp", 2, "--gpus", 8, "--layers-per-stage", "a,b"], "comma-separated layer counts"),
        (["estimate", "--pp", 4, "--gpus", 8, "--layers-per-stage", "8,8"], "lists 2 stages, but PP is 4"),
        (["estimate", "--gpus", 8, "--num-query-groups", 5], "multiple of num_query_groups"),
        (["sweep", "--gpus", 8, "--mem", 40, "-o", "/nonexistent/dir/x.json"], "no such directory: /nonexistent/dir"),
    ],
)
def test_bad_input_gets_one_line_and_status_2(advisor, args, message):
    assert message in advisor.error(*args)


def test_bad_config_files(advisor, tmp_path):
    malformed = tmp_path / "bad.json"
    malformed.write_text("{not json")
    assert "malformed JSON" in advisor.error("sweep", "--gpus", 8, "--mem", 40, "--model", malformed)
    incomplete = tmp_path / "config.json"
    incomplete.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    assert "missing required key(s): num_hidden_layers" in advisor.error(
        "sweep", "--gpus", 8, "--mem", 40, "--model", incomplete
    )
    assert "no such file" in advisor.error("sweep", "--gpus", 8, "--mem", 40, "--model", tmp_path / "none.json")


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                    max_leaves=20))
def test_json_documents_read_back_as_written(document):
    """render.to_json (every JSON the CLI writes): what json reads back is the document; each line
    holds one key of an object, one element of an array of containers, or a whole array of scalars."""
    import json

    from advisor.render import to_json

    text = to_json(document)
    assert json.loads(text) == document and text.endswith("\n")
    if isinstance(document, dict) and document:
        assert len(text.splitlines()) >= len(document) + 2
    if isinstance(document, list) and any(isinstance(item, (dict, list)) for item in document):
        assert [json.loads(line.strip().rstrip(",")) for line in text.splitlines()[1:-1]] == document


def test_megatron_spellings_mean_the_same_as_the_short_options(advisor):
    """A Megatron-LM user types --tensor-model-parallel-size, --micro-batch-size, --seq-length:
    click's 'did you mean' pointed at other options."""
    short = advisor.json("estimate", "--tp", 2, "--pp", 2, "--cp", 2, "--mbs", 2, "--seq-len", 4096, "--gbs", 64,
                         "--vpp", 2, "--recompute", "selective", "--gpus", 16, "--gpu", "h100-80gb")
    megatron = advisor.json("estimate", "--tensor-model-parallel-size", 2, "--pipeline-model-parallel-size", 2,
                            "--context-parallel-size", 2, "--micro-batch-size", 2, "--seq-length", 4096,
                            "--global-batch-size", 64, "--num-virtual-stages-per-pipeline-rank", 2,
                            "--recompute-granularity", "selective", "--gpus", 16, "--gpu", "h100-80gb")
    assert megatron == short and short["vpp"] == 2 and short["seq_len"] == 4096
    moe = ["estimate", "--model", "mixtral-8x7b", "--gpus", 16, "--gpu", "h100-80gb"]
    assert advisor.json(*moe, "--expert-model-parallel-size", 8, "--expert-tensor-parallel-size", 2) == \
        advisor.json(*moe, "--ep", 8, "--etp", 2)
    assert "--tp, --tensor-model-parallel-size" in advisor("estimate", "--help").stdout


@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_megatron_training_flag_spellings_set_the_advisor_value(advisor, command):
    """The README promises Megatron's flag names; --use-distributed-optimizer,
    --make-vocab-size-divisible-by and --untie-embeddings-and-output-weights were refused."""
    base = [command, "--gpus", 8, "--gpu", "h100-80gb", "--model", "llama2-7b",
            *(["--tp", 2] if command == "estimate" else ["--top", 3])]
    cases = [  # Megatron's spelling, the advisor's, and a value they must differ from
        (["--no-distributed-optimizer", "--use-distributed-optimizer"], ["--distributed-optimizer"],
         ["--no-distributed-optimizer"]),
        (["--make-vocab-size-divisible-by", 128], ["--vocab-divisible-by", 128], []),
        (["--tie-embeddings", "--untie-embeddings-and-output-weights"], ["--untie-embeddings"], ["--tie-embeddings"])]
    for megatron, ours, other in cases:
        assert advisor.json(*base, *megatron) == advisor.json(*base, *ours) != advisor.json(*base, *other)


def test_megatron_flag_that_means_something_else_says_why(advisor):
    """Megatron Core ignores --use-flash-attn; it is no spelling of --flash-attn."""
    message = advisor.error("estimate", "--tp", 2, "--gpus", 8, "--use-flash-attn")
    assert "Megatron Core ignores --use-flash-attn" in message and "--attention-backend unfused" in message


def test_json_as_other_tools_spell_it_points_at_format_json(advisor):
    """click's close-name hint does not reach --format from --json."""
    for command in (["sweep", "--gpus", 8], ["models"]):
        message = advisor.error(*command, "--json")
        assert "no such option: --json (machine-readable output is --format json)" in message


@pytest.mark.parametrize("given, advice", [
    (["--fp8", "hybrid"], "--fp8-format hybrid|e4m3"),
    (["--recompute-activations"], "give --recompute selective"),
    (["--num-layers-per-virtual-pipeline-stage", 2], "--vpp N"),
])
def test_flags_a_megatron_user_types_point_to_the_option(advisor, given, advice):
    """They got click's guess ('Did you mean one of: --ep, --pp, --tp?' for --fp8)."""
    message = advisor.error("estimate", "--tp", 2, "--gpus", 8, "--mem", 80, *given)
    assert advice in message and "Did you mean" not in message


@pytest.mark.parametrize("command", [["estimate", "--gpus", 8, "--mem", 80, "--pp", 2], ["sweep", "--gpus", 8],
                                     ["recommend", "--gpus", 8, "--pp", 2]], ids=["estimate", "sweep", "recommend"])
@pytest.mark.parametrize("given", [["--decoder-first-pipeline-num-layers", 15], ["--decoder-last-pipeline-num-layers", 15],
                                   ["--pipeline-model-parallel-layout", "Et*15|t*17L"],
                                   ["--account-for-embedding-in-pipeline-split"], ["--account-for-loss-in-pipeline-split"]],
                         ids=lambda given: given[0])
def test_megatrons_uneven_split_flags_point_to_layers_per_stage(advisor, command, given):
    """They got click's guess: 'Did you mean --recompute-num-layers?' for --decoder-first-pipeline-num-layers."""
    message = advisor.error(*command, *given)
    assert message.startswith(f"Error: Megatron's uneven pipeline split ({given[0]}) is advisor estimate's "
                              "--layers-per-stage N,N,... (each stage's layers); sweep and recommend choose the split "
                              "themselves; a whole Megatron command that sets it: advisor estimate --from-command FILE")
    assert "Did you mean" not in message


@pytest.mark.parametrize("command, says", [
    (["recommend", "--gpus", 8, "--mem", 80], "recommend plans without interleaving"),
    (["report"], "report takes no virtual pipeline stages (no --vpp)"),
])
def test_interleaving_advice_fits_the_command(advisor, command, says):
    """recommend has no --vpp: 'give --vpp N' sent the user to an option it refuses; it points to sweep and
    estimate instead, which price interleaved layouts."""
    message = advisor.error(*command, "--num-layers-per-virtual-pipeline-stage", 2)
    assert says in message and "'advisor sweep --vpp auto|N' and 'advisor estimate --vpp N'" in message
    assert "give the virtual stages per rank" not in message


def test_every_megatron_spelling_names_an_option():
    from advisor.cli import COMMANDS, cli
    from advisor.cli.spellings import MEGATRON_SPELLINGS

    import click

    def names(command):
        own = {name for param in command.params
               for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]}
        return own.union(*(names(sub) for sub in getattr(command, "commands", {}).values()))

    ctx = click.Context(cli)
    known = set().union(*(names(cli.get_command(ctx, name)) for name in COMMANDS))
    assert set(MEGATRON_SPELLINGS.values()) <= known


def test_output_and_plot_must_be_two_png_files_apart(advisor, tmp_path):
    """--plot draws a PNG, so it wants a .png name (matplotlib wrote one into 'p.txt'); -o and
    --plot naming one file wrote both there, the picture last. Refused before any work, nothing
    written."""
    common = ("sweep", "--gpus", 8, "--gpu", "h100-80gb")
    assert "name a file ending in .png, not" in advisor.error(*common, "--plot", tmp_path / "p.txt")
    same = tmp_path / "same.png"
    line = advisor.error(*common, "--format", "json", "-o", same, "--plot", tmp_path / "." / "same.png")
    # a .png name for -o is refused first (it would get JSON), so the two can never meet
    assert line == f"Error: --format json would write JSON into {same}: name the file {tmp_path / 'same.json'}"
    assert list(tmp_path.iterdir()) == []
    advisor(*common, "--format", "json", "-o", tmp_path / "rows.json", "--plot", tmp_path / "rows.PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.PNG", "rows.json"]


@pytest.mark.parametrize("model", [(), ("--model", "mixtral-8x7b")])
def test_plot_where_nothing_fits_says_why_and_exits_1(advisor, tmp_path, model):
    """Nothing fits is exit status 1 with the line saying why, --plot or not; it was exit 2 with
    '--plot: no rows to draw' and no why (a newcomer's report). No picture is written."""
    picture = tmp_path / "rows.png"
    result = advisor("sweep", *model, "--gpus", 8, "--mem", 1, "--plot", picture, expect=1)
    first, why = result.stderr.splitlines()
    assert first == f"--plot: {picture} not written: no row to draw (--all draws the oom ones)"
    assert why.startswith("advisor sweep: nothing fits: 0 fits, 0 tight, ") and "Traceback" not in result.output
    assert not picture.exists()


def test_recommend_png_is_a_png_file_of_its_own(advisor, tmp_path):
    """recommend --png, as sweep --plot: a .png name, and not the file -o writes."""
    common = ("recommend", "--gpus", 8, "--pp", 4, "--mem", 80)
    assert "name a file ending in .png, not" in advisor.error(*common, "--png", tmp_path / "plan.txt")
    line = advisor.error(*common, "-o", tmp_path / "plan.png", "--png", tmp_path / "plan.png")
    # -o gets the plan's JSON, so a .png name for it is refused before the two are compared
    assert line == f"Error: advisor recommend would write JSON into {tmp_path / 'plan.png'}: name the file " \
                   f"{tmp_path / 'plan.json'}"  # no remedy of --png: it is given
    assert list(tmp_path.iterdir()) == []
    assert advisor.error(*common, "-o", tmp_path / "plan.png").endswith("or give --png FILE.png for the picture")


def test_a_png_name_for_output_points_at_the_commands_picture(advisor, tmp_path):
    """-o x.png meant a picture (newcomer review: the remedy offered x.txt alone): the command's
    own picture option (sweep's --plot), else, for rows, the report's page (estimate draws none)."""
    path = tmp_path / "x.png"
    assert advisor.error("sweep", "--gpus", 8, "--mem", 80, "-o", path) == (
        f"Error: --format table would write a table into {path}: name the file {tmp_path / 'x.txt'}, "
        "or give --plot FILE.png for the picture")
    assert advisor.error("estimate", "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--mem", 80, "-o", path) == (
        f"Error: --format table would write a table into {path}: name the file {tmp_path / 'x.txt'}, "
        "or use 'advisor report' for a page with its pictures")
    assert list(tmp_path.iterdir()) == []


def test_a_count_of_one_is_singular(advisor):
    """'1 layouts considered' under a pinned sweep, '1 rows' in the report of an estimate."""
    from advisor.render import counted

    assert (counted(1, "layout"), counted(0, "row"), counted(3862, "layout")) == ("1 layout", "0 rows", "3,862 layouts")
    out = advisor("sweep", "--gpus", "8", "--mem", "80", "--tp", "8", "--pp", "1", "--cp", "1", "--mbs", "1",
                  "--recompute", "none", "--vpp", "1").stdout
    assert "1 layout considered (" in out, out
