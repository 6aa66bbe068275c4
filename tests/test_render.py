"""advisor.render: the lines the estimates print, from hand-made values."""


def test_the_step_line_says_which_peak_an_fp8_runs_mfu_is_of():
    from advisor.render import step_text

    timing = {"step_time_s": 6.374, "tflops_per_gpu": 715.4, "mfu": 715.4 / 989, "tokens_per_s": 161931.0}
    parts = {"total_s": 6.374, "compute_s": 4.23, "bubble_s": 0.2, "dp_comm_s": 0.0}
    # 715.4 / 989 = 72.3%; the parts without the total and the zero ones
    assert step_text(timing, parts) == ("step 6.37 s, 715 TFLOP/s per GPU (MFU 72%), 161,931 tokens/s; "
                                        "compute 4.23 s, bubble 0.20 s")
    assert "(MFU 72% of the BF16 peak)" in step_text(timing, parts, {"fp8_format": "hybrid"})
    assert step_text(timing, parts, {"fp8_format": None}) == step_text(timing, parts)


def test_a_long_overridden_model_name_wraps_between_its_fields():
    from advisor.render import Column, to_table

    name = "llama3.1-8b[num_layers=8,hidden_size=256,num_attention_heads=4]"
    text = to_table([{"a": 1}], [Column("a", "a")], title=f"{name}: 12,376 layouts considered", width=44)
    title = text.split("\n")[:3]
    # the name is 64 characters, the first line 41 of 44: it breaks after a field's comma, never inside 'hidden_size=256'
    # or inside the number 12,376
    assert title == ["llama3.1-8b[num_layers=8,hidden_size=256,", "num_attention_heads=4]: 12,376 layouts",
                     "considered"]


def test_tables_are_ascii_where_standard_output_cannot_encode_box_drawing():
    """A box-drawing character is one column but three bytes in UTF-8; where standard output is
    ASCII (PYTHONIOENCODING=ascii) the same table is drawn in ASCII: every line within 100 bytes,
    the same width in columns as the UTF-8 table."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "advisor", "sweep", "--gpus", "8", "--mem", "80", "--top", "3"]

    def lines(encoding: str) -> list[str]:
        env = {**os.environ, "COLUMNS": "100", "PYTHONIOENCODING": encoding}
        result = subprocess.run(command, capture_output=True, env=env, check=True)
        return result.stdout.decode(encoding).splitlines()

    ascii_lines, utf8_lines = lines("ascii"), lines("utf-8")
    assert all(len(line.encode()) <= 100 for line in ascii_lines)
    assert any(line.startswith("+---") for line in ascii_lines)
    assert [len(line) for line in ascii_lines] == [len(line) for line in utf8_lines]
    assert any(len(line.encode()) > 100 for line in utf8_lines)  # the box drawing: 3 bytes a column
