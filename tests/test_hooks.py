"""The layer hooks on a real megatron-core Llama GPTModel, trained on the CPU.

Independent references: parameter counts from ``advisor.equations`` (seed 004, Eq. 1-3, checked
against published parameter counts in test_models.py), and a hand count of what the local
layer spec keeps for backward, written out below.
"""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")

import torch  # noqa: E402

from advisor import equations as eq  # noqa: E402
from advisor.parallel import ParallelConfig  # noqa: E402
from advisor.profiles import ProfileError, load_run, read_rank_file  # noqa: E402
from megatron_hooks.backends import CpuBackend  # noqa: E402
from megatron_hooks.hooks import LayerMemoryHooks  # noqa: E402
from megatron_hooks.recorder import ProfileRecorder, RunInfo  # noqa: E402
from megatron_support import (  # noqa: E402
    MBS, SEQ, TINY, OutOfMemoryAt, batches, tiny_model, train,
)

FP32 = 4


def run_info(**changes) -> RunInfo:
    values = dict(run_id="test-run", model=TINY, parallel=ParallelConfig(mbs=MBS), seq_len=SEQ, global_batch_size=2 * MBS,
                  num_microbatches=2, layers_per_stage=(TINY.num_layers,), rank=0, world_size=1,
                  coords={"tp": 0, "cp": 0, "pp": 0, "dp": 0}, in_flight_microbatches=1)
    values.update(changes)
    return RunInfo(**values)


def profiled_run(directory, *, iterations=2):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    hooks = LayerMemoryHooks(model, optimizer=optimizer).install()
    recorder = ProfileRecorder(hooks, run_info(), directory).start()
    try:
        losses = train(model, optimizer, batches(2 * iterations), iterations=iterations, recorder=recorder)
        recorder.finish()
    finally:
        hooks.remove()
    return model, losses, load_run(directory).ranks[0]


@pytest.fixture(scope="module")
def profile(megatron_world, tmp_path_factory):
    return profiled_run(tmp_path_factory.mktemp("tiny"))[2]


def test_every_layer_has_a_record_in_every_iteration(profile):
    assert profile.status == "ok" and len(profile.iterations) == 2
    assert profile.header.stage_layers == (1, 2, 3, 4) and profile.header.in_flight_microbatches == 1
    for iteration in (1, 2):
        records = profile.layers_of(iteration)
        assert [r.name for r in records] == ["embedding", "decoder.layers.0", "decoder.layers.1",
                                             "decoder.layers.2", "decoder.layers.3", "output"]
        assert [r.layer_number for r in records if r.kind == "decoder"] == [1, 2, 3, 4]


def test_layer_times_are_inside_the_step(profile):
    """Wall time on the CPU: every region has a forward and a backward time per microbatch, and
    the regions' time over the iteration's 2 microbatches fits inside the step time (which
    also holds the optimizer step and what lies between regions)."""
    for it in profile.iterations:
        records = profile.layers_of(it.iteration)
        assert all(r.forward_time_s > 0 and r.backward_time_s > 0 for r in records)
        inside = 2 * sum(r.forward_time_s + r.backward_time_s for r in records)
        assert 0 < inside < it.step_time_s


def test_static_bytes_equal_the_spec_exactly(profile):
    h, v = TINY.hidden_size, TINY.vocab_size
    expected = {"embedding": eq.embedding_parameters(TINY), "output": eq.embedding_parameters(TINY) + h}
    tensors = {"embedding": 1, "output": 2}  # weight; final norm + output layer
    for record in profile.layers_of(2):
        count = expected.get(record.kind, eq.layer_parameters(TINY))
        assert record.parameter_bytes == count * FP32, record.name
        assert record.gradient_bytes == count * FP32, record.name  # FP32 gradients
        # Adam: exp_avg and exp_avg_sq in FP32, plus a 4-byte step counter per tensor (6 per layer).
        assert record.optimizer_bytes == 2 * count * FP32 + 4 * tensors.get(record.kind, 6), record.name
    total = profile.iterations[-1]
    assert total.parameter_bytes == eq.model_parameters(TINY) * FP32 == (2 * h * v + h + 4 * (8192 + 4096 + 16384 + 8192 + 2 * h)) * FP32
    assert total.parameter_bytes == sum(r.parameter_bytes for r in profile.layers_of(2))
    assert total.optimizer_bytes == sum(r.optimizer_bytes for r in profile.layers_of(2))


def hand_count_layer(first_layer: bool) -> int:
    """What one local-spec Llama layer keeps for backward, one microbatch, FP32 (s=32, b=2).

    s b h elements: each RMSNorm keeps its input x and x * rsqrt (2 sbh) and its output, which
    the next linear keeps (1 sbh): 3 sbh per norm, 6 for the two; Q after RoPE (sbh); K and V
    after repeat_interleave to all a heads, which the unfused attention does for GQA (sbh each,
    not sbh k/a); the attention context, input of linear_proj (sbh): 10 sbh in all.
    Each RMSNorm keeps rsqrt (sb); RoPE keeps cos and sin for Q and for K (4 s d, d = h/a);
    the unfused attention keeps the softmax output (a b s^2; dropout is off and keeps
    nothing); SwiGLU keeps linear_fc1's output (2 sb h_ffn), x_linear + offset, SiLU's output
    and the product that linear_fc2 takes (sb h_ffn each): 5 sb h_ffn.
    The boolean causal mask (s^2 bytes) is one tensor shared by all layers: it counts once,
    in the first layer that saves it.
    """
    s, b, h, a, ffn = SEQ, MBS, TINY.hidden_size, TINY.num_attention_heads, TINY.ffn_hidden_size
    d = h // a
    elements = 10 * s * b * h + 2 * s * b + 4 * s * d + a * b * s * s + 5 * s * b * ffn
    return elements * FP32 + (s * s if first_layer else 0)


def test_activation_bytes_match_a_hand_count(profile):
    s, b, h, v = SEQ, MBS, TINY.hidden_size, TINY.vocab_size
    # Embedding: the int64 token ids (8sb; seed 004's Eq. 13 counts 8sbh, Megatron-LM's own 8sb).
    # Output: the final RMSNorm as above (3 sbh + sb), the FP32 logits that the vocab-parallel
    # cross-entropy turns into exp(logits) in place (sbv), its target mask (bool, sb) and the
    # masked int64 targets (8 sb).
    expected = {"embedding": 8 * s * b, "output": (3 * s * b * h + s * b + s * b * v) * FP32 + s * b + 8 * s * b}
    for record in profile.layers_of(2):
        want = expected.get(record.kind) or hand_count_layer(record.layer_number == 1)
        assert record.activation_bytes == pytest.approx(want, rel=0.05), record.name
    # The count is exact here, not only within the 5%:
    assert [r.activation_bytes for r in profile.layers_of(2)] == [
        expected["embedding"], hand_count_layer(True), hand_count_layer(False), hand_count_layer(False),
        hand_count_layer(False), expected["output"]]


def test_transient_peaks_match_a_hand_count(profile):
    """The forward and backward rises above the level at a module's entry, counted by hand.

    Embedding forward: the lookup's [b, s, h] output and its transposed contiguous copy [s, b, h]
    (megatron-core's LanguageModelEmbedding), both alive at once: 2 sbh. Embedding backward: the
    dense gradient of the [v, h] weight. A decoder layer's forward: what it keeps for backward
    (the hand count above; the causal mask, made by the caller before the layer, is kept but not
    allocated by it) plus its output, the residual sum [s, b, h], which the next layer keeps."""
    s, b, h, v = SEQ, MBS, TINY.hidden_size, TINY.vocab_size
    records = {r.name: r for r in profile.layers_of(2)}
    assert records["embedding"].forward_peak_bytes == 2 * s * b * h * FP32
    assert records["embedding"].backward_peak_bytes == v * h * FP32
    for index in range(TINY.num_layers):
        mask = s * s if index == 0 else 0
        assert records[f"decoder.layers.{index}"].forward_peak_bytes == \
            hand_count_layer(index == 0) - mask + s * b * h * FP32


def test_activations_are_what_the_forward_pass_leaves_allocated(megatron_world):
    """Conservation: the saved-tensor count per region adds up to what the storage tracker sees
    retained after a forward pass, plus the loss tensor that the pass returns, less the saved
    tensors that existed before it (the token ids and the causal mask, which the caller made)."""
    from megatron_hooks.model import causal_mask

    model = tiny_model()
    backend = CpuBackend()
    hooks = LayerMemoryHooks(model, backend=backend).install()
    (tokens, labels), = batches(1)
    positions, mask = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ), causal_mask(SEQ)
    try:
        for iteration in (1, 2):  # the second one runs with the RoPE cache and attention buffer warm
            hooks.begin_iteration(iteration)
            before = backend.allocated()
            loss = model(tokens, positions, mask, labels=labels)
            retained = backend.allocated() - before
            saved = sum(region.activation_bytes for region in hooks.regions)
            loss.sum().backward()
            hooks.end_iteration()
            del loss
    finally:
        hooks.remove()
    inputs = tokens.numel() * 8 + mask.numel()  # int64 ids, bool mask
    assert retained == saved - inputs + MBS * SEQ * FP32  # the per-token loss


def test_training_is_unchanged_bit_for_bit(megatron_world, tmp_path):
    plain_model = tiny_model()
    plain = train(plain_model, torch.optim.Adam(plain_model.parameters(), lr=1e-3), batches(4))
    hooked_model, hooked, profile = profiled_run(tmp_path)
    assert hooked == plain  # float equality: bit for bit
    assert [it.loss for it in profile.iterations] == plain
    for mine, theirs in zip(hooked_model.parameters(), plain_model.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def hook_state(model):
    return [(len(m._forward_pre_hooks), len(m._forward_hooks), len(m._backward_hooks)) for m in model.modules()]


def test_remove_leaves_the_model_as_it_was(megatron_world, tmp_path):
    model = tiny_model()
    before = hook_state(model)
    hooks = LayerMemoryHooks(model).install()
    assert hook_state(model) != before
    with pytest.raises(RuntimeError, match="already installed"):
        hooks.install()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, optimizer, batches(2), iterations=1, recorder=ProfileRecorder(hooks, run_info(), tmp_path))
    hooks.remove()
    assert hook_state(model) == before
    assert torch._C._len_torch_dispatch_stack() == 0  # the CPU tracker is off
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


@pytest.mark.parametrize("where", [
    "iteration 2, microbatch 1, forward, decoder.layers.2 (layer 3)",
    "iteration 1, microbatch 2, backward, output",
])
def test_an_oom_leaves_a_record_that_says_how_far_it_got(megatron_world, tmp_path, where):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    backend = OutOfMemoryAt(where)
    hooks = LayerMemoryHooks(model, optimizer=optimizer, backend=backend).install()
    backend.position = lambda: hooks.where
    recorder = ProfileRecorder(hooks, run_info(), tmp_path).start()
    with pytest.raises(torch.OutOfMemoryError):
        train(model, optimizer, batches(4), recorder=recorder)
    hooks.remove()
    profile = load_run(tmp_path).ranks[0]
    assert profile.status == "oom" and profile.where == where
    assert profile.error.startswith("OutOfMemoryError: simulated")
    assert len(profile.iterations) == int(where.split()[1].rstrip(",")) - 1
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert torch._C._len_torch_dispatch_stack() == 0


def test_a_killed_run_leaves_a_valid_running_file(megatron_world, tmp_path):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with LayerMemoryHooks(model, optimizer=optimizer) as hooks:
        recorder = ProfileRecorder(hooks, run_info(), tmp_path).start()
        assert load_run(tmp_path).ranks[0].status == "running"
        train(model, optimizer, batches(2), iterations=1, recorder=recorder)
    # No finish(): as if the process had been killed after its first iteration.
    profile = load_run(tmp_path).ranks[0]
    assert profile.status == "running" and len(profile.iterations) == 1


def test_ctrl_c_inside_an_iteration_leaves_the_run_running(megatron_world, tmp_path):
    """Ctrl-C is a kill, not a failure: 'advisor profile run' interrupted mid-run recorded the
    rank 'error' (KeyboardInterrupt), and show and recommend reported a failed run (audit). The
    file stays 'running' with its finished iterations, and finish() (integration's, on the
    way out) does not end it 'ok'."""
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with LayerMemoryHooks(model, optimizer=optimizer) as hooks:
        recorder = ProfileRecorder(hooks, run_info(), tmp_path).start()
        train(model, optimizer, batches(2), iterations=1, recorder=recorder)
        with pytest.raises(KeyboardInterrupt), recorder.iteration(2):
            raise KeyboardInterrupt
        recorder.finish()
    profile = load_run(tmp_path).ranks[0]
    assert profile.status == "running" and len(profile.iterations) == 1 and profile.error is None
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # the hooks were undone


def test_damaged_profile_directories_get_clear_errors(profile, tmp_path):
    with pytest.raises(ProfileError, match="no profile files"):
        load_run(tmp_path)
    lines = profile.path.read_text().splitlines()
    bad = tmp_path / "rank00000.jsonl"
    bad.write_text("\n".join(lines[:-1]) + "\n")  # no end record: still running, or killed
    assert load_run(tmp_path).ranks[0].status == "running"
    bad.write_text(profile.path.read_text()[:-40])  # the end record cut short: an interrupted append
    assert load_run(tmp_path).ranks[0].iterations == profile.iterations
    bad.write_text("\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n")  # a cut line inside: damage
    with pytest.raises(ProfileError, match="rank00000.jsonl:2: malformed JSON"):
        load_run(tmp_path)
    header = json.loads(lines[0])
    bad.write_text("\n".join([json.dumps({**header, "version": 5}), *lines[1:]]) + "\n")
    with pytest.raises(ProfileError, match="schema version 5; this advisor reads versions 1, 2, 3, 4"):
        load_run(tmp_path)
    bad.write_text("\n".join(line for line in lines if '"layer_number": 3' not in line) + "\n")
    with pytest.raises(ProfileError, match="iteration 1: missing decoder layer 3"):
        read_rank_file(bad)


def test_two_model_chunks_as_in_an_interleaved_pipeline(megatron_world):
    """Two chunks of one rank (layers 1-2 with the embedding, 3-4 with the output), run like
    Megatron's interleaved schedule with all forwards first: every region is measured, and 2
    microbatches of 2 chunk forwards each are counted as 2 microbatches in flight."""
    from megatron_hooks.model import causal_mask

    first = tiny_model(layers=(1, 2), post_process=False)
    second = tiny_model(layers=(3, 4), pre_process=False)
    hooks = LayerMemoryHooks([first, second]).install()
    positions, mask = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ), causal_mask(SEQ)
    try:
        hooks.begin_iteration(1)
        losses = []
        for tokens, labels in batches(2):
            second.set_input_tensor(first(tokens, positions, mask))
            losses.append(second(None, positions, mask, labels=labels).mean())
        assert hooks.max_in_flight == 4 and hooks.in_flight_microbatches == 2
        for loss in losses:
            loss.backward()
        records = hooks.end_iteration().layers
    finally:
        hooks.remove()
    assert [r.name for r in records] == ["embedding", "decoder.layers.0", "decoder.layers.1", "decoder.layers.2",
                                         "decoder.layers.3", "output"]
    assert [r.layer_number for r in records[1:5]] == [1, 2, 3, 4]
    assert all(r.activation_bytes > 0 and r.backward_peak_bytes > 0 for r in records)
    assert records[3].activation_bytes == hand_count_layer(True)  # the second chunk's first layer saves the mask


def test_a_loss_that_is_not_finite_is_recorded_as_null(megatron_world):
    """JSON has no NaN: an FP16 run without loss scaling can diverge, the record must stay valid."""
    model = tiny_model()
    with LayerMemoryHooks(model) as hooks:
        hooks.begin_iteration(1)
        assert hooks.end_iteration(loss=float("nan")).iteration.loss is None
        hooks.begin_iteration(2)
        assert hooks.end_iteration(loss=2.5).iteration.loss == 2.5


def _activations_with(model, before=None, after=None) -> dict[str, int]:
    """Each region's activation bytes over one forward pass; ``before(model)`` and ``after(model)``
    run before and after the hooks are installed (forward pre-hooks run in that order)."""
    from megatron_hooks.model import causal_mask

    if before is not None:
        before(model)
    hooks = LayerMemoryHooks(model, backend=CpuBackend()).install()
    (tokens, labels), = batches(1)
    positions, mask = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ), causal_mask(SEQ)
    try:
        if after is not None:
            after(model)
        hooks.begin_iteration(1)
        model(tokens, positions, mask, labels=labels).sum().backward()
        measured = {region.name: region.activation_bytes for region in hooks.regions}
        hooks.end_iteration()
        return measured
    finally:
        hooks.remove()


def test_a_storage_freed_in_the_forward_pass_and_its_address_reused_count_right(megatron_world, monkeypatch):
    """Storages are known by address, and an address comes back once its storage is freed.
    Layer 1's region saves a tensor for a branch whose node dies in the forward pass (it keeps
    nothing); layer 2's then saves a new storage at that very address (it keeps it). Keyed by
    address alone, layer 1 counted the dead tensor and layer 2 not its own. Both run as layer 2's
    forward pre-hooks, one before the hooks open its region (still layer 1's), one after.

    Whether the allocator hands the freed address to the next storage is up to malloc (on CI it
    often did not), so the hooks' storage key is the one stand-in here: it reports the new
    storage under the freed one's address, as the allocator may. The dead tensor's storage itself
    is kept alive by an unsaved view, so that no other storage takes that address for real."""
    import megatron_hooks.hooks as hooks_module
    from megatron_hooks.static import storage_key

    n = 4096  # FP32 elements
    freed, reborn = {}, {}  # reborn: a new storage's real key -> the freed key it is reported under
    real_key = hooks_module.untyped_storage_key
    monkeypatch.setattr(hooks_module, "untyped_storage_key", lambda storage: reborn.get(real_key(storage), real_key(storage)))

    def dead_branch(_module, _args):
        leaf = torch.randn(n, requires_grad=True)
        _ = leaf * leaf  # saves leaf; the node dies with the result, and the saved tensor with it
        freed["key"], freed["keeper"] = storage_key(leaf), leaf.detach()

    def reused(_module, args, kwargs):
        candidate = torch.randn(n, requires_grad=True)
        reborn[storage_key(candidate)] = freed["key"]
        kwargs["hidden_states"] = kwargs["hidden_states"] + 0 * (candidate * candidate).sum()  # keeps candidate
        return args, kwargs

    def first(model):
        model.decoder.layers[2].register_forward_pre_hook(dead_branch)

    def then(model):
        model.decoder.layers[2].register_forward_pre_hook(reused, with_kwargs=True)

    plain = _activations_with(tiny_model())
    measured = _activations_with(tiny_model(), first, then)
    assert measured["decoder.layers.1"] == plain["decoder.layers.1"]
    assert measured["decoder.layers.2"] == plain["decoder.layers.2"] + n * FP32
