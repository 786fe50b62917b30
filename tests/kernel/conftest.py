"""Fixtures of the kernel tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def kernel_script():
    """load(name): the script tests/kernel/NAME.py as a module (the scripts import each other by plain name, so
    this folder is on sys.path while one loads)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(HERE))
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.path.remove(str(HERE))
        return mod
    return load
