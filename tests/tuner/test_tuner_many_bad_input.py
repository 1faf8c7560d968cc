"""Bad input to tune-many, coverage and best --validate: one line `tuner: error: ...`, exit code 2,
nothing on stdout, no database created (each through the real main())."""

from __future__ import annotations

import pytest

from tuner.cli.commands import main
from tuner_doubles import LANDSCAPE

def run(argv: list[str]) -> int:
    """main(argv)'s exit code (argparse's refusals exit)."""
    try:
        return main(argv)
    except SystemExit as done:
        return int(done.code)


GOOD = '- {shape: "2,8,1024,64", dtype: fp16, flags: {causal: true}}\n'


@pytest.mark.parametrize("text, line", [
    (None, "cannot read shapes.yaml: No such file or directory"),
    ("- [unclosed\n", "shapes.yaml is not YAML: "),
    ("", "shapes.yaml: expected a list of problems, each with shape, dtype and flags"),
    ("{shape: 1}\n", "shapes.yaml: expected a list of problems, each with shape, dtype and flags"),
    ("- 5\n", "shapes.yaml: entry 1 is not a mapping of shape, dtype and flags"),
    (GOOD + '- {shape: "2,8,1024,64"}\n', "shapes.yaml: entry 2 has no 'dtype'"),
    ('- {shape: "2,8,1024,64", dtypes: fp16}\n', "shapes.yaml: entry 1: unknown key 'dtypes' (keys: shape, dtype, flags)"),
    ('- {shape: "2,8,x,64", dtype: fp16}\n', "shapes.yaml: entry 1: malformed shape '2,8,x,64'"),
    ('- {shape: "2,8,1024,64", dtype: fp64}\n', "shapes.yaml: entry 1: unsupported dtype 'fp64'"),
    ('- {shape: "2,8,1024,64", dtype: fp16, flags: {masked: true}}\n',
     "shapes.yaml: entry 1: attention: unknown problem flag 'masked' (flags: causal)"),
    ('- {shape: "2,8,1024,64", dtype: fp16, flags: causal}\n',
     "shapes.yaml: entry 1: flags must be a mapping (name: value), not 'causal'"),
    ("- {shape: '2,8,1024,64', dtype: fp16}\n".encode("utf-16"), "shapes.yaml is not UTF-8 text: byte 0xff at offset 0"),
    (b"- {shape: '2,8,1024,64', dtype: fp16\xe9}\n", "shapes.yaml is not UTF-8 text: byte 0xe9 at offset 36"),
])
def test_a_bad_shapes_file(tmp_path, monkeypatch, capsys, text, line):
    monkeypatch.chdir(tmp_path)
    if isinstance(text, bytes):
        (tmp_path / "shapes.yaml").write_bytes(text)
    elif text is not None:
        (tmp_path / "shapes.yaml").write_text(text)
    assert main(["tune-many", "attention", "--shapes", "shapes.yaml", "--replay", str(LANDSCAPE)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("tuner: error: " + line), err
    assert list(tmp_path.iterdir()) == ([tmp_path / "shapes.yaml"] if text is not None else [])


@pytest.mark.parametrize("argv, line", [
    (["--replay", str(LANDSCAPE.parent)], "no landscape given records attention 4x8x512x64-fp16-causal "
                                          "(--replay: one landscape per problem, or a folder of them)"),
    (["--replay", "nope.json"], "cannot read landscape nope.json: No such file or directory"),
    ([], "no GPU is visible (to tune without one, replay a recorded landscape with --replay FILE)"),
    (["--trials", "0"], "argument --trials: must be at least 1, not 0"),
    (["--trials", "3", "--time-budget", "1m"], "argument --time-budget: not allowed with argument --trials"),
])
def test_tune_many_refuses(tmp_path, monkeypatch, capsys, argv, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes.yaml").write_text(GOOD + '- {shape: "4,8,512,64", dtype: fp16, flags: {causal: true}}\n')
    assert run(["tune-many", "attention", "--shapes", "shapes.yaml", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"tuner: error: {line}"]
    assert not (tmp_path / "tuner.db").exists()


@pytest.mark.parametrize("argv, line", [
    (["coverage", "nope"], "unknown kernel family 'nope'"),
    (["coverage", "attention"], "no database at {db}: nothing is stored there"),
    (["tune-many", "nope", "--shapes", "s.yaml"], "unknown kernel family 'nope'"),
    (["best", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--replay", str(LANDSCAPE)],
     "--replay and --ray-address go with --validate"),
    (["best", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--validate"],
     "no database at {db}: nothing is stored there"),
])
def test_coverage_and_best_refuse(tmp_path, monkeypatch, capsys, argv, line):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNER_DB", raising=False)
    assert run(argv) == 2
    out, err = capsys.readouterr()
    line = line.format(db=tmp_path / "tuner.db")
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"tuner: error: {line}"), err
    assert not (tmp_path / "tuner.db").exists()
