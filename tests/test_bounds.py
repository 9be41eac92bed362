"""The bounds that keep the code base carryable: a kernel module is one
stage (under 500 lines), ``api.py`` only validates and dispatches (200),
no kernel takes more than 25 parameters, README stays a user's document
(250 lines)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def test_kernel_modules_api_and_readme_stay_within_their_lines():
    for path in sorted((ROOT / "kernels").glob("*.py")):
        assert _lines(path) <= 500, path.name
    assert _lines(ROOT / "nvshmem_topk" / "api.py") <= 200
    assert _lines(ROOT / "README.md") <= 250


def test_no_kernel_takes_more_than_25_parameters():
    kernels = []
    for path in sorted((ROOT / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and node.decorator_list:
                kernels.append((f"{path.stem}.{node.name}", len(node.args.args)))
    assert len(kernels) >= 10, kernels  # every launched kernel is named *_kernel
    assert all(count <= 25 for _, count in kernels), kernels
