"""Sweep grids: from a mapping, from TOML files, named; the union of several grids."""

import importlib.util

import pytest

from attnbench.sweep.grid import (
    GRIDS,
    Grid,
    Point,
    expand,
    grid_from_mapping,
    load_grid_file,
    parse_variant,
)


def test_a_grid_is_the_product_of_its_values_with_kv_heads_defaulting_to_heads():
    grid = Grid(L=(16, 32), d_k=(8,), heads=(2, 4), mask=("none", "causal"),
                backend=("numba",))
    points = grid.points()
    assert len(points) == 2 * 2 * 2
    assert all(point.kv_heads == point.heads for point in points)
    assert Point("numba", 16, 8, 4, 4, 1, "causal", "float32") in points


def test_scalars_and_aliases_are_accepted_in_a_mapping():
    grid = grid_from_mapping({"L": 64, "dk": [8, 16], "backends": "reference"})
    assert grid.L == (64,) and grid.d_k == (8, 16) and grid.backend == ("reference",)


# (mapping, words the error must contain)
BAD_MAPPINGS = [
    ({"L": [0]}, ["L", "positive"]),
    ({"L": [1.5]}, ["L", "positive"]),
    ({"heads": [True]}, ["heads", "positive"]),
    ({"mask": ["triangle"]}, ["mask", "triangle", "causal"]),
    ({"dtype": ["int8"]}, ["dtype", "int8", "float32", "bfloat16"]),
    ({"backend": ["jax"]}, ["backend", "jax", "numba"]),
    ({"seq_len": [4]}, ["unknown parameter", "seq_len", "d_k"]),
    ({"L": []}, ["L", "no values"]),
    ({"direction": ["sideways"]}, ["direction", "sideways", "backward"]),
    ({"variant": ["window"]}, ["variant", "window", "window-W"]),
    ({"variant": ["documents-0"]}, ["variant", "documents-0", "documents-N"]),
    ({"variant": ["window--3"]}, ["variant", "window--3"]),
    ({"variant": ["relative"]}, ["variant", "relative", "alibi"]),
    ({"variant": []}, ["variant", "no values"]),
]


def test_half_dtypes_are_grid_values():
    grid = grid_from_mapping({"dtype": ["float16", "bfloat16"], "backend": "numba"})
    assert {point.dtype for point in grid.points()} == {"float16", "bfloat16"}


@pytest.mark.parametrize("mapping, words", BAD_MAPPINGS)
def test_bad_grids_say_what_was_expected(mapping, words):
    with pytest.raises(ValueError) as info:
        grid_from_mapping(mapping)
    for word in words:
        assert word in str(info.value)


def test_toml_with_several_grids_is_their_union(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        "[[grid]]\nL = [16, 32]\nd_k = 8\nbackend = ['numba', 'reference']\n\n"
        "[[grid]]\nL = 16\nd_k = [8, 16]\nbackend = 'numba'\n"
    )
    grids = load_grid_file(path)
    assert len(grids) == 2
    points = expand(grids)
    # numba: L16 d8, L32 d8, L16 d16 (L16 d8 only once); reference: L16, L32.
    assert len(points) == 5
    assert [p.backend for p in points] == ["numba"] * 3 + ["reference"] * 2


def test_toml_with_top_level_parameters_is_one_grid(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text("L = [16, 32]\nmask = ['none', 'padding']\n")
    (grid,) = load_grid_file(path)
    assert grid.mask == ("none", "padding") and grid.d_k == (64,)


def test_bad_files_name_the_file_and_the_problem(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("L = [16,\n")
    with pytest.raises(ValueError, match="broken.toml: not valid TOML"):
        load_grid_file(broken)
    mixed = tmp_path / "mixed.toml"
    mixed.write_text("d_k = 8\n[[grid]]\nL = 16\n")
    with pytest.raises(ValueError, match="outside the 'grid' list"):
        load_grid_file(mixed)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[[grid]]\nL = 16\n[[grid]]\nlength = 16\n")
    with pytest.raises(ValueError, match="grid 2: unknown parameter 'length'"):
        load_grid_file(unknown)


@pytest.mark.skipif(importlib.util.find_spec("yaml") is not None,
                    reason="tests the message shown without pyyaml, and pyyaml is installed")
def test_yaml_without_pyyaml_says_to_install_it(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("L: [16]\n")
    with pytest.raises(ValueError, match="pyyaml"):
        load_grid_file(path)


def test_yaml_with_pyyaml(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "grid.yaml"
    path.write_text("grid:\n  - {L: [16, 32], backend: numba}\n")
    assert len(expand(load_grid_file(path))) == 2


def test_named_grids_are_valid_and_the_tiny_one_is_small():
    for name, grids in GRIDS.items():
        assert expand(grids), name
    assert max(point.L for point in expand(GRIDS["tiny"])) <= 64


def test_direction_and_variant_axes_multiply_the_points_and_default_to_forward_plain():
    grid = grid_from_mapping({"L": [16, 32], "backend": "numba",
                              "directions": ["forward", "backward"],
                              "variants": ["none", "window-4", "documents-2", "alibi",
                                           "softcap"]})
    points = grid.points()
    assert len(points) == 2 * 2 * 5
    assert Point("numba", 32, 64, 4, 4, 1, "none", "float32", "backward", "window-4") in points
    plain = Grid(L=(16,), backend=("numba",)).points()[0]
    assert (plain.direction, plain.variant) == ("forward", "none")
    assert "window-4 backward" in Point("numba", 8, 4, 1, 1, 1, "none", "float32",
                                        "backward", "window-4").label()


@pytest.mark.parametrize("name, parsed", [("none", ("none", None)), ("window-0", ("window", 0)),
                                          ("window-256", ("window", 256)),
                                          ("documents-8", ("documents", 8)),
                                          ("alibi", ("alibi", None))])
def test_variant_names_are_parsed(name, parsed):
    assert parse_variant(name) == parsed


def test_grid_files_take_the_new_axes(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text("[[grid]]\nL = [16, 32]\nbackend = 'numba'\ndirection = 'backward'\n\n"
                    "[[grid]]\nL = 64\nmask = 'causal'\nvariant = ['window-8', 'window-16']\n"
                    "backend = 'numba'\n")
    points = expand(load_grid_file(path))
    assert [(p.L, p.direction, p.variant) for p in points] == [
        (16, "backward", "none"), (32, "backward", "none"), (64, "forward", "window-8"),
        (64, "forward", "window-16")]


def test_the_quick_grid_sweeps_the_backward_and_windows_over_enough_lengths():
    points = expand(GRIDS["quick"])
    backward = {p.L for p in points if p.direction == "backward" and p.backend == "numba"}
    windows = {(p.L, p.variant) for p in points if p.variant.startswith("window-")}
    assert len(backward) >= 7 and max(backward) / min(backward) >= 16
    assert len({L * int(v.split("-")[1]) for L, v in windows}) >= 7  # distinct L·W
    for variant in ("window-64", "window-256"):  # each W against L: 7 lengths over 16x
        lengths = {L for L, v in windows if v == variant}
        assert len(lengths) >= 7 and max(lengths) / min(lengths) >= 16
    plain_causal = {p.L for p in points if p.backend == "numba" and p.variant == "none"
                    and p.mask == "causal" and p.direction == "forward"}
    # The speed-up over the plain causal call, at 4 lengths per window.
    assert len({L for L, _ in windows} & plain_causal) >= 4
