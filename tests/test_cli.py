"""The command line: info, check, demo and bench run on this machine."""

import csv
import json
import os
import subprocess
import sys

import pytest


def _cli(*args, env=None):
    out = subprocess.run([sys.executable, "-m", "nvshmem_topk", *args], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, **(env or {})))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_info_names_versions_and_the_default_impl():
    text = _cli("info")
    assert "torch" in text and "impl" in text and "exchange" in text


def test_check_reference_passes_every_family():
    from nvshmem_topk.testing import families

    cases = 2 * sum(1 for _ in families(1))  # every family at each of the two world sizes
    assert _cli("check", "--world-sizes", "1", "5").strip().endswith(f"{cases} passed, 0 failed")


def test_demo_simulated():
    lines = _cli("demo", "--world-sizes", "3", "--local-len", "2048", "--topk", "256").splitlines()
    assert lines[-1].split()[0] == "3" and lines[-1].endswith("yes")


def test_bench_writes_json_csv_and_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    paths = {k: tmp_path / f"bench.{k}" for k in ("json", "csv", "png")}
    _cli("bench", "--world-size", "2", "--rows", "1", "2", "--widths", "512", "1024", "--topk", "64",
         "--reps", "2", "--json", str(paths["json"]), "--csv", str(paths["csv"]), "--plot", str(paths["png"]))
    rows = json.loads(paths["json"].read_text())
    assert {(r["T"], r["S"]) for r in rows} == {(1, 512), (1, 1024), (2, 512), (2, 1024)}
    assert all(r["merge_ms"] > 0 and r["generic_ms"] > 0 for r in rows)
    assert len(list(csv.DictReader(paths["csv"].open()))) == 4
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_over_score_families(tmp_path):
    """``bench --dist`` times each family (global rows sharded by the
    interleave) and compares it with the first."""
    out = tmp_path / "bench.json"
    printed = _cli("bench", "--world-size", "2", "--rows", "1", "--widths", "512", "--topk", "64", "--reps", "1",
                   "--dist", "normal", "all_equal", "--interleave", "4", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [(r["dist"], r["I"]) for r in rows] == [("normal", 4), ("all_equal", 4)]
    assert [line.split()[0] for line in printed.splitlines()[-2:]] == ["normal", "all_equal"]
    assert printed.splitlines()[-2].split()[4] == "1.00x"


@pytest.mark.parametrize("argv,message", [
    (["demo", "--topk", "5000"], "argument --topk: expected an integer in [1, 4096], got 5000"),
    (["check", "--world-sizes", "17"], "argument --world-sizes: expected an integer in [1, 16], got 17"),
    (["bench", "--rows", "x"], "argument --rows: expected an integer, got 'x'"),
])
def test_bad_values_are_usage_errors(argv, message):
    out = subprocess.run([sys.executable, "-m", "nvshmem_topk", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_triton_missing_says_how_to_install(monkeypatch):
    import importlib.util

    from nvshmem_topk.__main__ import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises(SystemExit, match=r'pip install "nvshmem-topk\[triton\]"'):
        main(["check", "--impl", "triton", "--world-sizes", "1"])
