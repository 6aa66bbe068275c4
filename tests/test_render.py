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


def test_an_option_hint_is_not_broken_between_the_option_and_its_value():
    from advisor.render import Column, to_table

    # 'best 5 of 1,889 shown (--top N)' at 80 columns broke after '(--top' (the newcomer review)
    caption = "881 fits, 109 likely fits, 41 likely oom, 1,229 oom (--all shows oom); best 5 of 1,889 shown (--top N)"
    broke = 0
    for width in range(30, 110):
        lines = to_table([{"a": 1}], [Column("a", "a")], caption=caption, width=width).rstrip("\n").split("\n")
        assert all(len(line) <= width for line in lines), width
        assert sum("(--top N)" in line for line in lines) == 1, width
        assert " ".join(lines[5:]) == caption  # the caption's words, none lost or joined
        broke += lines[5].endswith("shown") or any(line.startswith("(--top N)") for line in lines)
    assert broke  # some width puts the hint at a line's start: it moved whole


def test_a_wrapped_caption_keeps_units_labels_and_verdicts_with_their_values():
    """At 80 columns an estimate's caption ended a line with 'bubble 5.39' and began the next with
    's,'; at 30 one broke 'PP' from its '1' and 'ep' from 'comm'. A number stays with its unit, a
    degree with its value or its comm, an arrow with the verdict it leads to, at any width."""
    from advisor.render import Column, memory_call_text, step_text, to_table

    timing = {"step_time_s": 25.29, "tflops_per_gpu": 430.2, "mfu": 0.43, "tokens_per_s": 331657.0}
    parts = {"compute_s": 20.19, "tp_comm_s": 4.24, "pp_comm_s": 0.36, "bubble_s": 5.39}
    title = "mixtral-8x7b: TP 2, CP 1, PP 1, EP 8, ETP 2, DP 32 (expert DP 4), MBS 1, seq 8192, gbs 1024"
    caption = ("peak: stage 0, 61.34 GiB (analytic)" + memory_call_text(80, "likely fits", usage_gib=74.7)
               + "\n" + step_text(timing, parts))
    whole = ["TP 2", "PP 1", "ETP 2", "DP 32", "DP 4", "MBS 1", "seq 8192", "gbs 1024", "stage 0", "61.34 GiB",
             "80 GiB", "+5.3 GiB", "-> likely fits", "25.29 s", "430 TFLOP/s per GPU", "MFU 43%", "331,657 tokens/s",
             "20.19 s", "tp comm 4.24 s", "pp comm 0.36 s", "5.39 s"]
    for width in range(30, 110):
        lines = to_table([{"a": 1}], [Column("a", "a")], title=title, caption=caption, width=width).split("\n")
        assert all(len(line) <= width for line in lines), width
        assert " ".join(lines).split() == [*title.split(), "+---+", "|", "a", "|", "+---+", "|", "1", "|", "+---+",
                                           *caption.split()]  # no word lost or joined
        for phrase in whole:
            assert any(phrase in line for line in lines), (width, phrase, lines)


def test_the_note_of_columns_left_out_keeps_each_header_on_one_line():
    """A header of two words wrapped at its space ('... act., margin' / 'GiB, step s') read as two
    columns, 'GiB' one of its own."""
    from advisor.render import Column, to_table

    headers = ["rank", "states GiB", "act. GiB", "used GiB", "margin GiB", "in flight", "step s", "TFLOP/s/GPU"]
    columns = [Column(f"c{i}", header, drop=i) for i, header in enumerate(headers)]
    row = {f"c{i}": 123456 for i in range(len(headers))}
    for width in range(30, 90):
        text = to_table([row], columns, width=width)
        note = text[text.index("not shown"):].rstrip("\n").split("\n")
        assert " ".join(note).startswith(f"not shown to fit {width} columns: "), text
        hidden = " ".join(note).split(": ", 1)[1].removesuffix(" (--wide shows them)").split(", ")
        assert hidden and all(header in headers for header in hidden), text
        assert all(any(header in line for line in note) for header in hidden), text


def test_a_columns_unit_stands_under_its_header_at_no_cost_in_width():
    """Each column says its unit, on the header's second line, whatever the width leaves out, and
    the caption names a column left out with it ('margin GiB')."""
    from table_text import read_table

    from advisor.render import Column, to_table

    rows = [{"rank": 1, "margin": 22.25, "tflops": 507.4, "verdict": "fits"}]
    plain = [Column("rank", "rank"), Column("margin", "margin", "+.1f"), Column("tflops", "TFLOP/s", ".0f", drop=1),
             Column("verdict", "verdict", justify="left")]
    united = [plain[0], Column("margin", "margin", "+.1f", unit="GiB"),
              Column("tflops", "TFLOP/s", ".0f", drop=1, unit="per GPU"), plain[3]]
    text = to_table(rows, united, width=100)
    lines = text.split("\n")
    assert lines[1:3] == ["| rank | margin | TFLOP/s | verdict |", "|      |    GiB | per GPU |         |"]
    assert len(lines[0]) == len(to_table(rows, plain, width=100).split("\n")[0])  # no wider for its units
    table = read_table(text)
    assert table.headers == ["rank", "margin GiB", "TFLOP/s per GPU", "verdict"]
    assert table.records() == [{"rank": "1", "margin GiB": "+22.2", "TFLOP/s per GPU": "507", "verdict": "fits"}]
    narrow = read_table(to_table(rows, united, width=30))
    assert narrow.headers == ["rank", "margin GiB", "verdict"]
    assert narrow.caption == "not shown to fit 30 columns: TFLOP/s per GPU (--wide shows them)"
