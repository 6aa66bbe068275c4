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
