"""CI runs the README's test command, and the lint and type checks the README says it runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command_with_ruff_and_mypy() -> None:
    readme = ROOT.joinpath("README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b and "install" in b)
    ci = ROOT.joinpath(".ci", "run").read_text()
    install, pytest_part = test_command.split(" && ")
    assert install in ci and pytest_part in ci, (test_command, ci)
    assert "ruff check ." in ci and re.search(r"&& mypy &&", ci)
    assert "ruff check ." in readme and "mypy" in readme
