"""scripts/match_table.py on synthetic files of both benchmarks (no GPU)."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
import match_table  # noqa: E402


def bench_row(tflops, seqlen=1024, causal=False):
    return {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": causal, "seqlen_q": seqlen, "tflops": tflops}


def python_row(tflops, seqlen=1024, causal=False, method="flash3", status="ok"):
    return {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": causal, "seqlen": seqlen, "method": method,
            "status": status, "tflops": tflops}


def test_ratios_tolerance_and_shapes_in_one_only(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps([bench_row(500), bench_row(600, 2048), bench_row(400, 4096)]))
    (tmp_path / "p.json").write_text(json.dumps({"regime": {}, "results": [
        python_row(497), python_row(580, 2048), python_row(900, method="sdpa_flash"),
        python_row(0, 8192, status="na")]}))
    text, bad = match_table.table(match_table.bench_rows([tmp_path / "b.json"]),
                                  match_table.python_rows([tmp_path / "p.json"]), 0.01)
    assert "| fwd | bf16 | 128 | no | 1024 | 500.0 | 497.0 | 0.994 |" in text
    assert "| 2048 | 600.0 | 580.0 | 0.967 ** |" in text
    assert text.splitlines()[-1] == ("flash_attn_func/flash3-bench: 2 shapes, ratio 0.967-0.994, median 0.980; "
                                     "1 outside ±1%; 1 shapes in one only")
    assert bad == 2


def test_value_head_dim_of_its_own_is_a_row_of_its_own(tmp_path):
    # 192/128 (hdim_v in both files) is matched with itself, not merged with 192, and sorts after it.
    pair = dict(hdim=192, hdim_v=128)
    (tmp_path / "b.json").write_text(json.dumps([{**bench_row(700), "hdim": 192, "hdim_v": 192},
                                                 {**bench_row(650), **pair}, bench_row(600)]))
    (tmp_path / "p.json").write_text(json.dumps({"regime": {}, "results": [
        {**python_row(699), "hdim": 192}, {**python_row(648), **pair}, python_row(601)]}))
    text, bad = match_table.table(match_table.bench_rows([tmp_path / "b.json"]),
                                  match_table.python_rows([tmp_path / "p.json"]), 0.01)
    rows = [line for line in text.splitlines() if line.startswith("| fwd")]
    assert [r.split(" | ")[2] for r in rows] == ["128", "192", "192/128"]
    assert "| 192/128 | no | 1024 | 650.0 | 648.0 | 0.997 |" in text
    assert bad == 0
