"""Files given to the toolkit that are missing, not text, or not JSON: one clear error that names the file."""
from __future__ import annotations

import re

import pytest

from weave_sim.calibrate import CalibrationError, read_measurements
from weave_sim.cli import main
from weave_sim.jsonfile import read_json
from weave_sim.profile import ProfileError, load_profile


@pytest.fixture
def bad_files(tmp_path):
    binary = tmp_path / "plot.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    broken = tmp_path / "broken.json"
    broken.write_text('{"gemm": [1, 2,')
    return {"binary": (binary, "not a text (JSON) file"), "broken": (broken, "not valid JSON"),
            "missing": (tmp_path / "missing.json", "No such file"), "folder": (tmp_path, "Is a directory")}


def test_read_json(tmp_path, bad_files):
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2]}')
    assert read_json(good, "thing") == {"a": [1, 2]}
    for path, words in bad_files.values():
        with pytest.raises(ValueError, match=re.escape(f"cannot read thing {path}: ") + ".*" + re.escape(words)):
            read_json(path, "thing")
    with pytest.raises(KeyError):
        read_json(bad_files["binary"][0], "thing", KeyError)


def test_profiles_and_measurements_name_the_file(bad_files):
    for key in ("binary", "broken"):
        path, words = bad_files[key]
        with pytest.raises(ProfileError, match=re.escape(f"cannot read hardware profile {path}: {words}")):
            load_profile(path)
    for path, words in bad_files.values():
        with pytest.raises(CalibrationError, match=re.escape(f"cannot read measurements {path}: ") + ".*"
                           + re.escape(words)):
            read_measurements(path)


@pytest.mark.parametrize("key", ["binary", "broken", "missing"])
def test_cli_commands_name_the_file(tmp_path, capsys, bad_files, key):
    path, words = bad_files[key]
    out = str(tmp_path / "out")
    for argv in (["calibrate", str(path), "-o", str(tmp_path / "p.json")],
                 ["calibrate", "--fit", str(path), "-o", str(tmp_path / "p.json")],
                 ["validate", str(path), "--out", out],
                 ["timeline-stats", str(path)]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert str(path) in err and words in err and "Traceback" not in err, (argv, err)
    if key != "missing":  # a missing profile is refused earlier, with the shipped profiles listed
        capsys.readouterr()
        assert main(["simulate", "--profile", str(path), "--layers", "0", "--quiet", "--out", out]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and words in err and "Traceback" not in err, err
