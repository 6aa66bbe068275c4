"""Plans checked against themselves before anything launches them (advisor.capture.plan.check_plan):
hand-edited plans that stock Megatron-LM would launch as something else, or not at all."""

import copy
import json

import pytest
from launch_support import plan_files

from advisor.capture.plan import split_from_args
from advisor.errors import AdvisorError
from launch.inputs import read_input


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from conftest import Invoker

    files = plan_files(Invoker(), tmp_path_factory.mktemp("plans"))
    return {name: json.loads(path.read_text()) for name, path in files.items()}


def _args(document, old, new):
    args = document["megatron_args"]
    index = args.index(old)
    document["megatron_args"] = args[:index] + new + args[index + 2:]


def _stage(document, index, **changes):
    document["stages"][index].update(changes)


# pp4: layers 2/2/3/1 with --pipeline-model-parallel-layout; pp3-tp2: 3/3/2, TP 2, DP 2, last stage flag.
@pytest.mark.parametrize("name,edit,message", [
    ("pp3-tp2", lambda d: _stage(d, 1, tp=4, dp=1),
     "stage 1 has TP 4, DP 1, CP 1, but the plan is marked launchable with TP 2, DP 2, CP 1 on every stage"),
    ("pp4", lambda d: _args(d, "--pipeline-model-parallel-layout", []),
     "its megatron_args make Megatron-LM build 2/2/2/2 layers per stage, its layers_per_stage say 2/2/3/1"),
    ("pp4", lambda d: _args(d, "--pipeline-model-parallel-layout", ["--pipeline-model-parallel-layout",
                                                                    "E,t*3|t|t*3|t,L"]),
     "build 3/1/3/1 layers per stage, its layers_per_stage say 2/2/3/1"),
    ("pp3-tp2", lambda d: _args(d, "--decoder-last-pipeline-num-layers", ["--decoder-first-pipeline-num-layers", "2"]),
     "build 2/3/3 layers per stage, its layers_per_stage say 3/3/2"),
    ("pp3-tp2", lambda d: _args(d, "--decoder-last-pipeline-num-layers", ["--decoder-last-pipeline-num-layers", "x"]),
     "--decoder-last-pipeline-num-layers 'x' is not a layer count"),
    ("pp4", lambda d: _stage(d, 0, gpus=[-1]), "stage 0: GPU -1 is not in the plan's world of 4 (0..3)"),
    ("pp4", lambda d: _stage(d, 2, gpus=[1]), "stage 2: GPU 1 is also stage 1's"),
    ("pp4", lambda d: _stage(d, 3, gpus=[7]), "stage 3: GPU 7 is not in the plan's world of 4"),
    # in JSON's words: the string '3' read as GPU 3, which is in the world; a newline split the line
    ("pp4", lambda d: _stage(d, 3, gpus=["3"]), "stage 3: GPU '3' is not in the plan's world"),
    ("pp4", lambda d: _stage(d, 3, gpus=["3\n"]), "stage 3: GPU '3\\n' is not in the plan's world"),
    ("pp3-tp2", lambda d: (_stage(d, 0, gpus=[1, 0, 3, 2]), _stage(d, 1, gpus=[8, 9, 10, 11]),
                           _stage(d, 2, gpus=[4, 5, 6, 7])), "stage 1's GPUs are not Megatron's ranks 4..7"),
    ("pp4", lambda d: _stage(d, 1, first_layer=4, last_layer=5), "stage 1: layers 4..5 do not follow on"),
    ("pp4", lambda d: _stage(d, 1, stage=2), "stage 1: 'stage' is 2; stages are listed in order"),
    ("pp4", lambda d: _stage(d, 1, gpus=[1, 2]), "stage 1: 'gpus' must list TP x DP x CP = 1 GPUs"),
    ("pp4", lambda d: _stage(d, 1, tp="1"), "'tp' must be an integer, got '1'"),
    ("pp4", lambda d: d["stages"].pop(), "'stages' must list one stage per entry of layers_per_stage (4)"),
    ("pp4", lambda d: d.update(num_microbatches=3), "'global_batch_size' is 8, but micro_batch_size x DP x "
                                                    "num_microbatches = 2 x 1 x 3 = 6"),
])
def test_inconsistent_plans_are_refused_before_launch(tmp_path, plans, name, edit, message):
    document = copy.deepcopy(plans[name])
    edit(document)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    with pytest.raises(AdvisorError) as error:
        read_input(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_plans_the_recommender_writes_pass(plans, tmp_path):
    for name in ("pp4", "pp3", "pp3-tp2"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(plans[name]))
        assert read_input(path).layers_per_stage == tuple(plans[name]["layers_per_stage"])


@pytest.mark.parametrize("args,pp,split", [
    ([], 4, (8, 8, 8, 8)),
    (["--decoder-first-pipeline-num-layers", "6"], 3, (6, 13, 13)),
    (["--decoder-last-pipeline-num-layers=4"], 3, (14, 14, 4)),
    (["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "6"], 4, (2, 12, 12, 6)),
    (["--pipeline-model-parallel-layout", "E,t*5|t*9|t*9|t*9,L"], 4, (5, 9, 9, 9)),
    (["--pipeline-model-parallel-layout", "Et|(tt|)*2t,L"], 4, (1, 2, 2, 1)),
    # PP 2 with both ends given, as advisor recommend writes an uneven split (no middle stage:
    # transformer_config.py checks the middle only when there is one)
    (["--decoder-first-pipeline-num-layers", "14", "--decoder-last-pipeline-num-layers", "18"], 2, (14, 18)),
])
def test_the_split_megatron_builds_from_its_flags(args, pp, split):
    """Megatron-LM's own readings of these flags (its layout parser expands 't*n' and '(..)*n')."""
    assert split_from_args(args, 32, pp, "x") == split


def test_an_impossible_split_is_refused():
    with pytest.raises(AdvisorError, match="cannot split 32 layers over PP 3 with an even split"):
        split_from_args([], 32, 3, "x")
    with pytest.raises(AdvisorError, match="cannot split 32 layers over PP 2 with first stage 14, last stage 17"):
        split_from_args(["--decoder-first-pipeline-num-layers", "14", "--decoder-last-pipeline-num-layers", "17"],
                        32, 2, "x")


def test_a_recommended_uneven_pp2_plan_launches(advisor, tmp_path):
    """advisor recommend writes both end counts for an uneven PP 2 split; advisor-launch reads its
    own plan back (it refused it before)."""
    from launch_support import launcher
    from megatron_real import checkout as real_checkout

    plan = tmp_path / "plan.json"
    advisor("recommend", "--model", "llama3.2-1b", "--gpus", "8", "--pp", "2", "--mem", "80", "-o", plan)
    args = json.loads(plan.read_text())["megatron_args"]
    assert "--decoder-first-pipeline-num-layers" in args and "--decoder-last-pipeline-num-layers" in args
    checkout = real_checkout("core_v0.15.2").path
    out = launcher()("torchrun", "--from", plan, "--megatron-lm", checkout, "--dry-run").stdout
    assert "--decoder-last-pipeline-num-layers" in out
