"""scripts/clock_summary.py on hand-written nvidia-smi samples (no GPU)."""
import importlib.util
import pathlib

path = pathlib.Path(__file__).parent.parent / "scripts" / "clock_summary.py"
spec = importlib.util.spec_from_file_location("clock_summary", path)
clock_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clock_summary)


def sample(mhz, watts, temp=50, reasons="0x0000000000000004"):
    return f"2026/11/26 17:09:56.100, {mhz} MHz, {watts} W, {temp}, {reasons}"


def test_only_samples_under_load_count():
    lines = [sample(345, 70.1), sample(1590, 640.0), sample(1725, 503.2), sample(1980, 420.5, 55, "0x0")]
    line = clock_summary.summarise(lines)
    assert "(3 samples)" in line
    assert "SM 1590-1980 MHz, median 1725" in line
    assert "temperature max 55 C" in line
    assert "0x0000000000000004 x2" in line


def test_no_load_and_unreadable_lines_are_said_so():
    assert clock_summary.summarise([sample(345, 70.0), "garbage", "a, b, c, d, e"]) == "clocks: no sample under load"
