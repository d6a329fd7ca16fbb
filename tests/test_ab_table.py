"""scripts/ab_table.py on synthetic flash3-bench JSON (no GPU)."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
import ab_table  # noqa: E402


def row(tflops, hdim=128, causal=False, seqlen=1024):
    return {"pass": "fwd", "dtype": "bf16", "hdim": hdim, "causal": causal, "seqlen_q": seqlen, "tflops": tflops}


def test_medians_over_rounds_and_ratio(tmp_path):
    for r, (a, b) in enumerate([(100, 101), (102, 90), (98, 103)], start=1):
        (tmp_path / f"base_fwd_{r}.json").write_text(json.dumps([row(a)]))
        (tmp_path / f"new_fwd_{r}.json").write_text(json.dumps([row(b)]))
    text, outside = ab_table.table(ab_table.collect(tmp_path), "base", "new", 0.015)
    # Each build's own rounds: base 98-102, new 90-103.
    assert "| fwd | bf16 | 128 | no | 1024 | 100.0 | 101.0 | 1.010 | 4.1% | 14.4% |" in text
    assert outside == 0
    assert text.splitlines()[-1].endswith("rounds spread up to 14.4% (median 9.3%)")


def test_rows_outside_the_tolerance_are_marked(tmp_path):
    (tmp_path / "base_bwd_1.json").write_text(json.dumps([row(100, causal=True)]))
    (tmp_path / "new_bwd_1.json").write_text(json.dumps([row(97, causal=True)]))
    (tmp_path / "notes.txt").write_text("ignored")
    text, outside = ab_table.table(ab_table.collect(tmp_path), "base", "new", 0.015)
    assert "0.970 **" in text and outside == 1
    assert "; 1 outside ±1.5%;" in text.splitlines()[-1]
