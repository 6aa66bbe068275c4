"""The Megatron-LM versions the launcher knows: the release table (``advisor.releases``, the one
place that knows them) and what a launch does with it.

Each entry was read from, and is tested against, a real checkout of the release named in
``checked`` (``tests/test_megatron_real.py`` runs the launcher's argument lists through that
checkout's own ``parse_args`` and ``validate_args``, and trains with its ``pretrain_gpt.py``).
What differs between them, and why it matters to a launch:

- the Python it needs (its ``pyproject.toml``: core_v0.19.0 imports ``typing.override``);
- how many rows ``--mock-data``'s NullTokenizer gives for ``--vocab-size V``: core_v0.15.2's
  adds an end-of-document token (``_NullTokenizer.vocab_size`` = V + 1), core_v0.19.0's does not
  (``NullTokenizer.vocab_size`` = V, its eod is V - 1); Megatron then pads that to a multiple of
  ``--make-vocab-size-divisible-by`` x TP, which is what the estimator prices;
- which token ids ``--mock-data`` feeds: core_v0.15.2's ``MockGPTLowLevelDataset`` draws ids
  1 .. 4094 whatever the vocabulary (documents of up to 4095 tokens numbered 1, 2, ...), so a
  model with fewer rows fails in the embedding at the first iteration; core_v0.19.0 takes them
  modulo the vocabulary;
- the signature of ``megatron.training.pretrain``: core_v0.15.2 takes the dataset and model
  providers positionally; core_v0.19.0 takes a config container first and builds the model from
  it (``model_provider=None``), which is what ``megatron_hooks.integration`` must hook;
- where ``core_transformer_config_from_args`` lives;
- which ``--recompute-method uniform --recompute-num-layers N`` it runs: core_v0.15.2 only an N
  that divides every model chunk's layers (else IndexError at the first forward), core_v0.19.0
  any (``check_recomputation``, through the advisor's ``Recomputation.chunk_problem``).

The version of a checkout is read by parsing ``megatron/core/package_info.py`` (never by
importing it: core_v0.19.0's says 0.19.1 and appends the git hash of whatever repository it
sits in). Minor releases are matched (0.15.x, 0.19.x); any other is refused in one line.

Environment rules (``megatron/training/arguments.py``, ``validate_args``): in both releases, with
TP > 1 or CP > 1 on GPUs before Blackwell (compute capability < 10) Megatron asserts
``CUDA_DEVICE_MAX_CONNECTIONS=1`` unless Megatron FSDP / torch FSDP2 (which assert it is *not* 1)
or MoE expert-parallel communication overlap are on. ``--deterministic-mode`` differs:
core_v0.15.2 asserts an ``NCCL_ALGO`` set to one of Tree, Ring, CollnetDirect, CollnetChain,
^NVLS; core_v0.19.0 (``megatron/training/determinism.py``, ``apply_determinism_env``) accepts it
unset (it sets Ring itself) or a comma-separated list of Ring, CollnetDirect, CollnetChain and
^NVLS (not Tree), and asserts ``NVTE_ALLOW_NONDETERMINISTIC_ALGO`` (0), ``CUBLAS_WORKSPACE_CONFIG``
(:4096:8 or :16:8) and ``MAMBA_DETERMINISTIC`` (starting with 1) where they are set.
``environment()`` applies them to a launch's arguments and the
user's environment: it sets what Megatron needs, keeps what the user exported when Megatron
accepts it, and refuses (one line) what Megatron would refuse. The rule for TP/CP is applied as
for GPUs before Blackwell, where it is required; on Blackwell the value 1 is accepted too.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from advisor.errors import AdvisorError
from advisor.releases import RELEASES, MegatronRelease

if TYPE_CHECKING:
    from advisor.options.training import Recomputation

PACKAGE_INFO = Path("megatron") / "core" / "package_info.py"
PACKAGE_INFO_BYTES = 1 << 20
"""A real one is about 1 KiB; a megabyte is room enough and bounds what a bad checkout costs."""


MegatronVersion = MegatronRelease
"""The launcher's name for one release's facts (``advisor.releases.MegatronRelease``)."""
VERSIONS: tuple[MegatronVersion, ...] = RELEASES
NEWEST = VERSIONS[-1]


def _known() -> str:
    return ", ".join(f"core {v.release[0]}.{v.release[1]} (checked with {v.checked})" for v in VERSIONS)


# --- which version -----------------------------------------------------------------------


def read_version(checkout: Path) -> tuple[int, int, int]:
    """(major, minor, patch) from ``checkout/megatron/core/package_info.py``, parsed, not imported."""
    from advisor.fileio import decode_utf8, read_bytes

    path = checkout / PACKAGE_INFO
    if not path.exists() and not path.is_symlink():
        raise AdvisorError(f"Megatron-LM checkout {checkout} has no {PACKAGE_INFO}: is it a Megatron-LM checkout?")
    # the bounded regular-file reader: a FIFO there would hang a plain read, /dev/zero never end
    text = decode_utf8(read_bytes(path, max_bytes=PACKAGE_INFO_BYTES, what="package_info.py"), str(path))
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise AdvisorError(f"{path}: cannot read its version ({type(exc).__name__})") from None
    numbers: dict[str, int] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            numbers[node.targets[0].id] = node.value.value
    try:
        return numbers["MAJOR"], numbers["MINOR"], numbers["PATCH"]
    except KeyError:
        raise AdvisorError(f"{path}: no MAJOR, MINOR and PATCH numbers in it") from None


def rules_for(version: tuple[int, int, int], where: str) -> MegatronVersion:
    """The rules of this release; AdvisorError naming the version if it is not one we know."""
    for rules in VERSIONS:
        if tuple(version[:2]) == rules.release:
            return rules
    text = ".".join(map(str, version))
    raise AdvisorError(f"Megatron-LM core {text} ({where}) is not a version advisor-launch knows; it knows {_known()}")


def named(text: str) -> MegatronVersion:
    """--megatron-version: '0.15', '0.19.0', 'core_v0.15.2'."""
    parts = text.strip().removeprefix("core_v").removeprefix("v").split(".")
    if len(parts) not in (2, 3) or not all(part.isdecimal() for part in parts):
        raise AdvisorError(f"--megatron-version {text!r}: expected a release such as 0.19 or core_v0.15.2")
    numbers = tuple(int(part) for part in parts) + (0,) * (3 - len(parts))
    return rules_for(numbers, "--megatron-version")


def of_checkout(checkout: Path) -> MegatronVersion:
    return rules_for(read_version(checkout), str(checkout / PACKAGE_INFO))


# --- what a launch needs from its version --------------------------------------------------


def check_flags(rules: MegatronVersion, args: Sequence[str]) -> None:
    """A flag this release lacks: one line naming the version and the flag."""
    missing = sorted({arg.partition("=")[0] for arg in args if arg.startswith("--")} & rules.lacks)
    if missing:
        raise AdvisorError(f"{rules.name} has no {', '.join(missing)}, which this launch needs "
                           f"(it knows {_known()})")


def check_python(rules: MegatronVersion, running: tuple[int, int]) -> None:
    if tuple(running) < rules.python:
        raise AdvisorError(
            f"{rules.name} needs {rules.python_text}; this is Python {running[0]}.{running[1]}: run advisor-launch "
            f"from an environment with {rules.python_text}, torch and this package")


def check_mock_data(rules: MegatronVersion, rows: int, spec_vocab: int) -> None:
    """Refuse, before anything starts, a vocabulary that this release's --mock-data cannot feed."""
    highest = rules.mock_data_max_token_id
    if highest is not None and rows <= highest:
        raise AdvisorError(
            f"{rules.name}'s --mock-data feeds token ids up to {highest} whatever the vocabulary "
            f"(MockGPTLowLevelDataset), and this model's embedding has {rows} rows (v {spec_vocab}): it would fail "
            f"at the first iteration; use a vocabulary of at least {highest + 1} (--vocab-size) or your own data "
            f"(--data-path after --)")


def check_recomputation(rules: MegatronVersion, recomputation: Recomputation | None, chunk_layers: Sequence[int],
                        source: str) -> None:
    """Refuse, before anything starts, a --recompute-num-layers N that this release fails on with
    the input's model chunks (``Recomputation.chunk_problem``, the advisor's one check: core_v0.15.2
    runs the uniform method in whole units of N layers, an IndexError at the first forward of a
    chunk that N does not divide). ``recomputation``: the launch's, None where it has none."""
    newer = next((version for version in VERSIONS if version.uniform_recompute_any_n), NEWEST)
    release = f"{rules.release[0]}.{rules.release[1]}"
    remedy = (f"plan again for core {release} (advisor ... --megatron-version {release}) with an N that divides "
              f"every chunk or with --recompute-method block, or launch with a {newer.name} checkout")
    if recomputation is not None and (problem := recomputation.chunk_problem(chunk_layers, rules, remedy)):
        raise AdvisorError(f"{source}: {problem}")


# --- the environment Megatron demands ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchShape:
    """What the environment rules look at: the layout and the flags of the whole command line."""

    tp: int
    cp: int
    flags: frozenset[str]

    @classmethod
    def of(cls, tp: int, cp: int, args: Sequence[str]) -> "LaunchShape":
        return cls(tp=tp, cp=cp, flags=frozenset(arg.partition("=")[0] for arg in args if arg.startswith("--")))

    @property
    def fsdp(self) -> bool:
        return bool(self.flags & {"--use-megatron-fsdp", "--use-torch-fsdp2"})


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvironmentRule:
    """One environment variable that ``validate_args`` asserts on, for the launches it applies to."""

    variable: str
    applies: Callable[[LaunchShape], bool]
    why: str
    needs: str | None = None
    """The value it must have; the launcher sets it when unset."""
    forbids: str | None = None
    """A value it must not have; the launcher leaves it unset."""
    one_of: tuple[str, ...] = ()
    """Values one of which the user must choose (the launcher cannot)."""
    unset_ok: bool = False
    """With ``one_of``: unset is accepted too (Megatron sets its own default)."""
    tokens: bool = False
    """With ``one_of``: a comma-separated list, each of whose tokens is one of them."""
    prefix: bool = False
    """With ``one_of``: a value that starts with one of them."""
    releases: tuple[tuple[int, int], ...] = ()
    """The releases (major, minor) that assert it; empty: every release."""

    def accepts(self, value: str | None) -> bool:
        """Whether ``value`` (None: unset) passes this ``one_of`` rule."""
        if value is None:
            return self.unset_ok
        if self.tokens:
            words = [word.strip() for word in value.split(",") if word.strip()]
            return bool(words) and all(word in self.one_of for word in words)
        return value.startswith(self.one_of) if self.prefix else value in self.one_of

    def expected(self) -> str:
        """What ``one_of`` asks, in words."""
        values = ", ".join(self.one_of)
        text = (f"a comma-separated list of {values}" if self.tokens
                else f"a value starting with {values}" if self.prefix else f"one of {values}")
        return f"{text}, or unset" if self.unset_ok else text


def _deterministic(shape: LaunchShape) -> bool:
    return "--deterministic-mode" in shape.flags


ENVIRONMENT_RULES: tuple[EnvironmentRule, ...] = (
    EnvironmentRule(
        variable="CUDA_DEVICE_MAX_CONNECTIONS", needs="1",
        applies=lambda shape: (shape.tp > 1 or shape.cp > 1) and not shape.fsdp
        and "--overlap-moe-expert-parallel-comm" not in shape.flags,
        why="with TP > 1 or CP > 1 on GPUs before Blackwell"),
    EnvironmentRule(
        variable="CUDA_DEVICE_MAX_CONNECTIONS", forbids="1", applies=lambda shape: shape.fsdp,
        why="under FSDP (--use-megatron-fsdp, --use-torch-fsdp2)"),
    # core_v0.15.2: megatron/training/arguments.py, validate_args ('NCCL_ALGO must be one of ...')
    EnvironmentRule(
        variable="NCCL_ALGO", one_of=("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"),
        applies=_deterministic, why="with --deterministic-mode", releases=((0, 15),)),
    # core_v0.19.0: megatron/training/determinism.py, apply_determinism_env (from validate_args):
    # unset is filled with Ring; Tree is refused ('each token must be in ...')
    EnvironmentRule(
        variable="NCCL_ALGO", one_of=("Ring", "CollnetDirect", "CollnetChain", "^NVLS"), unset_ok=True, tokens=True,
        applies=_deterministic, why="with --deterministic-mode", releases=((0, 19),)),
    EnvironmentRule(
        variable="NVTE_ALLOW_NONDETERMINISTIC_ALGO", one_of=("0",), unset_ok=True,
        applies=_deterministic, why="with --deterministic-mode", releases=((0, 19),)),
    EnvironmentRule(
        variable="CUBLAS_WORKSPACE_CONFIG", one_of=(":4096:8", ":16:8"), unset_ok=True,
        applies=_deterministic, why="with --deterministic-mode", releases=((0, 19),)),
    EnvironmentRule(
        variable="MAMBA_DETERMINISTIC", one_of=("1",), unset_ok=True, prefix=True,
        applies=_deterministic, why="with --deterministic-mode", releases=((0, 19),)),
)


def _rules_of(rules: MegatronVersion, shape: LaunchShape) -> list[EnvironmentRule]:
    """The environment rules this release asserts for this launch."""
    return [rule for rule in ENVIRONMENT_RULES
            if (not rule.releases or rules.release in rule.releases) and rule.applies(shape)]


@dataclass(frozen=True, slots=True)
class Environment:
    """What a launch sets on every rank, and why (for the printed command and the Slurm script)."""

    settings: dict[str, str]
    reason: str


def environment(rules: MegatronVersion, shape: LaunchShape, exported: Mapping[str, str] | None = None) -> Environment:
    """The variables this launch sets on every rank (what Megatron demands); AdvisorError, one
    line, where a value the user exported would be refused by Megatron (else it is kept)."""
    exported = os.environ if exported is None else exported
    settings: dict[str, str] = {}
    reasons: list[str] = []
    where = f"{rules.name} (megatron/training/arguments.py, validate_args)"
    for rule in _rules_of(rules, shape):
        value = exported.get(rule.variable)
        if rule.needs is not None:
            if value not in (None, rule.needs):
                raise AdvisorError(f"{rule.variable}={value} in your environment: {where} requires "
                                   f"{rule.variable}={rule.needs} {rule.why}; unset it or set it to {rule.needs}")
            settings[rule.variable] = rule.needs
            reasons.append(f"{rule.variable}={rule.needs} {rule.why}")
        elif rule.forbids is not None and value == rule.forbids:
            raise AdvisorError(f"{rule.variable}={value} in your environment: {where} refuses it {rule.why}; "
                               f"unset it")
        elif rule.one_of and value is None and not rule.accepts(value):
            raise AdvisorError(f"{where} requires {rule.variable} to be {rule.expected()} {rule.why}; export one")
        elif rule.one_of and not rule.accepts(value):
            raise AdvisorError(f"{rule.variable}={value} in your environment: {where} refuses it {rule.why}: it "
                               f"accepts {rule.expected()}")
    return Environment(settings=settings, reason=f"{where} requires " + "; ".join(reasons) if reasons else "")


def environment_demands(rules: MegatronVersion, shape: LaunchShape) -> str | None:
    """What Megatron's ``validate_args`` demands of every rank's environment for this launch, as
    one line for ``advisor-launch args`` (which prints only the flags, for a launch script of the
    user's own, where the other launchers set it: ``environment``), or None where it demands
    nothing. The same ``ENVIRONMENT_RULES``, read without the user's environment here."""
    demands = []
    for rule in _rules_of(rules, shape):
        if rule.needs is not None:
            demands.append(f"{rule.variable}={rule.needs} {rule.why}")
        elif rule.forbids is not None:
            demands.append(f"{rule.variable} unset or other than {rule.forbids} {rule.why}")
        elif rule.one_of and not rule.unset_ok:  # one that may stay unset demands nothing
            demands.append(f"{rule.variable} {rule.expected()} {rule.why}")
    if not demands:
        return None
    return (f"your launch must give every rank {'; '.join(demands)}: {rules.name} (megatron/training/arguments.py, "
            "validate_args) refuses these arguments otherwise (the other advisor-launch commands see to it)")
