"""CAPTURE-style memory profiling, prediction and partitioning (seed 000), for Megatron-LM.

Pure Python; numpy and matplotlib are imported only by the modules that compute or draw, which
the CLI imports inside its commands. Never torch.

    layout          Scenario (per-stage TP/DP), StageSpec, PipelineLayout, 1F1B in-flight counts
    partitionings   Description 1 (generalised) and the reduced set of profiling partitionings
    campaign        the profiling campaign (JSON schema megatron-4d-advisor/campaign v1)
    coverage        which M_i / M_a a set of measured layer ranges yields
    observations    profile runs -> checked per-stage observations (ProfileSet, observe_run)
    statistics      M_i, M_a (III-A1) and the layer merger (III-A3)
    fits            Description 2's line, III-B3's a + b ln d, and F + A/d
    predictor       the interface both predictors share
    predict_capture CAPTURE's predictor (III-B), position-free
    predict_1f1b    the 1F1B-aware predictor from hook-measured module terms
    costs           stage-cost tables, the planners' input
    search          the exact planner (min-max DP with CAPTURE's tie-break), both modes
    algorithm4      CAPTURE's Algorithm 4 by enumeration, with its pruning
    recommend       predictor -> planner -> Plan, Megatron and hybrid modes
    plan            the plan (JSON schema megatron-4d-advisor/plan v1)
    chart           per-GPU memory PNG (like CAPTURE's Fig. 6)
    cli             advisor profile plan, advisor recommend
"""
