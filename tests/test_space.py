"""advisor.space: the launchable space, its pruning, and the closed forms it relies on."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.memory import MemoryOptions, StageModel
from advisor.models import PRESETS
from advisor.splits import caps


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4]), st.integers(1, 32), st.integers(0, 40), st.integers(1, 4),
       st.floats(1.0, 200.0), st.booleans(), st.integers(1, 6), st.sampled_from([1, 2, 3]))
def test_the_closed_form_inverse_is_the_bisection(model, tp, cp, pp, recompute, mbs, gib, sequence_parallel, vpp,
                                                  groups):
    """StageModel.most_layers (lines in q and r, then corrected) = bisection over n on total()."""
    spec = PRESETS[model]
    vpp = vpp if pp > 1 else 1
    options = MemoryOptions(sequence_parallel=sequence_parallel, recompute_method="block")
    stage = np.arange(pp)[None, :]
    model = StageModel(spec, 8192, options, tp=tp, cp=cp, dp=4, mbs=mbs, pp=pp, vpp=vpp,
                       num_microbatches=groups * pp, stage=stage, recompute_layers=recompute)
    low, high = np.full((1, pp), vpp, np.int64), np.full((1, pp), spec.num_layers, np.int64)
    bound = np.full((1, 1), gib * 2**30)
    closed = model.most_layers(bound, low, high)
    assert (closed == caps(model.total, bound, low, high)).all()
    every = np.arange(vpp, spec.num_layers + 1)[:, None]
    within = model.total(every) <= bound[0, 0]  # (L, pp): rank i holding n layers
    assert closed[0].tolist() == [int(every[within[:, i], 0].max(initial=vpp - 1)) for i in range(pp)]
