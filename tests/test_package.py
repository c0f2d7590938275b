"""The package as a whole (`spacy_unmask/__init__.py`): importing it is cheap, and its
modules stack in one order: each imports only modules below it (no circle, no arrow
running back up), function-level imports included."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spacy_unmask"
# Lowest first. A module may import only modules on earlier lines.
LAYERS = [
    ["masks", "families", "dropout", "fused", "gguf_tokenizer", "windows", "readers", "opt_ins", "cpu"],
    ["pooling", "settings", "download", "base_quantization", "saved_shapes", "saved_tokenizer", "compact", "weights_file"],
    ["loading", "lora", "base_model", "vocabulary"],
    ["quantize"],
    ["backbone"],
    ["saving"],
    ["layers.decoder_tok2vec", "layers.listener"],
    ["pipeline.viterbi", "pipeline.scoring", "pipeline_files"],
    ["pipeline.marginals"],
    ["pipeline.crf"],
    ["pipeline.unmask_ner", "sharing"],
    ["annotate.records", "trim_cli"],
    ["annotate.options"],
    ["annotate.output"],
    ["annotate.local", "annotate.ray_engine", "bench"],
    ["annotate.cli", "annotate"],
    ["__main__"],
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_imports(path: Path):
    """The project modules `path` imports anywhere in it (relative imports resolved)."""
    here = module_name(path).split(".") if module_name(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("spacy_unmask"):
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                candidate = ".".join(target + [alias.name])
                found.add(candidate if candidate in RANK else ".".join(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("spacy_unmask."):
                    found.add(alias.name.split(".", 1)[1])
    return {name for name in found if name}


def modules():
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if module_name(p) not in ("", "layers", "pipeline")}


def test_every_module_has_its_place_in_the_stack():
    assert sorted(set(modules()) - set(RANK)) == []
    assert sorted(set(RANK) - set(modules())) == []


def test_imports_only_run_down_the_stack():
    upward = []
    for name, path in modules().items():
        for target in project_imports(path):
            if target == name or target.startswith(name + "."):
                continue  # a package's own modules
            if RANK.get(target, -1) >= RANK[name]:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_importing_the_package_loads_neither_torch_nor_transformers():
    code = "import sys, spacy_unmask; print(any(m in sys.modules for m in ('torch', 'transformers', 'peft')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
