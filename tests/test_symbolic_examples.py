"""The committed real-size symbolic profiles and the README's comparison made from them (no torch)."""

from advisor.profiles import load_run
from conftest import ROOT
from tables import symbolic


def test_readme_comparison_is_what_the_committed_profiles_give():
    assert symbolic.section() in (ROOT / "README.md").read_text()


def test_the_examples_are_the_runs_their_commands_describe():
    for name, (_, flags) in symbolic.RUNS.items():
        run = load_run(symbolic.EXAMPLES / name)
        h = run.header
        assert run.status == "ok" and h.run_id == name and h.backend == "symbolic" and h.kernels == "cuda"
        assert (h.seq_len, h.params_dtype, h.layer_spec, h.distributed_optimizer) == (8192, "bfloat16",
                                                                                     "transformer_engine", True)
        assert h.parallel.tp == (int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1)
        assert h.parallel.cp == (int(flags[flags.index("--cp") + 1]) if "--cp" in flags else 1)
        stages = {r.header.coords["pp"] for r in run.ranks}
        assert len(run.ranks) == len(stages) * h.parallel.tp * h.parallel.cp
        assert all(layer.forward_time_s is None for r in run.ranks for layer in r.layers)
        assert f"--run-id {name}" in (symbolic.EXAMPLES / "README.md").read_text()
