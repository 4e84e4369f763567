"""The package's Numba cache stamps (kernels/_jit/cache.py): an edit of a helper module
that a cached kernel imports makes that kernel's cache entry stale."""

from attnbench.kernels._jit import cache as _numba_cache
from attnbench.kernels.numba_cpu.dense import forward
from attnbench.kernels.numba_cpu.dense import micro as _microkernel


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
    for kernel, helpers in ((forward.attend_block, {"math.py", "tiles.py"}),
                            (_microkernel._kernel, {"math.py", "launch.py"})):
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
    locator_class = type(forward.attend_block._cache._impl.locator)
    assert locator_class.from_function(namespace["f"], str(source)) is None


def test_dependencies_follow_relative_imports_of_any_depth(monkeypatch, tmp_path):
    files = {
        "__init__.py": "from ._api import run\n",  # the face: not read by a kernel
        "_api.py": "",
        "jit/__init__.py": "",
        "jit/maths.py": "from .consts import C\n",
        "jit/consts.py": "",
        "jit/unused.py": "",
        "cpu/__init__.py": "from .forward import run\n",
        "cpu/forward.py": "from ..jit.maths import f\nfrom . import tiles\nfrom .. import mods\n"
                          "import kernels_like.jit.deep\n",
        "cpu/tiles.py": "from ..jit import maths\n",
        "mods/__init__.py": "from .spec import m\n",
        "mods/spec.py": "",
        "jit/deep.py": "",
    }
    root = tmp_path / "kernels_like"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(_numba_cache, "PACKAGE_DIR", root)
    names = [p.relative_to(root).as_posix()
             for p in _numba_cache.dependencies(root / "cpu" / "forward.py")]
    assert names == ["cpu/forward.py", "cpu/tiles.py", "jit/__init__.py", "jit/consts.py",
                     "jit/deep.py", "jit/maths.py", "mods/__init__.py", "mods/spec.py"]
    before = _numba_cache.source_stamp(root / "cpu" / "forward.py")
    (root / "jit" / "unused.py").write_text("X = 1\n")
    assert _numba_cache.source_stamp(root / "cpu" / "forward.py") == before
    (root / "jit" / "consts.py").write_text("C = 2\n")
    assert _numba_cache.source_stamp(root / "cpu" / "forward.py") != before


_RUN_CACHED = """
import sys
from pathlib import Path
from attnbench.kernels._jit import cache as _numba_cache
_numba_cache.PACKAGE_DIR = Path(sys.argv[1]).resolve() / "tinypkg"
sys.path.insert(0, sys.argv[1])
from tinypkg.cpu import kern
print(kern.g(), kern.g.stats.cache_hits.get(kern.g.signatures[0], 0) if kern.g.signatures
      else 0)
"""


def test_editing_a_helper_in_a_subfolder_makes_a_cached_kernel_stale(tmp_path):
    """A real Numba cache: the kernel in ``cpu/kern.py`` inlines ``jit/helper.py``'s
    function (a subfolder of the package's other branch); editing only the helper must
    compile the kernel again (Numba alone would load the stale machine code: its stamp is
    the kernel file's)."""
    import os
    import subprocess
    import sys

    root = tmp_path / "tinypkg"
    for name, text in {
        "__init__.py": "", "cpu/__init__.py": "", "jit/__init__.py": "",
        "jit/helper.py": "from numba import njit\n\n@njit\ndef f():\n    return 1\n",
        "cpu/kern.py": "from numba import njit\nfrom ..jit.helper import f\n\n"
                       "@njit(cache=True)\ndef g():\n    return f()\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run():
        done = subprocess.run([sys.executable, "-c", _RUN_CACHED, str(tmp_path)], env=env,
                              capture_output=True, text=True, check=True)
        return done.stdout.split()

    assert run()[0] == "1"
    assert run() == ["1", "1"]  # loaded from the cache
    (root / "jit" / "helper.py").write_text(
        "from numba import njit\n\n@njit\ndef f():\n    return 2\n")
    assert run()[0] == "2"  # not the stale entry
