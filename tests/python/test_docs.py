# Every Python example in README.md, in docs/ and in the package's docstrings runs and prints
# what it shows (doctest).
import doctest
import os
import re

import pytest

import shardmm
from conftest import TESTS_DIR


def test_docstring_examples():
    failures, tried = doctest.testmod(shardmm, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried >= 10 and failures == 0


ROOT = os.path.dirname(TESTS_DIR)
# The pages whose ```python blocks run: each must have one. Their paths (examples/...) are
# from the repository root, as the pages' `$ shardmm` transcripts are.
PAGES = ["README.md", "docs/programs.md", "docs/solve.md"]


def test_every_page_with_python_blocks_is_tested():
    with_blocks = ["README.md"] + [f"docs/{name}" for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                   if name.endswith(".md") and python_blocks(f"docs/{name}")]
    assert sorted(with_blocks) == sorted(PAGES)


def python_blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks(page, monkeypatch):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no ```python block"
    monkeypatch.chdir(ROOT)
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for n, block in enumerate(blocks):
        runner.run(parser.get_doctest(block, {}, f"{page} python block {n + 1}", page, 0))
    assert runner.summarize(verbose=False).failed == 0
