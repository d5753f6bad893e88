# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The package's layout: imports flow one way (payload <- wheels <- models <- data <- evaluation <- training <- cli),
there is no import cycle, and the remote-code payload imports only torch, transformers, the standard library and its
sibling payload modules (a published checkpoint copies those files and nothing else); the generation config of a
call is read by the routing's checks, the loop and the options module only."""

import ast
import sys
from pathlib import Path

import pytest


PACKAGE = Path(__file__).resolve().parents[1] / "hf_dflash"
PAYLOAD = (
    "timing_dflash", "costs_dflash", "speed_dflash", "configuration_dflash", "model_card", "checkpoint_dflash",
    "attention_dflash",  # grouped key/value heads in the loop's attention
    # generation, by floor: each module imports only those of the floors before it (see test_payload_floors)
    "options_dflash", "schedules_dflash", "cache_dflash", "sampling_dflash", "policy_dflash", "lookup_dflash", "stats_dflash",
    "diagnostics_dflash", "rows_dflash", "hub_dflash", "vocabulary_dflash",
    "checks_dflash", "candidates_dflash", "tree_dflash", "capture_dflash", "features_dflash",
    "modeling_dflash", "generation_dflash",
    "configuration_dflash2", "modeling_dflash2",  # DFlash2 drafters
)
# The generation side of the payload, bottom up: a module may import siblings of lower floors only.
FLOORS = (
    # the one clock and the GEMM-friendly verify widths; measured costs; the arithmetic of expected speed; grouped
    # key/value heads in the loop's attention; the call's options, resolved once (the policies take them)
    ("timing_dflash", "costs_dflash", "speed_dflash", "attention_dflash", "options_dflash", "schedules_dflash"),
    ("cache_dflash", "sampling_dflash", "policy_dflash", "lookup_dflash", "stats_dflash", "configuration_dflash",
     "model_card", "checkpoint_dflash"),
    ("diagnostics_dflash", "rows_dflash", "configuration_dflash2", "hub_dflash", "vocabulary_dflash",
     "capture_dflash", "features_dflash"),
    ("checks_dflash", "candidates_dflash", "tree_dflash"),
    ("generation_dflash",),
    ("modeling_dflash",),  # imports the loop module so that loading a drafter installs the routing
    ("modeling_dflash2",),  # a DFlash drafter plus convolutions and a candidate selector
)
MAX_MODULE_LINES = 450
# modules allowed past MAX_MODULE_LINES for now, each with the reason
OVER_THE_LIMIT: dict[str, str] = {}
# Each concept's one home: the module that defines these names (no other module of the package defines them).
HOMES = {
    "hf_dflash.options_dflash": ("DFlashCallOptions", "call_options", "resolve_call_options", "DFLASH_GENERATE_KWARGS",
                                 "DEFAULT_POLICY"),
    "hf_dflash.schedules_dflash": ("Draft", "DraftPolicy", "FullBlocks", "HeuristicSchedule", "most_drafts"),
    "hf_dflash.policy_dflash": ("CostAwarePolicy", "policy_memory", "POLICIES", "draft_policy"),
    "hf_dflash.checks_dflash": ("check_generate_call", "check_drafter_matches_target", "check_tree_call",
                                "check_policy_name"),
    "hf_dflash.diagnostics_dflash": ("check_acceptance", "low_acceptance_causes", "warn_quantized_drafter",
                                     "is_quantized"),
    "hf_dflash.speed_dflash": ("decay", "rates_by_depth", "best_draft_count", "chain_speed"),
    "hf_dflash.data.arguments": ("RegenerationArguments", "validate_regeneration_arguments"),
    "hf_dflash.data.resume": ("skipped_path", "meta_path", "done_indices", "check_same_regeneration",
                              "record_regeneration_settings"),
    "hf_dflash.data.regenerate": ("regenerate", "in_process_steps", "served_steps"),
    "hf_dflash.data.sharegpt": ("SHAREGPT_REQUIREMENT", "sharegpt_conversations", "is_evaluation_text"),
    "hf_dflash.data.stdlib_code": ("stdlib_functions", "code_edit_sources"),
    "hf_dflash.data.math_problems": ("math_problem",),
    "hf_dflash.evaluation.training_prompts": ("evaluation_guard", "workload_prompts", "training_prompts",
                                              "write_prompts"),
    "hf_dflash.evaluation.methods": ("METHODS", "METHOD_LABELS", "Run", "ForwardCounter", "method_kwargs",
                                     "timed_generation", "first_difference"),
    "hf_dflash.evaluation.progress": ("BenchProgress", "run_from_json"),
    "hf_dflash.evaluation.summaries": ("PromptResult", "method_tau", "summary_of", "cycle_costs", "chosen_drafts",
                                       "differences_from_plain", "bench_report", "bench_config", "all_identical"),
    "hf_dflash.evaluation.bench": ("run_benchmark", "timed_results"),
}
# scripts in front of library code: they define nothing, the package does
THIN_SCRIPTS = ("scripts/build_smollm2_prompts.py",)
# Each module may import modules of its own layer or of the layers before it, never after.
LAYERS = (
    ("hf_dflash", "hf_dflash.kernels_cpu") + tuple(f"hf_dflash.{name}" for name in PAYLOAD),
    ("hf_dflash.wheels",),
    ("hf_dflash.models",),
    ("hf_dflash.data",),
    ("hf_dflash.evaluation",),
    ("hf_dflash.training",),
    ("hf_dflash.cli", "hf_dflash.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module `path` imports, at top level or inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            # `from . import x` / `from .pkg import sub` may name submodules
            found |= {f"{module}.{alias.name}" for alias in node.names if (PACKAGE.parent / f"{module}.{alias.name}"
                      .replace(".", "/")).with_suffix(".py").exists()}
    return found


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    for index, names in enumerate(LAYERS):
        if any(module == n or (n != "hf_dflash" and module.startswith(n + ".")) for n in names):
            return index
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}.")


def own_imports(path: Path) -> set[str]:
    return {m for m in imported_modules(path) if m == "hf_dflash" or m.startswith("hf_dflash.")}


def test_every_module_has_a_layer():
    for module in package_modules():
        layer_of(module)


def test_imports_flow_one_way():
    wrong = []
    for module, path in package_modules().items():
        for imported in own_imports(path):
            if layer_of(imported) > layer_of(module):
                wrong.append(f"{module} imports {imported}")
    flow = "payload <- wheels <- models <- data <- evaluation <- training <- cli"
    assert not wrong, f"imports against the flow {flow}: " + "; ".join(sorted(wrong))


def test_no_import_cycles():
    modules = package_modules()
    graph = {m: {i for i in own_imports(p) if i in modules and i != m} for m, p in modules.items()}
    # a remote-code copy of generation_dflash imports the installed package instead of routing generate itself;
    # the installed copy never runs that import
    graph["hf_dflash.generation_dflash"].discard("hf_dflash")
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("name", PAYLOAD)
def test_payload_imports_only_torch_transformers_and_siblings(name):
    # huggingface_hub is a hard requirement of transformers: wherever transformers loads, it is there
    allowed_roots = {"torch", "transformers", "huggingface_hub"} | set(sys.stdlib_module_names)
    siblings = {f"hf_dflash.{n}" for n in PAYLOAD} | {"hf_dflash"}
    bad = sorted(m for m in imported_modules(PACKAGE / f"{name}.py")
                 if m.split(".")[0] not in allowed_roots and m not in siblings)
    assert not bad, f"{name}.py is copied next to published weights; it may not import {bad}"


def test_payload_floors():
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    assert set(floor) == set(PAYLOAD), "every payload module has a floor in FLOORS"
    wrong = []
    for name in PAYLOAD:
        for imported in own_imports(PACKAGE / f"{name}.py"):
            sibling = imported.removeprefix("hf_dflash.")
            if sibling in floor and floor[sibling] >= floor[name] and sibling != name:
                wrong.append(f"{name} (floor {floor[name]}) imports {sibling} (floor {floor[sibling]})")
    assert not wrong, wrong


def test_modules_stay_small():
    """One concept per module: none of the package's modules grows past MAX_MODULE_LINES lines (but those of
    OVER_THE_LIMIT), and the loop reads as its numbered steps in one screen."""
    long = {module: n for module, path in package_modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
            and module not in OVER_THE_LIMIT}
    assert not long, long
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in package_modules().items()}
    stale = [module for module in OVER_THE_LIMIT if sizes.get(module, 0) <= MAX_MODULE_LINES]
    assert not stale, f"{stale} no longer need their exemption: remove them from OVER_THE_LIMIT"
    source = (PACKAGE / "generation_dflash.py").read_text(encoding="utf-8")
    loop = next(node for node in ast.parse(source).body
                if isinstance(node, ast.FunctionDef) and node.name == "dflash_decoding")
    assert loop.end_lineno - loop.lineno + 1 < 80


def test_tests_import_no_other_test_module():
    """Shared factories and fixtures live in tests/conftest.py; a test file importing another couples their fates."""
    tests = Path(__file__).resolve().parent
    wrong = []
    for path in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{path.relative_to(tests)} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not wrong, wrong



def defined_names(path: Path) -> set[str]:
    """Names a module defines at top level: functions, classes and assigned names."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_each_concept_lives_in_its_home():
    modules = package_modules()
    defined = {module: defined_names(path) for module, path in modules.items()}
    wrong = [f"{name} is not defined in {home}" for home, names in HOMES.items() for name in names
             if name not in defined.get(home, set())]
    wrong += [f"{name} (home: {home}) is defined in {other} too" for home, names in HOMES.items() for name in names
              for other in sorted(modules) if other != home and name in defined[other]]
    assert not wrong, wrong


@pytest.mark.parametrize("script", THIN_SCRIPTS)
def test_thin_scripts_define_nothing(script):
    path = PACKAGE.parent / script
    defined = [node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not defined, f"{script} defines {defined}: library code belongs in hf_dflash/"


# who may read a call's generation config: the routing's checks (before any work), the loop, and the options module,
# which resolves it once into the DFlashCallOptions that every part below the loop takes
CONFIG_READERS = {"hf_dflash.checks_dflash", "hf_dflash.generation_dflash", "hf_dflash.options_dflash"}


def test_below_the_loop_no_module_reads_the_generation_config():
    from transformers import GenerationConfig

    from conftest import cached_target, make_drafter, make_prompt

    readers = set()

    class RecordingConfig(GenerationConfig):
        """A generation config that notes which hf_dflash module reads each of its attributes."""

        def __getattribute__(self, name):
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith("hf_dflash"):
                readers.add((module, name))
            return super().__getattribute__(name)

    target = cached_target("qwen3")
    drafter = make_drafter(target)
    calls = [(1, {}, {}), (1, dict(do_sample=True, output_scores=True, return_dict_in_generate=True), {}),
             (1, {}, dict(dflash_tree_budget=6)), (1, dict(num_assistant_tokens=3), {}), (2, {}, {})]
    for batch, settings, dflash in calls:
        config = RecordingConfig(max_new_tokens=10, pad_token_id=0, **settings)
        target.generate(make_prompt(6).expand(batch, -1), generation_config=config, assistant_model=drafter, **dflash)
    wrong = sorted((module, name) for module, name in readers if module not in CONFIG_READERS)
    assert not wrong, f"read below the loop (take it from DFlashCallOptions instead): {wrong}"
    assert any(module == "hf_dflash.options_dflash" for module, _ in readers)  # the recording works
