"""The package's Numba cache stamps (kernels/_numba_cache.py): an edit of a helper module
that a cached kernel imports makes that kernel's cache entry stale."""

from kernels import _microkernel, _numba_cache, numba_cpu


def _package(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_dependencies_follow_module_level_package_imports(monkeypatch, tmp_path):
    pkg = _package(tmp_path, {
        "kernel.py": "import numpy\nfrom . import helper\nfrom .maths import f\n"
                     "def g():\n    from .lazy import h\n",
        "helper.py": "from .deep import x\n", "maths.py": "", "deep.py": "", "lazy.py": "",
    })
    monkeypatch.setattr(_numba_cache, "PACKAGE_DIR", pkg)
    names = [p.name for p in _numba_cache.dependencies(pkg / "kernel.py")]
    assert names == ["deep.py", "helper.py", "kernel.py", "maths.py"]  # not lazy.py


def test_the_stamp_changes_when_a_helper_changes(monkeypatch, tmp_path):
    pkg = _package(tmp_path, {"kernel.py": "from .maths import f\n", "maths.py": "A = 1\n",
                              "other.py": ""})
    monkeypatch.setattr(_numba_cache, "PACKAGE_DIR", pkg)
    before = _numba_cache.source_stamp(pkg / "kernel.py")
    (pkg / "other.py").write_text("B = 2\n")  # not imported by the kernel: same stamp
    assert _numba_cache.source_stamp(pkg / "kernel.py") == before
    (pkg / "maths.py").write_text("A = 2\n")
    assert _numba_cache.source_stamp(pkg / "kernel.py") != before


def test_the_kernels_are_stamped_with_their_helpers():
    assert _numba_cache.INSTALLED
    for kernel, helpers in ((numba_cpu._attend_block, {"_numba_math.py", "_numba_tiles.py"}),
                            (_microkernel._kernel, {"_numba_math.py", "_numba_launch.py"})):
        locator = kernel._cache._impl.locator
        assert getattr(locator, "package_locator", False)
        files = {p.name for p in _numba_cache.dependencies(locator._py_file)}
        assert helpers <= files
        assert locator.get_source_stamp()[1] == _numba_cache.source_stamp(locator._py_file)


def test_functions_outside_the_package_keep_numbas_locators(tmp_path):
    source = tmp_path / "elsewhere.py"
    source.write_text("def f(x):\n    return x\n")
    namespace = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    locator_class = type(numba_cpu._attend_block._cache._impl.locator)
    assert locator_class.from_function(namespace["f"], str(source)) is None
