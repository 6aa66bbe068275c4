"""A hidden size that is no multiple of the heads is refused with advice the user can follow
where the model came from: no advisor command has --kv-channels, which the errors named ("or give
kv_channels" after --hidden-size 7; "or give head_dim (--kv-channels)" for a config.json)."""

import json

from conftest import ROOT


def test_override_names_the_config_key(advisor):
    # llama3.1-8b has 32 heads; 7 is no multiple of 32
    line = advisor.error("sweep", "--gpus", "8", "--mem", "80", "--hidden-size", "7")
    assert line == ("Error: model 'llama3.1-8b[hidden_size=7]': hidden_size = 7 must be a multiple of "
                    "num_attention_heads = 32, or give head_dim in a config.json (--model FILE)")


def test_config_json_names_its_key_only(advisor, tmp_path):
    config = json.loads((ROOT / "tests" / "fixtures" / "hf_configs" / "llama3.2-1b.json").read_text())
    config.update(num_attention_heads=30, num_key_value_heads=10)  # 2048 / 30 is no integer
    config.pop("head_dim", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    line = advisor.error("sweep", "--gpus", "8", "--mem", "80", "--model", path)
    assert line == (f"Error: {path}: hidden_size = 2048 must be a multiple of num_attention_heads = 30, "
                    "or give head_dim")


def test_megatron_command_names_megatrons_flags(advisor, tmp_path):
    command = tmp_path / "train.sh"
    command.write_text("pretrain_gpt.py --num-layers 4 --hidden-size 250 --num-attention-heads 30 --seq-length 128 "
                       "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
                       "--tensor-model-parallel-size 1 --vocab-size 1000 --tokenizer-type NullTokenizer\n")
    line = advisor.error("estimate", "--from-command", command, "--gpus", "8", "--mem", "80")
    assert line == ("Error: --from-command train.sh: --hidden-size = 250 must be a multiple of --num-attention-heads = "
                    "30, or give --kv-channels")
