"""Bad input through the command line: exit code 2, exactly one line on stderr naming the file
and the field or node, never a traceback (unless --debug)."""
from __future__ import annotations

import pytest
import yaml

from kitsune_dse.errors import KitsuneError
from kitsune_dse.hw import list_specs

GOOD_MODEL = """\
name: tiny
sizes: {tokens: 8, hidden: 16}
inputs: {x: [tokens, hidden]}
weights: {w: [hidden, hidden]}
ops:
  - {name: fc, kind: matmul, inputs: [x, w], outputs: [h]}
  - {name: act, kind: relu, inputs: [h], outputs: [y]}
"""


def base_spec() -> dict:
    return yaml.safe_load(list_specs()["h100-sxm"].read_text(encoding="utf-8"))


def assert_one_line_error(result, *words):
    rc, out, err = result
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in out + err
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


# -- controls: the unmodified inputs work, so each error below is caused by its mutation --------
def test_controls_succeed(cli, write_yaml):
    assert cli(["hw", "show", write_yaml(base_spec(), "spec.yaml")]).rc == 0
    assert cli(["graph", "show", write_yaml(GOOD_MODEL, "model.yaml")]).rc == 0
    assert cli(["graph", "show", "gpt3-mlp", "--set", "tokens=64"]).rc == 0


# -- hardware specs --------------------------------------------------------------------------
def _spec_with(**changes) -> dict:
    data = base_spec()
    for k, v in changes.items():
        if v is _DELETE:
            del data[k]
        else:
            data[k] = v
    return data


_DELETE = object()


@pytest.mark.parametrize("changes, words", [
    pytest.param({"sm_count": -4}, ["'sm_count'", "greater than 0", "-4"], id="negative-sm-count"),
    pytest.param({"sm_count": 0}, ["'sm_count'"], id="zero-sm-count"),
    pytest.param({"hbm_bandwidth_Bps": 0}, ["'hbm_bandwidth_Bps'", "greater than 0"],
                 id="zero-bandwidth"),
    pytest.param({"hbm_bandwidth_Bps": "0 TB/s"}, ["'hbm_bandwidth_Bps'"], id="zero-bandwidth-unit"),
    pytest.param({"hbm_bandwidth_Bps": "3.35 GHz"}, ["'hbm_bandwidth_Bps'", "GHz", "B/s"],
                 id="wrong-unit-suffix"),
    pytest.param({"l2_bytes": "50 MB/s"}, ["'l2_bytes'", "MB/s"], id="bandwidth-for-bytes"),
    pytest.param({"sync_latency_s": "1 GHz"}, ["'sync_latency_s'", "GHz"], id="frequency-for-time"),
    pytest.param({"sm_count": "lots"}, ["'sm_count'", "lots"], id="unreadable-number"),
    pytest.param({"sm_clock_Hz": _DELETE}, ["missing required field", "'sm_clock_Hz'"],
                 id="missing-required-field"),
    pytest.param({"l2_byte": "50 MiB"}, ["unknown field 'l2_byte'", "did you mean", "'l2_bytes'"],
                 id="unknown-extra-field-with-suggestion"),
    pytest.param({"tensor_peak_flop_per_s": {"fp17": "1 TFLOP/s"}},
                 ["'tensor_peak_flop_per_s'", "unknown dtype 'fp17'", "'fp16'"],
                 id="unknown-dtype-in-peaks"),
    pytest.param({"efficiency": {"hbm": 1.5}}, ["'efficiency.hbm'"], id="fraction-above-one"),
    pytest.param({"efficiency": {"tensor_cor": 0.7}},
                 ["unknown field 'efficiency.tensor_cor'", "'tensor_core'"],
                 id="unknown-efficiency-field"),
])
def test_bad_spec(cli, write_yaml, changes, words):
    path = write_yaml(_spec_with(**changes), "bad-spec.yaml")
    assert_one_line_error(cli(["hw", "show", path]), path, *words)


def test_misspelt_spec_field_names_the_typo(cli, write_yaml):
    data = base_spec()
    data["l2_byte"] = data.pop("l2_bytes")
    path = write_yaml(data, "typo-spec.yaml")
    assert_one_line_error(cli(["hw", "show", path]), path, "unknown field 'l2_byte'",
                          "'l2_bytes'")


def test_malformed_spec_yaml(cli, write_yaml):
    path = write_yaml("name: x\nsm_count: [1, 2\n", "broken.yaml")
    assert_one_line_error(cli(["hw", "show", path]), path, "malformed YAML", "line")


def test_spec_that_is_not_a_mapping(cli, write_yaml):
    path = write_yaml("- just\n- a list\n", "list.yaml")
    assert_one_line_error(cli(["hw", "show", path]), path, "mapping")


def test_spec_file_not_found(cli, tmp_path):
    path = tmp_path / "nope.yaml"
    assert_one_line_error(cli(["hw", "show", path]), path, "not found")


def test_unknown_spec_name_suggests_closest(cli):
    assert_one_line_error(cli(["hw", "show", "h100-sx"]), "'h100-sx'", "did you mean",
                          "'h100-sxm'")


# -- models ----------------------------------------------------------------------------------
def test_unknown_model_name_suggests_closest(cli):
    assert_one_line_error(cli(["graph", "show", "gpt3-mpl"]), "'gpt3-mpl'", "did you mean",
                          "'gpt3-mlp'")


MODELS = {
    "cycle": ("""\
        name: cyc
        sizes: {n: 8}
        inputs: {x: [n, n]}
        ops:
          - {name: first, kind: add, inputs: [x, c], outputs: [b]}
          - {name: second, kind: relu, inputs: [b], outputs: [c]}
          - {name: out, kind: relu, inputs: [b], outputs: [y]}
        outputs: [y]
        """, ["cycle", "first", "second"]),
    "matmul-k-mismatch": ("""\
        name: kmis
        sizes: {m: 16, k: 32}
        inputs: {x: [m, k]}
        weights: {w: [64, 8]}
        ops:
          - {name: fc1, kind: matmul, inputs: [x, w], outputs: [y]}
        """, ["op 'fc1'", "matmul", "K=32", "K=64"]),
    "unknown-op-kind": ("""\
        name: kind
        inputs: {x: [4, 4]}
        ops:
          - {name: act, kind: gelue, inputs: [x], outputs: [y]}
        """, ["op 'act'", "unknown op kind 'gelue'", "did you mean", "'gelu'"]),
    "op-missing-kind": ("""\
        name: opmiss
        inputs: {x: [4, 4]}
        ops:
          - {name: act, inputs: [x], outputs: [y]}
        """, ["op 'act'", "missing required field 'kind'"]),
    "op-missing-outputs": ("""\
        name: opmiss
        inputs: {x: [4, 4]}
        ops:
          - {name: act, kind: relu, inputs: [x]}
        """, ["op 'act'", "missing required field 'outputs'"]),
    "unknown-default-dtype": ("""\
        name: dt
        dtype: fp17
        inputs: {x: [4, 4]}
        ops:
          - {name: act, kind: relu, inputs: [x], outputs: [y]}
        """, ["tensor 'x'", "unknown dtype 'fp17'", "'fp16'"]),
    "unknown-tensor-dtype": ("""\
        name: dt
        inputs: {x: {shape: [4, 4], dtype: flaot32}}
        ops:
          - {name: act, kind: relu, inputs: [x], outputs: [y]}
        """, ["tensor 'x'", "unknown dtype 'flaot32'", "'fp32'"]),
    "consumed-never-produced": ("""\
        name: np
        inputs: {x: [4, 4]}
        ops:
          - {name: act, kind: add, inputs: [x, hiden], outputs: [y]}
          - {name: act2, kind: relu, inputs: [y], outputs: [hidden]}
        """, ["op 'act'", "input 'hiden'", "neither", "'hidden'"]),
    "unknown-top-level-field": ("""\
        name: t
        input: {x: [4, 4]}
        ops:
          - {name: act, kind: relu, inputs: [x], outputs: [y]}
        """, ["unknown field 'input'", "'inputs'"]),
    "unknown-size-in-shape": ("""\
        name: t
        sizes: {tokens: 4}
        inputs: {x: [tokenz, 4]}
        ops:
          - {name: act, kind: relu, inputs: [x], outputs: [y]}
        """, ["tensor 'x'", "tokenz", "'tokens'"]),
    "op-name-used-twice": ("""\
        name: t
        inputs: {x: [4, 4]}
        ops:
          - {name: act, kind: relu, inputs: [x], outputs: [y]}
          - {name: act, kind: relu, inputs: [y], outputs: [z]}
        """, ["op 'act'", "twice"]),
    "malformed-model-yaml": ("name: bad\nops: [ {name: a\n", ["malformed YAML", "line"]),
}


@pytest.mark.parametrize("case", sorted(MODELS))
def test_bad_model(cli, write_yaml, case):
    text, words = MODELS[case]
    path = write_yaml(text, f"{case}.yaml")
    assert_one_line_error(cli(["graph", "show", path]), path, *words)


def test_model_file_not_found(cli, tmp_path):
    path = tmp_path / "missing.yaml"
    assert_one_line_error(cli(["graph", "show", path]), path, "not found")


# -- --set -----------------------------------------------------------------------------------
@pytest.mark.parametrize("setting, words", [
    pytest.param("tokenz=64", ["--set tokenz=64", "no size 'tokenz'", "did you mean", "'tokens'",
                               "gpt3-mlp.yaml"], id="unknown-size"),
    pytest.param("tokens=abc", ["--set", "'abc' is not an integer"], id="not-an-integer"),
    pytest.param("tokens=1.5", ["--set", "'1.5' is not an integer"], id="not-an-integer-float"),
    pytest.param("tokens", ["--set", "expected NAME=VALUE"], id="no-equals"),
    pytest.param("tokens=0", ["tokens=0", "positive integer"], id="zero"),
    pytest.param("tokens=-3", ["tokens=-3", "positive integer"], id="negative"),
])
def test_bad_set(cli, setting, words):
    assert_one_line_error(cli(["graph", "show", "gpt3-mlp", "--set", setting]), *words)


def test_set_on_a_yaml_file_names_the_file(cli, write_yaml):
    path = write_yaml(GOOD_MODEL, "tiny.yaml")
    assert_one_line_error(cli(["graph", "show", path, "--set", "seq=4"]), path, "no size 'seq'",
                          "hidden, tokens")


# -- --debug -----------------------------------------------------------------------------------
def test_debug_lets_the_traceback_through(cli, write_yaml):
    with pytest.raises(KitsuneError, match="did you mean 'h100-sxm'"):
        cli(["--debug", "hw", "show", "h100-sx"])
    path = write_yaml(MODELS["cycle"][0], "cycle.yaml")
    with pytest.raises(KitsuneError, match="cycle"):
        cli(["--debug", "graph", "show", path])


def test_debug_state_does_not_leak_into_the_next_call(cli):
    with pytest.raises(KitsuneError):
        cli(["--debug", "hw", "show", "h100-sx"])
    assert_one_line_error(cli(["hw", "show", "h100-sx"]), "h100-sx")


def test_an_unknown_option_is_a_usage_error_not_a_crash(cli):
    # typer >= 0.16 carries its own click (typer._click) and the click package may be absent:
    # the usage error must still come back as click's message and exit code 2
    r = cli(["explore", "gpt3-mlp", "--hw", "h100-sxm", "--no-such-option", "1"])
    assert r.rc == 2
    assert "No such option" in r.err and "Traceback" not in r.err
