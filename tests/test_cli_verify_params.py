"""The ``attnbench verify`` and ``attnbench params`` commands."""

import json

import pytest

from attnbench.claims import ledger as claims
from attnbench.cli import main


def test_verify_json_shape(capsys):
    assert main(["verify", "--only", "C03", "C23", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in records] == ["C03", "C23"]
    for record in records:
        assert {"id", "verdict", "measured", "condition", "claim", "values"} <= set(record)
        assert record["verdict"] in claims.VERDICTS
    assert records[1]["verdict"] == "does-not-hold"


def test_verify_text(capsys):
    assert main(["verify", "--only", "C24", "--details"]) == 0
    out = capsys.readouterr().out
    assert "C24  HOLDS" in out and "measured:" in out and "Ledger run time" in out


def test_verify_exits_1_when_a_check_errors(monkeypatch, capsys):
    claim = claims.CLAIMS["C09"]
    monkeypatch.setitem(claims.CLAIMS, "C09", claims.Claim(
        claim.id, claim.source, claim.text, lambda: 1 / 0))
    assert main(["verify", "--only", "C09", "C24", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["verdict"] == "error"
    assert "ZeroDivisionError" in captured.err


def test_verify_unknown_id_is_a_usage_error(capsys):
    assert main(["verify", "--only", "C77"]) == 2
    assert "unknown claim id" in capsys.readouterr().err


def test_params_named(capsys):
    assert main(["params", "bert-base"]) == 0
    out = capsys.readouterr().out
    assert "109,482,240" in out and "2,362,368" in out and "+0.00%" in out


def test_params_all_json(capsys):
    assert main(["params", "--all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [row["config"] for row in rows]
    assert {"bert-base", "bert-large", "gpt2-small", "gpt3-175b", "llama2-70b"} <= set(names)
    gpt3 = rows[names.index("gpt3-175b")]
    assert abs(gpt3["difference_pct"]) < 1 and gpt3["mha_parameters"] is None


def test_params_custom(capsys, tmp_path):
    csv = tmp_path / "p.csv"
    argv = ["params", "--d-model", "768", "--layers", "12", "--heads", "12", "--kv-heads", "12",
            "--d-ff", "3072", "--vocab", "30522", "--max-len", "512", "--json", "--csv", str(csv)]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["attention_per_layer"] == 2_362_368 and row["mha_matches"] is True
    assert row["published_total"] is None and csv.exists()


@pytest.mark.parametrize("argv, message", [
    (["params", "--d-model", "768"], "needs --layers"),
    (["params", "gpt5"], "unknown configuration"),
    (["params", "--d-model", "100", "--layers", "1", "--heads", "3", "--d-ff", "8",
      "--vocab", "9"], "divisible"),
])
def test_params_bad_input(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["verify", "params"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert command in capsys.readouterr().out
