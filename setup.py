"""What pyproject.toml cannot say: where the kernels' folder is installed.

- In every build, the repository's folder ``kernels/`` is the package ``attnbench.kernels``:
  a wheel has one top-level package, ``attnbench``.  Hugging Face's ``kernels``
  distribution (which transformers requires) installs a top-level ``kernels``; two
  distributions that write the same files overwrite, and on uninstall delete, each
  other's.
- An editable install (``pip install -e .``, the README's) also maps the top-level name
  ``kernels`` to the folder, through setuptools' import finder, which Python asks after
  every installed package: ``import kernels`` is attnbench's where no other package owns
  the name, and the folder hands the name over to ``attnbench.kernels`` (one module
  object; ``kernels/_name.py``).  docs/design.md says why.
"""

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel

KERNELS = find_packages(include=["kernels", "kernels.*"])


class EditableWithShortName(editable_wheel):
    """``editable_wheel`` with the top-level name ``kernels`` mapped to the folder too."""

    def run(self):
        dist = self.distribution
        dist.packages = [*dist.packages, *KERNELS]
        dist.package_dir = {**(dist.package_dir or {}), "kernels": "kernels"}
        super().run()


setup(
    packages=find_packages(include=["attnbench", "attnbench.*"])
    + [f"attnbench.{name}" for name in KERNELS],
    package_dir={"attnbench.kernels": "kernels"},
    cmdclass={"editable_wheel": EditableWithShortName},
)
