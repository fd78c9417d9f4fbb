"""CONTRIBUTING's "Interfaces between modules" is checked against the code: every signature written
there as `module.name(params)` must match the function or class it names (parameter names, their
order, keyword-only markers and defaults)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIGNATURE = re.compile(r"`(?P<module>[a-z_]+)\.(?P<name>[A-Za-z_][\w.]*)\((?P<params>[^`]*)\)`")


def section() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    start = text.index("## Interfaces between modules")
    return text[start:text.index("\n## ", start + 1) if "\n## " in text[start + 1:] else len(text)]


# where a short module name in the section may live: the library, then the command line's run-time tuning
PACKAGES = ("course_utils", "course_tools.cli")


OTHERS = ("torch",)  # libraries the section quotes for comparison; every other module name must be ours


def is_ours(module: str) -> bool:
    """A module (``gpt.py``) or a package (``pretrained/__init__.py``) of one of PACKAGES."""
    folders = [ROOT / package.replace(".", "/") for package in PACKAGES]
    return any((f / f"{module}.py").is_file() or (f / module / "__init__.py").is_file() for f in folders)


def documented() -> list[tuple[str, str, str]]:
    """(module, name, parameters) of every signature of one of our modules (``torch.…`` is not ours)."""
    return [(m["module"], m["name"], m["params"]) for m in SIGNATURE.finditer(section()) if is_ours(m["module"])]


def test_every_module_the_section_names_exists():
    """A mistyped or moved module would otherwise drop its signatures from the check without a word."""
    unknown = {m["module"] for m in SIGNATURE.finditer(section())} - {m for m, _, _ in documented()} - set(OTHERS)
    assert unknown == set(), f"CONTRIBUTING names modules that are not in {PACKAGES}: {sorted(unknown)}"


def resolve(module: str, name: str):
    for package in PACKAGES:
        try:
            obj = importlib.import_module(f"{package}.{module}")
        except ModuleNotFoundError:
            continue
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    raise AssertionError(f"no module {module} in {PACKAGES}")


def split_params(text: str) -> list[str]:
    """Top-level commas only (defaults may hold calls or tuples)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current.strip()] if p]


def same_default(written: str, actual: object) -> bool:
    try:
        return ast.literal_eval(written) == actual
    except ValueError:  # a name: a function, or the CPU device of Dist's default
        return written in (getattr(actual, "__name__", None), str(actual))


def check(module: str, name: str, params: str) -> list[str]:
    obj = resolve(module, name)
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    actual = [p for p in sig.parameters.values() if p.name != "self"]
    written = split_params(params)
    problems = []
    i = 0
    for item in written:
        if item == "*":
            if i >= len(actual) or actual[i].kind is not inspect.Parameter.KEYWORD_ONLY:
                problems.append("'*' where the code has no keyword-only parameters")
            continue
        if i >= len(actual):
            problems.append(f"{item!r} is not a parameter")
            continue
        p = actual[i]
        i += 1
        if item.startswith("*"):  # *args or **kwargs
            stars = 2 if item.startswith("**") else 1
            kind = inspect.Parameter.VAR_KEYWORD if stars == 2 else inspect.Parameter.VAR_POSITIONAL
            if p.kind is not kind or item[stars:] != p.name:
                problems.append(f"{item!r} vs {p}")
            continue
        pname, _, default = item.partition("=")
        if pname != p.name:
            problems.append(f"parameter {pname!r} is {p.name!r} in the code")
        elif default and (p.default is inspect.Parameter.empty or not same_default(default, p.default)):
            problems.append(f"{pname}={default} but the code has {p.name}={p.default!r}")
        elif not default and p.default is not inspect.Parameter.empty:
            problems.append(f"{pname} has the default {p.default!r} in the code")
        elif p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in written[:written.index(item)]:
            problems.append(f"{pname} is keyword-only in the code: write '*' before it")
    problems += [f"{p.name} is missing" for p in actual[i:]]
    return problems


def test_the_section_documents_the_model_library():
    names = {f"{m}.{n}" for m, n, _ in documented()}
    for expected in ("attention.MultiHeadAttention", "blocks.TransformerBlock", "config.GPTConfig", "gpt.GPT",
                     "counting.count_params", "train.train", "convert.from_hf", "tuning.choose_threads"):
        assert expected in names
    assert len(names) >= 50


@pytest.mark.parametrize(("module", "name", "params"), documented(), ids=lambda v: v if "(" not in v else "")
def test_documented_signature_matches_the_code(module, name, params):
    assert check(module, name, params) == [], f"CONTRIBUTING: {module}.{name}({params})"


def test_the_checker_finds_drift():
    assert check("attention", "causal_mask", "T, S=None") == ["device is missing"]
    assert check("attention", "causal_mask", "T, S=3, device=None") == ["S=3 but the code has S=None"]
    assert check("counting", "block_parameter_count",
                 "d_model, d_ff=None, activation='gelu', bias=True, n_heads=1, n_kv_heads=None, norm='layernorm'") \
        == [f"{name} is keyword-only in the code: write '*' before it" for name in ("n_heads", "n_kv_heads", "norm")]


def test_no_two_public_things_share_a_name():
    """CONTRIBUTING's rule across the library: a public function or class name means one thing (two
    ``load_tokenizer`` and two ``llama_config`` once did). Names a module imports are not its own."""
    import pkgutil

    import course_utils

    homes: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(course_utils.__path__):
        module = importlib.import_module(f"course_utils.{info.name}")
        for name, obj in vars(module).items():
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) \
                    and obj.__module__ == module.__name__:
                homes.setdefault(name, []).append(info.name)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def test_no_module_is_named_like_the_standard_library():
    """A file ``course_utils/tokenize.py`` (as the tokenizers' module once was) is imported in place of
    the standard library's ``tokenize`` by any script run from inside its folder, and ``linecache``,
    ``inspect`` and tracebacks import that one. Every module and subpackage of both packages is checked."""
    import pkgutil
    import sys

    import course_tools
    import course_utils

    clashes = [info.name
               for package in (course_utils, course_tools)
               for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
               if info.name.rsplit(".", 1)[-1] in sys.stdlib_module_names]
    assert clashes == [], f"rename {clashes}: each shadows a standard-library module"
