"""The pure parts of bench/compare_sdpa.py: no torch, no GPU."""
import importlib.util
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "compare_sdpa.py"
spec = importlib.util.spec_from_file_location("compare_sdpa", SCRIPT)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)

BASE = {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": False, "batch": 4, "seqlen_q": 4096,
        "seqlen_k": 4096, "heads_q": 16, "heads_kv": 16, "ms": 1.0, "tflops": 1.0, "ok": True, "variant": "default"}


def entry(**changes):
    return dict(BASE, **changes)


def ms_for(tflops, **changes):
    """The time at which a shape runs at the given TFLOP/s."""
    return cs.shape_flops(entry(**changes)) / (tflops * 1e12) * 1e3


def test_flops_formula():
    full = 4 * 4096 * 4096 * 128 * 16 * 4
    assert cs.attention_flops("fwd", 128, False, 4, 4096, 4096, 16) == full
    assert cs.attention_flops("fwd", 128, True, 4, 4096, 4096, 16) == full // 2
    assert cs.attention_flops("bwd", 128, False, 4, 4096, 4096, 16) == full * 5 // 2
    assert cs.attention_flops("bwd", 128, True, 4, 4096, 4096, 16) == full * 5 // 4
    # heads_kv does not enter: GQA does the same math per query head.
    assert cs.shape_flops(entry(heads_kv=4)) == full


def test_grouping_ignores_ablations_and_takes_median():
    rows = cs.group_shapes([
        entry(ms=1.0), entry(ms=3.0), entry(ms=2.0),
        entry(ms=0.1, variant="no-pingpong"), entry(ms=0.1, variant="no-persistent"),
        entry(causal=True, ms=1.0),
    ])
    assert [r["causal"] for r in rows] == [False, True]
    assert rows[0]["flash3"]["ms"] == 2.0
    assert set(rows[0]) == set(cs.SHAPE_KEYS) | {"flash3"}


def test_grouping_without_variant_field_is_default():
    plain = entry()
    del plain["variant"]
    assert len(cs.group_shapes([plain])) == 1
    assert cs.group_shapes([entry(variant="no-intra-wg-overlap")]) == []


def test_grouping_distinguishes_every_shape_key():
    changes = [{"dtype": "fp16"}, {"hdim": 64}, {"batch": 2}, {"seqlen_k": 8192}, {"heads_kv": 8}, {"pass": "bwd"}]
    assert len(cs.group_shapes([entry()] + [entry(**c) for c in changes])) == 1 + len(changes)


def test_failed_flash3_run():
    rows = cs.group_shapes([entry(ok=False, ms=0.0)])
    assert "failed" in rows[0]["flash3"] and cs.cell(rows[0]["flash3"]) == "FAIL"
    # A failed run beside a passing one of the same shape: the passing one counts.
    rows = cs.group_shapes([entry(ok=False, ms=0.5), entry(ms=2.0)])
    assert rows[0]["flash3"]["ms"] == 2.0


def test_flash3_tflops_recomputed_from_ms():
    rows = cs.group_shapes([entry(ms=ms_for(600.0), tflops=123.0)])
    assert abs(rows[0]["flash3"]["tflops"] - 600.0) < 1e-9


def test_peer_skip_reasons():
    assert cs.peer_skip_reason(entry()) is None
    assert cs.peer_skip_reason(entry(causal=True)) is None
    assert cs.peer_skip_reason(entry(heads_kv=4)) is None
    assert "top-left" in cs.peer_skip_reason(entry(causal=True, seqlen_q=128))
    assert cs.peer_skip_reason(entry(seqlen_q=128)) is None
    assert cs.peer_skip_reason(entry(dtype="e4m3"))
    assert cs.peer_skip_reason(entry(heads_kv=5))


def synthetic_rows():
    rows = cs.group_shapes([
        entry(ms=ms_for(600.0)),
        entry(causal=True, seqlen_q=512, seqlen_k=512, heads_kv=4, ms=ms_for(300.0, causal=True, seqlen_q=512,
                                                                            seqlen_k=512)),
        entry(hdim=256, ms=ms_for(500.0, hdim=256)),
    ])
    rows[0].update(fa2=cs.measured(rows[0], ms_for(400.0)), cudnn=cs.measured(rows[0], ms_for(480.0)))
    rows[1].update(fa2=cs.measured(rows[1], ms_for(100.0, causal=True, seqlen_q=512, seqlen_k=512)),
                   cudnn={"na": "No available kernel"})
    rows[2].update(fa2={"na": "head dim"}, cudnn=cs.measured(rows[2], ms_for(625.0, hdim=256)))
    return rows


def test_table_format():
    lines = cs.format_table(synthetic_rows()).splitlines()
    assert lines[0] == ("| pass | dtype | hdim | causal | batch | seqlen | heads | flash3 TFLOP/s | fa2 TFLOP/s "
                        "| cudnn TFLOP/s | flash3/fa2 | flash3/cudnn |")
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == "| fwd | bf16 | 128 | no | 4 | 4096 | 16 | 600.0 | 400.0 | 480.0 | 1.50 | 1.25 |"
    assert lines[3] == "| fwd | bf16 | 128 | yes | 4 | 512 | 16/4 | 300.0 | 100.0 | n/a | 3.00 | n/a |"
    assert lines[4] == "| fwd | bf16 | 256 | no | 4 | 4096 | 16 | 500.0 | n/a | 625.0 | n/a | 0.80 |"
    assert len(lines) == 5


def test_seqlen_column_shows_both_lengths_when_they_differ():
    row = cs.group_shapes([entry(seqlen_q=1, seqlen_k=8192)])[0]
    row.update(fa2={"na": "x"}, cudnn={"na": "x"})
    assert "| 1/8192 |" in cs.format_table([row])


def test_notes_count_each_reason_once():
    rows = synthetic_rows()
    rows.append(dict(rows[2], hdim=64))
    notes = cs.format_notes(rows)
    assert "- cudnn n/a on 1 shape(s): No available kernel" in notes
    assert "- fa2 n/a on 2 shape(s): head dim" in notes
    assert len(notes) == 2


def test_summary_counts_long_shapes_only():
    # Long shapes: 600 vs 480 (win), 500 vs 625 (loss); the 512 one is short.
    assert cs.format_summary(synthetic_rows()) == "flash3 beats cuDNN on 1 of 2 shapes with seqlen >= 1024"
    rows = synthetic_rows()
    rows[0]["cudnn"] = {"na": "x"}
    assert cs.format_summary(rows) == ("flash3 beats cuDNN on 0 of 2 shapes with seqlen >= 1024 "
                                       "(1 without both numbers)")


def test_self_test_needs_no_torch(tmp_path):
    # A torch that cannot be imported: the self-test must not touch it.
    (tmp_path / "torch.py").write_text("raise ImportError('torch must not be imported by --self-test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, str(SCRIPT), "--self-test"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_main_requires_input():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "--flash3-json" in done.stderr


def test_failure_reason_keeps_only_informative_warnings():
    caught = [
        "Memory efficient kernel not used because: (Triggered internally at /x/sdp_utils.cpp:986.)",
        "Memory Efficient attention has been runtime disabled. (Triggered internally at /x/sdp_utils_cpp.h:552.)",
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256. "
        "Got Query.size(-1): 512 instead. (Triggered internally at /x/sdp_utils.cpp:180.)",
    ]
    reason = cs.failure_reason(caught, RuntimeError("No available kernel. Aborting execution."))
    assert reason == ("Flash attention requires q,k,v to have the same last dimension and to be less than or "
                      "equal to 256. Got Query.size(-1): 512 instead. No available kernel. Aborting execution.")
    assert cs.failure_reason([], TypeError("unexpected keyword argument 'enable_gqa'")) == \
        "unexpected keyword argument 'enable_gqa'"
