# Every Python example in README.md and in the package's docstrings runs and prints what it
# shows (doctest).
import doctest
import os
import re

import shardmm
from conftest import TESTS_DIR


def test_docstring_examples():
    failures, tried = doctest.testmod(shardmm, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried >= 10 and failures == 0


def test_readme_python_blocks():
    with open(os.path.join(os.path.dirname(TESTS_DIR), "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    assert blocks, "README.md has no ```python block"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for n, block in enumerate(blocks):
        runner.run(parser.get_doctest(block, {}, f"README.md python block {n + 1}", "README.md", 0))
    assert runner.summarize(verbose=False).failed == 0
