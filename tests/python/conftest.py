# The shardmm package under test comes from PYTHONPATH (the build tree's python/); the
# command from SHARDMM_CLI. tests/CMakeLists.txt sets both for ctest.
import os
import subprocess

import pytest

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("SHARDMM_CLI")
    assert path and os.path.exists(path), "set SHARDMM_CLI to the built shardmm command"

    def run(*args):
        done = subprocess.run([path, *args], capture_output=True, text=True, cwd=TESTS_DIR)
        return done.returncode, done.stdout, done.stderr

    return run


def golden_specs():
    """(mesh, canonical) of every valid spec in tests/golden/valid_specs.txt (no contractions, no sizes)."""
    out = []
    with open(os.path.join(TESTS_DIR, "golden", "valid_specs.txt"), encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            mesh, text, canonical = line.rstrip("\n").split("\t")
            if "@" not in text and "--dims" not in text:
                out.append((mesh, canonical))
    return out


# Hypothesis keeps no example database in the tree, and its tests take their time.
from hypothesis import settings  # noqa: E402

settings.register_profile("shardmm", database=None, deadline=None)
settings.load_profile("shardmm")
