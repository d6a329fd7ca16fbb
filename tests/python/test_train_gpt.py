"""End to end: examples/train_gpt.py's GPT trained 200 steps with flash3 and
with SDPA from the same seed, on the same batches. The loss curves must agree
within bf16 noise, and both must learn; tokens/s is printed for both.

Skipped, saying why, without torch, without a CUDA device, or where flash3's
library does not load.
"""
import importlib.util
import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="the end-to-end test needs PyTorch")

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Both runs start from the same weights on the same batch, and their
# forwards differ only in how the attention output is rounded, so their first
# losses differ by far less than this.
INITIAL_BOUND = 0.01
# "Within bf16 noise": the mean |difference| of the two curves, each smoothed
# over 10 steps, over the last 50 steps. The runs see the same batches, so the
# batch-to-batch noise of the loss cancels in the difference; what is left is
# how far two kernels' roundings move the weights apart in 200 AdamW steps.
# Measured on the CPU with smaller models on this data (2 layers, seqlen 128,
# a marker every 16 tokens), 200 steps:
#   bf16 autocast, dim 64: SDPA's kernel against a plain bf16 attention (S and
#     P rounded to bf16), two correct roundings as flash3's and FA2's are:
#     6e-4;
#   float32, dim 128: attention outputs perturbed by 2^-8 relative noise every
#     call: 1e-4; an attention whose dK was zero (it could not learn where to
#     look): 0.31.
# The bound sits between: 30 times the bf16 difference (larger models,
# nondeterministic backward passes), 15 times below the broken gradient.
CURVE_BOUND = 0.02


def load_example():
    spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = load_example()
TINY = example.Config(vocab=40, dim=32, layers=1, heads=1, seqlen=48, batch=2, steps=12, warmup=2, topics=4,
                      marker_every=8)


# ---- CPU: the example's parts ----------------------------------------------------------------

def test_dataset_is_seeded_and_follows_the_chains():
    data = example.make_dataset(TINY, 3)
    assert data.shape == (3, TINY.batch, TINY.seqlen + 1)
    assert torch.equal(data, example.make_dataset(TINY, 3))
    states, successors, _ = example.chains(TINY, torch.Generator().manual_seed(TINY.seed))
    for seq in data.flatten(0, 1):
        markers = seq[::TINY.marker_every]
        assert (markers == markers[0]).all() and markers[0] >= states  # one topic, its marker throughout
        topic = int(markers[0]) - states
        chain = seq[torch.arange(len(seq)) % TINY.marker_every != 0]
        assert (chain < states).all()
        for x, y in zip(chain[:-1].tolist(), chain[1:].tolist()):
            assert y in successors[topic, x].tolist()


def test_entropies_bracket_the_task():
    known, unknown = example.entropies(example.Config())
    assert 0 < known < math.log(example.Config.branching) < unknown < math.log(example.Config.vocab)


def test_smoothing_and_comparison():
    assert example.smooth([4.0, 2.0, 0.0, 2.0], 2) == [4.0, 3.0, 1.0, 1.0]
    stats = example.compare_runs([5.0] * 60, [5.0] * 59 + [6.0], last=50, window=10)
    assert stats["initial"] == (5.0, 5.0)
    assert stats["final"] == (5.0, 5.1)
    assert stats["max_abs_diff"] == pytest.approx(0.1)
    assert stats["mean_abs_diff"] == pytest.approx(0.1 / 50)


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    cfg = example.Config(steps=100, warmup=10)
    factors = [example.lr_factor(cfg, s) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 89 / 90)))
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))


def test_same_seed_same_curve_on_the_cpu():
    """The comparison's premise: from one seed two runs differ only by their attention functions."""
    data = example.make_dataset(TINY, TINY.steps)
    a = example.train(example.sdpa_attention, TINY, data, "cpu")
    b = example.train(example.sdpa_attention, TINY, data, "cpu")
    assert a["losses"] == b["losses"] and len(a["losses"]) == TINY.steps
    assert a["tokens_per_s"] > 0


# ---- GPU: flash3 against SDPA ----------------------------------------------------------------


@pytest.fixture(scope="module")
def flash3_loaded():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the end-to-end test trains on the GPU")
    if importlib.util.find_spec("flash3") is None:
        sys.path.insert(0, str(ROOT / "python"))  # not installed: the source tree's package
    try:
        import flash3
    except (ImportError, OSError, RuntimeError) as e:  # the package, or its library, cannot be loaded here
        pytest.skip(f"flash3 does not load: {type(e).__name__}: {e}")
    return flash3


def test_flash3_trains_like_sdpa(flash3_loaded, capsys):
    cfg = example.Config(steps=200)
    data = example.make_dataset(cfg, cfg.steps)
    runs = {name: example.train(example.ATTENTION[name], cfg, data, "cuda") for name in ("flash3", "sdpa")}
    flash3_losses, sdpa_losses = runs["flash3"]["losses"], runs["sdpa"]["losses"]
    stats = example.compare_runs(flash3_losses, sdpa_losses)
    known_topic, unknown_topic = example.entropies(cfg)
    with capsys.disabled():
        print(f"\ntokens/s: flash3 {runs['flash3']['tokens_per_s']:,.0f}, SDPA {runs['sdpa']['tokens_per_s']:,.0f} "
              f"({cfg.layers} layers, dim {cfg.dim}, {cfg.heads} heads, seqlen {cfg.seqlen}, batch {cfg.batch}); "
              f"loss initial {stats['initial'][0]:.4f} / {stats['initial'][1]:.4f}, final (smoothed) "
              f"{stats['final'][0]:.4f} / {stats['final'][1]:.4f} (floors: {known_topic:.3f} knowing the topic, "
              f"{unknown_topic:.3f} not), last 50 steps' mean |difference| {stats['mean_abs_diff']:.4f} "
              f"(max {stats['max_abs_diff']:.4f})")
    assert all(math.isfinite(x) for x in flash3_losses + sdpa_losses)
    assert abs(stats["initial"][0] - stats["initial"][1]) < INITIAL_BOUND
    # Learned through attention: below what the previous token alone allows (make_dataset's docstring).
    for final in stats["final"]:
        assert final < unknown_topic
    assert stats["mean_abs_diff"] < CURVE_BOUND
