"""launch.megatron_versions: the releases as data, read from real checkouts where they are here."""

from dataclasses import replace

import pytest
from launch_support import make_checkout
from megatron_real import SHARED

from advisor.errors import AdvisorError
from advisor.models import PRESETS
from launch.arguments import compose
from launch.megatron_versions import (
    VERSIONS, LaunchShape, environment, named, of_checkout, read_version,
)

OLD, NEW = VERSIONS


@pytest.mark.parametrize("tag,version,rules", [("core_v0.15.2", (0, 15, 2), OLD), ("core_v0.19.0", (0, 19, 1), NEW)])
def test_the_version_is_parsed_from_the_real_package_info(tag, version, rules):
    """core_v0.19.0's package_info.py says 0.19.1 (and, imported, would append the git hash of the
    repository it sits in): it is parsed, never imported."""
    checkout = SHARED / tag
    if not checkout.is_dir():
        pytest.skip(f"no Megatron-LM checkout at {checkout}")
    assert read_version(checkout) == version and of_checkout(checkout) is rules


def test_unknown_and_malformed_releases_are_one_line(tmp_path):
    with pytest.raises(AdvisorError, match=r"Megatron-LM core 0\.16\.2 \(.*package_info.py\) is not a version "
                                           r"advisor-launch knows; it knows core 0\.15 \(checked with core_v0\.15\.2\)"):
        of_checkout(make_checkout(tmp_path / "a", 16))
    (tmp_path / "b").mkdir()
    with pytest.raises(AdvisorError, match="has no megatron/core/package_info.py: is it a Megatron-LM checkout"):
        read_version(tmp_path / "b")
    bad = make_checkout(tmp_path / "c")
    (bad / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = '15'\n")
    with pytest.raises(AdvisorError, match="no MAJOR, MINOR and PATCH numbers in it"):
        read_version(bad)
    for text in ("latest", "0", "0.15.2.1", "v0.x"):
        with pytest.raises(AdvisorError, match="expected a release such as 0.19"):
            named(text)
    assert named("v0.19") is NEW and named("0.15.0") is OLD


def test_a_flag_the_release_lacks_is_named_with_it():
    lacking = replace(OLD, lacks=frozenset({"--rotary-base"}))
    with pytest.raises(AdvisorError, match="Megatron-LM core 0.15 has no --rotary-base, which this launch needs"):
        compose("the row", ["--num-layers", "2", "--rotary-base", "500000"], rules=lacking,
                model=PRESETS["llama3.1-8b"])


def shape(tp=1, cp=1, *flags):
    return LaunchShape.of(tp, cp, list(flags))


def test_environment_rules_of_validate_args():
    assert environment(OLD, shape(1, 1), {}).settings == {}
    assert environment(OLD, shape(2, 1), {}).settings == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert environment(NEW, shape(1, 2), {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}).settings == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert "TP > 1 or CP > 1 on GPUs before Blackwell" in environment(OLD, shape(2), {}).reason
    # TP 1, CP 1: whatever the user exported is kept (nothing set)
    assert environment(OLD, shape(1, 1), {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}).settings == {}
    with pytest.raises(AdvisorError, match="CUDA_DEVICE_MAX_CONNECTIONS=32 in your environment"):
        environment(OLD, shape(4, 1), {"CUDA_DEVICE_MAX_CONNECTIONS": "32"})
    # FSDP asserts the opposite, and MoE expert-parallel overlap lifts the TP rule (validate_args)
    assert environment(OLD, shape(2, 1, "--use-megatron-fsdp"), {}).settings == {}
    with pytest.raises(AdvisorError, match="refuses it under FSDP"):
        environment(NEW, shape(2, 1, "--use-torch-fsdp2"), {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert environment(OLD, shape(2, 1, "--overlap-moe-expert-parallel-comm"), {}).settings == {}
    with pytest.raises(AdvisorError, match="requires NCCL_ALGO to be one of Tree, Ring"):
        environment(OLD, shape(1, 1, "--deterministic-mode"), {})
    assert environment(OLD, shape(1, 1, "--deterministic-mode"), {"NCCL_ALGO": "Ring"}).settings == {}


def test_deterministic_modes_environment_is_each_releases_own():
    """--deterministic-mode: core_v0.15.2's validate_args asserts NCCL_ALGO set to one of five
    words (Tree among them); core_v0.19.0's apply_determinism_env (megatron/training/determinism.py)
    takes it unset (it sets Ring), or a comma list of Ring, CollnetDirect, CollnetChain, ^NVLS
    (Tree refused), and refuses a nondeterministic NVTE_ALLOW_NONDETERMINISTIC_ALGO,
    CUBLAS_WORKSPACE_CONFIG or MAMBA_DETERMINISTIC. Megatron's own answers for the same values:
    tests/test_megatron_validation.py."""
    deterministic = shape(1, 1, "--deterministic-mode")
    assert environment(OLD, deterministic, {"NCCL_ALGO": "Tree"}).settings == {}
    with pytest.raises(AdvisorError, match=r"^NCCL_ALGO=Ring,CollnetDirect in your environment: Megatron-LM core "
                                           r"0\.15 .* refuses it with --deterministic-mode: it accepts one of Tree, "):
        environment(OLD, deterministic, {"NCCL_ALGO": "Ring,CollnetDirect"})
    assert environment(NEW, deterministic, {}).settings == {}  # Megatron sets NCCL_ALGO=Ring itself
    for value in ("Ring", "Ring,CollnetDirect", "^NVLS", "CollnetChain"):
        assert environment(NEW, deterministic, {"NCCL_ALGO": value}).settings == {}
    with pytest.raises(AdvisorError, match=r"^NCCL_ALGO=Tree in your environment: Megatron-LM core 0\.19 .* refuses "
                                           r"it with --deterministic-mode: it accepts a comma-separated list of Ring, "
                                           r"CollnetDirect, CollnetChain, \^NVLS, or unset$"):
        environment(NEW, deterministic, {"NCCL_ALGO": "Tree"})
    refused = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1", "CUBLAS_WORKSPACE_CONFIG": ":0:0", "MAMBA_DETERMINISTIC": "0"}
    for variable, value in refused.items():
        with pytest.raises(AdvisorError, match=f"^{variable}={value} in your environment"):
            environment(NEW, deterministic, {variable: value})
        assert environment(OLD, deterministic, {"NCCL_ALGO": "Ring", variable: value}).settings == {}
    accepted = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":16:8", "MAMBA_DETERMINISTIC": "1"}
    assert environment(NEW, deterministic, accepted).settings == {}
    assert environment(NEW, shape(1, 1), {"NCCL_ALGO": "Tree"}).settings == {}  # without the mode, no rule


def test_fsdp_is_a_conflict_with_the_estimate():
    """The estimate assumed no FSDP (it shards parameters too): the user's flag is refused."""
    with pytest.raises(AdvisorError, match="--use-megatron-fsdp \\(after --\\) conflicts with the row"):
        compose("the row", ["--num-layers", "2"], rules=OLD, model=PRESETS["llama3.1-8b"],
                extras=["--use-megatron-fsdp"])
