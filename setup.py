"""What pyproject.toml cannot say: the wheel carries the firmware's sources and the boards (SConstruct, firmware/,
boards/) as colibri/tree/, so `colibri build` and `colibri run` work without a checkout (colibri/paths.py copies
the tree into the user's cache and builds there). An editable install runs the checkout itself."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
TREE = ("SConstruct", "firmware", "boards")


class BuildPyWithTree(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        tree = Path(self.build_lib) / "colibri" / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        for name in TREE:
            source = HERE / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(source, tree / name)


setup(cmdclass={"build_py": BuildPyWithTree})
